"""The happens-before oracle: vector clocks over stream order, events, waits and host syncs.

Timing-independent, in the manner of PyTorch's CSAN (`torch/cuda/_sanitizer.py`), but over declared cell
ranges instead of whole tensors, so it sees kernels torch never dispatched (CuPy, Triton) and tells
overlapping views from disjoint ones.

Clocks: every stream keeps a vector clock `clock[s][t]` = how many of stream t's launches stream s is
ordered after. A launch on s bumps `clock[s][s]` and takes that value as its sequence number. A record
copies the stream's clock into the event (re-recording overwrites it); a wait joins the event's clock
(a never-recorded event has none: no-op); `s.wait_stream(o)` joins o's clock as of the call; a host sync
joins what it waited for into every stream, since everything enqueued after it is ordered after it.

Checking: launch b on stream s is ordered after launch a on stream t iff `a.seq <= clock[s][t]` at b's
launch. For a fixed s, the launches of t *not* ordered before b are a suffix of t's launches, so each new
launch only looks at the other streams' unordered suffixes -- and only at the entries of those suffixes
that touch the rows it touches (a per-stream (buffer, row) index, see `_Clocks`). Every pair that shares a
cell, has at least one store, sits on different streams and is unordered is reported, not just the first.
`analysis(program)` adds each launch's clock, so that `Analysis.ordered(a, b)` answers "is a before b in
every run" in constant time (the forced-order strategies use it).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from racefuzz.program import (
    CellRange,
    DeviceSync,
    EventSync,
    HostDelay,
    Launch,
    OpVisitor,
    Program,
    Record,
    StreamSync,
    WaitEvent,
    WaitStream,
    per_program,
)


class RaceKind(str, Enum):
    """Named by the access issued first, then the one issued second."""

    WAR = "WAR"  # read issued first, write issued second: the write may clobber what the read loads
    RAW = "RAW"  # write issued first, read second: the read may miss the write
    WAW = "WAW"  # both write: the final value depends on timing

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Race:
    """Two conflicting launches on different streams with no happens-before edge between them.

    Args:
        kind: WAR, RAW or WAW, in host issue order (`first` was issued before `second`).
        first: the launch issued first.
        second: the launch issued second.
        cells: the cells both touch in the conflicting way.
        seen_up_to: the last launch of `first`'s stream that `second`'s stream was ordered after when
            `second` was issued (None: it had never synchronized with that stream).
    """

    kind: RaceKind
    first: Launch
    second: Launch
    cells: tuple[CellRange, ...]
    seen_up_to: Launch | None

    @property
    def key(self) -> tuple[str, str, str, str, str]:
        """What identifies a race independently of op indices: kinds, kernels and streams."""
        return (self.kind.value, self.first.kernel, self.first.stream.name, self.second.kernel, self.second.stream.name)

    @property
    def across_designs(self) -> tuple[object, ...]:
        """What names this race in any design's program of the same workload: kind, each launch's kernel
        and iteration, and the shared cells. Designs add sync ops, not launches, so op indices differ
        between designs but (kernel, iteration) does not (one launch per kernel per iteration)."""
        return (
            self.kind.value,
            self.first.kernel,
            self.first.info.get("iteration"),
            self.second.kernel,
            self.second.info.get("iteration"),
            tuple(str(cells) for cells in self.cells),
        )

    def __str__(self) -> str:
        """One line: `WAR op #27 draft_metadata (forward_stream) -> op #36 post_launch_rewrite (schedule_stream)
        on req_to_token[1, 0:1]` (kind, both launches with kernel and stream, the shared cells)."""
        a, b = self.first, self.second
        cells = ", ".join(str(c) for c in self.cells)
        return f"{self.kind} op #{a.index} {a.kernel} ({a.stream}) -> op #{b.index} {b.kernel} ({b.stream}) on {cells}"

    def missing_edge(self) -> str:
        """The ordering edge that would remove this race, in plain words."""
        a, b = self.first, self.second
        if self.seen_up_to is None:
            seen = f"{b.stream} had never synchronized with {a.stream}"
        else:
            seen = (
                f"{b.stream} was ordered only after {a.stream}'s op #{self.seen_up_to.index} ({self.seen_up_to.kernel})"
            )
        return (
            f"no happens-before edge from op #{a.index} {a.kernel} on {a.stream} to op #{b.index} {b.kernel} on "
            f"{b.stream}: {seen}. Record an event on {a.stream} after op #{a.index} and make {b.stream} wait on it "
            f"before op #{b.index} (or {b.stream}.wait_stream({a.stream}) after op #{a.index} was issued)."
        )


def _overlaps(left: tuple[CellRange, ...], right: tuple[CellRange, ...]) -> tuple[CellRange, ...]:
    shared = []
    for x in left:
        for y in right:
            cells = x.intersection(y)
            if cells is not None:
                shared.append(cells)
    return tuple(shared)


def find_races(program: Program) -> list[Race]:
    """Every conflicting, unordered pair of launches of `program`, in the order the second was issued."""
    clocks = _Clocks(len(program.streams), len(program.events), len(program.buffers))
    clocks.visit_all(program.ops)
    races = clocks.races
    races.sort(key=lambda race: (race.second.index, race.first.index))
    return races


@dataclass(frozen=True)
class Analysis:
    """One program's happens-before facts: its races, and which launch is ordered before which.

    `clocks[i]` for launch i: (its stream id, its sequence number, its stream's clock when it was issued).
    """

    races: tuple[Race, ...]
    clocks: dict[int, tuple[int, int, tuple[int, ...]]]

    def ordered(self, a: int, b: int) -> bool:
        """Whether launch `a` happens before launch `b` (or is `b`): every run applies `a` first."""
        if a == b:
            return True
        stream, seq, _ = self.clocks[a]
        return seq <= self.clocks[b][2][stream]


@per_program
def analysis(program: Program) -> Analysis:
    """`program`'s races (as `find_races` gives them) and its launch ordering; the same object for the last
    PROGRAMS_KEPT programs (the simulator and the forced-order strategy ask once per run)."""
    clocks = _SnapshotClocks(len(program.streams), len(program.events), len(program.buffers))
    clocks.visit_all(program.ops)
    races = clocks.races
    races.sort(key=lambda race: (race.second.index, race.first.index))
    assert clocks.snapshots is not None
    return Analysis(tuple(races), clocks.snapshots)


WIDE_ROWS = 8
"""A range spanning more rows than this is indexed under its buffer, not row by row (see `_Clocks`)."""

_Entry = tuple[int, int, int, bool, Launch]
"""An index entry: (sequence number, col0, col1, whether the range is written, the launch)."""


class _Clocks(OpVisitor[None]):
    """The vector clocks of the module doc, advanced by one op at a time; `races` collects what launches find.

    `clock[s][t]`: how many of stream t's launches stream s is ordered after. `event_clock[e]`: the clock
    of e's latest record (None: never recorded). `history[s]`: stream s's launches in order; launch k
    (0-based) has sequence number k + 1.

    Finding the candidates: scanning every unordered launch of the other streams costs one rectangle test
    per in-flight pair (~50 per launch on an overlap loop, most of them on other rows). Instead each stream
    indexes its launches' ranges by row -- `cells_at[t][row * buffers + buffer]`, a list of `_Entry` in
    issue order -- so a new launch looks up only the rows it touches and walks each list back while its
    entries are unordered (sequence number above what the new launch's stream has seen of t). A range of
    more than WIDE_ROWS rows is filed under its buffer's wide key (-1 - buffer id), which lookups of that
    buffer also check once a stream has one (`has_wide[t]`); a launch with such a range finds its
    candidates by the plain scan of `history` instead.
    """

    __slots__ = ("buffers", "cells_at", "clock", "event_clock", "has_wide", "history", "n", "races", "snapshots")

    def __init__(self, streams: int, events: int, buffers: int = 1) -> None:
        self.snapshots: dict[int, tuple[int, int, tuple[int, ...]]] | None = None  # see _SnapshotClocks
        self.n = streams
        self.buffers = max(buffers, 1)
        self.clock = [[0] * streams for _ in range(streams)]
        self.event_clock: list[list[int] | None] = [None] * events
        self.history: list[list[Launch]] = [[] for _ in range(streams)]
        self.cells_at: list[dict[int, list[_Entry]]] = [{} for _ in range(streams)]
        self.has_wide = [False] * streams
        self.races: list[Race] = []

    def _join_all(self, other: list[int]) -> None:
        """A host sync: everything enqueued after it, on any stream, is ordered after `other`."""
        n = self.n
        for row in self.clock:
            for t in range(n):
                if other[t] > row[t]:
                    row[t] = other[t]

    def visit_launch(self, op: Launch) -> None:
        s = op.stream.id
        mine = self.clock[s]
        seq = mine[s] = mine[s] + 1
        history = self.history
        buffers = self.buffers
        keys = _keys(op, buffers)
        found: dict[int, tuple[Launch, int]] = {}
        for t in range(self.n):
            if t == s:
                continue
            seen = mine[t]
            launches = history[t]
            if len(launches) <= seen:
                continue  # everything stream t issued so far is ordered before this launch
            if keys is None:
                for k in range(len(launches) - 1, seen - 1, -1):
                    other = launches[k]
                    if (other.writes or op.writes) and _touch(other, op):
                        found[other.index] = (other, t)
                continue
            cells_at = self.cells_at[t]
            for key, col0, col1, writing in keys:
                bucket = cells_at.get(key)
                if bucket is not None:
                    i = len(bucket) - 1
                    while i >= 0:
                        entry = bucket[i]
                        if entry[0] <= seen:
                            break
                        if (writing or entry[3]) and entry[1] < col1 and col0 < entry[2]:
                            found[entry[4].index] = (entry[4], t)
                        i -= 1
            if self.has_wide[t]:
                for key, col0, col1, writing in keys:
                    bucket = cells_at.get(-1 - key % buffers)
                    if bucket is not None:
                        for entry in reversed(bucket):
                            if entry[0] <= seen:
                                break
                            if (writing or entry[3]) and entry[1] < col1 and col0 < entry[2]:
                                found[entry[4].index] = (entry[4], t)
        if found:
            races = self.races
            for index in sorted(found):
                other, t = found[index]
                seen = mine[t]
                races.extend(_conflicts(other, op, history[t][seen - 1] if seen else None))
        history[s].append(op)
        if self.snapshots is not None:
            self.snapshots[op.index] = (s, seq, tuple(mine))
        at = self.cells_at[s]
        if keys is None:
            self.has_wide[s] = True
            _file_wide(at, op, seq, buffers)
            return
        for key, col0, col1, writing in keys:
            entry = (seq, col0, col1, writing, op)
            bucket = at.get(key)
            if bucket is None:
                at[key] = [entry]
            else:
                bucket.append(entry)

    def visit_record(self, op: Record) -> None:
        self.event_clock[op.event.id] = list(self.clock[op.stream.id])

    def visit_wait_event(self, op: WaitEvent) -> None:
        recorded = self.event_clock[op.event.id]
        if recorded is not None:
            _join(self.clock[op.stream.id], recorded)

    def visit_wait_stream(self, op: WaitStream) -> None:
        _join(self.clock[op.stream.id], self.clock[op.other.id])

    def visit_event_sync(self, op: EventSync) -> None:
        recorded = self.event_clock[op.event.id]
        if recorded is not None:
            self._join_all(recorded)

    def visit_stream_sync(self, op: StreamSync) -> None:
        self._join_all(list(self.clock[op.stream.id]))

    def visit_device_sync(self, op: DeviceSync) -> None:
        clock = self.clock
        self._join_all([clock[t][t] for t in range(self.n)])

    def visit_host_delay(self, op: HostDelay) -> None:
        """Host work orders nothing."""


class _SnapshotClocks(_Clocks):
    """The clocks, keeping each launch's (stream, sequence number, clock) for `Analysis.ordered` (taken in
    `_Clocks.visit_launch`, once `snapshots` is a dict)."""

    __slots__ = ()

    def __init__(self, streams: int, events: int, buffers: int = 1) -> None:
        super().__init__(streams, events, buffers)
        self.snapshots = {}


def _keys(op: Launch, buffers: int) -> list[tuple[int, int, int, bool]] | None:
    """(row * buffers + buffer, col0, col1, written) for every row `op` touches; None when a range is wide."""
    keys = []
    for r in op.reads:
        row0, row1 = r.row0, r.row1
        if row1 - row0 > WIDE_ROWS:
            return None
        buffer = r.buffer.id
        for row in range(row0, row1):
            keys.append((row * buffers + buffer, r.col0, r.col1, False))
    for r in op.writes:
        row0, row1 = r.row0, r.row1
        if row1 - row0 > WIDE_ROWS:
            return None
        buffer = r.buffer.id
        for row in range(row0, row1):
            keys.append((row * buffers + buffer, r.col0, r.col1, True))
    return keys


def _file_wide(at: dict[int, list[_Entry]], op: Launch, seq: int, buffers: int) -> None:
    """File a launch with a wide range: each range under its buffer's wide key (-1 - buffer id), whatever
    its rows. A wide entry keeps its columns but not its rows: a lookup of another row may take it as a
    candidate, and `_conflicts` then finds no shared cell."""
    for ranges, writing in ((op.reads, False), (op.writes, True)):
        for r in ranges:
            at.setdefault(-1 - r.buffer.id, []).append((seq, r.col0, r.col1, writing, op))


def _touch(a: Launch, b: Launch) -> bool:
    """Whether any range of `a` shares a cell with any range of `b` (ignoring read/write kinds)."""
    for x in (*a.reads, *a.writes):
        for y in (*b.reads, *b.writes):
            if (
                x.buffer.id == y.buffer.id
                and x.row0 < y.row1
                and y.row0 < x.row1
                and x.col0 < y.col1
                and y.col0 < x.col1
            ):
                return True
    return False


def _join(into: list[int], other: list[int]) -> None:
    for t, value in enumerate(other):
        if value > into[t]:
            into[t] = value


def _conflicts(first: Launch, second: Launch, seen_up_to: Launch | None) -> list[Race]:
    found = []
    if first.reads and second.writes:
        cells = _overlaps(first.reads, second.writes)
        if cells:
            found.append(Race(RaceKind.WAR, first, second, cells, seen_up_to))
    if first.writes and second.reads:
        cells = _overlaps(first.writes, second.reads)
        if cells:
            found.append(Race(RaceKind.RAW, first, second, cells, seen_up_to))
    if first.writes and second.writes:
        cells = _overlaps(first.writes, second.writes)
        if cells:
            found.append(Race(RaceKind.WAW, first, second, cells, seen_up_to))
    return found
