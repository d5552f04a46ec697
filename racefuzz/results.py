"""What a search produces: one judged example (`Outcome`), a flaky one (`Flaky`), the whole result
(`SearchResult`, with why it stopped and what each phase cost: `racefuzz.phases`).

These are plain data: `racefuzz.search` makes them (`judge`, `search()`), and the reports, the timeline,
the assertions and the benchmarks read them without importing the search that made them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from racefuzz.designs import Design
from racefuzz.execution import Execution
from racefuzz.hb import Race
from racefuzz.oracle import Corruption
from racefuzz.phases import PhaseStatistics, StopReason, stop_line
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


@dataclass
class SearchResult:
    """What a search found. `counterexample` is minimal (shrunk) when present.

    `first_manifested_example/seconds` are kept apart from `first_detection_*` (any oracle), because only
    the manifested oracle depends on the schedule: they are what tells delay strategies apart.
    `replayed` counts the examples of the example database tried before the search drew any; `infeasible`
    the runs whose forced orders could not be realized (a GPU gate timed out): skipped, never judged.
    `stop_reason` says why it stopped; `phases` what each phase of `SEARCH_PHASES` cost, in that order; `budget` the
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
        return stop_line(self.stop_reason, self.phases, self.examples, self.budget)
