"""Buffer contents, and the replay of launches' loads and stores in a given order.

Both the simulator (order = when each launch's accesses take effect on the simulated clock) and the
sequential oracle (order = host issue order) reduce to: start from each buffer's fill value, then for
each launch in order, copy out what it loads, then apply what it stores.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from racefuzz.program import Launch, Program, per_program

Observations = dict[int, tuple[np.ndarray, ...]]
"""Launch index -> what it loaded, one array per entry of `launch.reads`, shaped like that range."""

INITIAL = -1
"""The writer index recorded for a cell no launch has written yet."""


@dataclass
class Replay:
    """What the loads saw: values always, and which launch last stored each loaded cell when tracked."""

    observations: Observations
    writers: Observations | None


def replay_in_order(program: Program, order: Iterable[Launch], *, track_writers: bool = False) -> Replay:
    """Apply each launch of `order` (loads first, then stores) to fresh buffers and collect the loads."""
    cells = {b.id: np.full((b.rows, b.cols), b.fill, dtype=np.int32) for b in program.buffers}
    writer = (
        {b.id: np.full((b.rows, b.cols), INITIAL, dtype=np.int32) for b in program.buffers} if track_writers else None
    )
    observations: Observations = {}
    writers: Observations = {}
    for launch in order:
        reads = launch.reads
        if reads:
            observations[launch.index] = tuple(
                [cells[r.buffer.id][r.row0 : r.row1, r.col0 : r.col1].copy() for r in reads]
            )
            if writer is not None:
                writers[launch.index] = tuple(
                    [writer[r.buffer.id][r.row0 : r.row1, r.col0 : r.col1].copy() for r in reads]
                )
        for w, values in zip(launch.writes, launch.values, strict=False):
            cells[w.buffer.id][w.row0 : w.row1, w.col0 : w.col1] = values
            if writer is not None:
                writer[w.buffer.id][w.row0 : w.row1, w.col0 : w.col1] = launch.index
    return Replay(observations, writers if track_writers else None)


@per_program
def in_order_loads(program: Program) -> Observations:
    """What every reading launch loads when `program` runs in host issue order: the sequential reference.

    Kept for the last PROGRAMS_KEPT programs, and the same object every time for one program, so that the
    simulator can return it for a run that applied every conflict in issue order and the search can tell
    such a run by identity (`observed is expected`) without comparing arrays. Read-only: do not mutate it.
    """
    return replay_in_order(program, program.launches).observations
