"""Benchmarks (not tests, not in the wheel), run from the repository root as `python -m ci.bench NAME`: each
prints its table, and writes files only when asked (`--json PATH`; for `matrix`, `--out DIR` for its
counterexamples). The raw output committed under docs/results/<benchmark>/ is written there explicitly;
docs/results/README.md names each benchmark's folder and the command that wrote it.
"""
