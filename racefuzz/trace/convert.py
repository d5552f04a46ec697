"""A `Trace` as racefuzz's `Program`, so the one happens-before checker (`racefuzz.hb.find_races`) judges it.

Each storage becomes a 1 x nbytes `Buffer` and each byte interval a one-row `CellRange` of it: cell
rectangles over a byte axis are byte intervals, so the IR needs no new kind of range.

The host is a participant: its accesses are launches on a `host` stream, and everything the host issues
after an access is ordered after it (host program order). That is expressed with the IR's own ops: the
host stream records a `host` event after each of its accesses, and a stream waits on it before its next op
if it has not yet. Host syncs (stream, event, device) join into every stream's clock, the host's included,
exactly as for any host-side wait.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from racefuzz.hb import Race, find_races
from racefuzz.program import (
    Buffer,
    BufferId,
    CellRange,
    DeviceSync,
    Event,
    EventId,
    EventSync,
    Launch,
    Op,
    Program,
    Record,
    Stream,
    StreamId,
    StreamSync,
    WaitEvent,
)
from racefuzz.trace.lifetime import with_reuse
from racefuzz.trace.model import (
    HOST,
    Access,
    Trace,
    TraceDeviceSync,
    TraceEventSync,
    TraceLaunch,
    TraceRecord,
    TraceStreamSync,
    TraceWait,
)

_NO_VALUES = np.zeros((1, 0), dtype=np.int32)
"""Launch.values is for the simulator's stores; a traced launch's values live on the device."""

_HOST_EVENT = "host-order"


@dataclass(frozen=True)
class Converted:
    """The program and, for each of its launches (by op index), the traced launch it stands for."""

    program: Program
    launches: dict[int, TraceLaunch]


def to_program(trace: Trace) -> Converted:
    """The `Program` of `trace` (see the module doc)."""
    stream_names = list(trace.streams)
    has_host = any(isinstance(op, TraceLaunch) and op.stream == HOST for op in trace.ops)
    if has_host and HOST not in stream_names:
        stream_names.append(HOST)
    streams = {name: Stream(StreamId(i), name) for i, name in enumerate(stream_names)}
    event_names: dict[str, None] = {}  # insertion-ordered set: a trace of 10^5 waits is not quadratic
    for op in trace.ops:
        if isinstance(op, (TraceRecord, TraceWait, TraceEventSync)):
            event_names[op.event] = None
    if has_host:
        event_names[_HOST_EVENT] = None
    events = {name: Event(EventId(i), name) for i, name in enumerate(event_names)}
    buffers = {
        key: Buffer(BufferId(i), storage.name, 1, max(storage.nbytes, 1))
        for i, (key, storage) in enumerate(trace.storages.items())
    }

    ops: list[Op] = []
    launches: dict[int, TraceLaunch] = {}
    host_accesses = 0
    seen_host: dict[str, int] = {}  # stream -> how many host accesses it is already ordered after

    def order_after_host(stream: str) -> None:
        if stream != HOST and has_host and seen_host.get(stream, 0) < host_accesses:
            ops.append(WaitEvent(len(ops), streams[stream], events[_HOST_EVENT]))
            seen_host[stream] = host_accesses

    def ranges(accesses: tuple[Access, ...]) -> tuple[CellRange, ...]:
        out = []
        for access in accesses:
            buffer = buffers[access.storage]
            out.extend(CellRange(buffer, 0, 1, start, end) for start, end in access.intervals)
        return tuple(out)

    for op in trace.ops:
        if isinstance(op, TraceLaunch):
            order_after_host(op.stream)
            writes = ranges(op.writes)
            launch = Launch(
                len(ops),
                streams[op.stream],
                op.kernel,
                ranges(op.reads),
                writes,
                tuple(_NO_VALUES for _ in writes),
                info=MappingProxyType({"at": op.source}) if op.source else MappingProxyType({}),
            )
            launches[launch.index] = op
            ops.append(launch)
            if op.stream == HOST:
                host_accesses += 1
                ops.append(Record(len(ops), events[_HOST_EVENT], streams[HOST]))
        elif isinstance(op, TraceRecord):
            order_after_host(op.stream)
            ops.append(Record(len(ops), events[op.event], streams[op.stream]))
        elif isinstance(op, TraceWait):
            order_after_host(op.stream)
            ops.append(WaitEvent(len(ops), streams[op.stream], events[op.event]))
        elif isinstance(op, TraceStreamSync):
            ops.append(StreamSync(len(ops), streams[op.stream]))
        elif isinstance(op, TraceEventSync):
            ops.append(EventSync(len(ops), events[op.event]))
        elif isinstance(op, TraceDeviceSync):
            ops.append(DeviceSync(len(ops)))
        else:  # pragma: no cover - the TraceOp union is closed
            raise TypeError(f"not a trace op: {op!r}")
    program = Program(
        streams=tuple(streams.values()),
        events=tuple(events.values()),
        buffers=tuple(buffers.values()),
        ops=tuple(ops),
    )
    return Converted(program, launches)


@dataclass(frozen=True)
class TraceRace:
    """A race of the happens-before checker, told in the trace's terms (kernels, source lines, elements)."""

    race: Race
    first: TraceLaunch
    second: TraceLaunch
    where: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.race.kind} {self.first.describe()} -> {self.second.describe()} on {', '.join(self.where)}"


@dataclass(frozen=True)
class TraceJudgement:
    """A trace's races, and its latent lifetime hazards: races against a free whose block no later
    allocation in the trace could reuse (`racefuzz.trace.lifetime`), said but not counted as races."""

    races: list[TraceRace]
    latent: list[TraceRace]


def judge_trace(trace: Trace) -> TraceJudgement:
    """Every unordered conflicting pair of the trace's launches (`racefuzz.hb.find_races`), with each free's
    write at its block's possible reuse (`racefuzz.trace.lifetime.with_reuse`): a pair whose second is a free
    no allocation reuses is latent, the rest are races."""
    moved, unreused = with_reuse(trace)
    found = _hb_races(moved)
    is_latent = [race.second.kind == "free" and race.second.index in unreused for race in found]
    return TraceJudgement(
        [race for race, latent in zip(found, is_latent, strict=True) if not latent],
        [race for race, latent in zip(found, is_latent, strict=True) if latent],
    )


def find_trace_races(trace: Trace) -> list[TraceRace]:
    """The races of `judge_trace` (latent lifetime hazards left out)."""
    return judge_trace(trace).races


def _hb_races(trace: Trace) -> list[TraceRace]:
    """Every unordered conflicting pair of the trace's launches, by `racefuzz.hb.find_races`, each free's
    write where the trace has it."""
    converted = to_program(trace)
    storages = list(trace.storages.values())  # buffer id i is the i-th storage
    found = []
    for race in find_races(converted.program):
        where = tuple(storages[c.buffer.id].describe(c.col0, c.col1) for c in race.cells)
        found.append(
            TraceRace(race, converted.launches[race.first.index], converted.launches[race.second.index], where)
        )
    return found
