"""What a traced step did, in host order: launches with their byte intervals, stream and event operations,
host syncs. Pure data (no torch), written by the recorders and read by `convert` and the report. Ops are
NamedTuples, as the IR's: a recorder makes one per torch op, and a frozen dataclass costs several times
more to construct.

Streams and events are named by strings that are stable across runs of the same step (the name the step
gave them, else the order in which the recorder first saw them), so that a delay point or a launch of one
run names the same thing in another.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from racefuzz.trace.intervals import Interval

HOST = "host"
"""The stream name of the host's own reads and writes of device or pinned memory (`.item()` results
read by Python, pinned buffers filled by the host): the host is a participant like a stream."""


@dataclass(frozen=True)
class Storage:
    """One allocation (one epoch of one device block) the step touched.

    Args:
        key: the recorder's id for it (a freed-and-reused block gets a new key).
        name: what the report calls it (the name the step gave the tensor, else where it came from).
        nbytes: its size.
        itemsize: the element size of the tensor first seen on it (to print byte ranges as elements).
        row_bytes: bytes per row when it was first seen as a 2-D table, else 0 (to print `R[row, c0:c1]`).
        allocated_on: the stream it was allocated on while recording; "" for a storage made before the
            recording or a pinned host block (no stream's pool): what the lifetime model
            (`racefuzz.trace.lifetime`) takes as an allocation that may reuse a freed block.
    """

    key: int
    name: str
    nbytes: int
    itemsize: int = 1
    row_bytes: int = 0
    allocated_on: str = ""

    def describe(self, start: int, end: int) -> str:
        """`req_to_token[1, 4:8]` for a byte range inside one row, else elements or bytes."""
        size = self.itemsize
        if start % size or end % size:
            return f"{self.name} bytes [{start}, {end})"
        if self.row_bytes and start // self.row_bytes == (end - 1) // self.row_bytes:
            row, base = divmod(start, self.row_bytes)
            return f"{self.name}[{row}, {base // size}:{base // size + (end - start) // size}]"
        return f"{self.name}[{start // size}:{end // size}] (flat)"


class Access(NamedTuple):
    """The bytes one launch touched in one storage, as sorted, merged intervals."""

    storage: int
    intervals: tuple[Interval, ...]


class TraceLaunch(NamedTuple):
    """One kernel (a torch op, a Triton or CuPy kernel, a host access, a free) as the step issued it.

    Args:
        index: its position among the trace's ops.
        stream: the stream it was enqueued on (`HOST` for the host's own accesses).
        kernel: the torch op (`aten.index.Tensor`), Triton kernel or CuPy kernel name.
        kind: `torch`, `triton`, `cupy`, `host`, `free`, or `copy` (a copy torch made out of the dispatch
            mode's sight, `torch.tensor`'s to the GPU, recorded after it ran: no delay point).
        reads, writes: the bytes it loads and stores.
        source: `file:line (function)` of the user's line that launched it.
        assumed: its read/write sets are the conservative default (no annotation).
    """

    index: int
    stream: str
    kernel: str
    kind: str
    reads: tuple[Access, ...]
    writes: tuple[Access, ...]
    source: str = ""
    assumed: bool = False

    def describe(self) -> str:
        where = f" at {self.source}" if self.source else ""
        return f"#{self.index} {self.kernel} on {self.stream}{where}"


class TraceRecord(NamedTuple):
    """`event.record(stream)`."""

    index: int
    event: str
    stream: str


class TraceWait(NamedTuple):
    """`stream.wait_event(event)` (and the wait half of `stream.wait_stream(other)`)."""

    index: int
    stream: str
    event: str


class TraceStreamSync(NamedTuple):
    """The host blocked until `stream` drained (`stream.synchronize()`, `.item()`, a blocking copy)."""

    index: int
    stream: str


class TraceEventSync(NamedTuple):
    """The host blocked until the latest record of `event` completed."""

    index: int
    event: str


class TraceDeviceSync(NamedTuple):
    """`torch.cuda.synchronize()`."""

    index: int


TraceOp = TraceLaunch | TraceRecord | TraceWait | TraceStreamSync | TraceEventSync | TraceDeviceSync


@dataclass
class Trace:
    """A recorded step: its storages, streams (in order of first use) and ops in host order."""

    storages: dict[int, Storage] = field(default_factory=dict)
    streams: list[str] = field(default_factory=list)
    ops: list[TraceOp] = field(default_factory=list)
    assumed_kernels: list[str] = field(default_factory=list)
    whole_view_indexing: list[str] = field(default_factory=list)
    """Index ops recorded over their whole views: their index values could not be read where they are the
    ones the op sees (a GPU run that is not serialized), or were of a kind racefuzz does not know."""

    @property
    def launches(self) -> list[TraceLaunch]:
        return [op for op in self.ops if isinstance(op, TraceLaunch)]


_OP_TYPES = {
    cls.__name__: cls for cls in (TraceLaunch, TraceRecord, TraceWait, TraceStreamSync, TraceEventSync, TraceDeviceSync)
}


def trace_to_json(trace: Trace) -> dict[str, object]:
    """A trace as plain JSON (committed traces let CPU CI judge traces recorded on a GPU)."""
    ops: list[dict[str, object]] = []
    for op in trace.ops:
        fields = op._asdict()
        if isinstance(op, TraceLaunch):
            fields["reads"] = [[a.storage, [list(iv) for iv in a.intervals]] for a in op.reads]
            fields["writes"] = [[a.storage, [list(iv) for iv in a.intervals]] for a in op.writes]
        ops.append({"op": type(op).__name__, **fields})
    return {
        "storages": [vars(storage) for storage in trace.storages.values()],
        "streams": list(trace.streams),
        "assumed_kernels": list(trace.assumed_kernels),
        "whole_view_indexing": list(trace.whole_view_indexing),
        "ops": ops,
    }


def trace_from_json(data: dict) -> Trace:
    """The inverse of `trace_to_json`."""

    def accesses(items: list) -> tuple[Access, ...]:
        return tuple(Access(int(key), tuple((int(a), int(b)) for a, b in intervals)) for key, intervals in items)

    ops: list[TraceOp] = []
    for raw in data["ops"]:
        fields = dict(raw)
        cls = _OP_TYPES[fields.pop("op")]
        if cls is TraceLaunch:
            fields["reads"], fields["writes"] = accesses(fields["reads"]), accesses(fields["writes"])
        ops.append(cls(**fields))
    storages = {int(s["key"]): Storage(**s) for s in data["storages"]}
    return Trace(
        storages,
        list(data["streams"]),
        ops,
        list(data.get("assumed_kernels", ())),
        list(data.get("whole_view_indexing", ())),
    )
