"""Staging: a program's launches packed into kernel calls and ONE int32 host array (pure: no torch, no CuPy).

`stage` packs every call's rectangle descriptors, every write's values, the observation slots (poisoned,
so a load that never ran cannot pass for a good one) and every buffer's initial contents into one array,
which one synchronous copy puts on the device before anything is issued, with two zeroed ints per forced
order (its gate's flag and timed-out mark); `collect_observations` cuts the slots copied back into
per-launch loads, and `timed_out_gates` reads the gates' marks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from racefuzz.backends.cuda.catalog import KernelCatalog
from racefuzz.errors import InvalidArgument
from racefuzz.memory import Observations
from racefuzz.program import Program, per_program
from racefuzz.schedule import Schedule

POISON = int(np.iinfo(np.int32).min)
"""What every observation slot holds before its reader stores into it."""


ObservedAt = tuple[tuple[int, tuple[tuple[int, int, tuple[int, int]], ...]], ...]
"""Per reading launch: (its index, per read range (first slot, size, shape)); see `Staging.observed_at`."""


class StagedCall(NamedTuple):
    """One kernel call of a launch: `kernel` over `count` rectangles of buffer `buffer`.

    Its descriptors are `count` runs of five ints (row0, nrows, col0, ncols, offset) at `rects_at` in the
    staging array. A writer's `offset` indexes the staging array itself (the values follow the
    descriptors); a reader's indexes the observation slots, which start at `Staging.observed_base`.
    `spin_us` is the reader's read window (only the first read call of a launch spins: the later ones
    load right after it, inside the same window).
    """

    kernel: str
    buffer: int
    rects_at: int
    count: int
    reads: bool
    spin_us: float = 0.0


@dataclass(frozen=True)
class Staging:
    """Everything the device needs before the first op, built on the host.

    Args:
        host: int32: every call's descriptors, then every write's values (row-major), then one observation
            slot per read cell, holding `POISON` until a reader stores into it, then every buffer's initial
            contents (row-major, its `fill`). One copy to the device carries all of it; one copy of the
            slots back carries every observation.
        observed_base: where the observation slots start in `host`.
        observed_size: how many slots there are (the sum of all read ranges' sizes).
        calls: launch index -> its kernel calls, in issue order (reads first).
        observed_at: per reading launch (in issue order), its index and, per read range, where the range
            starts among the slots (counted from `observed_base`), its size and its shape.
        tables_at: buffer id -> where that buffer's cells start in `host` (after the gate slots).
        gates_at: where the gate slots start in `host`, right after the observation slots (one copy back
            carries both): two ints per forced order of the schedule, in `Schedule.orders` order -- its
            flag, then its timed-out mark -- both 0 until the run sets them.
        gate_count: how many forced orders (gates) there are.
    """

    host: np.ndarray
    observed_base: int
    observed_size: int
    calls: dict[int, tuple[StagedCall, ...]]
    observed_at: ObservedAt
    tables_at: tuple[int, ...] = ()
    gates_at: int = 0
    gate_count: int = 0

    @property
    def readback_size(self) -> int:
        """How many ints from `observed_base` a run copies back: the observation slots, then the gate slots."""
        return self.observed_size + 2 * self.gate_count


def _overlaps(a: Any, b: Any) -> bool:
    return a.row0 < b.row1 and b.row0 < a.row1 and a.col0 < b.col1 and b.col0 < a.col1


class _ProgramStaging(NamedTuple):
    """What of a `Staging` depends on the program alone: everything but the gate slots and read windows.

    `prefix` holds the descriptors, the values and the poisoned observation slots (`host[:gates_at]`);
    `tables` every buffer's initial contents, in `program.buffers` order; `calls` has every `spin_us` 0.
    """

    prefix: np.ndarray
    tables: np.ndarray
    observed_base: int
    observed_size: int
    calls: dict[int, tuple[StagedCall, ...]]
    observed_at: ObservedAt
    table_offsets: tuple[int, ...]


def stage(program: Program, schedule: Schedule, catalog: KernelCatalog) -> Staging:
    """Pack `program`'s launches into kernel calls and one int32 array (see `Staging`).

    It runs once per example, so the packing, which depends on the program alone, is done once per program
    (a search runs most programs several times, under different schedules) and the schedule's part --
    the gate slots and the read windows -- is laid over it here.
    """
    by_catalog = _packed_by_catalog(program)
    packed = by_catalog.get(catalog)
    if packed is None:
        packed = by_catalog[catalog] = _pack(program, catalog)
    gate_count = len(schedule.orders)
    gates_at = packed.observed_base + packed.observed_size
    tables_base = gates_at + 2 * gate_count
    total = tables_base + packed.tables.size
    if total >= 2**31:
        raise InvalidArgument(f"program too large for int32 offsets: {total} staged ints")
    host = np.empty(max(1, total), dtype=np.int32)  # never empty: a device pointer is taken from it
    host[:gates_at] = packed.prefix
    host[gates_at:tables_base] = 0
    host[tables_base:total] = packed.tables
    calls = packed.calls
    if schedule.read_spins:
        calls = dict(calls)
        for index, spin_us in schedule.read_spins.items():
            staged = calls.get(index)
            if staged and spin_us:
                # Only the first read call of a launch spins: the later ones load right after it, inside
                # the same window.
                first = next(k for k, call in enumerate(staged) if call.reads)
                calls[index] = (*staged[:first], staged[first]._replace(spin_us=spin_us), *staged[first + 1 :])
    tables_at = tuple(tables_base + offset for offset in packed.table_offsets)
    return Staging(
        host, packed.observed_base, packed.observed_size, calls, packed.observed_at, tables_at, gates_at, gate_count
    )


def _pack(program: Program, catalog: KernelCatalog) -> _ProgramStaging:
    """The program's part of its staging (see `_ProgramStaging`): descriptors and values go into one flat
    list and one list of chunks, each copied into the array in a single step at the end."""
    launches = program.launches
    values_base = 5 * sum(len(launch.reads) + len(launch.writes) for launch in launches)
    descriptors: list[int] = []
    chunks: list[np.ndarray] = []
    value_cursor, observed_cursor = values_base, 0
    calls: dict[int, tuple[StagedCall, ...]] = {}
    observed_at: list[tuple[int, tuple[tuple[int, int, tuple[int, int]], ...]]] = []

    def emit(kernel: str, buffer: int, rects: list[tuple[Any, int]], reads: bool) -> StagedCall:
        at = len(descriptors)
        for cells, offset in rects:
            descriptors.extend((cells.row0, cells.row1 - cells.row0, cells.col0, cells.col1 - cells.col0, offset))
        return StagedCall(kernel, buffer, at, len(rects), reads)

    for launch in launches:
        out: list[StagedCall] = []
        if launch.reads:
            by_buffer: dict[int, list[tuple[Any, int]]] = {}
            ranges: list[tuple[int, int, tuple[int, int]]] = []
            for cells in launch.reads:
                ranges.append((observed_cursor, cells.size, cells.shape))
                by_buffer.setdefault(cells.buffer.id, []).append((cells, observed_cursor))
                observed_cursor += cells.size
            observed_at.append((launch.index, tuple(ranges)))
            reader = catalog.reader_for(launch.kernel)
            out.extend(emit(reader, buffer, rects, True) for buffer, rects in by_buffer.items())
        if launch.writes:
            # Per buffer, a list of calls; a store joins its buffer's last call unless it overlaps a store
            # already there, since the blocks of one call run in no fixed order.
            groups: dict[int, list[list[tuple[Any, int]]]] = {}
            for cells, values in zip(launch.writes, launch.values, strict=True):
                chunks.append(values.reshape(-1))
                buffer_calls = groups.setdefault(cells.buffer.id, [[]])
                if any(_overlaps(cells, other) for other, _ in buffer_calls[-1]):
                    buffer_calls.append([])
                buffer_calls[-1].append((cells, value_cursor))
                value_cursor += values.size
            writer = catalog.writer_for(launch.kernel)
            for buffer, buffer_calls in groups.items():
                out.extend(emit(writer, buffer, rects, False) for rects in buffer_calls)
        calls[launch.index] = tuple(out)
    assert len(descriptors) == values_base
    table_size = sum(buffer.rows * buffer.cols for buffer in program.buffers)
    if value_cursor + observed_cursor + table_size >= 2**31:  # checked before anything is allocated
        raise InvalidArgument(
            f"program too large for int32 offsets: {value_cursor + observed_cursor + table_size} staged ints"
        )
    prefix = np.empty(value_cursor + observed_cursor, dtype=np.int32)
    prefix[:values_base] = descriptors
    if chunks:
        np.concatenate(chunks, out=prefix[values_base:value_cursor])
    prefix[value_cursor:] = POISON
    table_offsets, cursor = [], 0
    for buffer in program.buffers:
        table_offsets.append(cursor)
        cursor += buffer.rows * buffer.cols
    tables = np.empty(cursor, dtype=np.int32)
    for buffer, at in zip(program.buffers, table_offsets, strict=True):
        tables[at : at + buffer.rows * buffer.cols] = buffer.fill
    prefix.flags.writeable = False
    tables.flags.writeable = False
    return _ProgramStaging(
        prefix, tables, value_cursor, observed_cursor, calls, tuple(observed_at), tuple(table_offsets)
    )


@per_program
def _packed_by_catalog(program: Program) -> dict[KernelCatalog, _ProgramStaging]:
    """The program's packings, one per kernel catalogue (in practice one), filled by `stage`."""
    return {}


def collect_observations(staging: Staging, observed: np.ndarray) -> Observations:
    """Cut the observation slots (`host[observed_base:]` as copied back) into per-launch, per-range arrays."""
    return {
        index: tuple(observed[at : at + size].reshape(shape) for at, size, shape in ranges)
        for index, ranges in staging.observed_at
    }


def timed_out_gates(staging: Staging, readback: np.ndarray) -> list[int]:
    """The positions (in `Schedule.orders`) of the gates whose wait gave up, from the ints copied back."""
    marks = readback[staging.observed_size + 1 : staging.observed_size + 2 * staging.gate_count : 2]
    return [int(i) for i in np.nonzero(marks)[0]]
