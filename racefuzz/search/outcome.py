"""What a search produces: one judged example (`Outcome`), a flaky one (`Flaky`), the whole result.

`judge` is the verdict of one example: build the program of a workload under a design (through the
design's scenario), run it under a schedule, and check both oracles -- manifested corruption (every load
equals the sequential reference, `racefuzz.oracle`) and happens-before (no conflicting pair unordered,
`racefuzz.hb`, timing-independent).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from racefuzz.backends import Execution, Executor
from racefuzz.designs import Design
from racefuzz.hb import Race, find_races
from racefuzz.oracle import Corruption, find_corruptions
from racefuzz.program import Program
from racefuzz.scenarios import Workload
from racefuzz.schedule import NO_DELAYS, Schedule


@dataclass
class Outcome:
    """One example judged by both oracles."""

    workload: Workload
    schedule: Schedule
    program: Program
    execution: Execution | None
    corruptions: list[Corruption]
    races: list[Race]

    @property
    def violations(self) -> tuple[str, ...]:
        return self.program.violations

    @property
    def oracle(self) -> str | None:
        """Which oracle flagged it, strongest first: `corruption` (manifested), `happens-before` (an
        unordered conflicting pair), `allocation` (a scenario invariant, see `Program.violations`), or None."""
        if self.corruptions:
            return "corruption"
        if self.races:
            return "happens-before"
        if self.violations:
            return "allocation"
        return None


@dataclass(frozen=True)
class Flaky:
    """An example whose loads differed in only `reproduced` of `runs` runs (GPU timing): not a verdict."""

    workload: Workload
    schedule: Schedule
    reproduced: int
    runs: int


@dataclass
class SearchResult:
    """What a search found. `counterexample` is minimal (shrunk) when present.

    `first_manifested_example/seconds` are kept apart from `first_detection_*` (any oracle), because only
    the manifested oracle depends on the schedule: they are what tells delay strategies apart.
    `replayed` counts the examples of the example database tried before the search drew any; `infeasible`
    the runs whose forced orders could not be realized (a GPU gate timed out): skipped, never judged.
    """

    design: Design
    backend: str
    examples: int
    seconds: float
    counterexample: Outcome | None
    first_detection_example: int | None = None
    first_detection_seconds: float | None = None
    manifested_examples: int = 0
    racy_examples: int = 0
    flaky: list[Flaky] = field(default_factory=list)
    repeat: int = 1
    strategy: str = "random"
    first_manifested_example: int | None = None
    first_manifested_seconds: float | None = None
    replayed: int = 0
    infeasible: int = 0

    @property
    def found(self) -> bool:
        return self.counterexample is not None


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
    """Whether `outcome`'s corruption shows again in each of `repeat` fresh runs."""
    return bool(outcome.corruptions) and all(
        bool(find_corruptions(outcome.program, run(outcome.program, outcome.schedule).observations))
        for _ in range(repeat)
    )


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
