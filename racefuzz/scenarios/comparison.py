"""What the scenarios' `racefuzz compare` share, one mechanism each: a design's verdict counts over the
drawn workloads (a happens-before race, a corruption under the drawn delays, the races by kind), the host
time blocked summed by what it waited for, the report lines of both, and the JSON file.

Each scenario keeps its own workloads, costs, extra counts and table (`scenarios/sglang/compare.py`,
`scenarios/vllm/compare.py`). Part of the core: it imports nothing above it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from racefuzz.execution import Execution
from racefuzz.hb import Race
from racefuzz.oracle import find_corruptions
from racefuzz.program import Program


class BlockedCosts(Protocol):
    """A scenario's per-run costs: the host's blocked time by what it waited for."""

    blocked_on: dict[str, float]


def race_key(race: Race) -> str:
    """A race by its kind and its two launches' kernels and streams (the report's `race_kinds`)."""
    return f"{race.kind} {race.first.kernel} ({race.first.stream}) -> {race.second.kernel} ({race.second.stream})"


def new_row(*counts: str) -> dict[str, Any]:
    """One design's tally: `unordered`, the scenario's own `counts`, `corrupted` (workloads), `race_kinds`
    and the runs' `costs` (which the scenario's summary pops)."""
    return {**dict.fromkeys(("unordered", *counts, "corrupted"), 0), "race_kinds": {}, "costs": []}


def tally(row: dict[str, Any], program: Program, races: list[Race], delayed: Execution) -> None:
    """Count one workload's run of one design in `row`: unordered (any race), its races by kind, and
    corrupted (used loads wrong in `delayed`, the run under the drawn delays)."""
    row["unordered"] += bool(races)
    kinds = row["race_kinds"]
    for race in races:
        kinds[race_key(race)] = kinds.get(race_key(race), 0) + 1
    row["corrupted"] += bool(find_corruptions(program, delayed.observations))


def blocked_on(costs: Iterable[BlockedCosts]) -> dict[str, float]:
    """The runs' host blocked time, summed by what it waited for."""
    total: dict[str, float] = {}
    for c in costs:
        for what, us in c.blocked_on.items():
            total[what] = total.get(what, 0.0) + us
    return total


def blocked_lines(designs: dict[str, dict[str, Any]], key: str, per: str) -> list[str]:
    """Per design, what its host blocked on per `per` (an iteration, a step): `row[key]`, us by what."""
    lines = []
    for name, row in designs.items():
        parts = ", ".join(f"{what} {us:.1f} us" for what, us in row[key].items())
        lines.append(f"  {name} host blocked per {per} on: {parts or 'nothing'}")
    return lines


def race_kind_lines(designs: dict[str, dict[str, Any]], top: int = 4) -> list[str]:
    """Per design, its `top` most frequent race kinds."""
    lines = []
    for name, row in designs.items():
        for kind, count in sorted(row["race_kinds"].items(), key=lambda kv: -kv[1])[:top]:
            lines.append(f"  {name}: {kind}  ({count} races)")
    return lines


def write_json(result: dict[str, Any], path: Path | None) -> None:
    """`--json FILE`: the comparison's result (its folder made if need be)."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2) + "\n")
