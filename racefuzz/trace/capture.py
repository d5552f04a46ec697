"""Installing the frontends of the recorder: torch's dispatch mode, its GPU-trace callbacks, Triton's launches.

`recording(recorder)` is the one entry point: inside it every torch op, Triton launch, stream or event
operation and allocation of the step reaches `recorder`. Imports torch (and Triton, if installed) lazily.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

from racefuzz.trace.model import HOST
from racefuzz.trace.recorder import Recorder

_ACTIVE: list[Recorder] = []
_CALLBACKS_INSTALLED = False
_TRITON_PATCHED = False

_NOT_ACCESSES = frozenset(
    {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "record_stream", "set_", "resize_"}
)
"""Ops that allocate or re-point memory without reading or writing its contents."""

_HOST_SYNCING = frozenset({"_local_scalar_dense"})
"""Ops after which the host has waited for the current stream (`.item()`, `.tolist()`)."""


def active() -> Recorder | None:
    return _ACTIVE[-1] if _ACTIVE else None


@functools.cache
def _torch_mode_class() -> type:
    from torch.utils._python_dispatch import TorchDispatchMode

    class TraceMode(TorchDispatchMode):
        """Records every torch op as a launch on the current stream (see `racefuzz.trace.recorder`)."""

        def __init__(self, recorder: Recorder) -> None:
            super().__init__()
            self.recorder = recorder

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            recorder = self.recorder
            info = _OP_INFO.get(func) or _op_info(func)
            name, label, outputs_written = info.name, info.label, info.fresh_outputs
            if recorder.paused or recorder.opaque or name in _NOT_ACCESSES:
                if name == "record_stream":
                    recorder.on_record_stream(args[0])
                return func(*args, **kwargs)
            reads, writes = _schema_accesses(info, args, kwargs)
            if not writes and not outputs_written:
                return func(*args, **kwargs)  # a view or metadata op
            on_gpu = recorder.on_gpu
            if on_gpu:
                if not reads and not writes:
                    # A factory (`zeros`, `arange`): a device launch iff it makes a CUDA tensor.
                    device = kwargs.get("device")
                    if device is None or device.type != "cuda":
                        return func(*args, **kwargs)
                elif not any(t.is_cuda for t in reads) and not any(t.is_cuda for _, t in writes):
                    pinned_reads = [t for t in reads if t.is_pinned()]
                    pinned_writes = [t for _, t in writes if t.is_pinned()]
                    out = func(*args, **kwargs)
                    if outputs_written:
                        pinned_writes += [t for t in _tensors(out) if t.is_pinned()]
                    if pinned_reads or pinned_writes:
                        recorder.host_access(label, pinned_reads, pinned_writes)
                    return out
                reads = [t for t in reads if t.is_cuda or t.is_pinned()]
                writes = [(slot, t) for slot, t in writes if t.is_cuda or t.is_pinned()]

            def fresh(out: Any) -> list[tuple[object, Any]]:
                if not outputs_written:
                    return []
                # An output on an input's storage is a view the schema does not declare (`_unsafe_view`).
                inputs = {t.untyped_storage().data_ptr() for t in reads}
                return [
                    (f"out{i}", t)
                    for i, t in enumerate(_tensors(out))
                    if (not on_gpu or t.is_cuda or t.is_pinned()) and t.untyped_storage().data_ptr() not in inputs
                ]

            out = recorder.launch(label, "torch", lambda: func(*args, **kwargs), reads, writes, outputs=fresh)
            if name in _HOST_SYNCING or (on_gpu and _is_blocking_d2h(name, args, kwargs, out)):
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


_OP_INFO: dict[Any, _OpInfo] = {}


def _op_info(func: Any) -> _OpInfo:
    schema = func._schema
    arguments = tuple(
        (i, arg.name, arg.kwarg_only, arg.alias_info is not None and arg.alias_info.is_write)
        for i, arg in enumerate(schema.arguments)
    )
    info = _OpInfo(schema.name.split("::")[-1], str(func), arguments, _is_compute(func))
    _OP_INFO[func] = info
    return info


def _schema_accesses(info: _OpInfo, args: tuple, kwargs: dict) -> tuple[list[Any], list[tuple[object, Any]]]:
    """(read tensors, (slot, written tensor) pairs) of one call, from the op's schema."""
    import torch

    reads: list[Any] = []
    writes: list[tuple[object, Any]] = []
    count = len(args)
    for i, name, kwarg_only, written in info.arguments:
        value = kwargs.get(name) if kwarg_only or i >= count else args[i]
        if isinstance(value, torch.Tensor):
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

    def forward(method: str, *convert: Any):
        def callback(*raw: Any) -> None:
            recorder = active()
            if recorder is not None and recorder.on_gpu and not recorder.paused:
                getattr(recorder, method)(*(fn(recorder, value) for fn, value in zip(convert, raw, strict=True)))

        return callback

    def event(recorder: Recorder, handle: int) -> str:
        return recorder.event_name(handle)

    def stream(recorder: Recorder, handle: int) -> str:
        return recorder.stream_name(handle)

    def raw(recorder: Recorder, value: int) -> int:
        return value

    trace.register_callback_for_event_record(forward("on_record", event, stream))
    trace.register_callback_for_event_wait(forward("on_wait", event, stream))
    trace.register_callback_for_event_synchronization(forward("on_event_sync", event))
    trace.register_callback_for_stream_synchronization(forward("on_stream_sync", stream))
    trace.register_callback_for_device_synchronization(forward("on_device_sync"))
    trace.register_callback_for_memory_allocation(forward("on_alloc", raw))
    trace.register_callback_for_memory_deallocation(forward("on_free", raw))
    torch._C._activate_gpu_trace()
    _CALLBACKS_INSTALLED = True


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
    _patch_triton()
    mode = _torch_mode_class()(recorder)
    _ACTIVE.append(recorder)
    try:
        with mode:
            yield recorder
    finally:
        _ACTIVE.remove(recorder)


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
