"""`ci.bench sglang_sync_cost` on a real GPU (`racefuzz.engines.sglang.costs --device cuda`): each version's plain
run times the sync call its design makes, at sglang's own line, and the forwards' GPU idle. Structure only (which
calls were timed, how many, on which clock); the times themselves are the benchmark's, not asserted.

    python -m pytest -q -p no:randomly tests/cuda/test_sglang_sync_cost_gpu.py

needs the sglang 0.5.14 and 0.5.15 sources (`racefuzz sglang fetch`; on the H200, ci/sglang_gpu.sh's setup).
"""

from __future__ import annotations

from typing import Any

import pytest

from racefuzz.engines.sglang import sources

SELF_EVENT = "synchronize at sglang/srt/speculative/dflash_info_v2.py:143 (prepare_for_decode)"
BARRIER = "wait_stream at sglang/srt/managers/scheduler.py:1530 (_apply_war_barrier)"


def _setting(version: str) -> dict[str, Any]:
    from ci.bench.sglang_sync_cost import run_costs
    from racefuzz.engines.sglang.costs import COST_WORKLOAD

    try:
        path = sources.locate(version=version)
    except sources.SourcesUnavailable as exc:
        pytest.skip(f"sglang {version}'s sources are not here: {exc}")
    result = run_costs(str(path), version, "cuda", (2000.0,), 2, COST_WORKLOAD)
    assert result["status"] == "ok", result.get("error")
    (setting,) = result["settings"]
    assert setting["spin_cycles"] > 0
    return setting


def _check_gpu_clock(run: dict[str, Any]) -> None:
    assert run["forwards"] > 10
    assert len(run["gpu_busy_us"]) == run["forwards"]
    assert len(run["gpu_idle_us"]) == run["forwards"] - 1
    assert all(idle >= 0 for idle in run["gpu_idle_us"])


def test_0_5_14_blocks_the_host_in_verify_done_and_has_no_barrier() -> None:
    run = _setting("0.5.14")["measured"][0]
    _check_gpu_clock(run)
    assert run["calls"].get(SELF_EVENT, 0) >= run["forwards"] - 4  # every decode step's prepare_for_decode
    assert not any(site.endswith("(_apply_war_barrier)") for site in run["calls"])  # off for DFLASH (:1482)


def test_0_5_15_waits_in_the_barrier_and_has_no_verify_done() -> None:
    run = _setting("0.5.15")["measured"][0]
    _check_gpu_clock(run)
    assert run["calls"].get(BARRIER, 0) == run["iterations"]  # once per loop iteration, at the loop's top
    assert not any("dflash_info_v2.py" in site for site in run["calls"])
