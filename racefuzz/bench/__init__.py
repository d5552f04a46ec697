"""Benchmarks (not tests), run by `racefuzz bench WHICH`: each prints its table, and writes files only when
asked (`--json PATH`; for `matrix`, `--out DIR` for its counterexamples). The raw output committed under
docs/results/ is written there explicitly (commands in docs/BENCHMARKS.md and docs/designs.md).
"""
