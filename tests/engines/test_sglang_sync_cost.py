"""`ci.bench sglang_sync_cost` on the CPU (`racefuzz.engines.sglang.costs`): a plain run of sglang's own loop
times each version's sync calls at sglang's own lines (structure only: on the CPU nothing waits)."""

from __future__ import annotations

import pytest

from racefuzz.engines.sglang import sources


def test_the_plain_run_times_0_5_15s_barrier_once_per_iteration_and_no_gpu_clock() -> None:
    from ci.bench.sglang_sync_cost import run_costs
    from racefuzz.engines.sglang.costs import COST_WORKLOAD

    try:
        path = sources.locate(version="0.5.15")
    except sources.SourcesUnavailable as exc:
        pytest.skip(f"sglang 0.5.15's sources are not here: {exc}")
    result = run_costs(str(path), "0.5.15", "cpu", (0.0,), 2, COST_WORKLOAD)
    assert result["status"] == "ok", result.get("error")
    run = result["settings"][0]["measured"][0]
    assert not run["stopped_by_budget"]
    barrier = "wait_stream at sglang/srt/managers/scheduler.py:1530 (_apply_war_barrier)"
    assert run["calls"][barrier] == run["iterations"]
    assert not any("dflash_info_v2.py" in site for site in run["calls"])  # verify_done is gone in 0.5.15
    assert set(run["blocked_s"]) == set(run["calls"])
    assert "gpu_idle_us" not in run
