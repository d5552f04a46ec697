"""The device API that scenarios and sync designs are written against; it records a `Program`.

It mirrors the torch calls sglang makes (`stream.wait_stream`, `stream.wait_event`, `event.record`,
`event.synchronize`, ...) so a design reads like the code it models. Nothing runs here: every call
appends an op to the program in host order, and a backend later executes the finished program (the
simulator on the CPU, real kernels on torch streams on the GPU). Because the modelled host never branches
on values read back from the GPU, recording first and executing afterwards issues exactly the calls a
live host would, in the same order.

Handles (`StreamHandle`, `EventHandle`) are thin shells over the IR objects that forward to the one
`Device` that owns them; using a handle of another device, or any handle after `finish()`, is an
`InvalidProgram` error.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from racefuzz.errors import InvalidProgram
from racefuzz.program import (
    Buffer,
    BufferId,
    CellRange,
    DeviceSync,
    Event,
    EventId,
    EventSync,
    HostDelay,
    Launch,
    Op,
    Program,
    Record,
    Stream,
    StreamId,
    StreamSync,
    WaitEvent,
    WaitStream,
)

WriteValues = int | Sequence[int] | np.ndarray


class StreamHandle:
    """A stream as scenario code sees it: `launch`, `wait_event`, `wait_stream`, `synchronize`."""

    __slots__ = ("_device", "stream")

    def __init__(self, device: Device, stream: Stream) -> None:
        self._device = device
        self.stream = stream

    @property
    def name(self) -> str:
        return self.stream.name

    def launch(
        self,
        kernel: str,
        *,
        reads: Iterable[CellRange] = (),
        writes: Iterable[tuple[CellRange, WriteValues]] = (),
        cost_us: float | None = None,
        info: Mapping[str, object] | None = None,
        unused_reads: Iterable[CellRange] = (),
    ) -> None:
        """Enqueue a kernel that loads `reads` and stores each `(cells, values)` of `writes`.

        `values` is one int (broadcast) or exactly `cells.size` ints in row-major order. `unused_reads` are
        loaded too but their values are not used (masked columns): they follow `reads` in `Launch.reads`,
        from `Launch.unused_from` on.
        """
        self._device._launch(self, kernel, reads, writes, cost_us, info, unused_reads)

    def wait_event(self, event: EventHandle) -> None:
        """Make later work on this stream wait for the latest record of `event` issued so far."""
        device = self._device
        device._check_live(self)
        event = device._own_event(event, "wait_event")
        device._append(WaitEvent(len(device._ops), self.stream, event.event))

    def wait_stream(self, other: StreamHandle) -> None:
        """Make later work on this stream wait for the work enqueued on `other` so far (a snapshot)."""
        device = self._device
        device._check_live(self)
        other = device._own_stream(other, "wait_stream")
        device._append(WaitStream(len(device._ops), self.stream, other.stream))

    def record_event(self, name: str = "event") -> EventHandle:
        """A fresh event recorded on this stream now (torch's `Stream.record_event`)."""
        event = self._device.event(name)
        event.record(self)
        return event

    def synchronize(self) -> None:
        """Block the host until everything enqueued on this stream so far has completed."""
        device = self._device
        device._check_live(self)
        device._append(StreamSync(len(device._ops), self.stream))

    def __repr__(self) -> str:
        return f"<stream {self.stream.name}>"


class EventHandle:
    """An event as scenario code sees it: `record(stream)`, `synchronize()`."""

    __slots__ = ("_device", "event")

    def __init__(self, device: Device, event: Event) -> None:
        self._device = device
        self.event = event

    def record(self, stream: StreamHandle) -> None:
        """(Re-)arm the event: it now completes when the work enqueued on `stream` so far has."""
        device = self._device
        device._check_live(self)
        stream = device._own_stream(stream, "record")
        device._append(Record(len(device._ops), self.event, stream.stream))

    def synchronize(self) -> None:
        """Block the host until the latest record completed (returns at once if never recorded)."""
        device = self._device
        device._check_live(self)
        device._append(EventSync(len(device._ops), self.event))

    def __repr__(self) -> str:
        return f"<event {self.event}>"


class Device:
    """Records a host program. Create streams, events and buffers, issue ops, then `finish()`."""

    def __init__(self) -> None:
        self._streams: list[Stream] = []
        self._events: list[Event] = []
        self._buffers: list[Buffer] = []
        self._ops: list[Op] = []
        self._violations: list[str] = []
        self._finished = False

    # -- objects ---------------------------------------------------------------------------------------

    def stream(self, name: str) -> StreamHandle:
        """A new stream. Names must be unique: reports and schedules refer to streams by name."""
        self._check_live(None)
        if any(s.name == name for s in self._streams):
            raise InvalidProgram(f"a stream named {name!r} already exists")
        stream = Stream(StreamId(len(self._streams)), name)
        self._streams.append(stream)
        return StreamHandle(self, stream)

    def event(self, name: str = "event") -> EventHandle:
        """A new, never-recorded event (waiting on it before its first record is a no-op)."""
        self._check_live(None)
        event = Event(EventId(len(self._events)), name)
        self._events.append(event)
        return EventHandle(self, event)

    def buffer(self, name: str, rows: int, cols: int, *, fill: int = 0) -> Buffer:
        """A new `rows x cols` int32 table filled with `fill`."""
        self._check_live(None)
        if rows <= 0 or cols <= 0:
            raise InvalidProgram(f"buffer {name!r}: shape must be positive, got {rows}x{cols}")
        buffer = Buffer(BufferId(len(self._buffers)), name, int(rows), int(cols), int(fill))
        self._buffers.append(buffer)
        return buffer

    # -- host-side ops ---------------------------------------------------------------------------------

    def synchronize(self) -> None:
        """Block the host until every stream has drained (`torch.cuda.synchronize()`)."""
        self._check_live(None)
        self._append(DeviceSync(len(self._ops)))

    def host_delay(self, us: float) -> None:
        """The host spends `us` microseconds on other work before its next call."""
        self._check_live(None)
        if not us >= 0:
            raise InvalidProgram(f"host_delay: delay must be >= 0 microseconds, got {us!r}")
        self._append(HostDelay(len(self._ops), float(us)))

    def violation(self, message: str) -> None:
        """Record that the scenario broke one of its own invariants here (reported as its own oracle)."""
        self._check_live(None)
        self._violations.append(f"op #{len(self._ops)}: {message}")

    def finish(self) -> Program:
        """Seal the program; any later use of this device or its handles is an error."""
        self._check_live(None)
        self._finished = True
        return Program(
            tuple(self._streams), tuple(self._events), tuple(self._buffers), tuple(self._ops), tuple(self._violations)
        )

    @property
    def op_count(self) -> int:
        return len(self._ops)

    # -- internals -------------------------------------------------------------------------------------

    def _append(self, op: Op) -> None:
        self._ops.append(op)

    def _check_live(self, handle: StreamHandle | EventHandle | None) -> None:
        if self._finished:
            what = f"{handle!r}" if handle is not None else "the device"
            raise InvalidProgram(f"{what} used after the program finished")

    def _own_stream(self, stream: object, call: str) -> StreamHandle:
        if not isinstance(stream, StreamHandle) or stream._device is not self:
            raise InvalidProgram(f"{call}: {stream!r} is not a stream of this device (make one with device.stream())")
        return stream

    def _own_event(self, event: object, call: str) -> EventHandle:
        if not isinstance(event, EventHandle) or event._device is not self:
            raise InvalidProgram(f"{call}: {event!r} is not an event of this device (make one with device.event())")
        return event

    def _own_range(self, cells: object, kernel: str) -> CellRange:
        if type(cells) is not CellRange:
            raise InvalidProgram(f"launch {kernel!r}: {cells!r} is not a cell range (index a buffer: buf[row, c0:c1])")
        buffer = cells.buffer
        if buffer.id >= len(self._buffers) or self._buffers[buffer.id] is not buffer:
            raise InvalidProgram(f"launch {kernel!r}: {cells} is a range of a buffer of another device")
        return cells

    def _launch(
        self,
        stream: StreamHandle,
        kernel: str,
        reads: Iterable[CellRange],
        writes: Iterable[tuple[CellRange, WriteValues]],
        cost_us: float | None,
        info: Mapping[str, object] | None,
        unused_reads: Iterable[CellRange] = (),
    ) -> None:
        # The checks of `_check_live`, `_own_stream` and `_own_range` inline for the common case (a scenario
        # launches tens of thousands of kernels a second); anything unusual goes through them, which raise.
        if self._finished or type(stream) is not StreamHandle or stream._device is not self:
            self._check_live(stream)
            stream = self._own_stream(stream, "launch")
        buffers = self._buffers
        owned = len(buffers)
        own_range = self._own_range
        read_ranges = tuple(
            [
                cells
                if type(cells) is CellRange and cells.buffer.id < owned and buffers[cells.buffer.id] is cells.buffer
                else own_range(cells, kernel)
                for cells in reads
            ]
        )
        unused_from = None
        if unused_reads:
            unused = tuple([own_range(cells, kernel) for cells in unused_reads])
            if unused:
                unused_from = len(read_ranges)
                read_ranges += unused
        write_ranges: list[CellRange] = []
        values: list[np.ndarray] = []
        for item in writes:
            if type(item) is not tuple or len(item) != 2:
                raise InvalidProgram(f"launch {kernel!r}: each write is a (cells, values) pair, got {item!r}")
            cells, value = item
            if type(cells) is not CellRange or cells.buffer.id >= owned or buffers[cells.buffer.id] is not cells.buffer:
                cells = own_range(cells, kernel)
            write_ranges.append(cells)
            values.append(_as_values(value, cells, kernel))
        if not read_ranges and not write_ranges:
            raise InvalidProgram(f"launch {kernel!r}: a kernel must read or write at least one cell range")
        if cost_us is not None and not cost_us >= 0:
            raise InvalidProgram(f"launch {kernel!r}: cost_us must be >= 0, got {cost_us!r}")
        ops = self._ops
        ops.append(
            Launch(
                len(ops),
                stream.stream,
                kernel,
                read_ranges,
                tuple(write_ranges),
                tuple(values),
                None if cost_us is None else float(cost_us),
                dict(info) if info else {},
                unused_from,
            )
        )


_FILLED: dict[tuple[int, int, int], np.ndarray] = {}
"""Read-only `np.full` arrays by (rows, columns, value): a scenario stores the same small constants (a
flag, an iteration number) over and over, and values are immutable, so launches may share them."""

_FILLED_KEPT = 4096


def _as_values(values: WriteValues, cells: CellRange, kernel: str) -> np.ndarray:
    if type(values) is int:
        key = (cells.row1 - cells.row0, cells.col1 - cells.col0, values)
        array = _FILLED.get(key)
        if array is None:
            array = np.full(key[:2], values, dtype=np.int32)
            array.setflags(write=False)
            if len(_FILLED) >= _FILLED_KEPT:
                _FILLED.clear()
            _FILLED[key] = array
        return array
    if isinstance(values, (int, np.integer)) and not isinstance(values, bool):
        array = np.full(cells.shape, int(values), dtype=np.int32)
    elif type(values) is np.ndarray and values.dtype == np.int32 and values.size == cells.size:
        array = values.reshape(cells.shape).copy()  # the common case (scenarios pass int32 slot arrays)
    else:
        array = np.asarray(values)
        if array.dtype.kind not in "iu":
            raise InvalidProgram(f"launch {kernel!r}: values for {cells} must be integers, got {array.dtype}")
        if array.size != cells.size:
            raise InvalidProgram(f"launch {kernel!r}: {array.size} values for {cells.size} cells of {cells}")
        array = array.astype(np.int32, copy=True).reshape(cells.shape)  # a copy: the caller keeps its array
    array.setflags(write=False)
    return array
