"""Installing the frontends of the recorder: torch's dispatch mode, torch.cuda's stream and event API, Triton.

`recording(recorder)` is the one entry point: inside it every torch op, Triton launch, stream or event
operation and allocation of the step reaches `recorder`. Imports torch (and Triton, if installed) lazily.
"""

from __future__ import annotations

import contextlib
import functools
import gc
from collections.abc import Callable, Iterator, Sequence
from threading import get_ident
from typing import Any, NamedTuple

from racefuzz.trace import fastpath, graphs, indexing, torch_patches
from racefuzz.trace.model import HOST
from racefuzz.trace.recorder import Recorder, fast_constants

_ACTIVE: list[Recorder] = []
_CUDA_API_PATCHED = False
_CUDA_API_ORIGINALS: list[tuple[Any, str, Any]] = []
"""`(owner, name, what owner.__dict__ had before the patch, or _ABSENT)` of each `torch.cuda` patch."""
_ABSENT = object()
_TRITON_PATCHED = False

_NOT_ACCESSES = frozenset(
    {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "record_stream", "set_", "resize_"}
)
"""Ops that allocate or re-point memory without reading or writing its contents."""

_HOST_SYNCING = frozenset(
    {
        "nonzero",  # and what decomposes to it: `argwhere`, one-argument `where`
        "masked_select",
        "_unique",
        "_unique2",
        "unique_dim",
        "unique_consecutive",
        "unique_dim_consecutive",
    }
)
"""Ops during which the host waits for the current stream (CUDA, non-empty input): torch's CUDA kernels
count, read the count back (`at::cuda::memcpy_and_sync`) to size their output, then launch the kernels
that read the input again and write the output. So the sync is recorded *before* the op's launch: the host
has waited for everything before the op, not for the op. `.item()` / `.tolist()` (`_local_scalar_dense`)
sync after their copy. Ops that sync only sometimes are left out, as is an assignment through a boolean
mask (`x[mask] = v` with a scalar `v` is a `masked_fill_`, no sync): a sync racefuzz does not know of can
only make it report more (a missing edge), one it wrongly assumed could hide a race."""

_SYNCING_WITH_MASK = frozenset({"index"})
"""A read through a boolean (or uint8) mask (`x[mask]`): `nonzero` inside, so a sync before its launch."""

_ALLOCATING = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"})
"""`_NOT_ACCESSES` ops that return a fresh allocation (its stream is where the caching allocator may reuse it)."""


def active() -> Recorder | None:
    return _ACTIVE[-1] if _ACTIVE else None


_Tensor: Any = None
"""`torch.Tensor`, set when the mode class is made (no `import torch` per op)."""
_STRIDED: Any = None
"""`torch.strided`, set when the mode class is made."""
_set_eval_frame: Any = None
"""`torch._C._dynamo.eval_frame.set_eval_frame`, set when the mode class is made."""
_DisableTorchDispatch: Any = None
"""`torch._C._DisableTorchDispatch`, set when the mode class is made."""


@functools.cache
def _torch_mode_class() -> type:
    global _Tensor, _STRIDED, _set_eval_frame, _MASK_DTYPES, _INPLACE_VIEW, _DisableTorchDispatch
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    _Tensor = torch.Tensor
    _STRIDED = torch.strided
    _MASK_DTYPES = frozenset({torch.bool, torch.uint8})
    _INPLACE_VIEW = torch.Tag.inplace_view
    _set_eval_frame = torch._C._dynamo.eval_frame.set_eval_frame
    _DisableTorchDispatch = torch._C._DisableTorchDispatch

    class TraceMode(TorchDispatchMode):
        """Records every torch op as a launch on the current stream (see `racefuzz.trace.recorder`)."""

        def __init__(self, recorder: Recorder) -> None:
            super().__init__()
            self.recorder = recorder
            self.fastpath = fastpath.load()
            self.launch_op = self.fastpath.launch_op if self.fastpath is not None else None
            self.bail = object()
            self.fast_state = recorder.fast_state(self.bail) if self.fastpath is not None else None

        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            # torch wraps a mode's `__torch_dispatch__` in `torch._dynamo.disable` (a Python wrapper of a
            # few µs per op); this one keeps Dynamo out of its frames itself, with the C call that wrapper
            # makes (`set_eval_frame(None)`, the prior callback restored after).
            return False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            prior = _set_eval_frame(None)
            try:
                info = _OP_INFO.get(func) or _op_info(func)
                if kwargs is None:
                    kwargs = _NO_KWARGS
                recorder = self.recorder
                if (
                    info.fast
                    and self.fast_state is not None
                    and not recorder.paused
                    and not recorder.opaque
                    and not graphs.CAPTURES  # the C++ applies delays and snapshots: not inside a capture
                ):
                    out = self.launch_op(self.fast_state, info.arguments, info.label, info.call, args, kwargs)
                    if out is not self.bail:
                        return out
                return self._record(func, info, args, kwargs)
            finally:
                _set_eval_frame(prior)

        def _record(self, func: Any, info: _OpInfo, args: tuple, kwargs: dict) -> Any:
            recorder = self.recorder
            if recorder.paused or recorder.opaque or info.not_access:
                if info.name == "record_stream":
                    recorder.on_record_stream(args[0])
                out = func(*args, **kwargs)
                if recorder.paused:
                    return out  # the recorder's own copies
                if info.name == "resize_":
                    recorder.resized(args[0])
                # Allocations count inside an opaque launch too (a launcher's own tensors can be freed and
                # their blocks reused); an output on an input's storage is a view, not an allocation.
                if info.allocates or (recorder.opaque and info.fresh_outputs):
                    inputs = _storage_ptrs(_tensors(list(args)))
                    for tensor in _tensors(out):
                        on_device = tensor.is_cuda or not recorder.on_gpu
                        if on_device and tensor.untyped_storage().data_ptr() not in inputs:
                            recorder.allocated(tensor)
                return out
            if info.name == "lift_fresh" and (recorder.on_gpu or recorder.lifting_to_device):
                return self._lifted(func, args, kwargs)
            reads, writes = _schema_accesses(info, args, kwargs)
            outputs_written = info.fresh_outputs
            if not writes and not outputs_written:
                return func(*args, **kwargs)  # a view or metadata op
            on_gpu = recorder.on_gpu
            capture = graphs.capture_of(recorder) if graphs.CAPTURES else None
            if capture is not None:
                if info.sync is not None and info.sync(args, kwargs, None, on_gpu):
                    raise capture.refused(f"{info.label} (it makes the host wait for the stream)")
                if not on_gpu:
                    func = capture.deferred(func)  # CUDA runs a captured kernel at each replay, not now
            if on_gpu:
                device = kwargs.get("device")
                if not reads and not writes:
                    # A factory (`zeros`, `arange`): a device launch iff it makes a CUDA tensor.
                    if device is None or device.type != "cuda":
                        return func(*args, **kwargs)
                elif [t for t in reads if not t.is_cuda] or [t for _, t in writes if not t.is_cuda]:
                    # Host tensors only: the host's own access of pinned memory, unless the op makes a CUDA
                    # tensor from them (`x.to("cuda")`: a copy launched on the stream, writing its output).
                    # Only strided sources: a sparse tensor's copy has no plain storage to record.
                    to_device = (
                        outputs_written
                        and device is not None
                        and device.type == "cuda"
                        and all(t.layout == _STRIDED for t in reads)
                    )
                    on_host = not [t for t in reads if t.is_cuda] and not [t for _, t in writes if t.is_cuda]
                    if on_host and not to_device:
                        pinned_reads = [t for t in reads if t.is_pinned()]
                        pinned_writes = [t for _, t in writes if t.is_pinned()]
                        out = func(*args, **kwargs)
                        if outputs_written:
                            pinned_writes += [t for t in _tensors(out) if t.is_pinned()]
                        if pinned_reads or pinned_writes:
                            recorder.host_access(info.label, pinned_reads, pinned_writes)
                        return out
                    reads = [t for t in reads if t.is_cuda or t.is_pinned()]
                    writes = [(slot, t) for slot, t in writes if t.is_cuda or t.is_pinned()]
                    if on_host and info.name != "_to_copy":
                        reads = []  # `zeros_like(t, device="cuda")`, `t.new_zeros(...)`: `t`'s shape, not its data

            read_tensors = reads
            if info.exact is not None:
                reads, writes = self._exact(info, args, kwargs, reads, writes)
            fresh = None
            if outputs_written:

                def fresh(out: Any) -> list[tuple[object, Any]]:
                    # An output on an input's storage is a view the schema does not declare (`_unsafe_view`).
                    inputs = {t.untyped_storage().data_ptr() for t in read_tensors}
                    made = [
                        (f"out{i}", t)
                        for i, t in enumerate(_tensors(out))
                        if (not on_gpu or t.is_cuda or t.is_pinned()) and t.untyped_storage().data_ptr() not in inputs
                    ]
                    for _, t in made:
                        recorder.allocated(t)
                    return made

            if fresh is None and info.sync is None:
                return recorder.launch_op(info.label, func, args, kwargs, reads, writes)
            host_sync = None
            if info.sync is not None:
                sync = info.sync

                def host_sync(out: Any) -> str:
                    return sync(args, kwargs, out, on_gpu)

            return recorder.launch(
                info.label, "torch", lambda: func(*args, **kwargs), reads, writes, outputs=fresh, host_sync=host_sync
            )

        def _exact(
            self, info: _OpInfo, args: tuple, kwargs: dict, reads: list[Any], writes: list[tuple[object, Any]]
        ) -> tuple[list[Any], list[tuple[object, Any]]]:
            """An index op's reads and writes with the byte sets its index values select
            (`racefuzz.trace.indexing`) in place of the schema's whole views, where the recorder can read
            those values (`Recorder.exact_indexing`); else, or if they cannot be worked out, the whole views,
            noted in the trace (`Recorder.whole_view`)."""
            recorder = self.recorder
            if not recorder.exact_indexing:
                recorder.whole_view(info.label)
                return reads, writes
            recorder.paused += 1  # the recorder's own reads of the index values (copies on a GPU)
            try:
                with _DisableTorchDispatch():
                    found = info.exact(args, kwargs)
            except Exception:  # an index the rules do not know: the op's own checks say more, when it runs
                recorder.whole_view(info.label)
                return reads, writes
            finally:
                recorder.paused -= 1
            exact_reads, exact_writes = list(reads), list(writes)
            for region in found.reads.values():
                at = next((i for i, t in enumerate(exact_reads) if t is region.tensor), None)
                if at is None:  # not one of the op's arguments: the rule is wrong, the whole views stay
                    recorder.whole_view(info.label)
                    return reads, writes
                exact_reads[at] = region
            for region in found.writes.values():
                at = next((i for i, (_, t) in enumerate(exact_writes) if t is region.tensor), None)
                if at is None:
                    recorder.whole_view(info.label)
                    return reads, writes
                exact_writes[at] = (exact_writes[at][0], region)
            return exact_reads, exact_writes

        def _lifted(self, func: Any, args: tuple, kwargs: dict) -> Any:
            """`lift_fresh(t)` in a GPU run: torch made `t` from Python data (`torch.tensor`,
            `torch.as_tensor`) with the copy to the GPU hidden from the mode (torch excludes the Python key
            while it fills and copies the tensor; `lift_fresh` follows). A CUDA `t` was an allocation and a
            blocking copy on the current stream: a launch writing `t` (`TORCH_TENSOR_COPY`), then the host's
            sync of that stream (torch's copy from pageable memory waits for it). A host `t` (a tensor the step
            keeps on the host, a scalar torch wraps for an indexing assignment) is no launch, nor is a CUDA
            `t` on a storage the recorder has seen (made from that storage: no copy). In a CPU run, where every
            CPU tensor stands for a device tensor, only inside a `torch.tensor` / `as_tensor` / `asarray` call
            that names a `device` (`Recorder.lifting_to_device`, `racefuzz.trace.torch_patches`): the call a
            step makes as `torch.tensor(data, device=env.device)` to run on both, a copy to the GPU there.
            """
            recorder = self.recorder
            tensor = args[0] if args else None
            if (
                not isinstance(tensor, _Tensor)
                or (recorder.on_gpu and not tensor.is_cuda)
                or tensor.numel() == 0
                or recorder.knows(tensor)
            ):
                return func(*args, **kwargs)

            def made(out: Any) -> list[tuple[object, Any]]:
                recorder.allocated(out)
                return [("out0", out)]

            return recorder.launch(
                TORCH_TENSOR_COPY,
                "copy",  # it ran already: no delay point (a delay here would only follow the copy and its sync)
                lambda: func(*args, **kwargs),
                [],
                [],
                outputs=made,
                host_sync=lambda out: "after",
            )

    return TraceMode


@functools.cache
def _capture_mode_class() -> type:
    from torch.utils._python_dispatch import TorchDispatchMode

    class CaptureMode(TorchDispatchMode):
        """On top of the recorder's mode during a CUDA graph capture (`racefuzz.trace.graphs`): keeps what each
        op allocates (its fresh outputs), which belongs to the graph's pool, alive until the recording ends."""

        def __init__(self, kept: list[Any]) -> None:
            super().__init__()
            self.kept = kept

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if _is_compute(func):
                self.kept.append(out)
            return out

    return CaptureMode


def _capture_mode(kept: list[Any]) -> Any:
    return _capture_mode_class()(kept)


graphs.use_capture_mode(_capture_mode)

TORCH_TENSOR_COPY = "torch.tensor (host-to-device copy)"
"""The kernel name of the copy `torch.tensor(data, device=...)` makes, hidden from the mode (`_lifted`)."""


def _is_compute(func: Any) -> bool:
    """An op that returns fresh tensors (not views of its inputs)."""
    return not any(r.alias_info is not None for r in func._schema.returns)


def _storage_ptrs(tensors: list[Any]) -> set[int]:
    """The storage addresses of `tensors`, skipping any without a plain storage (sparse, nested)."""
    ptrs = set()
    for tensor in tensors:
        with contextlib.suppress(RuntimeError, NotImplementedError):
            ptrs.add(tensor.untyped_storage().data_ptr())
    return ptrs


def _tensors(value: Any) -> list[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


class _OpInfo(NamedTuple):
    """What the recorder needs of an op's schema, computed once per op."""

    name: str  # `add_`
    label: str  # `aten.add_.Tensor`
    arguments: tuple[tuple[int, str, bool, bool], ...]  # (position, name, keyword-only, written)
    fresh_outputs: bool  # returns new tensors (not views of its inputs)
    not_access: bool  # allocates or re-points memory only (`_NOT_ACCESSES`)
    allocates: bool  # one of those that returns a fresh allocation (`_ALLOCATING`)
    sync: Callable[[tuple, dict, Any, bool], str] | None  # (args, kwargs, out, on_gpu) -> `Recorder.launch`'s
    fast: bool  # what the C++ fast path records (`launch_op`'s case: no fresh outputs, no sync, an access)
    exact: Callable[[tuple, dict], Any] | None  # an index op's byte sets from its index values (`indexing.RULES`)
    call: Callable[..., Any]  # the op's C++ callable (`OpOverload.__call__` is `self._op(*args, **kwargs)`)


_OP_INFO: dict[Any, _OpInfo] = {}
_NO_KWARGS: dict[str, Any] = {}
"""The kwargs of a call that has none (shared: never written to)."""


def _may_hold_tensors(schema_type: Any) -> bool:
    """Whether an argument of this schema type can be a tensor or hold tensors (`Tensor`, `Tensor?`,
    `Tensor[]`, `Tensor?[]`, `Any`); an `int[]`, `Scalar` or `str` argument is never looked at."""
    text = str(schema_type)
    return "Tensor" in text or "Any" in text


def _op_info(func: Any) -> _OpInfo:
    schema = func._schema
    arguments = tuple(
        (i, arg.name, arg.kwarg_only, arg.alias_info is not None and arg.alias_info.is_write)
        for i, arg in enumerate(schema.arguments)
        if _may_hold_tensors(arg.type)
    )
    name = schema.name.split("::")[-1]
    sync = None
    if name == "_local_scalar_dense":
        sync = _syncs_after_copy_out
    elif name in _HOST_SYNCING:
        sync = _syncs_on_input
    elif name in _SYNCING_WITH_MASK:
        sync = _syncs_on_mask
    elif name in ("_to_copy", "copy_"):
        sync = _syncs_in_copy
    # An in-place view op (`detach_`, `unsqueeze_`, `as_strided_`: torch's `inplace_view` tag) declares a write
    # of `self` but changes only its metadata: no launch, no access.
    fresh_outputs = _is_compute(func)
    not_access = name in _NOT_ACCESSES or _INPLACE_VIEW in getattr(func, "tags", ())
    # `lift_fresh` stands for a copy the mode did not see (`TraceMode._lifted`): the mode's, not the fast path's.
    # An index op's byte sets come from its index values, read in Python (`TraceMode._exact`): not the fast
    # path's either, which records the schema's whole views.
    exact = indexing.RULES.get(name)
    fast = not fresh_outputs and not not_access and sync is None and name != "lift_fresh" and exact is None
    call = getattr(func, "_op", func)
    info = _OpInfo(name, str(func), arguments, fresh_outputs, not_access, name in _ALLOCATING, sync, fast, exact, call)
    _OP_INFO[func] = info
    return info


def _schema_accesses(info: _OpInfo, args: tuple, kwargs: dict) -> tuple[list[Any], list[tuple[object, Any]]]:
    """(read tensors, (slot, written tensor) pairs) of one call, from the op's schema."""
    reads: list[Any] = []
    writes: list[tuple[object, Any]] = []
    count = len(args)
    for i, name, kwarg_only, written in info.arguments:
        if kwarg_only or i >= count:
            if name not in kwargs:
                continue
            value = kwargs[name]
        else:
            value = args[i]
        if isinstance(value, _Tensor):
            if written:
                writes.append((name, value))
            else:
                reads.append(value)
        elif isinstance(value, (list, tuple)):
            tensors = _tensors(value)
            if written:
                writes += [(f"{name}{k}", t) for k, t in enumerate(tensors)]
            else:
                reads += tensors
    return reads, writes


# A sync rule answers, from an op's (args, kwargs, out, on_gpu), where the host waited for the current
# stream: "before" its launch (it waited for the work issued before the op, then the op's last kernels
# ran), "after" it, or "" (no sync). Each answers "" unless the op surely synced: an assumed sync that did
# not happen could hide a race. A device tensor is a CUDA one in a GPU run, any tensor in a CPU run.


def _is_device(tensor: Any, on_gpu: bool) -> bool:
    return isinstance(tensor, _Tensor) and (tensor.is_cuda or not on_gpu) and tensor.numel() > 0


def _syncs_after_copy_out(args: tuple, kwargs: dict, out: Any, on_gpu: bool) -> str:
    """`_local_scalar_dense` (`.item()`, `.tolist()`): a copy to the host, then the sync."""
    return "after" if args and _is_device(args[0], on_gpu) else ""


def _syncs_on_input(args: tuple, kwargs: dict, out: Any, on_gpu: bool) -> str:
    """A `_HOST_SYNCING` op on a non-empty device tensor: the sync comes before its output's kernels."""
    return "before" if args and _is_device(args[0], on_gpu) else ""


def _syncs_on_mask(args: tuple, kwargs: dict, out: Any, on_gpu: bool) -> str:
    """`index` through a non-empty device boolean or uint8 mask: `nonzero` first, so a sync before."""
    indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
    masked = any(_is_device(index, on_gpu) and index.dtype in _MASK_DTYPES for index in indices or ())
    return "before" if masked else ""


def _syncs_in_copy(args: tuple, kwargs: dict, out: Any, on_gpu: bool) -> str:
    """`_to_copy` / `copy_` of a non-empty tensor between the host and the GPU without `non_blocking=True`
    (torch's `memcpy_and_sync`). A copy to the host syncs after the copy; one to the GPU too, unless it needs
    work on the device after the copy (a non-contiguous operand, another dtype, a conjugate or negative bit
    that differs: torch's `copy_kernel_cuda` syncs, then runs a kernel): the sync is then before it. A
    `non_blocking` copy is never taken for a sync (CUDA's copy into pageable memory "might be synchronous":
    not a promise). None on the CPU."""
    if not on_gpu:
        return ""
    # `_to_copy` takes it keyword-only; `copy_(self, src, non_blocking)`
    non_blocking = kwargs["non_blocking"] if "non_blocking" in kwargs else len(args) > 2 and bool(args[2])
    if non_blocking:
        return ""
    if len(args) > 1 and isinstance(args[1], _Tensor):  # copy_(dst, src)
        dst, src = args[0], args[1]
    else:
        made = _tensors(out)
        if not made:
            return ""
        dst, src = made[0], args[0]
    if dst.is_cuda == src.is_cuda or not dst.numel():
        return ""
    if src.is_cuda:
        return "after"
    plain = (
        dst.is_contiguous()
        and src.is_contiguous()
        and dst.dtype == src.dtype
        and dst.is_conj() == src.is_conj()  # else `conj_physical_` / `neg_` runs on the device after the sync
        and dst.is_neg() == src.is_neg()
    )
    return "after" if plain else "before"


_MASK_DTYPES: frozenset[Any] = frozenset()
"""`torch.bool`, `torch.uint8`: set when the mode class is made."""
_INPLACE_VIEW: Any = None
"""`torch.Tag.inplace_view`: set when the mode class is made."""


def _gpu_recorder() -> Recorder | None:
    """The active recorder if it records a GPU run and is not paused (its own copies and spins)."""
    recorder = _ACTIVE[-1] if _ACTIVE else None
    return recorder if recorder is not None and recorder.on_gpu and not recorder.paused else None


def _syncing_recorder() -> Recorder | None:
    """`_gpu_recorder()` if this is the thread that records: a host sync orders only the thread that waited
    (another thread's `torch.cuda.synchronize()` tells the step's thread nothing). Records and waits count
    from any thread: they order the device itself."""
    recorder = _gpu_recorder()
    return recorder if recorder is not None and recorder.thread == get_ident() else None


def _raw_handle(stream: Any) -> int:
    """The `cudaStream_t` of a `torch.cuda.Stream`, or of a device-generic `torch.Stream` (which torch.cuda's
    methods accept too, and which has no `cuda_stream`)."""
    handle = getattr(stream, "cuda_stream", None)
    if handle is None:
        import torch

        handle = torch.cuda.Stream(
            stream_id=stream.stream_id, device_index=stream.device_index, device_type=stream.device_type
        ).cuda_stream
    return handle


def _patch_cuda_api() -> None:
    """Route the step's stream and event operations through the active recorder (patched once per process).

    `torch.cuda.Event.record` / `.wait` / `.synchronize` / `.query`, `torch.cuda.Stream.synchronize` /
    `.wait_stream` and `torch.cuda.synchronize` run torch's own C calls, then report to the active GPU
    recorder (`wait_event` and `record_event` reach it through `Event.wait` / `Event.record`); outside a
    recording they only add one check. Not torch's GPU-trace callbacks: once activated those stay on for the
    process (torch has no way to turn them off) and call into Python for every allocation, free, event
    creation, record, wait and sync of every later test, recorded or not. Host syncs inside torch's C++ ops
    are known from the op instead (`_HOST_SYNCING`, blocking copies), frees from the storages themselves
    (`Recorder.allocated`). `torch.cuda.CUDAGraph.capture_begin` / `.capture_end` / `.replay` (which
    `torch.cuda.graph` calls) report a capture and its replays (`racefuzz.trace.graphs`).
    """
    global _CUDA_API_PATCHED
    if _CUDA_API_PATCHED:
        return
    import torch

    event_base, stream_base = torch._C._CudaEventBase, torch._C._CudaStreamBase
    record, wait = event_base.record, event_base.wait
    event_synchronize, event_query = event_base.synchronize, event_base.query
    stream_synchronize, stream_query = stream_base.synchronize, stream_base.query
    device_synchronize = torch.cuda.synchronize
    wait_stream = torch.cuda.Stream.wait_stream
    current_stream = torch.cuda.current_stream
    graph_class = torch.cuda.CUDAGraph
    capture_begin, capture_end, graph_replay = graph_class.capture_begin, graph_class.capture_end, graph_class.replay

    def event_record(self: Any, stream: Any = None) -> None:
        if stream is None:
            stream = current_stream()
        record(self, stream)
        recorder = _gpu_recorder()
        if recorder is not None:
            recorder.on_record(recorder.event_name(self.cuda_event, self), recorder.stream_name(_raw_handle(stream)))

    def event_wait(self: Any, stream: Any = None) -> None:
        if stream is None:
            stream = current_stream()
        wait(self, stream)
        recorder = _gpu_recorder()
        if recorder is not None and self.cuda_event:  # torch waits on no event before its first record
            recorder.on_wait(recorder.event_name(self.cuda_event, self), recorder.stream_name(_raw_handle(stream)))

    def event_sync(self: Any) -> None:
        event_synchronize(self)
        recorder = _syncing_recorder()
        if recorder is not None and self.cuda_event:
            recorder.on_event_sync(recorder.event_name(self.cuda_event, self))

    def event_done(self: Any) -> bool:
        # A query that answers True is an event sync: the host knows the recorded work has finished.
        done = event_query(self)
        recorder = _syncing_recorder() if done else None
        if recorder is not None and self.cuda_event:
            recorder.on_event_sync(recorder.event_name(self.cuda_event, self))
        return done

    def stream_sync(self: Any) -> None:
        stream_synchronize(self)
        recorder = _syncing_recorder()
        if recorder is not None:
            recorder.on_stream_sync(recorder.stream_name(self.cuda_stream))

    def stream_done(self: Any) -> bool:
        # As `Event.query`: a stream query that answers True is a sync of the stream.
        done = stream_query(self)
        recorder = _syncing_recorder() if done else None
        if recorder is not None:
            recorder.on_stream_sync(recorder.stream_name(self.cuda_stream))
        return done

    def synchronize(device: Any = None) -> None:
        device_synchronize(device)
        recorder = _syncing_recorder()
        if recorder is not None:
            recorder.on_device_sync()

    def pooled_wait_stream(self: Any, stream: Any) -> None:
        # torch's makes a new `torch.cuda.Event` per call (Python `__new__`, `record_event`, `Event.record`,
        # `wait_event`, `Event.wait`); this one records the recorder's one event on `stream` and makes `self`
        # wait on it: the same two CUDA calls, the same record and wait in the trace (a wait refers to the
        # event's latest record). Re-recording the event later cannot affect this wait: CUDA captures the
        # event's state at the wait. Only the thread that entered `recording` uses the event (another could
        # re-record it between this thread's record and wait: the wait would then be on the wrong work);
        # other threads, and streams on another device than the recorder's, get torch's own (which reaches
        # the recorder through `Event.record` / `Event.wait`).
        recorder = _gpu_recorder()
        if (
            recorder is None
            or recorder.thread != get_ident()
            or self.device_index != recorder.device_index
            or stream.device_index != recorder.device_index
        ):
            return wait_stream(self, stream)
        event = recorder.wait_stream_event
        if event is None:
            event = recorder.wait_stream_event = torch.cuda.Event()
        record(event, stream)
        wait(event, self)
        name = recorder.event_name(event.cuda_event)
        recorder.on_record(name, recorder.stream_name(_raw_handle(stream)))
        recorder.on_wait(name, recorder.stream_name(self.cuda_stream))

    def graph_capture_begin(self: Any, *args: Any, **kwargs: Any) -> None:
        capture_begin(self, *args, **kwargs)
        recorder = _syncing_recorder()
        if recorder is not None:
            graphs.begin(recorder)

    def graph_capture_end(self: Any) -> None:
        recorder = _syncing_recorder()
        try:
            capture_end(self)
        finally:
            if recorder is not None:
                graphs.end(recorder, self)

    def replay(self: Any) -> None:
        # The replay's boundary launches are recorded here, not in `graphs` (a launch names the line that
        # called the function launching it).
        recorder = _syncing_recorder()
        if recorder is None:
            return graph_replay(self)
        replaying = graphs.start_replay(recorder, self)
        recorder.launch(replaying.label, graphs.REPLAY, lambda: graph_replay(self), [], [])
        graphs.replayed(recorder, replaying)
        recorder.launch(replaying.end_label, graphs.REPLAY, graphs.nothing, [], [])
        return None

    for owner, name, replacement in (
        (graph_class, "capture_begin", graph_capture_begin),
        (graph_class, "capture_end", graph_capture_end),
        (graph_class, "replay", replay),
        (torch.cuda.Event, "record", event_record),
        (torch.cuda.Event, "wait", event_wait),
        (torch.cuda.Event, "synchronize", event_sync),
        (torch.cuda.Event, "query", event_done),
        (torch.cuda.Stream, "synchronize", stream_sync),
        (torch.cuda.Stream, "query", stream_done),
        (torch.cuda.Stream, "wait_stream", pooled_wait_stream),
        (torch.cuda, "synchronize", synchronize),
    ):
        _CUDA_API_ORIGINALS.append((owner, name, vars(owner).get(name, _ABSENT)))
        setattr(owner, name, functools.wraps(getattr(owner, name))(replacement))
    _CUDA_API_PATCHED = True


@contextlib.contextmanager
def cuda_api_unpatched() -> Iterator[None]:
    """torch's own `torch.cuda` methods inside the block, racefuzz's patches (`_patch_cuda_api`) again after.

    For the recording-cost benchmarks only: an unrecorded run inside the block is the baseline of a user
    who never ran racefuzz, timed back to back with recorded runs in one process so that a host whose speed
    drifts moves both alike. Not for recording (a recording inside it would miss every stream and event
    operation) and not thread-safe (it swaps class attributes). A no-op where the patches are not installed.
    """
    patched = [(owner, name, getattr(owner, name)) for owner, name, _ in _CUDA_API_ORIGINALS]
    for owner, name, original in _CUDA_API_ORIGINALS:
        if original is _ABSENT:
            delattr(owner, name)
        else:
            setattr(owner, name, original)
    try:
        yield
    finally:
        for owner, name, replacement in patched:
            setattr(owner, name, replacement)


def _patch_triton() -> None:
    """Wrap `triton.runtime.jit.JITFunction.run` once: a launch with the active recorder is recorded.

    Triton's `launch_enter_hook` fires before the launch with the stream, but hands over the arguments only
    through a per-kernel `launch_metadata`; `run` has the bound arguments of every `@triton.jit` kernel
    (autotuned ones too) and launches on torch's current stream, which the recorder reads.
    """
    global _TRITON_PATCHED
    if _TRITON_PATCHED:
        return
    _TRITON_PATCHED = True  # also when Triton is missing: not looked for again at every recording
    try:
        from triton.runtime.jit import JITFunction
    except ImportError:
        return
    original = JITFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        recorder = active()
        if recorder is None or warmup or recorder.paused:
            return original(self, *args, grid=grid, warmup=warmup, **kwargs)
        bound = dict(zip(self.arg_names, args, strict=False))  # defaults fill the rest
        bound.update(kwargs)
        name = getattr(self.fn, "__name__", str(self))
        capture = graphs.capture_of(recorder) if graphs.CAPTURES else None
        launch = recorder.kernel_launch if capture is None else capture.kernel_launch
        return launch(name, "triton", bound, lambda: original(self, *args, grid=grid, warmup=warmup, **kwargs))

    JITFunction.run = run


@contextlib.contextmanager
def recording(recorder: Recorder) -> Iterator[Recorder]:
    """Every torch op, Triton launch, stream/event operation and allocation inside reaches `recorder`."""
    if recorder.on_gpu:
        _patch_cuda_api()
    _patch_triton()
    mode = _torch_mode_class()(recorder)
    # The trace's ops and accesses are NamedTuples, which the cyclic GC keeps tracking (it stops tracking
    # plain tuples of atoms only): a few surviving objects per op make Python run full collections every
    # few thousand ops, each scanning the whole heap (torch's included: tens of ms). Freezing the objects
    # that exist when recording starts keeps them out of those scans; unfrozen at the end. Not done when
    # the process has frozen objects itself (unfreezing would undo its freeze). A cycle among those older
    # objects that becomes garbage while recording is collected after it.
    freeze = gc.isenabled() and gc.get_freeze_count() == 0
    if freeze:
        gc.freeze()
    recorder.thread = get_ident()
    recorder.active = True
    _ACTIVE.append(recorder)
    try:
        with torch_patches.installed(recorder.on_gpu, active), mode:
            if mode.fastpath is not None:
                _dispatcher_fast_path(mode.fastpath)
                mode.fastpath.begin(mode.fast_state)  # most ops, before they reach the mode
            try:
                yield recorder
            finally:
                graphs.abandon(recorder)  # a capture the step left open: its mode and fast-path scope go first
                if mode.fastpath is not None:
                    mode.fastpath.end()
    finally:
        _ACTIVE.remove(recorder)
        recorder.active = False
        graphs.release(recorder)  # after `active`: the frees of what the graphs kept are not the step's
        if freeze:
            gc.unfreeze()


_DISPATCHER_HELPER_SET = False


def _dispatcher_fast_path(module: Any) -> None:
    """Tell the C++ fast path's dispatcher entry which ops it records (once per process)."""
    global _DISPATCHER_HELPER_SET
    if not _DISPATCHER_HELPER_SET:
        module.configure(_dispatcher_op_info, _set_eval_frame, fast_constants())
        _DISPATCHER_HELPER_SET = True


FAST_WRITES, FAST_FRESH, FAST_ALLOCATES, FAST_LIFTED = range(4)
"""What the C++ fast path's dispatcher entry does with an op (`_dispatcher_op_info`'s kind; its `OpKind`)."""


def _dispatcher_op_info(name: str, overload: str) -> tuple[Any, str, int] | None:
    """For the C++ fast path's dispatcher entry, asked once per op (`aten::add_`, `Tensor`): the op's
    `(arguments, label, kind)` if it is one the fast path records, else None. The kinds:

    * `FAST_WRITES`: an op that writes only its arguments (`_OpInfo.fast`), or `copy_` (its sync rule,
      `_syncs_in_copy`, answers "" between two tensors of the recording's device, the only ones the entry
      takes);
    * `FAST_FRESH`: one that returns fresh tensors, each a plain `Tensor` (no list, no optional), and neither
      syncs the host nor only allocates; `_to_copy` too (a copy on the device: the entry leaves one with a
      `device` of another kind, between the host and the device, to the mode);
    * `FAST_ALLOCATES`: an allocation only (`_ALLOCATING`: `empty`, `empty_like`, ...), no launch;
    * `FAST_LIFTED`: `lift_fresh`, the copy `torch.tensor(data, device=...)` made (`TraceMode._lifted`), its
      label `TORCH_TENSOR_COPY`.
    """
    import torch

    namespace, _, op_name = name.partition("::")
    try:
        func = getattr(getattr(getattr(torch.ops, namespace), op_name), overload or "default")
    except (AttributeError, RuntimeError):
        return None
    info = _OP_INFO.get(func) or _op_info(func)
    returns = func._schema.returns
    plain_returns = bool(returns) and all(str(r.type) == "Tensor" for r in returns)
    copies = info.sync is _syncs_in_copy and info.exact is None
    if info.name == "lift_fresh":
        return info.arguments, TORCH_TENSOR_COPY, FAST_LIFTED
    if info.allocates:
        return (info.arguments, info.label, FAST_ALLOCATES) if plain_returns else None
    if info.fresh_outputs and not info.not_access and (info.sync is None or copies) and info.exact is None:
        return (info.arguments, info.label, FAST_FRESH) if plain_returns else None
    if info.fast or (copies and not info.fresh_outputs and not info.not_access):
        return info.arguments, info.label, FAST_WRITES
    return None


__all__ = ["HOST", "active", "recording"]


def launch_kernel(name: str, fn: Callable[..., Any], /, kind: str = "external", **args: Any) -> Any:
    """Call `fn(**args)`, recorded as a launch of kernel `name` on the current stream if a recorder is active.

    For kernels racefuzz cannot see by itself (a C++ extension, a custom launcher): their read and write
    sets come from `annotate(name, ...)` over the argument names, else the conservative default.
    """
    recorder = active()
    if recorder is None or recorder.paused:
        return fn(**args)
    capture = graphs.capture_of(recorder) if graphs.CAPTURES else None
    launch = recorder.kernel_launch if capture is None else capture.kernel_launch
    return launch(name, kind, args, lambda: fn(**args))


def cupy_kernel(kernel: Any, arg_names: Sequence[str], name: str | None = None) -> Callable[..., Any]:
    """A CuPy `RawKernel` (or `RawModule` function) callable as `launch(grid, block, args, shared_mem=0)`
    with torch tensors as arguments, recorded (kind `cupy`) and run on torch's current stream.

    CuPy has no launch hook: wrapping the kernel object is how its launches reach the recorder.
    `arg_names` name the positional arguments for annotations.
    """
    label = name or getattr(kernel, "name", None) or repr(kernel)

    def launch(grid: tuple[int, ...], block: tuple[int, ...], args: Sequence[Any], shared_mem: int = 0) -> Any:
        import cupy
        import torch

        def run(**bound: Any) -> Any:
            values = [cupy.asarray(v) if isinstance(v, torch.Tensor) else v for v in bound.values()]
            with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
                return kernel(grid, block, tuple(values), shared_mem=shared_mem)

        return launch_kernel(label, run, kind="cupy", **dict(zip(arg_names, args, strict=True)))

    return launch
