"""Forced orders on real code (issue 26, item 2): which launch points get a gate's wait and signal, the
orders refused because they could deadlock, the search that draws them, and the replay file that carries
them. On the CPU a step executes eagerly and nothing can be held back, so the GPU's gates are faked here:
`FakeGates` records what the recorder asks it to enqueue, and a step stands in for the GPU by reading
`HELD`, set while a gate holds its forward launch back (a read the racing write then overtakes returns
the written value). tests/cuda/test_trace_orders_gpu.py runs the same on the GPU's real gates."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from racefuzz.exitcodes import ExitCode  # noqa: E402
from racefuzz.schedule import Schedule, ScheduleInfeasible  # noqa: E402
from racefuzz.trace import fastpath, search  # noqa: E402
from racefuzz.trace.judge import judge  # noqa: E402
from racefuzz.trace.orders import Gates, OrderFacts, candidate_orders  # noqa: E402

SCHEDULE_WRITE, FORWARD_READ = ("schedule", 0), ("forward", 0)
"""The WAR of `war_step`: the schedule stream's write and the forward's read it races with."""

HELD = SimpleNamespace(forward=False, timed_out=False, made=[])
"""Whether a gate holds the forward back in the run in progress; whether the fake gates time out; the
fake gates made, one per run with orders."""


class FakeGates:
    """`GateKernels` on the CPU: records the waits and signals, and sets `HELD.forward` while a wait is
    enqueued on the forward's read and its signal has not come."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.calls: list[tuple[str, int]] = []
        HELD.made.append(self)

    def wait(self, gate: int) -> None:
        self.calls.append(("wait", gate))
        HELD.forward = True

    def signal(self, gate: int) -> None:
        self.calls.append(("signal", gate))

    def timed_out(self) -> list[int]:
        HELD.forward = False
        return list(range(self.count)) if HELD.timed_out else []


@pytest.fixture
def fake_gpu(monkeypatch):
    """`fuzz` and the replay take the GPU's path with `FakeGates`, recorded on the CPU."""
    record_on_cpu = search.run_once
    monkeypatch.setattr(search, "resolve_device", lambda device: "cuda")
    monkeypatch.setattr(search, "run_once", lambda step, device, **options: record_on_cpu(step, "cpu", **options))
    monkeypatch.setattr(search, "gates_unavailable", lambda device: "")
    monkeypatch.setattr(search, "gate_kernels", lambda device, count: FakeGates(count))
    HELD.forward, HELD.timed_out, HELD.made = False, False, []
    return HELD


def _war(env, *, barrier: bool, host_sync: bool = False):
    """The forward reads rows 1-2 of a table that the schedule stream then rewrites (row 1): a WAR unless
    the schedule stream waits for the forward (`barrier`) or the host does (`host_sync`). Under a gate
    holding the forward back, its read sees the rewrite (`HELD`)."""
    table = env.name(torch.zeros(4, 16, dtype=torch.int32, device=env.device), "table")
    schedule, forward = env.stream("schedule"), env.stream("forward")
    forward.wait_stream(env.current_stream())
    schedule.wait_stream(env.current_stream())
    with env.use(forward):
        kv = table[1:3].sum(0) + (7 if HELD.forward else 0)  # held, the read would have seen row 1's rewrite
    if barrier:
        schedule.wait_stream(forward)
    if host_sync:
        forward.synchronize()
    with env.use(schedule):
        table[1, 4:8] = 7
    env.synchronize()
    return {"kv": kv}


def war_step(env):
    return _war(env, barrier=False)


def synced_step(env):
    return _war(env, barrier=True)


def host_synced_step(env):
    return _war(env, barrier=False, host_sync=True)


def _reference(step):
    return search.run_once(step, "cpu", serialize=True)


def test_the_candidate_order_of_a_war_puts_its_write_before_its_read():
    reference = _reference(war_step)
    races = judge(reference.program).races
    assert [str(race.race.kind) for race in races] == ["WAR"]
    assert candidate_orders(reference, races) == [(SCHEDULE_WRITE, FORWARD_READ)]
    assert candidate_orders(_reference(synced_step), judge(_reference(synced_step).program).races) == []


@pytest.mark.parametrize("fast", [True, False], ids=["fast path", "python path"])
def test_a_gate_waits_right_before_then_and_signals_right_after_first(monkeypatch, fast):
    """The wait is enqueued at the forward's read (the recorder's `_delay` at that point), the signal after
    the schedule stream's write (`_after`), in host order, by the C++ fast path as by the Python path."""
    if not fast:
        monkeypatch.setattr(fastpath, "load", lambda: None)
    reference = _reference(war_step)
    kernels = FakeGates(1)
    gates = Gates(((SCHEDULE_WRITE, FORWARD_READ),), kernels)
    run = search.run_once(war_step, "cpu", evaluate_annotations=False, snapshot_plan=reference.snapshots, gates=gates)
    assert gates.issued == [("wait", FORWARD_READ, 0), ("signal", SCHEDULE_WRITE, 0)]
    assert kernels.calls == [("wait", 0), ("signal", 0)]
    assert run.delays_applied == []  # a gate's point spins 0 us
    assert run.kernel_sequence() == reference.kernel_sequence()


def test_an_order_whose_then_happens_before_its_first_is_refused():
    """The barrier (a stream wait) and a host sync on the forward each order its read before the write:
    forcing the write first would make the gate wait forever."""
    for step in (synced_step, host_synced_step):
        facts = OrderFacts(_reference(step))
        with pytest.raises(ScheduleInfeasible, match="cannot hold: in the step's reference run launch 0 on forward"):
            facts.check([(SCHEDULE_WRITE, FORWARD_READ)])
        assert facts.consistent([(SCHEDULE_WRITE, FORWARD_READ)]) == []
        facts.check([(FORWARD_READ, SCHEDULE_WRITE)])  # the order happens-before already keeps: fine
    facts = OrderFacts(_reference(war_step))
    facts.check([(SCHEDULE_WRITE, FORWARD_READ)])
    with pytest.raises(ScheduleInfeasible, match="an order forced before it"):  # the two close a cycle
        facts.check([(SCHEDULE_WRITE, FORWARD_READ), (FORWARD_READ, SCHEDULE_WRITE)])
    assert facts.consistent([(SCHEDULE_WRITE, FORWARD_READ), (FORWARD_READ, SCHEDULE_WRITE)]) == [
        (SCHEDULE_WRITE, FORWARD_READ)
    ]
    with pytest.raises(ScheduleInfeasible, match="no launch point"):
        facts.check([(("schedule", 9), FORWARD_READ)])


def test_on_the_cpu_the_candidate_orders_are_reported_as_needing_a_gpu():
    from racefuzz.trace.report import render

    result = search.fuzz(war_step, device="cpu")
    assert result.racy and not result.searched
    assert result.candidate_orders == [(SCHEDULE_WRITE, FORWARD_READ)]
    text = render(result)
    assert "forced orders (not searched: they need a GPU): 1 candidate(s)" in text
    assert "launch 0 on schedule before launch 0 on forward" in text
    with pytest.raises(Exception, match="forced orders need a GPU"):
        search.run_with_delays(
            war_step, "cpu", _reference(war_step), Schedule(orders=((SCHEDULE_WRITE, FORWARD_READ),))
        )


def test_the_search_forces_the_order_confirms_it_k_of_k_and_the_synced_step_stays_clean(fake_gpu):
    racy = search.fuzz(war_step, examples=30, seed=0, confirm=3, delays_us=(20.0,))
    assert racy.racy and racy.manifested and (racy.confirmed, racy.confirm_runs) == (3, 3)
    assert racy.orders == [(SCHEDULE_WRITE, FORWARD_READ)] and racy.delays == []  # shrunk to the order alone
    assert racy.divergence is not None and "aten.add.Tensor on forward" in str(racy.divergence)
    # The negative control: the same search on the synced step has no candidate and no divergence.
    clean = search.fuzz(synced_step, examples=30, seed=0, confirm=3, delays_us=(20.0,))
    assert not clean.racy and clean.divergence is None and clean.candidate_orders == [] and clean.examples > 0


def test_a_run_whose_gate_timed_out_is_not_judged(fake_gpu):
    fake_gpu.timed_out = True
    result = search.fuzz(war_step, examples=10, seed=0, confirm=3, delays_us=(20.0,), max_delays=1)
    assert result.infeasible > 0 and result.divergence is None and not result.manifested
    from racefuzz.trace.report import render

    assert "not judged: a gate timed out" in render(result)


def test_the_replay_file_carries_the_orders_and_replays_them_1_of_1(fake_gpu, tmp_path, monkeypatch, capsys):
    from racefuzz.cli import main
    from racefuzz.commands.trace import load_trace_replay
    from racefuzz.trace.report import replay_json

    result = search.fuzz(war_step, examples=30, seed=0, confirm=3, delays_us=(20.0,))
    assert result.orders
    data = {**replay_json(result, ("table",)), "step": "test_trace_orders:war_step"}  # this module: its HELD
    path = tmp_path / "orders.json"
    path.write_text(json.dumps(data))
    assert data["orders"] == [
        {"first": {"stream": "schedule", "launch": 0}, "then": {"stream": "forward", "launch": 0}}
    ]
    assert load_trace_replay(path)[1:] == ("cuda", ("table",), result.schedule)
    made = len(fake_gpu.made)
    assert main(["replay", str(path), "--repeat", "1"]) == ExitCode.RACE
    out = capsys.readouterr().out
    assert "forced orders: launch 0 on schedule before launch 0 on forward" in out
    assert "reproduced in 1/1 run(s)" in out and len(fake_gpu.made) > made


@pytest.mark.parametrize(
    ("orders", "message"),
    [
        ([{"first": {"stream": "schedule", "launch": 0}}], 'forced order 0 must be {"first": point, "then": point}'),
        (
            [{"first": {"stream": "schedule", "launch": -1}, "then": {"stream": "forward", "launch": 0}}],
            "forced order 0 out of range: first's launch",
        ),
        (
            [{"first": {"stream": "forward", "launch": 0}, "then": {"stream": "forward", "launch": 1}}],
            "both launches are on one stream",
        ),
        (
            [{"first": {"stream": "schedule", "launch": 5}, "then": {"stream": "forward", "launch": 0}}],
            "forced order at launch 5 on 'schedule', but the step makes 1 there",
        ),
        (
            [{"first": {"stream": "forward", "launch": 0}, "then": {"stream": "schedule", "launch": 0}}],
            None,  # the order happens-before keeps already: fine (a CPU replay judges happens-before)
        ),
    ],
    ids=["no then", "negative launch", "one stream", "past the launches", "already kept"],
)
def test_a_bad_or_infeasible_order_in_a_replay_file_is_one_usage_line(tmp_path, capsys, orders, message):
    from racefuzz.cli import main

    path = tmp_path / "r.json"
    step = f"{Path(__file__).resolve()}:war_step"
    base = {"format": "racefuzz-replay", "version": 1, "kind": "trace", "racefuzz": "0", "step": step}
    path.write_text(json.dumps({**base, "device": "cpu", "watch": [], "delays": [], "orders": orders}))
    code = main(["replay", str(path)])
    err = capsys.readouterr().err
    if message is None:
        assert code == ExitCode.RACE  # the WAR's happens-before race, on the CPU
        return
    assert code == ExitCode.USAGE and message in err and len(err.strip().splitlines()) == 1


def test_an_infeasible_order_in_a_replay_file_is_refused_before_it_runs(tmp_path, capsys):
    from racefuzz.cli import main

    path = tmp_path / "r.json"
    base = {"format": "racefuzz-replay", "version": 1, "kind": "trace", "racefuzz": "0"}
    order = {"first": {"stream": "schedule", "launch": 0}, "then": {"stream": "forward", "launch": 0}}
    step = f"{Path(__file__).resolve()}:synced_step"
    path.write_text(json.dumps({**base, "step": step, "device": "cpu", "watch": [], "delays": [], "orders": [order]}))
    assert main(["replay", str(path)]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "cannot hold" in err and "its gate would wait forever" in err and len(err.strip().splitlines()) == 1


def test_a_real_code_schedule_round_trips_through_json_and_refuses_mixed_keys():
    from racefuzz.errors import InvalidArgument

    schedule = Schedule(device_delays={("forward", 2): 200.0}, orders=((SCHEDULE_WRITE, FORWARD_READ),))
    assert schedule.of_real_code and Schedule.from_json(json.loads(json.dumps(schedule.to_json()))) == schedule
    assert schedule.to_json()["device_delays"] == {"forward/2": 200.0}
    with pytest.raises(InvalidArgument, match="not both"):
        Schedule(device_delays={3: 1.0}, orders=((SCHEDULE_WRITE, FORWARD_READ),))
    with pytest.raises(InvalidArgument, match="device_delays and orders only"):
        Schedule(read_spins={("forward", 0): 1.0})
    with pytest.raises(InvalidArgument, match="one stream"):
        Schedule(orders=((("forward", 0), ("forward", 1)),))
