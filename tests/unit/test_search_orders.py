"""Searching forced orders: the control caught by a gate with no delay, reported and drawn as an order."""

from __future__ import annotations

from racefuzz.backends import executor
from racefuzz.designs import load_design
from racefuzz.report import primary_race, render
from racefuzz.scenarios.sglang import HAZARDS
from racefuzz.search import judge, search
from racefuzz.timeline import chrome_trace


def test_the_control_is_caught_by_one_forced_order_and_reported_as_one() -> None:
    design = load_design("none")
    sim = executor("sim")
    result = search(design, sim, examples=300, seed=0, strategy="orders")
    c = result.counterexample
    assert result.found and c is not None and c.corruptions
    assert c.schedule.nonzero_delays == 0
    inverted = [(a, b) for a, b in c.schedule.orders if a > b]
    assert len(inverted) == 1, "shrunk to one forced order against issue order"
    first, then = inverted[0]
    text = render(c, design="none", backend="sim", replay_path=None, scenario=design.scenario)
    assert f"forced: op #{first} {c.program.ops[first].kernel}" in text
    assert f"finished before op #{then} {c.program.ops[then].kernel}" in text
    gates = [e for e in chrome_trace(c.execution, primary_race(c), "t")["traceEvents"] if e.get("cat") == "gate"]
    assert [g["args"]["op"] for g in gates] == [then]
    # Deterministic: the same example corrupts the same cells on every run.
    again = [judge(c.workload, design, c.schedule, sim).corruptions for _ in range(3)]
    assert all([x.cells for x in run] == [x.cells for x in c.corruptions] for run in again)


def test_forced_orders_never_flag_a_clean_design() -> None:
    # `war-after-launch` fences every hazard: no race, so neither strategy may find a corruption; the
    # control `none` is caught on the same hazards in the same test.
    sim = executor("sim")
    for strategy in ("orders", "interleave"):
        clean = search(load_design("war-after-launch"), sim, examples=400, seed=3, strategy=strategy, hazards=HAZARDS)
        control = search(load_design("none"), sim, examples=400, seed=3, strategy=strategy, hazards=HAZARDS)
        assert not clean.found and clean.examples == 400
        assert control.found and control.counterexample.corruptions


def test_a_forced_order_counterexample_replays_from_its_file(tmp_path) -> None:
    import json

    from racefuzz import __version__
    from racefuzz.cli import main
    from racefuzz.report import ReplayFile

    result = search(load_design("none"), executor("sim"), examples=300, seed=0, strategy="orders")
    c = result.counterexample
    assert c is not None
    replay = ReplayFile("none", "sim", 0, c.workload, c.schedule, c.oracle, __version__, load_design("none").scenario)
    path = tmp_path / "case.json"
    path.write_text(json.dumps(replay.to_json()))
    assert ReplayFile.from_json(json.loads(path.read_text()), str(path)).schedule.orders == c.schedule.orders
    assert main(["replay", str(path), "--backend", "sim", "--repeat", "3"]) == 1  # the race, 3 of 3
