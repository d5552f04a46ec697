"""The sglang harness on a real GPU (`racefuzz sglang --device cuda`): the CPU tests' expectations
(tests/engines/test_sglang_harness.py) on torch.cuda's streams, sglang's own Triton kernel in the fake
forward, and the GPU's negative control (`_apply_war_barrier`'s own flag off: racefuzz/engines/sglang/gpu.py).

* 0.5.15 has #31687's post-launch race at sglang's lines (the barrier at the loop top, before run_batch);
* 0.5.23 is clean beside a caught control.

The versions' sources must be in the cache (`racefuzz sglang fetch --version X [--archive FILE]`; on the
H200, `ci/sglang_gpu.sh` unpacks the carried archives); without them a test skips, saying so. With
`RACEFUZZ_SGLANG_GPU_JSON` naming the `--json` file of a `racefuzz sglang --device cuda` run that covered
the version (what `ci/sglang_gpu.sh` does, to run each version once), the checks read that run's result
instead of running the harness again. `check_0_5_15` / `check_0_5_23` are the checks themselves.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from racefuzz.engines.sglang import sources
from racefuzz.exitcodes import ExitCode

JSON_ENV = "RACEFUZZ_SGLANG_GPU_JSON"


def _writes_by(race: dict, function: str) -> bool:
    return any(function in chain for chain in race["second"].get("called_from", []))


def check_0_5_15(result: dict[str, Any], device: str = "cuda") -> None:
    """#31687's race on 0.5.15's own code: the forward's read of a row (called from run_batch) against
    the prefill result's radix-cache rewrite of it on the schedule stream."""
    from racefuzz.commands.sglang import version_verdict

    assert result["status"] == "ok", result.get("error")
    assert result.get("device", "cpu") == device, f"not a {device} run: device {result.get('device')!r}"
    barrier = result["runs"][0]
    assert barrier["barrier"]
    assert barrier["races"], "0.5.15 ran clean on the GPU: #31687's race was not found"
    found = [
        race
        for race in barrier["races"]
        if race["kind"] == "WAR"
        and race["first"]["stream"] == "forward_stream"
        and race["second"]["stream"] == "schedule_stream"
        and race["first"].get("called_from") == ["sglang/srt/managers/scheduler.py:3250 (run_batch)"]
        and race["second"]["source"] == "sglang/srt/mem_cache/memory_pool.py:271 (write)"
    ]
    assert found, f"no WAR of the forward (scheduler.py:3250) against memory_pool.py:271: {barrier['races'][:2]}"
    chain = found[0]["second"]["called_from"][0]
    assert "radix_cache.py:528 (cache_unfinished_req)" in chain
    assert "batch_result_processor.py:242 (process_batch_result_prefill)" in chain
    assert any(where.startswith("req_to_token[") for where in found[0]["bytes"])
    assert version_verdict(result, control=True) == ExitCode.RACE


def check_0_5_23(result: dict[str, Any], device: str = "cuda") -> None:
    """0.5.23 clean with its barrier (after run_batch), beside the control (the flag off) caught."""
    from racefuzz.commands.sglang import version_verdict

    assert result["status"] == "ok", result.get("error")
    assert result.get("device", "cpu") == device, f"not a {device} run: device {result.get('device')!r}"
    barrier, control = result["runs"][:2]
    assert barrier["barrier"] and not control["barrier"]
    assert barrier["forwards"] >= 4, "the loop ran too few forwards to mean anything"
    assert barrier["races"] == [], barrier["races"][:2]
    assert control["races"], "the negative control was not caught on the GPU"
    assert all(race["kind"] == "WAR" for race in control["races"])
    assert ("forward_stream", "schedule_stream") in {
        (r["first"]["stream"], r["second"]["stream"]) for r in control["races"]
    }
    assert any(_writes_by(race, "cache_unfinished_req") or _writes_by(race, "checkpoint") for race in control["races"])
    assert version_verdict(result, control=True) == ExitCode.CLEAN


def _result(version: str) -> dict[str, Any]:
    carried = os.environ.get(JSON_ENV)
    if carried:
        for result in json.loads(Path(carried).read_text()):
            if result.get("version") == version or result.get("label") == version:
                return result
    try:
        path = sources.locate(version=version)
    except sources.SourcesUnavailable as exc:
        pytest.skip(f"sglang {version}'s sources are not here: {exc}")
    from racefuzz.commands.sglang import run_harness
    from racefuzz.engines.sglang.workload import FIXED

    return run_harness(path, [FIXED.to_json()], True, version, 600, device="cuda")


def test_0_5_15_has_the_post_launch_race_of_31687_on_the_gpu() -> None:
    check_0_5_15(_result("0.5.15"))


def test_0_5_23_is_clean_beside_a_caught_control_on_the_gpu() -> None:
    check_0_5_23(_result("0.5.23"))
