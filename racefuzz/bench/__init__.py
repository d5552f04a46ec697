"""Benchmarks (not tests): each writes raw output that is committed under docs/results/."""
