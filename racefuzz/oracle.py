"""The manifested-corruption oracle: what every load should have seen, and where a run disagrees.

The reference is the same program executed sequentially in host issue order: a correctly fenced program
observes exactly that, whatever the timing, because every write it orders before a read was issued
before it and every write issued after a read is ordered after it. A load that differs from the
reference was clobbered by a write that landed too early (WAR) or missed one that landed too late (RAW).

A value loaded is not always a value used: a kernel that gathers a batch rectangle `R[rows, :max_len]`
loads the columns beyond a short row's length and masks them afterwards (`Launch.unused_from`). A changed
value there is an ordering conflict (the happens-before oracle reports it) but not a corruption, so
`find_corruptions` compares only the used reads; `masked_conflict` tells the races that touch masked
columns only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from racefuzz.hb import Race, RaceKind
from racefuzz.memory import INITIAL, Observations, Replay, in_order_loads, replay_in_order
from racefuzz.program import Launch, Program, per_program

UNKNOWN = -2
"""The writer index for a loaded value that no single launch explains."""


def sequential_replay(program: Program, *, track_writers: bool = False) -> Replay:
    """The reference run: every launch in host issue order."""
    return replay_in_order(program, program.launches, track_writers=track_writers)


def expected_observations(program: Program) -> Observations:
    """What every reading launch loads when the program runs in host issue order."""
    return sequential_replay(program).observations


@dataclass(frozen=True)
class Corruption:
    """The cells of one read range of one launch whose loaded values differ from the reference.

    Args:
        read: the reading launch.
        range_index: which entry of `read.reads`.
        cells: the differing cells as (row, column) pairs, row-major.
        observed: the values loaded, aligned with `cells`.
        expected: the reference values, aligned with `cells`.
        observed_writers: the launch that stored each observed value (-1: the buffer's fill; -2: unknown),
            tracked on the simulator, recovered from the values on the GPU.
        expected_writers: the launch that stored each expected value (-1: the buffer's fill).
    """

    read: Launch
    range_index: int
    cells: tuple[tuple[int, int], ...]
    observed: tuple[int, ...]
    expected: tuple[int, ...]
    observed_writers: tuple[int, ...] | None
    expected_writers: tuple[int, ...]

    @property
    def culprits(self) -> tuple[int, ...]:
        """The launches whose stores explain the wrong values.

        Per cell: when the observed value was stored by a launch issued *after* the expected one, that
        later write landed too early (it clobbered the read: WAR, or WAW); otherwise the read missed the
        expected write (RAW). Without writer tracking, the expected writers are named.
        """
        culprits = set()
        observed = self.observed_writers or (INITIAL,) * len(self.expected_writers)
        for got, want in zip(observed, self.expected_writers, strict=True):
            culprit = got if got > want else want
            if culprit >= 0:
                culprits.add(culprit)
        return tuple(sorted(culprits))


def find_corruptions(
    program: Program,
    observed: Observations,
    observed_writers: Observations | None = None,
    *,
    expected: Observations | None = None,
) -> list[Corruption]:
    """Compare `observed` against the sequential reference; one `Corruption` per differing read range.

    The common case -- everything matches -- costs one untracked sequential replay, or none when the
    caller passes `expected_observations(program)` as `expected` (computed ahead, e.g. while the device
    runs); the reference's writers are only recomputed when something differs.
    """
    if expected is None:
        expected = in_order_loads(program)
    if expected is in_order_loads(program) and _matches_reference(program, observed):
        return []
    ops = program.ops
    differing = [
        (index, k)
        for index, arrays in expected.items()
        for k, want in enumerate(arrays)
        if ops[index].used(k) and not np.array_equal(_observation(observed, index)[k], want)  # type: ignore[union-attr]
    ]
    if not differing:
        return []
    reference = sequential_replay(program, track_writers=True)
    assert reference.writers is not None
    corruptions: list[Corruption] = []
    for index, k in differing:
        got, want = observed[index][k], expected[index][k]
        read = program.ops[index]
        assert isinstance(read, Launch)
        rows, cols = np.nonzero(got != want)
        cells = tuple(
            (read.reads[k].row0 + int(r), read.reads[k].col0 + int(c)) for r, c in zip(rows, cols, strict=False)
        )
        buffer = read.reads[k].buffer
        if observed_writers is not None:
            got_writers = tuple(int(v) for v in observed_writers[index][k][rows, cols])
        else:  # a GPU run tracks no writers: recover them from the values (slot ids are unique)
            got_writers = tuple(
                writer_of_value(program, buffer.id, row, col, int(value))
                for (row, col), value in zip(cells, got[rows, cols], strict=True)
            )
        corruptions.append(
            Corruption(
                read,
                k,
                cells,
                tuple(int(v) for v in got[rows, cols]),
                tuple(int(v) for v in want[rows, cols]),
                got_writers,
                tuple(int(v) for v in reference.writers[index][k][rows, cols]),
            )
        )
    return corruptions


@per_program
def _used_reference(program: Program) -> list[tuple[int, int, tuple[int, ...], bytes]]:
    """Every used read range of `program` as (launch index, range index, shape, the reference's bytes), in
    `in_order_loads` order."""
    ops = program.ops
    return [
        (index, k, want.shape, want.tobytes())
        for index, arrays in in_order_loads(program).items()
        for k, want in enumerate(arrays)
        if ops[index].used(k)  # type: ignore[union-attr]
    ]


def _matches_reference(program: Program, observed: Observations) -> bool:
    """Whether every used load of `observed` equals the sequential reference, compared as shape and bytes
    (a few times cheaper than `np.array_equal` on arrays this small). False also when an observation is
    missing or not an int32 array like the reference's, which `find_corruptions`' comparison then judges."""
    try:
        for index, k, shape, want in _used_reference(program):
            got = observed[index][k]
            if got.shape != shape or got.tobytes() != want:
                return False
    except (KeyError, IndexError, AttributeError):
        return False
    return True


def masked_conflict(race: Race) -> bool:
    """Whether every cell `race` conflicts on is a masked column of its reader (loaded, not used): an
    ordering conflict that cannot corrupt a used value. WAW races and races on used cells are not."""
    if race.kind is RaceKind.WAW:
        return False
    reader, writer = (race.first, race.second) if race.kind is RaceKind.WAR else (race.second, race.first)
    used = [cells for k, cells in enumerate(reader.reads) if reader.used(k)]
    return not any(w.intersection(r) is not None for w in writer.writes for r in used)


def writer_of_value(program: Program, buffer_id: int, row: int, col: int, value: int) -> int:
    """The launch that stores `value` into cell (row, col), INITIAL if only the fill holds it, or UNKNOWN
    when zero or several launches could have (values are then not unique, as in some litmus programs)."""
    candidates = [
        launch.index
        for launch in program.launches
        for cells, values in zip(launch.writes, launch.values, strict=True)
        if cells.buffer.id == buffer_id
        and cells.row0 <= row < cells.row1
        and cells.col0 <= col < cells.col1
        and int(values[row - cells.row0, col - cells.col0]) == value
    ]
    if len(candidates) == 1:
        return candidates[0]
    if not candidates and program.buffers[buffer_id].fill == value:
        return INITIAL
    return UNKNOWN


def _observation(observed: Observations, index: int) -> tuple[np.ndarray, ...]:
    try:
        return observed[index]
    except KeyError:
        raise ValueError(f"no observation for reading launch #{index}") from None
