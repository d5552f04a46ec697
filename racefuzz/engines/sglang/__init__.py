"""sglang's own overlap loop under racefuzz.trace (docs/sglang.md).

From a test (sglang's own CI, on a pull request's tree):

    from racefuzz.engines.sglang import assert_loop_race_free

    def test_overlap_loop_has_no_war_race():
        assert_loop_race_free(source="python")   # the checkout's python/ directory

raises `racefuzz.errors.RaceFound` (a race with the barrier as the tree has it) or `Inconclusive` (no race,
but the control with the barrier off was not caught either), and returns the harness's result otherwise.
Each call runs the harness in a subprocess (`racefuzz.engines.sglang.harness`). Importing this package
imports neither torch nor sglang.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def run_loop(
    source: str | Path | None = None,
    version: str | None = None,
    workload: str = "fixed",
    examples: int = 10,
    seed: int = 0,
    read_done: str = "none",
    timeout: float = 900.0,
) -> dict[str, Any]:
    """The harness's result for a source tree or a fetched version (see `racefuzz sglang`)."""
    from racefuzz.commands.sglang import run_harness, workloads_for
    from racefuzz.engines.sglang import sources

    path = sources.locate(version=version, source=source)
    workloads = workloads_for(workload, examples, seed)
    return run_harness(path, workloads, True, version, timeout, read_done)


def assert_loop_race_free(source: str | Path | None = None, version: str | None = None, **options: Any) -> dict:
    """`run_loop`, then RaceFound / Inconclusive / RuntimeError as `racefuzz sglang` would exit 1 / 3 / 5."""
    from racefuzz.commands.engine import raise_for_verdict
    from racefuzz.commands.sglang import format_result, version_verdict

    result = run_loop(source, version, **options)
    raise_for_verdict(version_verdict(result, control=True), format_result(result))
    return result


__all__ = ["assert_loop_race_free", "run_loop"]
