"""Structural minimization keeps the failure and removes what it does not need."""

from __future__ import annotations

from racefuzz import Schedule, find_corruptions, find_races, simulate
from racefuzz.designs import load_design
from racefuzz.scenarios.sglang import RequestSpec, Workload, build_program
from racefuzz.search.minimize import minimize, transfer

GLOBAL_WAR = load_design("global-war")
# A post-launch-rewrite race buried in extra requests and iterations.
BIG = Workload(
    requests=(
        RequestSpec(0, 4, 64, (1, 1, 1), rewrite_at=(0,)),
        RequestSpec(2, 7, 64, (2, 3, 1, 4), rewrite_at=()),
        RequestSpec(2, 3, 64, (1, 1)),
    ),
    iterations=8,
    rows=3,
)


def _reader_spin(workload: Workload, us: float) -> Schedule:
    program = build_program(workload, GLOBAL_WAR.hooks)
    (race, *_) = find_races(program)
    return Schedule(read_spins={race.first.index: us}, host_delays={0: 300.0})


def test_manifested_counterexample_shrinks_to_one_request_and_one_delay() -> None:
    schedule = _reader_spin(BIG, 3000.0)
    program = build_program(BIG, GLOBAL_WAR.hooks)
    assert find_corruptions(program, simulate(program, schedule).observations), "the start must fail"
    workload, small = minimize(BIG, schedule, GLOBAL_WAR, simulate)
    assert len(workload.requests) == 1 and workload.iterations <= 3
    assert small.nonzero_delays == 1 and max(small.read_spins.values()) < 3000.0
    program = build_program(workload, GLOBAL_WAR.hooks)
    assert find_corruptions(program, simulate(program, small).observations), "the minimum still fails"


def test_unordered_counterexample_shrinks_without_a_schedule() -> None:
    workload, schedule = minimize(BIG, Schedule(), GLOBAL_WAR, None)
    assert schedule.nonzero_delays == 0 and len(workload.requests) == 1
    assert find_races(build_program(workload, GLOBAL_WAR.hooks))


def test_transfer_follows_launches_by_identity() -> None:
    old = build_program(BIG, GLOBAL_WAR.hooks)
    smaller = Workload(requests=BIG.requests[:1], iterations=8, rows=1)
    new = build_program(smaller, GLOBAL_WAR.hooks)
    reader = next(op for op in old.launches if op.kernel == "verify_page_table" and op.info["iteration"] == 3)
    gone = next(op for op in old.launches if op.info["iteration"] == 7)
    moved = transfer(Schedule(read_spins={reader.index: 100.0, gone.index: 50.0}), old, new)
    (index,) = moved.read_spins
    target = new.ops[index]
    assert (target.kernel, target.info["iteration"]) == ("verify_page_table", 3)


def test_a_war_is_re_aimed_with_a_read_spin_inside_its_reader() -> None:
    # On global-war, seed 5, the failure Hypothesis shrinks still has extra requests and iterations; the
    # minimizer's simpler workloads move the race to other launches, so it re-aims the delay: a WAR's
    # read spin goes inside the reader (`race.first`), which stretches the reader's window until the
    # rewrite lands. A spin inside the writer delays the rewrite instead, and no smaller workload fails.
    from racefuzz.backends import executor
    from racefuzz.search import search

    counterexample = search(GLOBAL_WAR, executor("sim"), seed=5).counterexample
    assert counterexample is not None and counterexample.oracle == "corruption"
    workload, schedule = counterexample.workload, counterexample.schedule
    assert (len(workload.requests), workload.iterations) == (1, 2)
    (spun,) = schedule.read_spins
    readers = {race.first.index for race in find_races(counterexample.program) if race.kind.value == "WAR"}
    assert spun in readers, "the read spin is inside a WAR's reader"
