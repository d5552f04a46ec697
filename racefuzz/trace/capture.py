"""Installing the frontends of the recorder: torch's dispatch mode, its GPU-trace callbacks, Triton's launches.

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

from racefuzz.trace.model import HOST
from racefuzz.trace.recorder import Recorder

_ACTIVE: list[Recorder] = []
_CALLBACKS_INSTALLED = False
_TRITON_PATCHED = False
_WAIT_STREAM_PATCHED = False

_NOT_ACCESSES = frozenset(
    {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "record_stream", "set_", "resize_"}
)
"""Ops that allocate or re-point memory without reading or writing its contents."""

_HOST_SYNCING = frozenset({"_local_scalar_dense"})
"""Ops after which the host has waited for the current stream (`.item()`, `.tolist()`)."""


def active() -> Recorder | None:
    return _ACTIVE[-1] if _ACTIVE else None


_Tensor: Any = None
"""`torch.Tensor`, set when the mode class is made (no `import torch` per op)."""
_set_eval_frame: Any = None
"""`torch._C._dynamo.eval_frame.set_eval_frame`, set when the mode class is made."""


@functools.cache
def _torch_mode_class() -> type:
    global _Tensor, _set_eval_frame
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    _Tensor = torch.Tensor
    _set_eval_frame = torch._C._dynamo.eval_frame.set_eval_frame

    class TraceMode(TorchDispatchMode):
        """Records every torch op as a launch on the current stream (see `racefuzz.trace.recorder`)."""

        def __init__(self, recorder: Recorder) -> None:
            super().__init__()
            self.recorder = recorder

        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            # torch wraps a mode's `__torch_dispatch__` in `torch._dynamo.disable` (a Python wrapper of a
            # few µs per op); this one keeps Dynamo out of its frames itself, with the C call that wrapper
            # makes (`set_eval_frame(None)`, the prior callback restored after).
            return False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            prior = _set_eval_frame(None)
            try:
                return self._record(func, args, _NO_KWARGS if kwargs is None else kwargs)
            finally:
                _set_eval_frame(prior)

        def _record(self, func: Any, args: tuple, kwargs: dict) -> Any:
            recorder = self.recorder
            info = _OP_INFO.get(func) or _op_info(func)
            if recorder.paused or recorder.opaque or info.not_access:
                if info.name == "record_stream":
                    recorder.on_record_stream(args[0])
                return func(*args, **kwargs)
            reads, writes = _schema_accesses(info, args, kwargs)
            outputs_written = info.fresh_outputs
            if not writes and not outputs_written:
                return func(*args, **kwargs)  # a view or metadata op
            on_gpu = recorder.on_gpu
            if on_gpu:
                if not reads and not writes:
                    # A factory (`zeros`, `arange`): a device launch iff it makes a CUDA tensor.
                    device = kwargs.get("device")
                    if device is None or device.type != "cuda":
                        return func(*args, **kwargs)
                elif [t for t in reads if not t.is_cuda] or [t for _, t in writes if not t.is_cuda]:
                    if not [t for t in reads if t.is_cuda] and not [t for _, t in writes if t.is_cuda]:
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

            fresh = None
            if outputs_written:

                def fresh(out: Any) -> list[tuple[object, Any]]:
                    # An output on an input's storage is a view the schema does not declare (`_unsafe_view`).
                    inputs = {t.untyped_storage().data_ptr() for t in reads}
                    return [
                        (f"out{i}", t)
                        for i, t in enumerate(_tensors(out))
                        if (not on_gpu or t.is_cuda or t.is_pinned()) and t.untyped_storage().data_ptr() not in inputs
                    ]

            if fresh is None and not info.syncs_host and not info.maybe_d2h:
                return recorder.launch_op(info.label, func, args, kwargs, reads, writes)
            out = recorder.launch(info.label, "torch", lambda: func(*args, **kwargs), reads, writes, outputs=fresh)
            if info.syncs_host or (info.maybe_d2h and on_gpu and _is_blocking_d2h(info.name, args, kwargs, out)):
                recorder.on_stream_sync(recorder.current_stream())
            return out

    return TraceMode


def _is_compute(func: Any) -> bool:
    """An op that returns fresh tensors (not views of its inputs)."""
    return not any(r.alias_info is not None for r in func._schema.returns)


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
    syncs_host: bool  # the host waits for the current stream after it (`_HOST_SYNCING`)
    maybe_d2h: bool  # may be a blocking device-to-host copy (`_is_blocking_d2h`)


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
    info = _OpInfo(
        name,
        str(func),
        arguments,
        _is_compute(func),
        name in _NOT_ACCESSES,
        name in _HOST_SYNCING,
        name in ("_to_copy", "copy_"),
    )
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


def _is_blocking_d2h(name: str, args: tuple, kwargs: dict, out: Any) -> bool:
    """A copy from the GPU into ordinary (not pinned) host memory: the host waited for it."""
    if name == "_to_copy":
        return (
            bool(_tensors(out))
            and not _tensors(out)[0].is_cuda
            and args[0].is_cuda
            and not _tensors(out)[0].is_pinned()
        )
    if name == "copy_":
        return not args[0].is_cuda and args[1].is_cuda and not args[0].is_pinned()
    return False


def _install_gpu_callbacks() -> None:
    """Register torch's GPU-trace callbacks once; they forward to the active recorder, if any."""
    global _CALLBACKS_INSTALLED
    if _CALLBACKS_INSTALLED:
        return
    import torch
    from torch.cuda import _gpu_trace as trace

    # One closure per callback, each converting its own arguments: torch calls these for every event
    # record and wait, sync, allocation and free of the process while tracing is on.
    def gpu_recorder() -> Recorder | None:
        recorder = _ACTIVE[-1] if _ACTIVE else None
        return recorder if recorder is not None and recorder.on_gpu and not recorder.paused else None

    def on_record(event: int, stream: int) -> None:
        recorder = gpu_recorder()
        if recorder is not None:
            recorder.on_record(recorder.event_name(event), recorder.stream_name(stream))

    def on_wait(event: int, stream: int) -> None:
        recorder = gpu_recorder()
        if recorder is not None:
            recorder.on_wait(recorder.event_name(event), recorder.stream_name(stream))

    def on_event_sync(event: int) -> None:
        recorder = gpu_recorder()
        if recorder is not None:
            recorder.on_event_sync(recorder.event_name(event))

    def on_stream_sync(stream: int) -> None:
        recorder = gpu_recorder()
        if recorder is not None:
            recorder.on_stream_sync(recorder.stream_name(stream))

    def on_device_sync() -> None:
        recorder = gpu_recorder()
        if recorder is not None:
            recorder.on_device_sync()

    def on_alloc(ptr: int) -> None:
        recorder = gpu_recorder()
        if recorder is not None:
            recorder.on_alloc(ptr)

    def on_free(ptr: int) -> None:
        recorder = gpu_recorder()
        if recorder is not None:
            recorder.on_free(ptr)

    trace.register_callback_for_event_record(on_record)
    trace.register_callback_for_event_wait(on_wait)
    trace.register_callback_for_event_synchronization(on_event_sync)
    trace.register_callback_for_stream_synchronization(on_stream_sync)
    trace.register_callback_for_device_synchronization(on_device_sync)
    trace.register_callback_for_memory_allocation(on_alloc)
    trace.register_callback_for_memory_deallocation(on_free)
    torch._C._activate_gpu_trace()
    _CALLBACKS_INSTALLED = True


def _patch_wait_stream() -> None:
    """Replace `torch.cuda.Stream.wait_stream` once: with a GPU recorder active, one reused event per recorder.

    torch's `wait_stream` makes a new `torch.cuda.Event` per call (Python `__new__`, `record_event`,
    `Event.record`, `wait_event`, `Event.wait`), and with GPU tracing on the event's creation and deletion
    each call into Python too. This one records the recorder's event on `stream` and makes `self` wait on
    it: the same two CUDA calls (`cudaEventRecord`, `cudaStreamWaitEvent`), the same record and wait
    callbacks (so the trace is unchanged: a wait refers to the event's latest record), without the rest.
    Re-recording the event later cannot affect this wait: CUDA captures the event's state at the wait.
    Only the thread that entered `recording` uses the event (another thread could re-record it between
    this thread's record and wait: the wait would then be on the wrong work); other threads, and streams
    on another device than the recorder's, get torch's own, as does everything outside recording.
    """
    global _WAIT_STREAM_PATCHED
    if _WAIT_STREAM_PATCHED:
        return
    import torch

    original = torch.cuda.Stream.wait_stream
    record = torch._C._CudaEventBase.record
    wait = torch._C._CudaEventBase.wait

    def wait_stream(self: Any, stream: Any) -> None:
        recorder = _ACTIVE[-1] if _ACTIVE else None
        if (
            recorder is None
            or not recorder.on_gpu
            or recorder.thread != get_ident()
            or self.device_index != recorder.device_index
            or stream.device_index != recorder.device_index
        ):
            return original(self, stream)
        event = recorder.wait_stream_event
        if event is None:
            event = recorder.wait_stream_event = torch.cuda.Event()
        record(event, stream)
        wait(event, self)

    torch.cuda.Stream.wait_stream = functools.wraps(original)(wait_stream)
    _WAIT_STREAM_PATCHED = True


def _patch_triton() -> None:
    """Wrap `triton.runtime.jit.JITFunction.run` once: a launch with the active recorder is recorded.

    Triton's `launch_enter_hook` fires before the launch with the stream, but hands over the arguments only
    through a per-kernel `launch_metadata`; `run` has the bound arguments of every `@triton.jit` kernel
    (autotuned ones too) and launches on torch's current stream, which the recorder reads.
    """
    global _TRITON_PATCHED
    if _TRITON_PATCHED:
        return
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
        return recorder.kernel_launch(
            name, "triton", bound, lambda: original(self, *args, grid=grid, warmup=warmup, **kwargs)
        )

    JITFunction.run = run
    _TRITON_PATCHED = True


@contextlib.contextmanager
def recording(recorder: Recorder) -> Iterator[Recorder]:
    """Every torch op, Triton launch, stream/event operation and allocation inside reaches `recorder`."""
    if recorder.on_gpu:
        _install_gpu_callbacks()
        _patch_wait_stream()
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
    _ACTIVE.append(recorder)
    try:
        with mode:
            yield recorder
    finally:
        _ACTIVE.remove(recorder)
        if freeze:
            gc.unfreeze()


__all__ = ["HOST", "active", "recording"]


def launch_kernel(name: str, fn: Callable[..., Any], /, kind: str = "external", **args: Any) -> Any:
    """Call `fn(**args)`, recorded as a launch of kernel `name` on the current stream if a recorder is active.

    For kernels racefuzz cannot see by itself (a C++ extension, a custom launcher): their read and write
    sets come from `annotate(name, ...)` over the argument names, else the conservative default.
    """
    recorder = active()
    if recorder is None or recorder.paused:
        return fn(**args)
    return recorder.kernel_launch(name, kind, args, lambda: fn(**args))


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
