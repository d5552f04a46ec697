"""The recorder: turns what a step does into a `Program` (through `racefuzz.trace.builder`), and is where delays
and value snapshots happen.

Frontends report to the active `Recorder`:

* torch ops through `TraceMode`, a `TorchDispatchMode` (`racefuzz.trace.torch_mode`): read and write sets from
  the op's schema (`racefuzz.trace.op_schemas`: `alias_info.is_write` for in-place and `out=` arguments, fresh
  outputs written, views and allocations are not accesses), the stream from the current stream; most ops
  (in-place, `out=`, fresh outputs from tensor inputs) through the C++ fast path
  (`racefuzz/trace/_fastpath.cpp`: below torch's dispatcher, before the op reaches the mode), which does what
  `launch_op` / `launch` do, and what `StorageTable.key`, `allocated`, `StorageTable.watch` and `on_free` do
  for its ops' new storages, fresh outputs and their frees, with this recorder's own containers, its
  `StorageTable`'s and its `ProgramBuilder`'s (`fast_state`), and hands anything unusual (a strided view's
  accesses, a storage grown in place) back to its methods;
* Triton launches through a wrapper of `JITFunction.run` (`racefuzz.trace.triton_launches`): arguments and the
  kernel's name; sets from its annotation, else the conservative default;
* stream and event operations and host syncs through `torch.cuda`'s `Event` / `Stream` methods and
  `torch.cuda.synchronize` (GPU, `racefuzz.trace.cuda_api`) and the ops that sync the host
  (`.item()`, blocking copies, `nonzero`, ...), or the virtual streams of `TraceEnv` (CPU);
* allocations: a storage a torch op returns while recording (`allocated`) is watched (a weak reference
  with a callback) and its death is its free: a freed block is a new storage when reused, and the free
  is recorded as a write of the whole block on the stream it was allocated on (not for a pinned host block,
  which torch's host allocator reuses only after the copies that used it). The caching allocator may hand
  the block to that stream's next allocation: `racefuzz.trace.lifetime` moves the write there (each
  storage's `Allocation` names the stream it was allocated on, `allocated_on`), so a use on another stream not ordered
  before that reuse is a race, and one with no reuse in the trace a latent hazard. (A storage's Python
  object lives exactly as long as the storage: torch preserves it while C++ holds the storage.) A storage
  seen at a new address was grown in place: its old block is freed then.

Every launch gets an ordinal (its position among launches). The same step run twice launches the same
sequence, so an ordinal names "the same launch" in the serialized reference run and in a fuzzed run:
delay points are (stream, n-th launch on it) and value snapshots are keyed by ordinal.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from racefuzz.program import Allocation, CellRange, Launch, Program, StreamSync
from racefuzz.trace import sources
from racefuzz.trace.annotations import WHOLE, annotation
from racefuzz.trace.builder import HOST, ProgramBuilder
from racefuzz.trace.indexing import Region
from racefuzz.trace.intervals import Interval, merge, view_intervals
from racefuzz.trace.sources import user_source
from racefuzz.trace.storages import StorageTable

SPIN_CYCLES_PER_US = 1980
"""`torch.cuda._sleep` counts SM clock cycles; at the H200's 1.98 GHz boost clock one microsecond is about
this many (a slower clock makes the spin longer, which is harmless for a delay)."""

_tuple_new = tuple.__new__
"""Makes a cell range (a NamedTuple) from all its fields without its Python `__new__` (the launch path's
hottest lines: every field is given)."""


@dataclass
class Snapshot:
    """What one launch stored into one storage: bytes `[lo, hi)` of it, compared only on `intervals`."""

    slot: object
    lo: int
    hi: int
    intervals: tuple[Interval, ...]
    data: Any = None  # a uint8 tensor of hi - lo bytes (moved to the CPU at the end of the run)


@dataclass
class RunRecord:
    """What one run of a step left: its program (as its builder emitted it), per-launch snapshots, what it
    returned, the delays it applied, and what the report says of how its sets were taken."""

    builder: ProgramBuilder
    snapshots: dict[int, list[Snapshot]] = field(default_factory=dict)
    outputs: Mapping[str, Any] = field(default_factory=dict)
    delays_applied: list[tuple[str, int, float]] = field(default_factory=list)
    launch_ops: list[int] = field(default_factory=list)  # ordinal -> index in the program's ops
    assumed_kernels: list[str] = field(default_factory=list)
    """Kernels whose read/write sets are the conservative default (no annotation)."""
    whole_view_indexing: list[str] = field(default_factory=list)
    """Index ops recorded over their whole views: their index values could not be read where they are the
    ones the op sees (a GPU run that is not serialized), or were of a kind racefuzz does not know."""

    @property
    def program(self) -> Program:
        """The run's program (`ProgramBuilder.program`)."""
        return self.builder.program()

    def kernel_sequence(self) -> list[tuple[str, str]]:
        """(stream, kernel) of every launch (by ordinal): what two runs of one step must agree on. Frees
        and host accesses are not launches: when the host frees a tensor depends on Python's garbage
        collector, not on the step's control flow."""
        ops = self.builder.ops
        return [(ops[i].stream.name, ops[i].kernel) for i in self.launch_ops]  # type: ignore[union-attr]


class Recorder:
    """Collects one run's program (see the module doc).

    Args:
        device: `cuda` or `cpu` (a CPU run records virtual streams and executes eagerly).
        evaluate_annotations: evaluate kernels' annotations (may read device values: the reference run only).
        serialize: synchronize the device after every launch (the reference run).
        delays: (stream, n) -> microseconds to spin on `stream` before its n-th launch (0-based).
        gates: the forced orders of the run (`racefuzz.trace.orders.Gates`): a gate's wait enqueued before its
            `then` launch point, its signal after its `first` (after that launch's snapshots).
        snapshot_plan: ordinal -> the snapshots to take after that launch; None: take one per write
            (the reference run, which makes the plan for the fuzzed runs).
        run_kernels: False records Triton / CuPy / `launch_kernel` launches from their annotations without
            running them: the happens-before trace of GPU code on a machine that cannot run its kernels
            (values are then meaningless; torch ops still run).
        watch_frees: record the frees of storages allocated while recording (default: on, on both devices:
            a CPU run models frees as a GPU run does, so the caching-allocator races are its verdict too;
            off, a run keeps every storage it saw alive instead, so that no address is reused within it).
    """

    def __init__(
        self,
        device: str,
        *,
        evaluate_annotations: bool = True,
        serialize: bool = False,
        delays: Mapping[tuple[str, int], float] | None = None,
        snapshot_plan: Mapping[int, list[Snapshot]] | None = None,
        run_kernels: bool = True,
        watch_frees: bool | None = None,
        gates: Any = None,
    ) -> None:
        self.device = device
        self.run_kernels = run_kernels
        self.on_gpu = device.startswith("cuda")
        self.evaluate_annotations = evaluate_annotations
        self.serialize = serialize
        self.delays = dict(delays or {})
        """(stream, n) -> microseconds: the launch points `delay` acts at (0: a gate's point, no spin)."""
        self.gates = gates
        self._signal_due: tuple[str, int] | None = None
        """The launch point whose gate signals are due after the launch in progress (`after_launch`)."""
        if gates is not None:
            for point in gates.points:
                self.delays.setdefault(point, 0.0)
        self.snapshot_plan = snapshot_plan
        self._snapshots_or_syncs = snapshot_plan is None or bool(snapshot_plan) or serialize or gates is not None
        """Whether a launch is followed by snapshots or a device sync (not in a trace-only run)."""
        self.builder = ProgramBuilder()
        """What every op is emitted through (`racefuzz.trace.builder`)."""
        self.record = RunRecord(self.builder)
        self.paused = 0
        self.opaque = 0
        self._stream_names: dict[int, str] = {0: "default"}
        self._seen_streams = self.builder.streams
        """The streams seen so far, by name (the builder's: a stream is seen once it has its `Stream`)."""
        self.device_index = 0
        self.raw_stream: Callable[[int], int] | None = None
        """`torch._C._cuda_getCurrentRawStream` in a GPU run (looked up once, not per op), else None."""
        self.wait_stream_event: Any = None
        """The event `stream.wait_stream(other)` records and waits on while this recorder is active (GPU)."""
        self.thread: int | None = None
        """The thread that entered `recording` with this recorder (`threading.get_ident()`)."""
        if self.on_gpu:
            import torch

            self.device_index = torch.cuda.current_device()
            self.raw_stream = torch._C._cuda_getCurrentRawStream
        self._event_names: dict[int, str] = {}
        self._events = 0
        self._given_event_names: set[str] = set()
        self._virtual_handles = 0
        """How many virtual streams were named (their stand-in handles are -1, -2, ...: no CUDA handle is)."""
        self._launches_on: dict[str, int] = {}
        self._self_ref = weakref.ref(self)
        self.watch_frees = True if watch_frees is None else watch_frees
        self.storage_table = StorageTable(self.builder, self.watch_frees, self._self_ref)
        """The run's storages: keys, epochs, watched storages, allocation streams (the C++ fast path's too)."""
        self.active = False
        """Whether this recorder is recording now (set by `racefuzz.trace.capture.recording`)."""
        self._warned: set[str] = set()
        from racefuzz.trace.env import VirtualStream

        # A proxy, not the recorder itself: no reference cycle, so a finished run's trace is freed when its
        # last user lets go of it instead of waiting (with every other run's) for a full collection.
        self.virtual_current = VirtualStream(weakref.proxy(self), "default")
        self.virtual_default = self.virtual_current
        """The default stream of a CPU run (`torch.cuda.default_stream()` inside a CPU recording)."""
        self.lifting_to_device = 0
        """Inside a CPU run's `torch.tensor(data, device=...)` (`racefuzz.trace.torch_patches`): its tensor is a
        device tensor's copy from the host, as in a GPU run (`TraceMode._lifted`)."""
        self.exact_indexing = evaluate_annotations and (not self.on_gpu or serialize)
        """Whether index ops (`index`, `index_select`, `gather`, `index_put_`, ...) get the byte sets their
        index values select (`racefuzz.trace.indexing`): where the values are those the op sees in host
        order, read without changing the run: a CPU run (eager) or a GPU reference run (serialized). Else
        the op's whole views, said once in `RunRecord.whole_view_indexing`."""

    def fast_state(self, bail: object) -> dict[str, Any]:
        """What the C++ fast path (`racefuzz.trace._fastpath.cpp`) reads and appends to, by name (its
        `STATE_FIELDS`; `racefuzz.trace.fastpath.pack_state` checks the names and packs them): this recorder's
        own containers, its storage table's and its builder's, so an op, buffer, allocation or free it records
        is the one `launch_op`, `StorageTable.key`, `allocated` and `on_free` would."""
        table = self.storage_table
        builder = self.builder
        return {
            "recorder": self,
            "bail": bail,
            "builder": builder,
            "ops": builder.ops,
            "buffers": builder.buffers,
            "torch_infos": builder.torch_infos,
            "host_count": builder.host_count,
            "after_host": builder.after_host,
            "launch_ops": self.record.launch_ops,
            "storage_table": table,
            "keys": table.keys,
            "epochs": table.epochs,
            "stream_names": self._stream_names,
            "streams": builder.streams,
            "delays": self.delays,
            "snapshots_or_syncs": bool(self._snapshots_or_syncs),  # the C++ compares with True
            "on_gpu": bool(self.on_gpu),
            "raw_stream": self.raw_stream,
            "device_index": self.device_index,
            "alloc_streams": table.alloc_streams,
            "recorded_streams": table.recorded_streams,
            "address_of": table.address_of,
            "watched": table.watched,
            "given_names": table.given_names,
            "keep": table.keep,
            "watch_frees": bool(table.watch_frees),
            "recorder_ref": self._self_ref,
        }

    # --- names -------------------------------------------------------------------------------------

    def name_stream(self, handle: int, name: str) -> None:
        self._stream_names[handle] = name

    def _stream(self, name: str) -> str:
        if name not in self._seen_streams:
            self.builder.stream(name)
        return name

    def current_stream(self) -> str:
        if self.on_gpu:
            handle = self.raw_stream(self.device_index)
            name = self._stream_names.get(handle)
            if name is not None and name in self._seen_streams:
                return name
            return self._stream(self.stream_name(handle))
        name = self.virtual_current.name
        return name if name in self._seen_streams else self._stream(name)

    def stream_name(self, handle: int) -> str:
        if handle not in self._stream_names:
            self._stream_names[handle] = f"stream#{len(self._stream_names)}"
        return self._stream_names[handle]

    def name_virtual_stream(self, stream: Any, name: str) -> None:
        """A CPU run's `env.stream(name)`: counted among the named streams, as a GPU run counts the handle
        it names, so that the streams a step makes with torch get the `stream#k` names a GPU run gives."""
        self._virtual_handles += 1
        self._stream_names[-self._virtual_handles] = name

    def new_virtual_stream_name(self) -> str:
        """The name of a stream the step made with torch's API in a CPU run (`stream#k`, as on a GPU)."""
        self._virtual_handles += 1
        return self.stream_name(-self._virtual_handles)

    def event_name(self, handle: int, event: Any = None) -> str:
        """The name of the CUDA event `handle`: the name `name_event` gave `event`, else `event#k`."""
        if handle not in self._event_names:
            given = getattr(event, "_racefuzz_name", None) if event is not None else None
            self._event_names[handle] = given if given is not None else self.new_event_name()
        return self._event_names[handle]

    def new_event_name(self) -> str:
        self._events += 1
        return f"event#{self._events}"

    def given_event_name(self, name: str) -> str:
        """`name`, or `name#2`, `name#3`, ... if an event of this run has it already (a trace names an event
        by its name: two events of one name would be taken for one)."""
        unique, k = name, 1
        while unique in self._given_event_names:
            k += 1
            unique = f"{name}#{k}"
        self._given_event_names.add(unique)
        return unique

    def name_event(self, event: Any, name: str) -> None:
        """Call the `torch.cuda.Event` `event` `name` (its CUDA handle exists only from its first record,
        where `event_name` takes the name up)."""
        event._racefuzz_name = self.given_event_name(name)

    def name_storage(self, tensor: Any, name: str) -> None:
        """Call `tensor`'s storage `name`; a 2-D tensor also gives the row length reports print with."""
        self.storage_table.given_names[tensor.untyped_storage().data_ptr()] = name
        key = self.storage_table.key(tensor, name)
        old = self.builder.buffers[key].allocation
        assert old is not None  # every buffer of a recording is a storage's
        row_bytes = tensor.stride(0) * tensor.element_size() if tensor.dim() == 2 else old.row_bytes
        self.builder.replace_buffer(key, name, Allocation(tensor.element_size(), row_bytes, old.allocated_on))

    # --- storages (the table's; see `racefuzz.trace.storages`) ------------------------------------------

    def knows(self, tensor: Any) -> bool:
        """Whether the recorder has a key for `tensor`'s storage in its current epoch (`StorageTable.knows`)."""
        return self.storage_table.knows(tensor)

    def allocated(self, tensor: Any) -> None:
        """`tensor` is a fresh allocation on the current stream: its free is a write on that stream (`on_free`),
        unless it is a pinned host block of a GPU run (see below)."""
        storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
        if ptr:
            # Not a pinned host block's: torch's host allocator hands one out again only after every copy that
            # used it has finished (it records an event per copy), so its free is no write on a stream.
            # Watched all the same: its reuse is a new storage.
            stream = self.current_stream() if not self.on_gpu or tensor.is_cuda else None
            self.storage_table.allocated(storage, ptr, stream)

    def resized(self, tensor: Any) -> None:
        """`tensor.resize_(...)` ran: a storage seen before that now lives elsewhere moved (`StorageTable.watch`)."""
        self.storage_table.resized(tensor.untyped_storage())

    def _accesses(self, tensors: list[Any], origin: str) -> tuple[CellRange, ...]:
        """The accesses of `tensors`: views (their bytes), or `Region`s (the bytes an index op selected)."""
        if len(tensors) == 1 and type(tensors[0]) is not Region:
            return self._access(tensors[0], origin)
        return self.merged_accesses(tensors, origin) if tensors else ()

    def merged_accesses(self, tensors: list[Any], origin: str) -> tuple[CellRange, ...]:
        """The byte intervals of `tensors`, merged per storage, as cell ranges of its buffer: storages in
        first-seen order, each one's intervals sorted."""
        by_storage: dict[int, list[Interval]] = {}
        for tensor in tensors:
            if type(tensor) is Region:
                by_storage.setdefault(self.storage_table.key(tensor.tensor, origin), []).extend(tensor.intervals)
                continue
            key = self.storage_table.key(tensor, origin)
            size = tensor.element_size()
            if tensor.is_contiguous():
                start = tensor.storage_offset() * size
                intervals = [(start, start + tensor.numel() * size)] if tensor.numel() else []
            else:
                intervals, _ = view_intervals(tensor.storage_offset(), tensor.shape, tensor.stride(), size)
            by_storage.setdefault(key, []).extend(intervals)
        buffers = self.builder.buffers
        return tuple(
            _tuple_new(CellRange, (buffers[key], 0, 1, start, end))
            for key, intervals in by_storage.items()
            for start, end in merge(intervals)
        )

    def _access(self, tensor: Any, origin: str) -> tuple[CellRange, ...]:
        """`_accesses` of one tensor; a contiguous one (the common case) without the merging."""
        if not tensor.is_contiguous():
            return self.merged_accesses([tensor], origin)
        nbytes = tensor.nbytes
        if not nbytes:
            return ()
        start = tensor.storage_offset() * tensor.itemsize
        # A known storage found from the base address (as `StorageTable.key` does, without its calls).
        base = tensor.data_ptr() - start
        table = self.storage_table
        key = table.keys.get((base, table.epochs.get(base, 0)))
        if key is None:
            key = table.key(tensor, origin)
        return (_tuple_new(CellRange, (self.builder.buffers[key], 0, 1, start, start + nbytes)),)

    # --- launches ----------------------------------------------------------------------------------

    def launch(
        self,
        kernel: str,
        kind: str,
        call: Callable[[], Any],
        reads: list[Any],
        writes: list[tuple[object, Any]],
        *,
        outputs: Callable[[Any], list[tuple[object, Any]]] | None = None,
        assumed: bool = False,
        host_sync: Callable[[Any], str] | None = None,
    ) -> Any:
        """Record one launch, apply its delay, run `call`, take its snapshots; return what `call` returned.

        `writes` pairs each written view with its slot (how the same tensor is found in another run's
        launch: an argument name or position); `outputs(result)` gives the fresh tensors the call returned,
        written too, with their slots. `host_sync(result)` says where the host waited for the stream during
        the call: "before" the launch's kernels (a sync recorded ahead of the launch), "after" them, or "".
        """
        stream = self.current_stream()
        if self.delays and kind != "copy":
            self.delay(stream)
        source = user_source(3)
        if kind in ("torch", "copy"):
            result = call()
        else:
            # The launch is opaque: torch ops and stream operations inside it (a Python launcher's own
            # bookkeeping) are not the step's; allocations still are.
            self.opaque += 1
            try:
                result = call()
            finally:
                self.opaque -= 1
        if outputs is not None:
            writes = writes + outputs(result)
        synced = host_sync(result) if host_sync is not None else ""
        if synced == "before":
            self.on_stream_sync(stream)
        self._append_launch(stream, kernel, kind, reads, writes, source, assumed)
        if synced == "after":
            self.on_stream_sync(stream)
        return result

    def launch_op(
        self, kernel: str, func: Any, args: tuple, kwargs: dict, reads: list[Any], writes: list[tuple[object, Any]]
    ) -> Any:
        """`launch` of a torch op `func(*args, **kwargs)` that returns no fresh tensors (an in-place or
        `out=` op: every write is an argument), recorded exactly as `launch` records it: the hot path."""
        stream = self.current_stream()
        if self.delays:
            self.delay(stream)
        source = user_source(3)
        result = func(*args, **kwargs)
        self._append_launch(stream, kernel, "torch", reads, writes, source, False)
        return result

    def _append_launch(
        self,
        stream: str,
        kernel: str,
        kind: str,
        reads: list[Any],
        writes: list[tuple[object, Any]],
        source: str,
        assumed: bool,
    ) -> None:
        """Emit the `Launch` of a launch that has run (its accesses from the views now), then take its
        snapshots."""
        record = self.record
        if len(writes) == 1 and type(writes[0][1]) is not Region:
            written = self._access(writes[0][1], kernel)
        else:
            written = self._accesses([view for _, view in writes], kernel)
        read = self._accesses(reads, kernel)
        # The index after the accesses: a new storage seen there may have recorded a free first (`StorageTable.watch`).
        ordinal = len(record.launch_ops)
        record.launch_ops.append(self.builder.launch(stream, kernel, kind, read, written, source, assumed))
        if self._snapshots_or_syncs:
            self.after_launch(ordinal, writes)

    def delay(self, stream: str) -> None:
        """Count this launch on `stream` and act at its launch point: spin if a delay is planned there, then
        enqueue the waits of the gates that hold it back (and note the signals due after it)."""
        nth = self._launches_on.get(stream, 0)
        self._launches_on[stream] = nth + 1
        spin = self.delays.get((stream, nth))
        if spin:
            self._spin(spin)
            self.record.delays_applied.append((stream, nth, spin))
        if self.gates is not None:
            self.paused += 1
            try:
                self._signal_due = (stream, nth) if self.gates.before((stream, nth)) else None
            finally:
                self.paused -= 1

    def after_launch(self, ordinal: int, writes: list[tuple[object, Any]]) -> None:
        """After a launch: its snapshots, then the signals of the gates whose `first` it is."""
        self._snapshot(ordinal, writes)
        if self._signal_due is not None:
            point, self._signal_due = self._signal_due, None
            self.paused += 1
            try:
                self.gates.after(point)
            finally:
                self.paused -= 1

    def _snapshot(self, ordinal: int, writes: list[tuple[object, Any]]) -> None:
        if not self.snapshot_plan and self.snapshot_plan is not None and not self.serialize:
            return  # a trace-only run: nothing to copy, nothing to wait for
        import torch

        self.paused += 1
        try:
            # The copies are the recorder's own: they skip the dispatch mode (and any other Python mode)
            # instead of entering it to be let through.
            with torch._C._DisableTorchDispatch():
                if self.snapshot_plan is None:
                    plan_here = self._plan_from(writes)
                else:
                    plan_here = [Snapshot(s.slot, s.lo, s.hi, s.intervals) for s in self.snapshot_plan.get(ordinal, ())]
                if plan_here:
                    slots = {slot: view.tensor if type(view) is Region else view for slot, view in writes}
                    taken = []
                    for snap in plan_here:
                        tensor = slots.get(snap.slot)
                        # A nested tensor's storage is not its bytes to copy (a jagged one's copy crashed
                        # the process), a meta tensor has none: their writes are not compared by the value
                        # oracle.
                        if (
                            tensor is not None
                            and not tensor.is_nested
                            and not tensor.is_meta
                            and tensor.untyped_storage().nbytes() >= snap.hi
                        ):
                            snap.data = _storage_bytes(tensor, snap.lo, snap.hi)
                            taken.append(snap)
                    self.record.snapshots[ordinal] = taken
                if self.serialize and self.on_gpu:
                    torch.cuda.synchronize()
        finally:
            self.paused -= 1

    def _plan_from(self, writes: list[tuple[object, Any]]) -> list[Snapshot]:
        by_slot: dict[object, list[Interval]] = {}
        tensors: dict[object, Any] = {}
        for slot, view in writes:
            if type(view) is Region:
                by_slot.setdefault(slot, []).extend(view.intervals)
                continue
            if view.is_contiguous():
                start = view.storage_offset() * view.itemsize
                intervals = [(start, start + view.nbytes)] if view.nbytes else []
            else:
                intervals, _ = view_intervals(view.storage_offset(), view.shape, view.stride(), view.element_size())
            by_slot.setdefault(slot, []).extend(intervals)
            tensors[slot] = view
        plan = []
        for slot, intervals in by_slot.items():
            merged = merge(intervals)
            if merged:
                plan.append(Snapshot(slot, merged[0][0], merged[-1][1], tuple(merged)))
        return plan

    def _spin(self, us: float) -> None:
        if not self.on_gpu:
            return  # a CPU run executes eagerly: a delay changes nothing, it is only recorded
        import torch

        self.paused += 1
        try:
            torch.cuda._sleep(int(us * SPIN_CYCLES_PER_US))
        finally:
            self.paused -= 1

    def whole_view(self, kernel: str) -> None:
        """The index op `kernel` was recorded over its whole views (see `exact_indexing`); said once, in the
        trace of a run that evaluates annotations (the one that is judged)."""
        if self.evaluate_annotations and kernel not in self.record.whole_view_indexing:
            self.record.whole_view_indexing.append(kernel)

    def assumed(self, kernel: str) -> None:
        if kernel not in self.record.assumed_kernels:
            self.record.assumed_kernels.append(kernel)

    # --- stream and event operations, syncs, allocations ----------------------------------------------

    def on_record(self, event: str, stream: str) -> None:
        if not self.paused and not self.opaque:
            self.builder.record(event, stream)

    def on_wait(self, event: str, stream: str) -> None:
        if not self.paused and not self.opaque:
            self.builder.wait(stream, event)

    def on_stream_sync(self, stream: str) -> None:
        if not self.paused and not self.opaque:
            self.builder.stream_sync(stream)

    def on_event_sync(self, event: str) -> None:
        if not self.paused and not self.opaque:
            self.builder.event_sync(event)

    def on_device_sync(self) -> None:
        if not self.paused and not self.opaque:
            self.builder.device_sync()

    def on_free(self, ptr: int) -> None:
        """The storage at `ptr` allocated while recording was freed (see the module doc): a write of the whole
        block on the stream it was allocated on, and a storage at `ptr` after it is a new one."""
        key, stream, record_stream = self.storage_table.end_epoch(ptr)
        if self.paused or key is None or stream is None or record_stream:
            return
        self.builder.free(key, stream, user_source(2))

    def on_record_stream(self, tensor: Any) -> None:
        """`tensor.record_stream(s)` defers the block's reuse: its free is then not modelled (see docs/trace.md)."""
        self.storage_table.recorded_streams.add(tensor.untyped_storage().data_ptr())

    def host_access(self, kernel: str, reads: list[Any], writes: list[Any], source: str | None = None) -> None:
        """The host read or wrote pinned memory itself (an op on CPU tensors of a GPU run), at `source` (default:
        the caller's caller's line)."""
        read, written = self._accesses(reads, kernel), self._accesses(writes, kernel)
        self.builder.launch(HOST, kernel, "host", read, written, user_source(3) if source is None else source)

    def finish(self, outputs: Mapping[str, Any]) -> RunRecord:
        """Move the snapshots to the host and attach the step's outputs."""
        self.paused += 1
        try:
            if self.on_gpu:
                import torch

                torch.cuda.synchronize()
            for snaps in self.record.snapshots.values():
                for snap in snaps:
                    snap.data = snap.data.cpu()
            self.record.outputs = {k: _to_host(v) for k, v in outputs.items()}
        finally:
            self.paused -= 1
        return self.record

    def kernel_launch(self, kernel: str, kind: str, bound: Mapping[str, Any], call: Callable[[], Any]) -> Any:
        """A launch with named arguments (Triton, CuPy): sets from the kernel's annotation, else the default."""
        import torch

        if not self.run_kernels:
            call = _not_run
        tensors = {name: value for name, value in bound.items() if isinstance(value, torch.Tensor)}
        spec = annotation(kernel)
        if spec is None:
            self.assumed(kernel)
            return self.launch(kernel, kind, call, list(tensors.values()), list(tensors.items()), assumed=True)
        if not self.evaluate_annotations:
            # A fuzzed run: the sets are the reference run's; only the slots to snapshot are needed here.
            return self.launch(
                kernel, kind, call, [], [(name, tensors[name]) for name in spec.writes if name in tensors]
            )
        self.paused += 1
        try:
            reads = [view for name, how in spec.reads.items() for view in _regions(bound, name, how)]
            writes = [(name, view) for name, how in spec.writes.items() for view in _regions(bound, name, how)]
        finally:
            self.paused -= 1
        return self.launch(kernel, kind, call, reads, writes)


ACTIVE: list[Recorder] = []
"""The recorders recording now, innermost last (`racefuzz.trace.capture.recording` pushes and pops them)."""


def active() -> Recorder | None:
    """The innermost recorder recording now, or None."""
    return ACTIVE[-1] if ACTIVE else None


def fast_constants() -> dict[str, Any]:
    """What the C++ fast path's `configure` takes, by name (its `CONSTANT_FIELDS`): the program's types and
    `user_source`'s caches and helpers."""
    return {
        "launch": Launch,
        "cell_range": CellRange,
        "library_code": sources.LIBRARY_CODE,
        "sources": sources.SOURCES,
        "code_is_library": sources.code_is_library,
        "frame_source": sources.frame_source,
        "kind_torch": "torch",
        "kind_free": "free",
        "kind_copy": "copy",
        "stream_sync": StreamSync,
    }


def _to_host(value: Any) -> Any:
    """A host copy of a returned value: tensors detached and moved to the CPU, inside lists, tuples and dicts too."""
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        return value.detach().cpu()
    if isinstance(value, Mapping):
        return {k: _to_host(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_host(v) for v in value]
    if isinstance(value, tuple):
        items = [_to_host(v) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    return value


def _not_run() -> None:
    """A kernel launch a `run_kernels=False` recorder records but does not run."""


def _regions(bound: Mapping[str, Any], name: str, how: object) -> list[Any]:
    if bound.get(name) is None:
        return []
    if how == WHOLE:
        return [bound[name]]
    return list(how(bound))  # type: ignore[operator]


def _storage_bytes(tensor: Any, lo: int, hi: int) -> Any:
    """A copy of bytes [lo, hi) of `tensor`'s storage, enqueued on the current stream."""
    import torch

    flat = torch.empty(0, dtype=torch.uint8, device=tensor.device)
    flat.set_(tensor.untyped_storage(), 0, (tensor.untyped_storage().nbytes(),), (1,))
    return flat[lo:hi].clone()
