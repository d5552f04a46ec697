"""The one builder a recording emits its program through: a traced step is a frontend of the core IR.

What a step did, in host order, is a `racefuzz.program.Program`, judged by the one happens-before checker
(`racefuzz.hb.find_races`, through `racefuzz.trace.judge`). The recorder (`racefuzz.trace.recorder`: its
Python path, and the C++ fast path `_fastpath.cpp` through the containers named in `Recorder.fast_state`)
emits every op through a `ProgramBuilder`:

* a storage (one allocation: one epoch of one device block) is a 1 x nbytes `Buffer` carrying its
  `Allocation` (element size, row length, the stream it was allocated on); its buffer id is the
  recorder's key for it, and the last `Buffer` of an id (`buffers[id]`: a storage the step names after
  using it is renamed there) is what reports name (a cell range keeps the buffer it was made with);
* an access is one-row `CellRange`s of that buffer (byte intervals: cell rectangles over a byte axis), per
  buffer in first-seen order, each buffer's sorted and merged;
* a launch (a torch op, a Triton or CuPy kernel, a host access, a free) is a `Launch` whose `info` says
  where it comes from: `at` (the user's source line), `kind` (`torch`, `triton`, `cupy`, `host`, `free`,
  `copy`, `graph`) and `assumed` (its sets are the conservative default), one shared mapping per
  (kind, source, assumed) (`info`); its `values` are () (they live on the device);
* streams and events are named by the strings the recorder gives them (stable across runs of one step).

The host is a participant: its accesses are launches on the `HOST` stream, and everything the host issues
after an access is ordered after it (host program order), with the IR's own ops, emitted as they happen:
the host stream records the `HOST_ORDER` event after each of its accesses, and a stream waits on it before
its next op if it has not since. Host syncs (stream, event, device) join into every stream's clock, the
host's included, as any host-side wait does.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from racefuzz.program import (
    Allocation,
    Buffer,
    CellRange,
    DeviceSync,
    Event,
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

HOST = "host"
"""The stream name of the host's own reads and writes of device or pinned memory (`.item()` results read by
Python, pinned buffers filled by the host): the host is a participant like a stream."""

HOST_ORDER = "host-order"
"""The event the host stream records after each host access (see the module doc)."""

_tuple_new = tuple.__new__
"""Makes an op or a cell range (a NamedTuple) from all its fields without its Python `__new__` (the launch
path's hottest lines: every field is given)."""

_object_new = object.__new__
_SET_EVENT = (Event.__dict__["id"].__set__, Event.__dict__["name"].__set__)
_SET_BUFFER = tuple(Buffer.__dict__[name].__set__ for name in ("id", "name", "rows", "cols", "fill", "allocation"))
"""The slot setters of `Buffer`'s fields, in order."""


def _event(key: int, name: str) -> Event:
    """`Event(key, name)`, made as `_buffer` makes a buffer: every `wait_stream` records a new event."""
    event = _object_new(Event)
    set_id, set_name = _SET_EVENT
    set_id(event, key)
    set_name(event, name)
    return event


def _buffer(key: int, name: str, cols: int, allocation: Allocation) -> Buffer:
    """`Buffer(key, name, 1, cols, 0, allocation)`, made as its frozen `__init__` makes it (each slot set once)
    without that `__init__`'s per-field overhead: a fresh output makes one per op (a third of its cost)."""
    buffer = _object_new(Buffer)
    set_id, set_name, set_rows, set_cols, set_fill, set_allocation = _SET_BUFFER
    set_id(buffer, key)
    set_name(buffer, name)
    set_rows(buffer, 1)
    set_cols(buffer, cols)
    set_fill(buffer, 0)
    set_allocation(buffer, allocation)
    return buffer


class ProgramBuilder:
    """A recording's program as it is emitted (see the module doc); `program()` is it so far.

    Its containers are public: the C++ fast path reads and appends to them directly (`Recorder.fast_state`).
    """

    def __init__(self) -> None:
        self.streams: dict[str, Stream] = {}
        """Stream name -> its `Stream`, in order of first use (ids 0, 1, ...)."""
        self.events: dict[str, Event] = {}
        """Event name -> its `Event`, in order of first use."""
        self.buffers: list[Buffer] = []
        """Buffer id (the recorder's storage key) -> its `Buffer` now."""
        self.ops: list[Op] = []
        self.torch_infos: dict[str, Mapping[str, object]] = {}
        """Source line -> the `info` of a torch op launched there with its sets not assumed (the hot path's)."""
        self.free_infos: dict[str, Mapping[str, object]] = {}
        """Source line -> the `info` of a free there (the C++ fast path's frees)."""
        self._infos: dict[tuple[str, str, bool], Mapping[str, object]] = {}
        self.host_count = [0]
        """How many host accesses were emitted (a list: the C++ fast path reads it in place)."""
        self.after_host: dict[str, int] = {}
        """Stream name -> how many host accesses it is ordered after (its last wait on `HOST_ORDER`)."""
        self._program: Program | None = None
        self._renamed = 0

    @classmethod
    def over(cls, program: Program) -> ProgramBuilder:
        """A builder with `program`'s streams, events and buffers and no ops (to `replay` ops into)."""
        builder = cls()
        builder.streams = {s.name: s for s in program.streams}
        builder.events = {e.name: e for e in program.events}
        builder.buffers = list(program.buffers)
        return builder

    # --- objects -----------------------------------------------------------------------------------

    def stream(self, name: str) -> Stream:
        """The stream `name`, made at its first use."""
        found = self.streams.get(name)
        if found is None:
            found = self.streams[name] = Stream(StreamId(len(self.streams)), name)
        return found

    def event(self, name: str) -> Event:
        """The event `name`, made at its first use."""
        found = self.events.get(name)
        if found is None:
            found = self.events[name] = _event(len(self.events), name)
        return found

    def new_buffer(self, name: str, nbytes: int, itemsize: int, row_bytes: int, allocated_on: str) -> int:
        """A new storage's buffer (one row of `nbytes` bytes); returns its id, the next one."""
        buffers = self.buffers
        key = len(buffers)
        allocation = _tuple_new(Allocation, (itemsize, row_bytes, allocated_on))
        buffers.append(_buffer(key, name, nbytes if nbytes > 1 else 1, allocation))
        return key

    def replace_buffer(self, key: int, name: str, allocation: Allocation) -> None:
        """Buffer `key` from now on named `name`, of `allocation` (cell ranges made before keep the old one;
        reports name a buffer by its id: `buffers[key]`)."""
        old = self.buffers[key]
        self.buffers[key] = Buffer(old.id, name, old.rows, old.cols, old.fill, allocation)
        self._renamed += 1

    def info(self, kind: str, source: str, assumed: bool) -> Mapping[str, object]:
        """The `Launch.info` of a launch of `kind` at `source` (shared: one per kind, source and assumed)."""
        key = (kind, source, assumed)
        found = self._infos.get(key)
        if found is None:
            fields: dict[str, object] = {"at": source, "kind": kind}
            if assumed:
                fields["assumed"] = True
            found = self._infos[key] = MappingProxyType(fields)
            if kind == "torch" and not assumed:
                self.torch_infos[source] = found
            elif kind == "free":
                self.free_infos[source] = found
        return found

    # --- ops ---------------------------------------------------------------------------------------

    def order_after_host(self, stream: str) -> None:
        """Before an op on `stream`: a wait on `HOST_ORDER` if host accesses were emitted since its last."""
        count = self.host_count[0]
        if count and stream != HOST and self.after_host.get(stream, 0) < count:
            ops = self.ops
            ops.append(_tuple_new(WaitEvent, (len(ops), self.stream(stream), self.event(HOST_ORDER))))
            self.after_host[stream] = count

    def launch(
        self,
        stream: str,
        kernel: str,
        kind: str,
        reads: tuple[CellRange, ...],
        writes: tuple[CellRange, ...],
        source: str,
        assumed: bool = False,
    ) -> int:
        """Append a launch on `stream` (a host access on `HOST`, then its `HOST_ORDER` record); its index."""
        if stream == HOST:
            return self._host_launch(kernel, reads, writes, source)
        if self.host_count[0]:
            self.order_after_host(stream)
        info = self.torch_infos.get(source) if kind == "torch" and not assumed else None
        if info is None:
            info = self.info(kind, source, assumed)
        on = self.streams.get(stream)
        if on is None:
            on = self.stream(stream)
        ops = self.ops
        index = len(ops)
        ops.append(_tuple_new(Launch, (index, on, kernel, reads, writes, (), None, info, None)))
        return index

    def _host_launch(
        self, kernel: str, reads: tuple[CellRange, ...], writes: tuple[CellRange, ...], source: str
    ) -> int:
        ops = self.ops
        index = len(ops)
        host = self.stream(HOST)
        ops.append(Launch(index, host, kernel, reads, writes, (), None, self.info("host", source, False)))
        ops.append(Record(len(ops), self.event(HOST_ORDER), host))
        self.host_count[0] += 1
        return index

    def free(self, key: int, stream: str, source: str) -> None:
        """The free of buffer `key`'s block, allocated on `stream`: a write of all of it there."""
        buffer = self.buffers[key]
        whole = (_tuple_new(CellRange, (buffer, 0, 1, 0, buffer.cols)),)
        self.launch(stream, f"free({buffer.name})", "free", (), whole, source)

    def record(self, event: str, stream: str) -> None:
        """`event.record(stream)`."""
        if self.host_count[0]:
            self.order_after_host(stream)
        events = self.events
        recorded = events.get(event)
        if recorded is None:  # `event(event)`, inline: a CPU run's `wait_stream` records a new event each time
            recorded = events[event] = _event(len(events), event)
        on = self.streams.get(stream)
        if on is None:
            on = self.stream(stream)
        ops = self.ops
        ops.append(_tuple_new(Record, (len(ops), recorded, on)))

    def wait(self, stream: str, event: str) -> None:
        """`stream.wait_event(event)` (and the wait half of `stream.wait_stream(other)`)."""
        if self.host_count[0]:
            self.order_after_host(stream)
        waited = self.events.get(event)
        if waited is None:
            waited = self.event(event)
        on = self.streams.get(stream)
        if on is None:
            on = self.stream(stream)
        ops = self.ops
        ops.append(_tuple_new(WaitEvent, (len(ops), on, waited)))

    def stream_sync(self, stream: str) -> None:
        """The host blocked until `stream` drained (`stream.synchronize()`, `.item()`, a blocking copy)."""
        ops = self.ops
        ops.append(StreamSync(len(ops), self.stream(stream)))

    def event_sync(self, event: str) -> None:
        """The host blocked until the latest record of `event` completed."""
        ops = self.ops
        ops.append(EventSync(len(ops), self.event(event)))

    def device_sync(self) -> None:
        """`torch.cuda.synchronize()`."""
        ops = self.ops
        ops.append(DeviceSync(len(ops)))

    def replay(self, op: Op) -> None:
        """Append `op` (an op of a program of this builder's streams, events and buffers, or one taken back by
        `rewind`) as a recorded op of its kind is appended: re-indexed, ordered after the host accesses emitted
        before it. Not a `HOST_ORDER` op: those are emitted here, as they are due."""
        ops = self.ops
        if type(op) is Launch:
            if op.stream.name == HOST:
                index = len(ops)
                ops.append(op._replace(index=index))
                ops.append(Record(len(ops), self.event(HOST_ORDER), op.stream))
                self.host_count[0] += 1
                return
            self.order_after_host(op.stream.name)
        elif type(op) is Record or type(op) is WaitEvent:
            self.order_after_host(op.stream.name)
        ops.append(op._replace(index=len(ops)))

    def mark(self) -> tuple[int, int, dict[str, int]]:
        """Where the ops stand now, for `rewind`."""
        return len(self.ops), self.host_count[0], dict(self.after_host)

    def rewind(self, mark: tuple[int, int, dict[str, int]]) -> list[Op]:
        """Take back the ops appended since `mark` (the host order as it stood then); returns them, without
        the `HOST_ORDER` ops (`replay` emits those again where they are due)."""
        start, count, after_host = mark
        taken = self.ops[start:]
        del self.ops[start:]
        self.host_count[0] = count
        self.after_host = after_host
        return [op for op in taken if not is_host_order(op)]

    def program(self) -> Program:
        """The program emitted so far (the same object until something is emitted or renamed)."""
        cached = self._program
        if (
            cached is None
            or len(cached.ops) != len(self.ops)
            or len(cached.buffers) != len(self.buffers)
            or len(cached.streams) != len(self.streams)
            or len(cached.events) != len(self.events)
            or self._renamed
        ):
            self._renamed = 0
            cached = self._program = Program(
                streams=tuple(self.streams.values()),
                events=tuple(self.events.values()),
                buffers=tuple(self.buffers),
                ops=tuple(self.ops),
            )
        return cached


def is_host_order(op: Op) -> bool:
    """Whether `op` is the builder's own host-order record or wait (not an op the step issued)."""
    return (type(op) is Record or type(op) is WaitEvent) and op.event.name == HOST_ORDER


def launch_kind(launch: Launch) -> str:
    """A traced launch's kind (`torch`, `triton`, `cupy`, `host`, `free`, `copy`, `graph`)."""
    return str(launch.info.get("kind", ""))


def launch_source(launch: Launch) -> str:
    """`file:line (function)` of the user's line that launched it ("" if none)."""
    return str(launch.info.get("at", ""))


def sets_assumed(launch: Launch) -> bool:
    """Whether its read/write sets are the conservative default (no annotation)."""
    return bool(launch.info.get("assumed", False))


def launch_text(launch: Launch) -> str:
    """`#index kernel on stream at file:line (function)`."""
    source = launch_source(launch)
    where = f" at {source}" if source else ""
    return f"#{launch.index} {launch.kernel} on {launch.stream.name}{where}"
