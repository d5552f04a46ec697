"""Why a search stopped (`StopReason`) and what each of its phases cost (`PhaseStatistics`), after
Hypothesis's `ExitReason` and its phase statistics; `PhaseClock` counts them. One mechanism for the
model's search (`racefuzz.search`: `SEARCH_PHASES`) and the trace's (`racefuzz.trace.search`:
`TRACE_PHASES`).

A leaf: plain data and a clock, importing nothing of racefuzz, so that the trace (which may not import
the search) shares it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum


class StopReason(Enum):
    """Why a search stopped."""

    FOUND = "found"
    """A counterexample: a corruption (for real code, a divergence) that manifested, or an unordered pair."""
    EXAMPLES = "examples"
    """Every example of the budget ran, and none failed."""
    EXHAUSTED = "exhausted"
    """Hypothesis stopped drawing before the budget was spent (a space with fewer distinct examples than
    asked -- few launch points, say -- or too many invalid draws)."""
    INTERRUPTED = "interrupted"
    """Ctrl-C, SIGTERM or the per-example watchdog stopped it (`racefuzz.watchdog`)."""
    SKIPPED = "skipped"
    """The search did not run (real code on the CPU, or `--examples 0`: happens-before only)."""


SEARCH_PHASES = ("replay", "generate", "shrink", "minimize")
"""The model's search, in order: `replay` (the failures saved by earlier runs, `racefuzz.search.corpus`),
`generate` (Hypothesis drawing examples, until the first failure), `shrink` (Hypothesis shrinking it, or
shrinking a batch's failing member alone), `minimize` (the structural minimizer, the final k-of-k re-check,
the GPU's headroom: `racefuzz.search.finish`)."""

TRACE_PHASES = ("reference", "replay", "generate", "shrink", "confirm")
"""The trace's, in order: `reference` (the serialized reference run and the serialized runs that learn what
varies without a schedule), `replay` (saved failing delay sets), `generate` (Hypothesis drawing
schedules, until the first divergence), `shrink` (Hypothesis shrinking it), `confirm` (its k re-runs)."""


@dataclass(frozen=True)
class PhaseStatistics:
    """One phase of a search: `runs` runs (of a program by the backend, or of the user's step) in `seconds`
    of wall time."""

    phase: str
    runs: int
    seconds: float

    def __str__(self) -> str:
        return f"{self.phase} {self.runs} run(s) {self.seconds:.2f} s"


class PhaseClock:
    """The phase now running, and the runs and wall time counted in each phase so far."""

    def __init__(self, phases: Sequence[str]) -> None:
        self.names = tuple(phases)
        self.phase = self.names[0]
        self.started = time.perf_counter()
        self.runs = dict.fromkeys(self.names, 0)
        self.seconds = dict.fromkeys(self.names, 0.0)

    def enter(self, phase: str) -> None:
        """End the phase now running (its time is counted) and start `phase`."""
        if phase not in self.runs:
            raise ValueError(f"no phase {phase!r} among {', '.join(self.names)}")
        now = time.perf_counter()
        self.seconds[self.phase] += now - self.started
        self.phase, self.started = phase, now

    def count_run(self, runs: int = 1) -> None:
        """`runs` more runs in the phase now running."""
        self.runs[self.phase] += runs

    def statistics(self) -> tuple[PhaseStatistics, ...]:
        """Every phase's figures, in order, the one now running counted up to now."""
        self.enter(self.phase)
        return tuple(PhaseStatistics(name, self.runs[name], self.seconds[name]) for name in self.names)


def stop_line(reason: StopReason, phases: Sequence[PhaseStatistics], examples: int, budget: int) -> str:
    """`stopped: <why>; phases: <each phase that ran>`, for a search that ran `examples` of `budget`."""
    why = {
        StopReason.FOUND: "found a counterexample",
        StopReason.EXAMPLES: f"all {examples} examples ran",
        StopReason.EXHAUSTED: f"Hypothesis drew no more after {examples} of {budget} examples",
        StopReason.INTERRUPTED: f"interrupted after {examples} examples",
        StopReason.SKIPPED: "the search did not run",
    }[reason]
    ran = ", ".join(str(phase) for phase in phases if phase.runs or phase.seconds >= 0.005)
    return f"stopped: {why}; phases: {ran or 'none ran'}"
