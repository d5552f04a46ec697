"""vLLM's own `GPUModelRunner` under racefuzz.trace (docs/vllm.md).

From a test (vLLM's own CI, on a pull request's tree):

    from racefuzz.engines.vllm import assert_runner_race_free

    def test_input_preparation_has_no_host_device_race():
        assert_runner_race_free(source=".")   # the checkout (the directory holding vllm/)

raises `racefuzz.errors.RaceFound` (a race with `prepare_inputs_event` as the tree has it) or
`Inconclusive` (no race, but the control with the event's synchronize a no-op was not caught either), and
returns the harness's result otherwise. Each call runs the harness in a subprocess
(`racefuzz.engines.vllm.harness`). Importing this package imports neither torch nor vLLM.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def run_runner(
    source: str | Path | None = None,
    version: str | None = None,
    workload: str = "fixed",
    examples: int = 10,
    seed: int = 0,
    timeout: float = 900.0,
    device: str = "cpu",
) -> dict[str, Any]:
    """The harness's result for a source tree or a fetched version on `device` (`cpu`, `cuda`, `auto`;
    see `racefuzz vllm`)."""
    from racefuzz.commands.vllm import run_harness, workloads_for
    from racefuzz.engines.device_choice import resolve_device
    from racefuzz.engines.vllm import sources

    path = sources.locate(version=version, source=source)
    return run_harness(path, workloads_for(workload, examples, seed), True, version, timeout, resolve_device(device))


def assert_runner_race_free(source: str | Path | None = None, version: str | None = None, **options: Any) -> dict:
    """`run_runner`, then RaceFound / Inconclusive / RuntimeError as `racefuzz vllm` would exit 1 / 3 / 5."""
    from racefuzz.commands.engine import raise_for_verdict
    from racefuzz.commands.vllm import format_result, version_verdict

    result = run_runner(source, version, **options)
    raise_for_verdict(version_verdict(result, control=True), format_result(result))
    return result


__all__ = ["assert_runner_race_free", "run_runner"]
