"""The recorded host program (the IR): streams, events, buffers, cell ranges and the ops between them.

A `Program` is what a scenario plus a sync design issue, in host order, with no timing in it: every
backend (the simulator, the CUDA executor) and every analysis (the happens-before checker, the sequential
oracle) consumes the same `Program`. Delays are not part of it; they live in a separate `Schedule`, so
that one program can be run under many schedules.

Accesses are declared at cell granularity: a `CellRange` is a row/column rectangle of a 2-D int32
buffer. Two accesses conflict when their rectangles share a cell, which is how overlapping views of one
tensor are told apart from disjoint ones (PyTorch's CSAN keys accesses by `data_ptr` and misses both).
"""

from __future__ import annotations

import functools
import re
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar, Generic, NamedTuple, NewType, TypeVar, get_args

import numpy as np

from racefuzz.errors import InvalidProgram

StreamId = NewType("StreamId", int)
EventId = NewType("EventId", int)
BufferId = NewType("BufferId", int)


@dataclass(frozen=True, slots=True)
class Stream:
    """A CUDA stream of the program. `id` is its index in `Program.streams`."""

    id: StreamId
    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class Event:
    """A CUDA event of the program. `id` is its index in `Program.events`; names need not be unique."""

    id: EventId
    name: str

    def __str__(self) -> str:
        return f"{self.name}#{self.id}"


class Allocation(NamedTuple):
    """What a traced step's buffer is: one allocation (one epoch of one device block) that the step touched,
    seen as a 1 x nbytes buffer of bytes (`racefuzz.trace.builder`).

    Args:
        itemsize: the element size of the tensor first seen on it (to print byte ranges as elements).
        row_bytes: bytes per row when it was first seen as a 2-D table, else 0 (to print `R[row, c0:c1]`).
        allocated_on: the stream it was allocated on while recording; "" for a block made before the
            recording or a pinned host block (no stream's pool): what the lifetime model
            (`racefuzz.trace.lifetime`) takes as an allocation that may reuse a freed block.
    """

    itemsize: int = 1
    row_bytes: int = 0
    allocated_on: str = ""


@dataclass(frozen=True, slots=True)
class Buffer:
    """A 2-D int32 device table such as `req_to_token[rows, cols]`, initially filled with `fill`; or, with an
    `allocation`, the bytes of one block a traced step touched (one row of `cols` bytes).

    Indexing a buffer makes a `CellRange`: `buf[row, c0:c1]`, `buf[r0:r1, c0:c1]`.
    """

    id: BufferId
    name: str
    rows: int
    cols: int
    fill: int = 0
    allocation: Allocation | None = None

    def __getitem__(self, key: tuple[int | slice, int | slice]) -> CellRange:
        if type(key) is not tuple or len(key) != 2:
            raise InvalidProgram(f"{self.name}[...] takes two indices (rows, columns), got {key!r}")
        rows, cols = key
        # Fast path for the common `buf[row, c0:c1]` (scenarios build thousands of ranges per second).
        if type(rows) is int and 0 <= rows < self.rows:
            row0, row1 = rows, rows + 1
        else:
            row0, row1 = _bounds(rows, self.rows, f"{self.name} rows")
        if type(cols) is slice and cols.step is None and type(cols.start) is int and type(cols.stop) is int:
            col0, col1 = cols.start, cols.stop
            if not 0 <= col0 < col1 <= self.cols:
                col0, col1 = _bounds(cols, self.cols, f"{self.name} columns")  # raises the precise error
        else:
            col0, col1 = _bounds(cols, self.cols, f"{self.name} columns")
        return CellRange(self, row0, row1, col0, col1)


def _bounds(index: int | slice, size: int, what: str) -> tuple[int, int]:
    if isinstance(index, (int, np.integer)) and not isinstance(index, bool):
        start, stop = int(index), int(index) + 1
    elif isinstance(index, slice):
        if index.step not in (None, 1):
            raise InvalidProgram(f"{what}: a cell range takes no step, got {index!r}")
        start = 0 if index.start is None else int(index.start)
        stop = size if index.stop is None else int(index.stop)
    else:
        raise InvalidProgram(f"{what}: index must be an int or a slice, got {index!r}")
    if start >= stop:
        raise InvalidProgram(f"{what}: empty cell range {start}:{stop}")
    if start < 0 or stop > size:
        raise InvalidProgram(f"{what}: range {start}:{stop} is out of bounds [0, {size})")
    return start, stop


class CellRange(NamedTuple):
    """The half-open rectangle `buffer[row0:row1, col0:col1]`; never empty, always in bounds.

    IR values are immutable. They are NamedTuples rather than frozen dataclasses because a scenario
    builds tens of thousands per second and a frozen dataclass costs several times more to construct.
    """

    buffer: Buffer
    row0: int
    row1: int
    col0: int
    col1: int

    @property
    def shape(self) -> tuple[int, int]:
        return (self.row1 - self.row0, self.col1 - self.col0)

    @property
    def size(self) -> int:
        return (self.row1 - self.row0) * (self.col1 - self.col0)

    def intersection(self, other: CellRange) -> CellRange | None:
        """The cells both ranges cover, or None when they share none."""
        if self.buffer.id != other.buffer.id:
            return None
        row0, row1 = max(self.row0, other.row0), min(self.row1, other.row1)
        col0, col1 = max(self.col0, other.col0), min(self.col1, other.col1)
        if row0 >= row1 or col0 >= col1:
            return None
        return CellRange(self.buffer, row0, row1, col0, col1)

    def __str__(self) -> str:
        rows = str(self.row0) if self.row1 == self.row0 + 1 else f"{self.row0}:{self.row1}"
        return f"{self.buffer.name}[{rows}, {self.col0}:{self.col1}]"

    def to_json(self) -> list[int]:
        return [self.row0, self.row1, self.col0, self.col1]

    def describe(self) -> str:
        """`str(self)`; for a traced buffer's bytes (`Buffer.allocation`), `req_to_token[1, 4:8]` for a byte
        range inside one row of its table, else elements (`name[4:8] (flat)`) or bytes."""
        allocation = self.buffer.allocation
        if allocation is None:
            return str(self)
        name, start, end, size = self.buffer.name, self.col0, self.col1, allocation.itemsize
        if start % size or end % size:
            return f"{name} bytes [{start}, {end})"
        row_bytes = allocation.row_bytes
        if row_bytes and start // row_bytes == (end - 1) // row_bytes:
            row, base = divmod(start, row_bytes)
            return f"{name}[{row}, {base // size}:{base // size + (end - start) // size}]"
        return f"{name}[{start // size}:{end // size}] (flat)"


class Launch(NamedTuple):
    """A kernel on `stream` that loads `reads` and stores `values[i]` into `writes[i]`.

    Args:
        index: position in `Program.ops` (host issue order).
        stream: the stream it is enqueued on.
        kernel: the kernel's name, e.g. `prefill_write`, `block_gather`.
        reads: the cells it loads; what it loaded is its observation.
        writes: the cells it stores.
        values: one int32 array per write, shaped like the write's rectangle; () for a traced launch (its
            values live on the device).
        cost_us: its duration without injected delay, or None for the backend's default.
        info: where it comes from (iteration, request, ...), for reports.
        unused_from: `reads[unused_from:]` are loaded but their values are not used (masked columns, such as
            the columns of a batch-rectangle page table beyond a row's own length): a write racing them is
            an ordering conflict, not a corruption. None: every read is used.
    """

    index: int
    stream: Stream
    kernel: str
    reads: tuple[CellRange, ...]
    writes: tuple[CellRange, ...]
    values: tuple[np.ndarray, ...]
    cost_us: float | None = None
    info: Mapping[str, object] = MappingProxyType({})
    unused_from: int | None = None

    def used(self, read_index: int) -> bool:
        """Whether the values loaded by `reads[read_index]` are used (False: masked columns)."""
        return self.unused_from is None or read_index < self.unused_from

    def describe(self) -> str:
        where = ", ".join(f"{k} {v}" for k, v in self.info.items())
        return f"op #{self.index} {self.kernel} on {self.stream}" + (f" ({where})" if where else "")


class Record(NamedTuple):
    """`event.record(stream)`: the event completes when all work enqueued on `stream` so far has."""

    index: int
    event: Event
    stream: Stream


class WaitEvent(NamedTuple):
    """`stream.wait_event(event)`: binds to the latest record of `event` issued before this call.

    Waiting on an event that was never recorded is a no-op, as in CUDA.
    """

    index: int
    stream: Stream
    event: Event


class WaitStream(NamedTuple):
    """`stream.wait_stream(other)`: waits for the work enqueued on `other` up to this host call, not later."""

    index: int
    stream: Stream
    other: Stream


class EventSync(NamedTuple):
    """`event.synchronize()`: the host blocks until the latest record of `event` completed."""

    index: int
    event: Event


class StreamSync(NamedTuple):
    """`stream.synchronize()`: the host blocks until everything enqueued on `stream` completed."""

    index: int
    stream: Stream


class DeviceSync(NamedTuple):
    """`torch.cuda.synchronize()`: the host blocks until every stream drained."""

    index: int


class HostDelay(NamedTuple):
    """The host does `us` microseconds of other work before issuing the next op."""

    index: int
    us: float


Op = Launch | Record | WaitEvent | WaitStream | EventSync | StreamSync | DeviceSync | HostDelay
StreamOp = (Launch, Record, WaitEvent, WaitStream)
"""Op types that are enqueued on a stream (and so can be preceded by an injected spin on it)."""

OP_TYPES: tuple[type, ...] = get_args(Op)
"""Every op type of the IR, in the order of `Op`."""


def _method_name(op_type: type) -> str:
    """`WaitEvent` -> `visit_wait_event`: the `OpVisitor` method that handles `op_type`."""
    return "visit_" + re.sub(r"(?<!^)(?=[A-Z])", "_", op_type.__name__).lower()


OP_METHODS: Mapping[type, str] = MappingProxyType({op_type: _method_name(op_type) for op_type in OP_TYPES})
"""The `OpVisitor` method name of every op type."""

R = TypeVar("R")


class OpVisitor(Generic[R]):
    """The one dispatch over the op types: a subclass has one `visit_<op type>` method per type of `Op`.

    A concrete subclass that lacks a method for some op type is refused when the class is defined (at
    import), with the missing methods named: adding an op type to `Op` breaks every consumer that does not
    handle it, instead of letting it skip the new op silently. An intermediate base that leaves methods to
    its subclasses says so with `class Base(OpVisitor[R], partial=True)`.

    `visit(op)` calls the method for `type(op)` through a type -> method table (exact types: ops are
    NamedTuples and are not subclassed). A hot loop takes `dispatcher()` once, a type -> bound method
    dict, and calls `dispatcher[type(op)](op)` per op.
    """

    _op_methods: ClassVar[dict[type, Callable[..., Any]]] = {}

    def __init_subclass__(cls, partial: bool = False, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if partial:
            return
        missing = missing_visit_methods(cls)
        if missing:
            raise TypeError(
                f"{cls.__module__}.{cls.__qualname__} does not handle every op type: it lacks "
                f"{', '.join(missing)} (an OpVisitor needs one visit_* method per type of racefuzz.program.Op)"
            )
        cls._op_methods = {op_type: getattr(cls, name) for op_type, name in OP_METHODS.items()}

    def visit(self, op: Op) -> R:
        """Call the method for `op`'s type and return what it returns."""
        return self._op_methods[type(op)](self, op)

    def visit_all(self, ops: Iterable[Op]) -> None:
        """Visit every op in order, discarding the results."""
        dispatch = self.dispatcher()
        for op in ops:
            dispatch[type(op)](op)

    def dispatcher(self) -> dict[type, Callable[[Any], R]]:
        """Op type -> this visitor's bound method for it: `dispatcher()[type(op)](op)` is `visit(op)`."""
        return {op_type: getattr(self, name) for op_type, name in OP_METHODS.items()}

    def visit_launch(self, op: Launch) -> R:
        raise NotImplementedError

    def visit_record(self, op: Record) -> R:
        raise NotImplementedError

    def visit_wait_event(self, op: WaitEvent) -> R:
        raise NotImplementedError

    def visit_wait_stream(self, op: WaitStream) -> R:
        raise NotImplementedError

    def visit_event_sync(self, op: EventSync) -> R:
        raise NotImplementedError

    def visit_stream_sync(self, op: StreamSync) -> R:
        raise NotImplementedError

    def visit_device_sync(self, op: DeviceSync) -> R:
        raise NotImplementedError

    def visit_host_delay(self, op: HostDelay) -> R:
        raise NotImplementedError


def missing_visit_methods(cls: type, op_types: Iterable[type] = OP_TYPES) -> list[str]:
    """The `visit_*` methods that `cls` lacks for `op_types`: not defined, or only `OpVisitor`'s stub."""
    missing = []
    for op_type in op_types:
        name = _method_name(op_type)
        method = getattr(cls, name, None)
        if method is None or method is OpVisitor.__dict__.get(name):
            missing.append(name)
    return missing


@dataclass(frozen=True)
class Program:
    """A finished host program: its objects and its ops in host issue order (`ops[i].index == i`).

    `violations` are invariants the scenario itself found broken while issuing (for example a forward
    reading cells its request never allocated): timing-independent, like the happens-before oracle.
    """

    streams: tuple[Stream, ...]
    events: tuple[Event, ...]
    buffers: tuple[Buffer, ...]
    ops: tuple[Op, ...]
    violations: tuple[str, ...] = ()

    @property
    def launches(self) -> list[Launch]:
        return [op for op in self.ops if isinstance(op, Launch)]


PROGRAMS_KEPT = 64
"""Programs whose derived facts a `per_program` function keeps (a search reruns most of its workloads'
programs)."""

D = TypeVar("D")


def per_program(derive: Callable[[Program], D]) -> Callable[[Program], D]:
    """`derive`, memoized on the program object: the same result object for the same program, for the last
    PROGRAMS_KEPT programs. Keyed by identity (a program is immutable, and two equal ones are built apart);
    a weak reference tells a live program from a dead one whose id was reused."""
    kept: dict[int, tuple[weakref.ref[Program], D]] = {}

    def memoized(program: Program) -> D:
        known = kept.get(id(program))
        if known is not None and known[0]() is program:
            return known[1]
        result = derive(program)
        if len(kept) >= PROGRAMS_KEPT:
            dead = [key for key, (ref, _) in kept.items() if ref() is None]
            for key in dead or list(kept)[: PROGRAMS_KEPT // 2]:
                del kept[key]
        kept[id(program)] = (weakref.ref(program), result)
        return result

    return functools.update_wrapper(memoized, derive)


def program_to_json(program: Program) -> dict[str, object]:
    """`program` as plain JSON (`program_from_json` reads it back equal): streams and events by name,
    buffers with their allocations, ops by type with their objects as indices and cell ranges as
    `[buffer, row0, row1, col0, col1]`. Committed traces of real code let CPU CI judge steps recorded on a
    GPU; a launch's `info` must hold JSON values."""

    def cells(ranges: tuple[CellRange, ...]) -> list[list[int]]:
        return [[c.buffer.id, c.row0, c.row1, c.col0, c.col1] for c in ranges]

    ops: list[dict[str, object]] = []
    for op in program.ops:
        kind = type(op).__name__
        if type(op) is Launch:
            entry: dict[str, object] = {
                "op": kind,
                "stream": op.stream.id,
                "kernel": op.kernel,
                "reads": cells(op.reads),
                "writes": cells(op.writes),
            }
            if op.values:
                entry["values"] = [np.asarray(v).tolist() for v in op.values]
            if op.cost_us is not None:
                entry["cost_us"] = op.cost_us
            if op.info:
                entry["info"] = dict(op.info)
            if op.unused_from is not None:
                entry["unused_from"] = op.unused_from
        else:
            entry = {"op": kind}
            for name, value in op._asdict().items():
                if name != "index":
                    entry[name] = value.id if isinstance(value, (Stream, Event)) else value
        ops.append(entry)
    return {
        "streams": [s.name for s in program.streams],
        "events": [e.name for e in program.events],
        "buffers": [
            {
                "name": b.name,
                "rows": b.rows,
                "cols": b.cols,
                "fill": b.fill,
                **({"allocation": list(b.allocation)} if b.allocation is not None else {}),
            }
            for b in program.buffers
        ],
        "ops": ops,
        "violations": list(program.violations),
    }


_JSON_OP_TYPES: Mapping[str, type] = MappingProxyType({op_type.__name__: op_type for op_type in OP_TYPES})


def program_from_json(data: Mapping[str, Any]) -> Program:
    """The `Program` that `program_to_json` wrote; `InvalidProgram` for JSON that is not one."""
    try:
        streams = tuple(Stream(StreamId(i), str(name)) for i, name in enumerate(data["streams"]))
        events = tuple(Event(EventId(i), str(name)) for i, name in enumerate(data["events"]))
        buffers = tuple(
            Buffer(
                BufferId(i),
                str(b["name"]),
                int(b["rows"]),
                int(b["cols"]),
                int(b.get("fill", 0)),
                Allocation(int(b["allocation"][0]), int(b["allocation"][1]), str(b["allocation"][2]))
                if "allocation" in b
                else None,
            )
            for i, b in enumerate(data["buffers"])
        )

        def cells(items: list) -> tuple[CellRange, ...]:
            return tuple(CellRange(buffers[b], int(r0), int(r1), int(c0), int(c1)) for b, r0, r1, c0, c1 in items)

        ops: list[Op] = []
        for raw in data["ops"]:
            op_type = _JSON_OP_TYPES[raw["op"]]
            index = len(ops)
            if op_type is Launch:
                writes = cells(raw["writes"])
                values = (
                    tuple(
                        np.asarray(v, dtype=np.int32).reshape(w.shape)
                        for v, w in zip(raw["values"], writes, strict=True)
                    )
                    if "values" in raw
                    else ()
                )
                ops.append(
                    Launch(
                        index,
                        streams[raw["stream"]],
                        str(raw["kernel"]),
                        cells(raw["reads"]),
                        writes,
                        values,
                        raw.get("cost_us"),
                        MappingProxyType(dict(raw.get("info", {}))),
                        raw.get("unused_from"),
                    )
                )
                continue
            fields: dict[str, Any] = {}
            for name in op_type._fields[1:]:  # type: ignore[attr-defined]
                value = raw[name]
                fields[name] = (
                    events[value] if name == "event" else streams[value] if name in ("stream", "other") else value
                )
            ops.append(op_type(index, **fields))
        return Program(streams, events, buffers, tuple(ops), tuple(str(v) for v in data.get("violations", ())))
    except (KeyError, IndexError, TypeError, ValueError) as error:
        raise InvalidProgram(f"not a program's JSON: {type(error).__name__}: {error}") from None
