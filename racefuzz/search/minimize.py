"""Structural minimization of a counterexample, after Hypothesis has shrunk it.

Hypothesis shrinks the byte strings that workloads and schedules are decoded from; it does not know that
7 bytes are a request or that one header byte is the iteration count, so it can stop at, say, two
requests over six iterations when one request over three would fail the same way. This pass knows the
structure. It greedily tries simpler candidates -- fewer forced orders, fewer delays, shorter delays, fewer
iterations, fewer requests, simpler requests -- and keeps a candidate only if it still fails the same
oracle (a manifested corruption in every one of `repeat` runs, `racefuzz.confirm`'s k of k, or an
unordered pair), until none is accepted.

The workload candidates come from the scenario (`Scenario.simpler_workloads`); the schedule candidates
(drop a delay, halve one) are generic. Delays are keyed by op index, which changes when the workload
changes; a delay follows its launch by the scenario's `launch_identity` (for the overlap loop: stream,
kernel, iteration) and is dropped when that launch no longer exists; a forced order follows both its
launches the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from dataclasses import replace

from racefuzz.backends import Executor
from racefuzz.confirm import confirm
from racefuzz.designs import Design
from racefuzz.errors import InvalidArgument
from racefuzz.hb import RaceKind, find_races
from racefuzz.oracle import find_corruptions
from racefuzz.program import Launch, Program
from racefuzz.scenarios import Workload
from racefuzz.schedule import Schedule, ScheduleInfeasible

MIN_DELAY_US = 20.0
MAX_RETARGETS = 3


def transfer(
    schedule: Schedule, old: Program, new: Program, identity: Callable[[Launch], Hashable] | None = None
) -> Schedule:
    """`schedule`'s delays moved from `old`'s launches to the same launches of `new`, where they exist.

    `identity` says which launches are the same (default: the default scenario's `launch_identity`)."""
    if identity is None:
        from racefuzz.scenarios import get_scenario

        identity = get_scenario().launch_identity
    where = {identity(op): op.index for op in new.launches}

    def move(delays) -> dict[int, float]:
        moved = {}
        for index, us in delays.items():
            op = old.ops[index]
            if isinstance(op, Launch) and identity(op) in where:
                moved[where[identity(op)]] = us
        return moved

    orders = []
    for first, then in schedule.orders:
        a, b = old.ops[first], old.ops[then]
        if isinstance(a, Launch) and isinstance(b, Launch) and identity(a) in where and identity(b) in where:
            moved = (where[identity(a)], where[identity(b)])
            if new.ops[moved[0]].stream != new.ops[moved[1]].stream:  # type: ignore[union-attr]
                orders.append(moved)
    return Schedule(move(schedule.device_delays), move(schedule.read_spins), move(schedule.host_delays), tuple(orders))


def _retargeted(
    schedule: Schedule, old: Program, new: Program, timed: bool, identity: Callable[[Launch], Hashable]
) -> Iterator[Schedule]:
    """Schedules to try on a simplified workload's program: the old delays where their launches still
    exist, then -- because simplifying the workload can move the race to other launches -- one delay as
    long as the longest old one aimed at each of the new program's first races: a read spin inside the
    reader of a WAR, a spin before the writer of a RAW or WAW."""
    yield transfer(schedule, old, new, identity)
    if not timed:
        return
    if schedule.orders and not schedule.nonzero_delays:
        # Forced orders alone: aim one at each of the new program's first races, in its racing order.
        for race in find_races(new)[:MAX_RETARGETS]:
            yield Schedule(orders=((race.second.index, race.first.index),))
        return
    delays = [*schedule.device_delays.values(), *schedule.read_spins.values(), *schedule.host_delays.values()]
    if not delays:  # it corrupted with no injected delay (possible on a GPU): nothing to re-aim
        return
    longest = max(delays)
    for race in find_races(new)[:MAX_RETARGETS]:
        if race.kind is RaceKind.WAR:
            yield Schedule(read_spins={race.first.index: longest})
        else:
            yield Schedule(device_delays={race.first.index: longest})


def _schedule_candidates(schedule: Schedule, floor_us: float) -> Iterator[Schedule]:
    for order in schedule.orders:
        yield replace(schedule, orders=tuple(o for o in schedule.orders if o != order))
    parts = ("device_delays", "read_spins", "host_delays")
    for part in parts:
        for index in getattr(schedule, part):
            yield replace(schedule, **{part: {k: v for k, v in getattr(schedule, part).items() if k != index}})
    for part in parts:
        for index, us in getattr(schedule, part).items():
            if us > floor_us:
                shorter = max(floor_us, round(us / 2 / MIN_DELAY_US) * MIN_DELAY_US)
                yield replace(schedule, **{part: {**getattr(schedule, part), index: shorter}})


def minimize(
    workload: Workload,
    schedule: Schedule,
    design: Design,
    run: Executor | None,
    *,
    repeat: int = 1,
    budget: int = 400,
    min_delay_us: float = MIN_DELAY_US,
) -> tuple[Workload, Schedule]:
    """The simplest (workload, schedule) found that still fails like the given one.

    With `run`, failing means a manifested corruption in all `repeat` runs; without it, an unordered
    conflicting pair or a scenario invariant violation (the schedule is then irrelevant and is dropped).
    Delays are never shortened below `min_delay_us`.
    At most `budget` candidates run.
    """
    scenario = design.scenario
    tries = 0

    def fails(candidate: Workload, delays: Schedule) -> bool:
        nonlocal tries
        tries += 1
        try:
            program = scenario.build_program(candidate, design.hooks)
            delays.check_against(program)
        except InvalidArgument:
            return False
        if run is None:
            return bool(program.violations or find_races(program))
        try:
            return confirm(
                lambda: bool(find_corruptions(program, run(program, delays).observations)), repeat, stop_at_miss=True
            ).confirmed
        except ScheduleInfeasible:  # forced orders that cannot hold on this candidate: not a failure
            return False

    if run is None:
        schedule = Schedule()
    program = scenario.build_program(workload, design.hooks)
    improved = True
    while improved and tries < budget:
        improved = False
        for candidate in _schedule_candidates(schedule, min_delay_us) if run is not None else ():
            if tries >= budget:
                break
            if fails(workload, candidate):
                schedule, improved = candidate, True
                break
        if improved:
            continue
        for candidate in scenario.simpler_workloads(workload):
            if tries >= budget:
                break
            new_program = scenario.build_program(candidate, design.hooks)
            for delays in _retargeted(schedule, program, new_program, run is not None, scenario.launch_identity):
                if fails(candidate, delays):
                    workload, schedule, program, improved = candidate, delays, new_program, True
                    break
            if improved:
                break
    return workload, schedule
