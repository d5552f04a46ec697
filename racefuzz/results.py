"""What a search produces: one judged example (`Outcome`), a flaky one (`Flaky`), the whole result
(`SearchResult`), why it stopped (`StopReason`) and what each of its phases cost (`PhaseStatistics`).

These are plain data: `racefuzz.search` makes them (`judge`, `search()`), and the reports, the timeline,
the assertions and the benchmarks read them without importing the search that made them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from racefuzz.designs import Design
from racefuzz.execution import Execution
from racefuzz.hb import Race
from racefuzz.oracle import Corruption
from racefuzz.program import Program
from racefuzz.scenarios import Workload
from racefuzz.schedule import Schedule


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


class StopReason(Enum):
    """Why a search stopped (after Hypothesis's `ExitReason`)."""

    FOUND = "found"
    """A counterexample: a corruption manifested k of k, or an unordered conflicting pair."""
    EXAMPLES = "examples"
    """Every example of the budget ran, and none failed."""
    EXHAUSTED = "exhausted"
    """Hypothesis stopped drawing before the budget was spent (a space with fewer distinct examples, or too
    many invalid draws)."""
    INTERRUPTED = "interrupted"
    """Ctrl-C, SIGTERM or the per-example watchdog stopped it (`racefuzz.watchdog`)."""


PHASES = ("replay", "generate", "shrink", "minimize")
"""A search's phases, in order: `replay` (the failures saved by earlier runs, `racefuzz.search.corpus`),
`generate` (Hypothesis drawing examples, until the first failure), `shrink` (Hypothesis shrinking it, or
shrinking a batch's failing member alone), `minimize` (the structural minimizer, the final k-of-k re-check,
the GPU's headroom: `racefuzz.search.finish`)."""


@dataclass(frozen=True)
class PhaseStatistics:
    """One phase of a search: `runs` executions of a program by the backend (k-of-k re-runs included) in
    `seconds` of wall time."""

    phase: str
    runs: int
    seconds: float

    def __str__(self) -> str:
        return f"{self.phase} {self.runs} run(s) {self.seconds:.2f} s"


@dataclass
class SearchResult:
    """What a search found. `counterexample` is minimal (shrunk) when present.

    `first_manifested_example/seconds` are kept apart from `first_detection_*` (any oracle), because only
    the manifested oracle depends on the schedule: they are what tells delay strategies apart.
    `replayed` counts the examples of the example database tried before the search drew any; `infeasible`
    the runs whose forced orders could not be realized (a GPU gate timed out): skipped, never judged.
    `stop_reason` says why it stopped; `phases` what each phase of `PHASES` cost, in that order; `budget` the
    examples asked for.
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
    stop_reason: StopReason = StopReason.EXAMPLES
    phases: tuple[PhaseStatistics, ...] = ()
    budget: int = 0

    @property
    def found(self) -> bool:
        return self.counterexample is not None

    def statistics_line(self) -> str:
        """`stopped: ...; phases: ...`: why the search stopped and what each phase that ran cost."""
        why = {
            StopReason.FOUND: "found a counterexample",
            StopReason.EXAMPLES: f"all {self.examples} examples ran",
            StopReason.EXHAUSTED: f"Hypothesis drew no more after {self.examples} of {self.budget} examples",
            StopReason.INTERRUPTED: f"interrupted after {self.examples} examples",
        }[self.stop_reason]
        ran = ", ".join(str(phase) for phase in self.phases if phase.runs or phase.seconds >= 0.005)
        return f"stopped: {why}; phases: {ran or 'none ran'}"
