"""A traced step's verdict: the happens-before races of its program, told in the trace's terms.

The recorder's program (`racefuzz.trace.builder`) is judged by the one happens-before checker
(`racefuzz.hb.find_races`), with each free's write moved to its block's possible reuse
(`racefuzz.trace.lifetime.with_reuse`): a pair whose second is a free no allocation reuses is a latent
lifetime hazard, said but not counted; the rest are races.
"""

from __future__ import annotations

from dataclasses import dataclass

from racefuzz.hb import Race, find_races
from racefuzz.program import CellRange, Launch, Program
from racefuzz.trace.builder import launch_kind, launch_text
from racefuzz.trace.lifetime import with_reuse


@dataclass(frozen=True)
class TraceRace:
    """A race of the happens-before checker, told in the trace's terms (kernels, source lines, elements).

    `first` and `second` are the recorded program's launches (by their index there); a free moved to its
    reuse is on the reuse's stream and names it in its kernel. `race` is the checker's, on the program it
    judged (the moved one: its op numbers are that program's)."""

    race: Race
    first: Launch
    second: Launch
    where: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.race.kind} {launch_text(self.first)} -> {launch_text(self.second)} on {', '.join(self.where)}"


@dataclass(frozen=True)
class TraceJudgement:
    """A trace's races, and its latent lifetime hazards: races against a free whose block no later
    allocation in the trace could reuse (`racefuzz.trace.lifetime`), said but not counted as races."""

    races: list[TraceRace]
    latent: list[TraceRace]


def described(program: Program, cells: CellRange) -> str:
    """`cells` as elements of its buffer as `program` names it last (`req_to_token[1, 4:8]`)."""
    return CellRange(program.buffers[cells.buffer.id], cells.row0, cells.row1, cells.col0, cells.col1).describe()


def judge(program: Program) -> TraceJudgement:
    """Every unordered conflicting pair of the program's launches, each free's write at its block's possible
    reuse (see the module doc)."""
    moved, origin, unreused = with_reuse(program)
    races: list[TraceRace] = []
    latent: list[TraceRace] = []
    for race in find_races(moved):
        first = race.first._replace(index=origin[race.first.index])
        second = race.second._replace(index=origin[race.second.index])
        found = TraceRace(race, first, second, tuple(described(program, c) for c in race.cells))
        is_latent = launch_kind(second) == "free" and second.index in unreused
        (latent if is_latent else races).append(found)
    return TraceJudgement(races, latent)


def trace_races(program: Program) -> list[TraceRace]:
    """The races of `judge` (latent lifetime hazards left out)."""
    return judge(program).races


def unmoved_races(program: Program) -> list[TraceRace]:
    """Every unordered conflicting pair of the program's launches with each free's write where it was
    recorded (no reuse model): what `judge` refines."""
    return [
        TraceRace(race, race.first, race.second, tuple(described(program, c) for c in race.cells))
        for race in find_races(program)
    ]
