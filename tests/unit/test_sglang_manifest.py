"""The sglang harness's manifestation mode aims a delay at each race's first access (manifest.py).

What a GPU run finds with those delays is in tests/cuda and docs/results/sglang-manifest-h200/; here, on
the CPU, only the aiming: the delay point must be the reading launch's, counted as the search counts.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from racefuzz.engines.sglang.manifest import AIMED_DELAYS_US, aimed_delays  # noqa: E402
from racefuzz.trace.judge import trace_races  # noqa: E402
from racefuzz.trace.search import launch_points, run_once  # noqa: E402


def overlap(env, sync: bool = False):
    """Two launches on `forward` (the second reads row 1), then the schedule stream rewrites row 1."""
    table = env.name(torch.zeros(4, 16, dtype=torch.int32), "req_to_token")
    schedule, forward = env.stream("schedule"), env.stream("forward")
    forward.wait_stream(env.current_stream())
    schedule.wait_stream(env.current_stream())
    with env.use(forward):
        scratch = torch.ones(8, dtype=torch.int32) * 3
        kv = table[1] + scratch.sum()
    if sync:
        schedule.wait_stream(forward)
    with env.use(schedule):
        table[1, 4:8] = 7
    env.synchronize()
    return {"kv": kv}


def test_each_race_gets_a_delay_before_its_reading_launch() -> None:
    reference = run_once(overlap, "cpu", serialize=True)
    races = trace_races(reference.program)
    assert [(r.first.kernel, r.second.kernel) for r in races] == [("aten.add.Tensor", "aten.fill_.Tensor")]
    # forward's launches: ones (0), mul (1), sum (2), the add that reads row 1 (3); the frees are no points
    assert [point for point in launch_points(reference) if point[0] == "forward"] == [("forward", n) for n in range(4)]
    assert aimed_delays(reference, races) == [[("forward", 3, us)] for us in AIMED_DELAYS_US]


def test_no_race_no_aimed_delay() -> None:
    reference = run_once(lambda env: overlap(env, sync=True), "cpu", serialize=True)
    assert trace_races(reference.program) == []
    assert aimed_delays(reference, []) == []
