"""What one run of a program returns (`Execution`, made of `Span`s), whichever backend ran it.

The simulator (`racefuzz.sim.simulate`) and the CUDA backend (`racefuzz.backends.cuda`) return the same
shape, so the oracles, the search and the reports never care which one ran. Part of the pure core: the
simulator builds it, so it lives below `racefuzz.backends` (which re-exports it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from racefuzz.memory import Observations

HOST = "host"
"""The track name of host-side spans in a timeline."""


class Span(NamedTuple):
    """One interval of a timeline: op `op_index` (or the spin before it) on `track`, [start_us, end_us)."""

    op_index: int
    track: str
    kind: str
    start_us: float
    end_us: float
    label: str


@dataclass
class Execution:
    """The outcome of one run: what each reading launch loaded, and when everything happened.

    `writers` (launch index -> which launch stored each loaded cell) is filled when asked for, to name
    the writer that clobbered a read.
    """

    observations: Observations
    timeline: list[Span]
    host_end_us: float
    writers: Observations | None = None
    access_time_us: dict[int, float] = field(default_factory=dict)
