"""Structural minimization of a counterexample, after Hypothesis has shrunk it.

Hypothesis shrinks the byte strings that workloads and schedules are decoded from; it does not know that
7 bytes are a request or that one header byte is the iteration count, so it can stop at, say, two
requests over six iterations when one request over three would fail the same way. This pass knows the
structure. It greedily tries simpler candidates -- fewer delays, shorter delays, fewer iterations, fewer
requests, simpler requests -- and keeps a candidate only if it still fails the same oracle (a manifested
corruption in every one of `repeat` runs, or an unordered pair), until none is accepted.

Delays are keyed by op index, which changes when the workload changes; a delay follows its launch by
identity (stream, kernel, iteration), which is unique per iteration in the overlap loop, and is dropped
when that launch no longer exists.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace

from racefuzz.designs import Design
from racefuzz.errors import InvalidArgument
from racefuzz.hb import find_races
from racefuzz.oracle import find_corruptions
from racefuzz.program import Launch, Program
from racefuzz.scenarios.sglang import build_program
from racefuzz.scenarios.workload import RequestSpec, Workload
from racefuzz.schedule import Schedule
from racefuzz.sim import Execution

Executor = Callable[[Program, Schedule], Execution]
MIN_DELAY_US = 20.0
MAX_RETARGETS = 3


def _identity(launch: Launch) -> tuple[str, str, object]:
    return (launch.stream.name, launch.kernel, launch.info.get("iteration"))


def transfer(schedule: Schedule, old: Program, new: Program) -> Schedule:
    """`schedule`'s delays moved from `old`'s launches to the same launches of `new`, where they exist."""
    where = {_identity(op): op.index for op in new.launches}

    def move(delays) -> dict[int, float]:
        moved = {}
        for index, us in delays.items():
            op = old.ops[index]
            if isinstance(op, Launch) and _identity(op) in where:
                moved[where[_identity(op)]] = us
        return moved

    return Schedule(move(schedule.device_delays), move(schedule.read_spins), move(schedule.host_delays))


def _retargeted(schedule: Schedule, old: Program, new: Program, timed: bool) -> Iterator[Schedule]:
    """Schedules to try on a simplified workload's program: the old delays where their launches still
    exist, then -- because simplifying the workload can move the race to other launches -- one delay as
    long as the longest old one aimed at each of the new program's first races: a read spin inside the
    reader of a WAR, a spin before the writer of a RAW or WAW."""
    yield transfer(schedule, old, new)
    if not timed:
        return
    delays = [*schedule.device_delays.values(), *schedule.read_spins.values(), *schedule.host_delays.values()]
    if not delays:  # it corrupted with no injected delay (possible on a GPU): nothing to re-aim
        return
    longest = max(delays)
    for race in find_races(new)[:MAX_RETARGETS]:
        if race.kind.value == "WAR":
            yield Schedule(read_spins={race.first.index: longest})
        else:
            yield Schedule(device_delays={race.first.index: longest})


def _schedule_candidates(schedule: Schedule, floor_us: float) -> Iterator[Schedule]:
    parts = ("device_delays", "read_spins", "host_delays")
    for part in parts:
        for index in getattr(schedule, part):
            yield replace(schedule, **{part: {k: v for k, v in getattr(schedule, part).items() if k != index}})
    for part in parts:
        for index, us in getattr(schedule, part).items():
            if us > floor_us:
                shorter = max(floor_us, round(us / 2 / MIN_DELAY_US) * MIN_DELAY_US)
                yield replace(schedule, **{part: {**getattr(schedule, part), index: shorter}})


def _request_candidates(r: RequestSpec) -> Iterator[RequestSpec]:
    if r.arrival:
        yield replace(r, arrival=0)
    if r.accepts:  # down to none: a request that finishes at its prefill (max_new_tokens=1)
        yield replace(r, accepts=r.accepts[:-1], rewrite_at=tuple(s for s in r.rewrite_at if s < len(r.accepts) - 1))
    if any(a > 1 for a in r.accepts):
        yield replace(r, accepts=tuple(1 for _ in r.accepts))
    for step in r.rewrite_at:
        yield replace(r, rewrite_at=tuple(s for s in r.rewrite_at if s != step))
    if r.prompt_len > 1:
        yield replace(r, prompt_len=max(1, r.prompt_len // 2))
        yield replace(r, prompt_len=r.prompt_len - 1)
    if r.chunk < r.prompt_len:
        yield replace(r, chunk=64)


def _workload_candidates(w: Workload) -> Iterator[Workload]:
    for iterations in range(1, w.iterations):
        yield replace(w, iterations=iterations)
    for i in range(len(w.requests)):
        if len(w.requests) > 1:
            rest = w.requests[:i] + w.requests[i + 1 :]
            yield replace(w, requests=rest, rows=min(w.rows, len(rest)))
    if w.plan_stream:
        yield replace(w, plan_stream=False)
    if w.page_size > 1:
        yield replace(w, page_size=1)
    if w.rows > 1:
        yield replace(w, rows=w.rows - 1)
    for i, r in enumerate(w.requests):
        for simpler in _request_candidates(r):
            yield replace(w, requests=(*w.requests[:i], simpler, *w.requests[i + 1 :]))
    if w.block_size > 1 and all(a < w.block_size for r in w.requests for a in r.accepts):
        yield replace(w, block_size=w.block_size - 1)


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
    tries = [0]

    def fails(candidate: Workload, delays: Schedule) -> bool:
        tries[0] += 1
        try:
            program = build_program(candidate, design.hooks)
            delays.check_against(program)
        except InvalidArgument:
            return False
        if run is None:
            return bool(program.violations or find_races(program))
        return all(bool(find_corruptions(program, run(program, delays).observations)) for _ in range(repeat))

    if run is None:
        schedule = Schedule()
    program = build_program(workload, design.hooks)
    improved = True
    while improved and tries[0] < budget:
        improved = False
        for candidate in _schedule_candidates(schedule, min_delay_us) if run is not None else ():
            if tries[0] >= budget:
                break
            if fails(workload, candidate):
                schedule, improved = candidate, True
                break
        if improved:
            continue
        for candidate in _workload_candidates(workload):
            if tries[0] >= budget:
                break
            new_program = build_program(candidate, design.hooks)
            for delays in _retargeted(schedule, program, new_program, run is not None):
                if fails(candidate, delays):
                    workload, schedule, program, improved = candidate, delays, new_program, True
                    break
            if improved:
                break
    return workload, schedule
