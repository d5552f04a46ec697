"""Recording: the one entry point that installs the recorder's frontends for a step.

`recording(recorder)`: inside it every torch op (`racefuzz.trace.torch_mode`, the C++ fast path of
`racefuzz.trace.fastpath`), Triton launch (`racefuzz.trace.triton_launches`), stream or event operation
(`racefuzz.trace.cuda_api` on a GPU, `racefuzz.trace.torch_patches` on the CPU) and allocation of the step
reaches `recorder`. `launch_kernel` and `cupy_kernel` record the kernels racefuzz cannot see by itself.
Imports torch (and Triton, if installed) lazily.
"""

from __future__ import annotations

import contextlib
import functools
import gc
from collections.abc import Callable, Iterator, Sequence
from threading import get_ident
from typing import Any

from racefuzz.trace import cuda_api, fastpath, graphs, op_schemas, torch_mode, torch_patches, triton_launches
from racefuzz.trace.builder import HOST
from racefuzz.trace.op_schemas import TORCH_TENSOR_COPY
from racefuzz.trace.recorder import ACTIVE, Recorder, active, fast_constants


@contextlib.contextmanager
def recording(recorder: Recorder) -> Iterator[Recorder]:
    """Every torch op, Triton launch, stream/event operation and allocation inside reaches `recorder`."""
    if recorder.on_gpu:
        cuda_api.patch()
    triton_launches.patch()
    mode = torch_mode.trace_mode_class()(recorder)
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
    ACTIVE.append(recorder)
    try:
        with torch_patches.installed(recorder.on_gpu), mode:
            if mode.fastpath is not None:
                _configure_dispatcher(mode.fastpath)
                mode.fastpath.begin(mode.fast_state)  # most ops, before they reach the mode
            try:
                yield recorder
            finally:
                graphs.abandon(recorder)  # a capture the step left open: its mode and fast-path scope go first
                if mode.fastpath is not None:
                    mode.fastpath.end()
    finally:
        ACTIVE.remove(recorder)
        recorder.active = False
        graphs.release(recorder)  # after `active`: the frees of what the graphs kept are not the step's
        if freeze:
            gc.unfreeze()


@functools.cache  # once a process (the C++ keeps what it is given)
def _configure_dispatcher(module: Any) -> None:
    """Tell the C++ fast path's dispatcher entry which ops it records (`op_schemas.dispatcher_op_info`)."""
    import torch

    set_eval_frame = torch._C._dynamo.eval_frame.set_eval_frame
    fastpath.configure(module, op_schemas.dispatcher_op_info, set_eval_frame, fast_constants())


__all__ = ["HOST", "TORCH_TENSOR_COPY", "active", "cupy_kernel", "launch_kernel", "recording"]


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
