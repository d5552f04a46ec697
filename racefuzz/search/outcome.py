"""Judging one example: `judge`, `reproduces` (the k-of-k re-check), `explain` (a counterexample completed
for its report). What they produce, `Outcome`, `Flaky` and `SearchResult`, is plain data in `racefuzz.results`.

`judge` is the verdict of one example: build the program of a workload under a design (through the
design's scenario), run it under a schedule, and check both oracles -- manifested corruption (every load
equals the sequential reference, `racefuzz.oracle`) and happens-before (no conflicting pair unordered,
`racefuzz.hb`, timing-independent).
"""

from __future__ import annotations

from racefuzz.backends import Executor
from racefuzz.confirm import confirm
from racefuzz.designs import Design
from racefuzz.hb import find_races
from racefuzz.oracle import find_corruptions
from racefuzz.results import Outcome
from racefuzz.scenarios import Workload
from racefuzz.schedule import NO_DELAYS, Schedule


def judge(workload: Workload, design: Design, schedule: Schedule | None, run: Executor | None) -> Outcome:
    """Build the program of `workload` under `design`, run it under `schedule` (if `run`), check both oracles."""
    program = design.scenario.build_program(workload, design.hooks)
    races = find_races(program)
    if run is None or schedule is None:
        return Outcome(workload, schedule or NO_DELAYS, program, None, [], races)
    execution = run(program, schedule)
    corruptions = find_corruptions(program, execution.observations, execution.writers)
    return Outcome(workload, schedule, program, execution, corruptions, races)


def reproduces(outcome: Outcome, run: Executor, repeat: int) -> bool:
    """Whether `outcome`'s corruption shows again in each of `repeat` fresh runs (`racefuzz.confirm`: k of k;
    it stops at the first fresh run that does not show it)."""

    def corrupts() -> bool:
        return bool(find_corruptions(outcome.program, run(outcome.program, outcome.schedule).observations))

    return bool(outcome.corruptions) and confirm(corrupts, repeat, stop_at_miss=True).confirmed


def explain(outcome: Outcome, backend: str) -> Outcome:
    """Complete a counterexample for its report: its races, and on the simulator who stored each bad value."""
    races = find_races(outcome.program)
    if backend != "sim":
        return Outcome(
            outcome.workload, outcome.schedule, outcome.program, outcome.execution, outcome.corruptions, races
        )
    from racefuzz.sim import simulate

    execution = simulate(outcome.program, outcome.schedule, track_writers=True)
    corruptions = find_corruptions(outcome.program, execution.observations, execution.writers)
    return Outcome(outcome.workload, outcome.schedule, outcome.program, execution, corruptions, races)
