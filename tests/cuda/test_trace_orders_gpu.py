"""Forced orders on real code on a real GPU (issue 26, item 2): the CUDA backend's gate kernels hold a
traced step's read back until the racing write on another stream has run, so the WAR manifests by the
order itself -- 1 of 1 and 5 of 5 on replay -- while the synced step stays clean under the same search
(the negative control, in the same run), and an order that would deadlock ends by the gate's timeout.

Each test prints what it saw (run with `-s` for the record)."""

from __future__ import annotations

import json

import pytest

from racefuzz.exitcodes import ExitCode
from racefuzz.schedule import Schedule, ScheduleInfeasible
from racefuzz.trace.search import fuzz, judge_run, run_once, run_with_delays

pytestmark = pytest.mark.cuda

WRITE, READ = ("schedule", 0), ("forward", 0)
"""The racing pair: the schedule stream's rewrite of row 1 and the forward's read of rows 1-2."""


def _war(env, *, barrier: bool):
    """The forward reads rows 1-2 of a table that the schedule stream then rewrites (row 1, columns 4:8):
    a WAR unless the schedule stream waits for the forward (`barrier`)."""
    import torch

    table = env.name(torch.zeros(4, 16, dtype=torch.int32, device=env.device), "table")
    schedule, forward = env.stream("schedule"), env.stream("forward")
    forward.wait_stream(env.current_stream())
    schedule.wait_stream(env.current_stream())
    with env.use(forward):
        kv = table[1:3].sum(0)
    if barrier:
        schedule.wait_stream(forward)
    with env.use(schedule):
        table[1, 4:8] = 7
    env.synchronize()
    return {"kv": kv}


def war_step(env):
    return _war(env, barrier=False)


def synced_step(env):
    return _war(env, barrier=True)


ORDERS_ONLY = (0.0,)
"""`delays_us` whose every delay is 0 us (dropped from the schedule): a search that can manifest a race
only by forcing an order."""


def test_the_forced_order_manifests_the_war_every_time_and_the_synced_step_stays_clean():
    racy = fuzz(war_step, device="cuda", examples=50, seed=0, confirm=5, delays_us=ORDERS_ONLY)
    print("racy:", racy.divergence, racy.schedule, f"{racy.confirmed}/{racy.confirm_runs}", racy.examples)
    assert racy.candidate_orders == [(WRITE, READ)]
    assert racy.orders == [(WRITE, READ)] and racy.delays == []
    assert racy.manifested and (racy.confirmed, racy.confirm_runs) == (5, 5) and racy.infeasible == 0
    clean = fuzz(synced_step, device="cuda", examples=50, seed=0, confirm=5, delays_us=ORDERS_ONLY)
    print("clean:", clean.divergence, clean.candidate_orders, clean.examples)
    assert clean.races == [] and clean.candidate_orders == [] and clean.divergence is None and clean.examples > 0
    assert not clean.racy


def test_without_the_order_the_war_does_not_show_and_with_it_it_shows_in_each_run():
    reference = run_once(war_step, "cuda", serialize=True)
    forced = Schedule(orders=((WRITE, READ),))
    plain = [judge_run(reference, run_with_delays(war_step, "cuda", reference, Schedule()), None) for _ in range(5)]
    held = [judge_run(reference, run_with_delays(war_step, "cuda", reference, forced), None) for _ in range(5)]
    print("plain:", plain, "\nheld:", held)
    assert all(found is None for found in plain)
    assert all(found is not None and found.kind == "value" for found in held)


def test_a_deadlocking_order_ends_by_the_gates_timeout_and_is_reported(capsys):
    """Forced on the synced step (its barrier orders the read before the write), the gate waits for a signal
    queued behind itself: the wait gives up after its timeout and the run is ScheduleInfeasible -- it ends,
    it is not judged. The search never draws such an order (OrderFacts refuses it)."""
    reference = run_once(synced_step, "cuda", serialize=True)
    with pytest.raises(ScheduleInfeasible, match="gate's wait timed out") as refused:
        run_with_delays(synced_step, "cuda", reference, Schedule(orders=((WRITE, READ),)))
    print(refused.value)


def test_the_replay_file_of_the_order_replays_1_of_1_and_5_of_5(tmp_path, capsys):
    from racefuzz.cli import main
    from racefuzz.trace.report import replay_json

    racy = fuzz(war_step, device="cuda", examples=50, seed=0, confirm=3, delays_us=ORDERS_ONLY)
    assert racy.orders == [(WRITE, READ)]
    path = tmp_path / "orders.json"
    path.write_text(json.dumps({**replay_json(racy), "step": f"{__file__}:war_step"}))
    for repeat in (1, 5):
        assert main(["replay", str(path), "--repeat", str(repeat)]) == ExitCode.RACE
        out = capsys.readouterr().out
        print(out)
        assert "forced orders: launch 0 on schedule before launch 0 on forward" in out
        assert f"the value divergence reproduced in {repeat}/{repeat} run(s)" in out
