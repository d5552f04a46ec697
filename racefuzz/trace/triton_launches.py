"""Triton launches routed through the active recorder: `JITFunction.run` wrapped once a process (`patch`)."""

from __future__ import annotations

import functools

from racefuzz.trace import graphs
from racefuzz.trace.recorder import active


@functools.cache  # once a process, also when Triton is missing: not looked for again at every recording
def patch() -> None:
    """Wrap `triton.runtime.jit.JITFunction.run` once: a launch with the active recorder is recorded.

    Triton's `launch_enter_hook` fires before the launch with the stream, but hands over the arguments only
    through a per-kernel `launch_metadata`; `run` has the bound arguments of every `@triton.jit` kernel
    (autotuned ones too) and launches on torch's current stream, which the recorder reads.
    """
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


def patched() -> bool:
    """Whether `patch` has run in this process (whether or not Triton was there)."""
    return patch.cache_info().currsize > 0
