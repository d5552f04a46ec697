"""racefuzz.trace: fuzz unmodified PyTorch, Triton and CuPy code for stream-ordering races.

A step is a function of a `TraceEnv` that runs real code (torch ops, Triton kernels, waits, syncs) and
returns the tensors to compare. `fuzz(step)` records it (byte intervals per storage, streams, events,
syncs, allocations), judges the trace with racefuzz's happens-before checker, and on a GPU searches delay
points with Hypothesis for a run whose values differ from the serialized reference run:

    from racefuzz.trace import fuzz

    def step(env):
        table = env.name(torch.zeros(8, 64, dtype=torch.int32, device=env.device), "req_to_token")
        schedule, forward = env.stream("schedule"), env.stream("forward")
        schedule.wait_stream(env.current_stream())  # after the table's allocation and zeroing
        forward.wait_stream(env.current_stream())
        ...
        return {"kv_indices": kv_indices}

    result = fuzz(step, watch=["req_to_token"])

Importing this package imports neither torch nor Triton; recording does, lazily.
"""

from racefuzz.trace.annotations import WHOLE, KernelAccess, annotate, rows
from racefuzz.trace.capture import cupy_kernel, launch_kernel
from racefuzz.trace.env import TraceEnv, VirtualEvent, VirtualStream
from racefuzz.trace.search import TraceResult, fuzz, load_step

__all__ = [
    "WHOLE",
    "KernelAccess",
    "TraceEnv",
    "TraceResult",
    "VirtualEvent",
    "VirtualStream",
    "annotate",
    "cupy_kernel",
    "fuzz",
    "launch_kernel",
    "load_step",
    "rows",
]
