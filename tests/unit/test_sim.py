"""The simulator's time model: FIFO streams, snapshots, host blocking, determinism."""

from __future__ import annotations

import numpy as np

from racefuzz import Device, Schedule, SimConfig, simulate
from racefuzz.backends import HOST


def _spans(run, kind: str):
    return [span for span in run.timeline if span.kind == kind]


def test_stream_is_fifo_and_costs_add_up() -> None:
    device = Device()
    forward = device.stream("forward_stream")
    table = device.buffer("req_to_token", 2, 8)
    forward.launch("block_gather", reads=[table[0, 0:4]], cost_us=100)
    forward.launch("page_table_build", reads=[table[0, 0:4]], cost_us=50)
    run = simulate(device.finish(), config=SimConfig(launch_cost_us=5, kernel_cost_us=5))
    first, second = _spans(run, "kernel")
    assert (first.start_us, first.end_us) == (5, 105)
    assert (second.start_us, second.end_us) == (105, 155)
    assert run.host_end_us == 155


def test_wait_stream_snapshot_does_not_cover_later_work() -> None:
    device = Device()
    forward, schedule = device.stream("forward_stream"), device.stream("schedule_stream")
    table = device.buffer("req_to_token", 2, 8)
    forward.launch("block_gather", reads=[table[0, 0:4]], cost_us=100)  # issued at 5, ends 105
    schedule.wait_stream(forward)  # snapshot: 105
    forward.launch("page_table_build", reads=[table[0, 0:4]], cost_us=1000)  # ends 1105, not covered
    schedule.launch("prefill_write", writes=[(table[1, 0:4], 1)], cost_us=10)
    run = simulate(device.finish())
    write = next(span for span in _spans(run, "kernel") if span.label == "prefill_write")
    assert write.start_us == 105


def test_host_sync_blocks_the_host_and_delays_later_issue() -> None:
    device = Device()
    forward = device.stream("forward_stream")
    table = device.buffer("req_to_token", 2, 8)
    forward.launch("block_gather", reads=[table[0, 0:4]], cost_us=2000)
    verify_done = forward.record_event("verify_done")
    verify_done.synchronize()
    never = device.event("never")
    never.synchronize()  # never recorded: returns at once
    run = simulate(device.finish())
    syncs = [span for span in run.timeline if span.kind == "sync"]
    assert syncs[0].track == HOST and syncs[0].end_us == 2005
    assert syncs[1].start_us == syncs[1].end_us == 2005


def test_injected_delays_appear_on_the_timeline() -> None:
    device = Device()
    forward = device.stream("forward_stream")
    table = device.buffer("req_to_token", 2, 8)
    forward.launch("block_gather", reads=[table[0, 0:4]])
    program = device.finish()
    run = simulate(program, Schedule(device_delays={0: 300}, read_spins={0: 700}, host_delays={0: 40}))
    (spin,) = _spans(run, "spin")
    (kernel,) = _spans(run, "kernel")
    (host_delay,) = _spans(run, "host_delay")
    assert (host_delay.start_us, host_delay.end_us) == (0, 40)
    assert (spin.start_us, spin.end_us) == (45, 345)
    assert (kernel.start_us, kernel.end_us) == (345, 345 + 5 + 700)


def test_same_inputs_same_outputs() -> None:
    from racefuzz.litmus import all_litmus

    for litmus in all_litmus():
        schedule = litmus.corrupting or litmus.stressing
        assert schedule is not None
        a, b = simulate(litmus.program, schedule), simulate(litmus.program, schedule)
        assert a.timeline == b.timeline
        assert a.observations.keys() == b.observations.keys()
        for key in a.observations:
            for x, y in zip(a.observations[key], b.observations[key], strict=True):
                np.testing.assert_array_equal(x, y)


def test_the_no_replay_shortcut_gives_the_replayed_loads() -> None:
    # A run that applies every hb-unordered conflict in issue order returns the sequential loads without a
    # replay; track_writers always replays. Both must load the same values, on runs that corrupt and not.
    import random

    from racefuzz.memory import in_order_loads
    from racefuzz.testing_programs import overlap_shaped_program

    shortcut = corrupted = 0
    for seed in range(60):
        program = overlap_shaped_program(80, seed)
        readers = [op.index for op in program.launches if op.reads]
        rng = random.Random(seed)
        spins = {i: 2000.0 for i in rng.sample(readers, min(rng.randint(0, 3), len(readers)))}
        fast = simulate(program, Schedule(read_spins=spins), record_timeline=False)
        replayed = simulate(program, Schedule(read_spins=spins), track_writers=True)
        assert fast.observations.keys() == replayed.observations.keys()
        for key in fast.observations:
            for x, y in zip(fast.observations[key], replayed.observations[key], strict=True):
                np.testing.assert_array_equal(x, y)
        shortcut += fast.observations is in_order_loads(program)
        corrupted += any(
            not np.array_equal(x, y)
            for key, arrays in in_order_loads(program).items()
            for x, y in zip(arrays, replayed.observations[key], strict=True)
        )
    assert shortcut >= 10 and corrupted >= 3  # both paths were taken


def _war_program():
    """A reader on forward, then a writer of the same cells on schedule, no edge between them (a WAR race)."""
    device = Device()
    forward, schedule = device.stream("forward_stream"), device.stream("schedule_stream")
    table = device.buffer("req_to_token", 2, 8)
    schedule.launch("prefill_write", writes=[(table[0, 0:4], 7)])
    device.synchronize()
    forward.launch("block_gather", reads=[table[0, 0:4]])  # op 2
    schedule.launch("post_launch_rewrite", writes=[(table[0, 0:4], 9)])  # op 3
    return device.finish()


def test_a_forced_order_decides_the_race_whatever_the_delays() -> None:
    program = _war_program()
    reader, writer = 2, 3
    clobbered = Schedule(orders=((writer, reader),))
    run = simulate(program, clobbered)
    assert run.observations[reader][0].tolist() == [[9, 9, 9, 9]]
    assert run.access_time_us[writer] < run.access_time_us[reader]
    # A long spin on the writer's stream does not undo the order; the gate waits for it.
    late_writer = Schedule(device_delays={writer: 5000.0}, orders=((writer, reader),))
    assert simulate(program, late_writer).observations[reader][0].tolist() == [[9, 9, 9, 9]]
    # The other order holds against a read spin that would otherwise let the writer clobber the read.
    spun = Schedule(read_spins={reader: 5000.0})
    assert simulate(program, spun).observations[reader][0].tolist() == [[9, 9, 9, 9]]
    kept = Schedule(read_spins={reader: 5000.0}, orders=((reader, writer),))
    assert simulate(program, kept).observations[reader][0].tolist() == [[7, 7, 7, 7]]


def test_the_gate_is_on_the_timeline() -> None:
    program = _war_program()
    run = simulate(program, Schedule(orders=((3, 2),)))
    (gate,) = _spans(run, "gate")
    assert gate.op_index == 2 and gate.track == "forward_stream"
    assert "op #3 post_launch_rewrite" in gate.label
    (writer,) = [span for span in _spans(run, "kernel") if span.op_index == 3]
    assert gate.end_us == writer.end_us + SimConfig().gate_cost_us


def test_orders_that_cannot_hold_are_infeasible_not_a_hang() -> None:
    import pytest

    from racefuzz.schedule import ScheduleInfeasible

    program = _war_program()
    with pytest.raises(ScheduleInfeasible, match="cycle"):
        simulate(program, Schedule(orders=((3, 2), (2, 3))))
    # The host blocks on forward before it issues the writer the gate waits for.
    device = Device()
    forward, schedule = device.stream("forward_stream"), device.stream("schedule_stream")
    table = device.buffer("req_to_token", 2, 8)
    forward.launch("block_gather", reads=[table[0, 0:4]])
    forward.synchronize()
    schedule.launch("post_launch_rewrite", writes=[(table[0, 0:4], 9)])
    with pytest.raises(ScheduleInfeasible, match=r"forward_stream\.synchronize"):
        simulate(device.finish(), Schedule(orders=((2, 0),)))


def test_forced_orders_are_checked_and_round_trip() -> None:
    import pytest

    from racefuzz.errors import InvalidArgument

    program = _war_program()
    schedule = Schedule(read_spins={2: 40.0}, orders=[(3, 2), (3, 2)])
    assert schedule.orders == ((3, 2),)
    assert Schedule.from_json(schedule.to_json()) == schedule
    assert "orders" not in Schedule(read_spins={2: 40.0}).to_json()  # delay-only files read as before
    with pytest.raises(InvalidArgument, match="one stream"):
        Schedule(orders=((0, 3),)).check_against(program)
    with pytest.raises(InvalidArgument, match="not a launch"):
        Schedule(orders=((1, 3),)).check_against(program)
    with pytest.raises(InvalidArgument, match="itself"):
        Schedule(orders=((3, 3),))


def test_a_long_cascade_of_gates_runs_every_op_once_in_order() -> None:
    # A0..A(n-1), then B0..B(n-1), then one launch C: each A_i held until B_i, each B_i until A_(i-1), B0
    # until C. C, issued last, releases a chain of 2n ops (B0, A0, B1, A1, ...) at once.
    n = 3000
    device = Device()
    a, b, c = device.stream("a"), device.stream("b"), device.stream("c")
    table = device.buffer("t", 1, 1)
    for _ in range(n):
        a.launch("k", reads=[table[0, 0:1]])
    for _ in range(n):
        b.launch("k", reads=[table[0, 0:1]])
    c.launch("k", reads=[table[0, 0:1]])
    program = device.finish()
    orders = [(n + i, i) for i in range(n)] + [(i - 1, n + i) for i in range(1, n)] + [(2 * n, n)]
    run = simulate(program, Schedule(orders=orders))
    assert sorted(span.op_index for span in run.timeline if span.kind == "kernel") == list(range(2 * n + 1))
    times = run.access_time_us
    assert all(times[n + i] < times[i] for i in range(n)) and all(times[i - 1] < times[n + i] for i in range(1, n))


def test_under_forced_orders_a_wait_stream_still_waits_for_the_other_stream() -> None:
    # Any forced order puts the run on the gated machine, which times a wait_stream by its own rule (the
    # other stream's last op at the call). The default path cannot see a wait_stream ignored there: the
    # reader below is ordered after the writer, so its pair is no race, and the no-replay shortcut returns
    # the sequential loads. The replay (`track_writers`) and the access times do see it.
    device = Device()
    forward, schedule, plan = device.stream("forward_stream"), device.stream("schedule_stream"), device.stream("plan")
    table = device.buffer("req_to_token", 2, 8)
    forward.launch("prefill_write", writes=[(table[0, 0:4], 7)], cost_us=100)  # op 0: ends at 105
    plan.wait_stream(forward)  # op 1
    plan.launch("page_table_build", reads=[table[0, 0:4]], cost_us=5)  # op 2: must start at 105
    forward.launch("stash", writes=[(table[1, 0:4], 1)])  # op 3
    schedule.launch("rewrite", writes=[(table[1, 0:4], 2)])  # op 4: races op 3
    program = device.finish()
    run = simulate(program, Schedule(orders=((3, 4),)), track_writers=True)
    assert run.access_time_us[2] == 110.0 and run.access_time_us[0] == 105.0
    assert run.observations[2][0].tolist() == [[7, 7, 7, 7]]
