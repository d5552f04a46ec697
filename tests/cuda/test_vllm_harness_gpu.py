"""The vLLM harness on a real GPU (`racefuzz vllm --device cuda`): the CPU tests' expectations
(tests/engines/test_vllm_harness.py) on torch.cuda's streams and events and really pinned host buffers
(the recorder's own host/device split: a pinned CPU tensor's op is the host's).

* 0.10.2 races where vLLM #25279 says: `InputBatch.condense` (inside `_update_states`, outside #24527's
  synchronized section) rewrites `temperature_cpu_tensor` while the previous step's `copy_slice` may still
  read it;
* 0.33.0 is clean beside a caught control (`prepare_inputs_event.synchronize` a no-op: the host rewrites
  a persistent pinned buffer the previous step's `copy_to_gpu` may still read).

The versions' sources must be in the cache (`racefuzz vllm fetch --version X [--archive FILE]`; on the
H200, `ci/vllm_gpu.sh` unpacks the carried archives); without them a test skips, saying so. With
`RACEFUZZ_VLLM_GPU_JSON` naming the `--json` file of a `racefuzz vllm --device cuda` run that covered the
version (what `ci/vllm_gpu.sh` does, to run each version once), the checks read that run's result instead
of running the harness again. `check_0_10_2` / `check_0_33_0` are the checks themselves (the script's dry
run, `DEVICE=cpu ci/vllm_gpu.sh`, calls them with `device="cpu"`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from racefuzz.engines.vllm import sources
from racefuzz.exitcodes import ExitCode

pytestmark = pytest.mark.cuda

JSON_ENV = "RACEFUZZ_VLLM_GPU_JSON"


def _races(result: dict[str, Any], control: bool) -> list[dict[str, Any]]:
    return [race for run in result["runs"] if run["control"] is control for race in run["races"]]


def _ran_on(result: dict[str, Any], device: str) -> None:
    assert result["status"] == "ok", result.get("error")
    assert result.get("device") == device, f"not a {device} run: device {result.get('device')!r}"


def check_0_10_2(result: dict[str, Any], device: str = "cuda") -> None:
    """#25279's race on 0.10.2's own code: `copy_slice`'s non-blocking copy of the sampling tensor on the
    default stream against `condense`'s host write of it."""
    from racefuzz.commands.vllm import version_verdict

    _ran_on(result, device)
    races = _races(result, control=False)
    assert races, "0.10.2 ran clean: #25279's race was not found"
    found = [
        r
        for r in races
        if r["kind"] == "WAR"
        and r["first"]["stream"] == "default"
        and r["second"]["stream"] == "host"
        and "vllm/v1/utils.py" in r["first"]["source"]
        and "(copy_slice)" in r["first"]["source"]
        and "gpu_input_batch.py" in r["second"]["source"]
        and "(condense)" in r["second"]["source"]
    ]
    assert found, f"no WAR of copy_slice against condense: {races[:2]}"
    assert any(b.startswith("input_batch.temperature_cpu_tensor[") for r in found for b in r["bytes"])
    assert version_verdict(result, control=True) == ExitCode.RACE


def check_0_33_0(result: dict[str, Any], device: str = "cuda") -> None:
    """0.33.0 clean with `prepare_inputs_event` as it has it, beside the control caught."""
    from racefuzz.commands.vllm import version_verdict

    _ran_on(result, device)
    checked = next(run for run in result["runs"] if not run["control"])
    assert checked["forwards"] >= 6, "the loop ran too few forwards to mean anything"
    assert checked["host_accesses"] > 0, "no host access recorded: the pinned buffers' host writes were not seen"
    assert _races(result, control=False) == [], _races(result, control=False)[:2]
    caught = _races(result, control=True)
    assert caught, "the negative control (prepare_inputs_event.synchronize a no-op) was not caught"
    streams = ("default", "host")
    war = [r for r in caught if r["kind"] == "WAR" and (r["first"]["stream"], r["second"]["stream"]) == streams]
    assert any("(copy_to_gpu)" in r["first"]["source"] for r in war)
    assert any("gpu_model_runner.py" in r["second"]["source"] for r in war)
    assert version_verdict(result, control=True) == ExitCode.CLEAN


ACCEPTED = "input_batch.num_accepted_tokens_cpu_tensor"


def check_spec_0_33_0(result: dict[str, Any], device: str = "cuda") -> None:
    """`--workload spec` (#36013's setting) on 0.33.0: clean (no host read of the accepted counts under
    async non-align), beside the control caught."""
    from racefuzz.commands.vllm import version_verdict

    _ran_on(result, device)
    assert _races(result, control=False) == [], _races(result, control=False)[:2]
    assert _races(result, control=True), "the negative control (the runner's input-prep events) was not caught"
    assert version_verdict(result, control=True) == ExitCode.CLEAN


def check_spec_condense_0_33_0(result: dict[str, Any], device: str = "cuda") -> None:
    """`--workload spec-condense` (#51571 / #53613) on 0.33.0: `_update_states_after_model_execute`'s
    non-blocking copy of the accepted counts against `InputBatch.condense`'s host access of them, and nothing
    else."""
    from racefuzz.commands.vllm import version_verdict

    _ran_on(result, device)
    races = _races(result, control=False)
    assert races, "0.33.0 spec-condense ran clean: #51571's race was not found"
    pairs = [
        r
        for r in races
        if r["kind"] in ("RAW", "WAW")
        and "(_update_states_after_model_execute)" in r["first"]["source"]
        and "gpu_input_batch.py" in r["second"]["source"]
        and "(condense)" in r["second"]["source"]
        and any(b.startswith(ACCEPTED) for b in r["bytes"])
    ]
    assert pairs == races, f"races besides the accepted counts against condense: {races[:2]}"
    assert version_verdict(result, control=True) == ExitCode.RACE


def _result(version: str) -> dict[str, Any]:
    carried = os.environ.get(JSON_ENV)
    if carried:
        for result in json.loads(Path(carried).read_text()):
            if result.get("label") == version:
                return result
    try:
        path = sources.locate(version=version)
    except sources.SourcesUnavailable as exc:
        pytest.skip(f"vLLM {version}'s sources are not here: {exc}")
    from racefuzz.commands.vllm import run_harness
    from racefuzz.engines.vllm.workload import FIXED

    return run_harness(path, [FIXED.to_json()], True, version, 600, device="cuda")


def test_0_10_2_races_where_25279_says_on_the_gpu() -> None:
    check_0_10_2(_result("0.10.2"))


def test_0_33_0_is_clean_beside_a_caught_control_on_the_gpu() -> None:
    check_0_33_0(_result("0.33.0"))
