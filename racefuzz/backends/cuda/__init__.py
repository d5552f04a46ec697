"""The CUDA backend: a `Program` run for real, with the kernels of `kernels/req_to_token.cu` on torch streams.

`execute(program, schedule)` issues the program's ops in host order, the way the modelled host would:
* every IR stream is a fresh `torch.cuda.Stream()` (no two aliasing one CUDA stream), every IR event a
  fresh `torch.cuda.Event()` (created lazily by torch, so waiting on a never-recorded one is a no-op, as
  the IR says); records, waits and syncs are torch's own calls;
* kernels are CuPy `RawKernel`s compiled once per process and device from `kernels/req_to_token.cu`,
  launched on the torch streams through `cupy.cuda.ExternalStream`, on torch tensors without copies;
* `schedule.device_delays[i]` is an `rf_spin` kernel on op i's stream right before op i;
  `schedule.read_spins[i]` is launch i's own in-kernel spin before its loads (its read window);
  host delays (scheduled, and `HostDelay` ops) busy-wait on `time.perf_counter`, since `time.sleep`
  overshoots by tens of microseconds.

Kernel choice: a launch's stores go through the kernel named `launch.kernel` when the module defines a
*writer* of that name, else `rf_write_cells`; its loads through a *reader* of that name, else
`rf_read_cells`. Writers and readers are told apart by their signatures in the source (see
`kernel_catalog`), so a reader's name on a writing launch can never bind the wrong argument list. A launch
that both reads and writes issues its read calls, then its write calls, on its stream: loads first, as in
the replay. Rectangles of different buffers need separate calls, and so do overlapping stores of one
launch (blocks of one call run in no fixed order, while the replay applies stores in order).

`Launch.cost_us` (the launch's own duration, e.g. a forward's compute) is an `rf_spin` of that length on
the launch's stream right before its kernel calls, inside its timeline span: the launch's loads and stores
then land at the end of its cost, where the simulator puts them.

Staging keeps the per-op host cost to a kernel launch: `stage` packs every call's rectangle descriptors,
every write's values, the observation slots (poisoned, so a load that never ran cannot pass for a good
one) and every buffer's initial contents into ONE int32 host array, which one synchronous copy puts on
the device before anything is issued (the tables are views into it: no allocation or fill kernel per
buffer); every call's argument tuple is built before the first op. Then the ops are issued in program
order, the device is synchronized, and the observation slots alone are copied back. A `CudaExecutor`
re-running the same (program, schedule) objects -- the k-of-k reproduction of a search -- reuses the
staging, the device array (re-uploaded, which resets the tables and slots) and the argument tuples of its
previous run.
`prepare(p, s).start().finish()` is the same run split in three (`CudaExecutor`, a `PreparingExecutor`):
a search stages and uploads the next example while the GPU still runs this one.

Delays are microseconds in the schedule; the kernels spin on `%globaltimer`, the GPU's nanosecond wall
clock, so a delay is passed as nanoseconds and needs no calibration. (An earlier version counted
`clock64()` SM cycles against a per-process calibration; on an H200 whose SM clock moved between 1307
and 1980 MHz within one session, its spins came out 30% short and flipped delay-dominated verdicts.)
The `timeline=True` spans show the real durations.

The package, by concept: `availability` (can it run here; torch and CuPy imported lazily, with the install
line), `catalog` (the kernels of the source, by signature), `staging` (the packed host array; pure),
`runtime` (compiled kernels, streams, staging bound to device memory, per device) and `issue` (issuing
the ops through `racefuzz.program.OpVisitor`, spans, `execute`, `prepare`, `CudaExecutor`). Importing it
imports neither torch nor CuPy.
"""

from racefuzz.backends.cuda.availability import (
    cuda_unavailable_reason,
    import_cupy,
    import_torch,
    one_line,
    pip_line,
    require,
)
from racefuzz.backends.cuda.catalog import (
    KERNEL_FILE,
    READ_FALLBACK,
    SPIN_KERNEL,
    WRITE_FALLBACK,
    KernelCatalog,
    kernel_catalog,
    read_kernels,
)
from racefuzz.backends.cuda.issue import (
    CudaConfig,
    CudaExecutor,
    PreparedRun,
    StartedRun,
    busy_wait_us,
    execute,
    prepare,
)
from racefuzz.backends.cuda.runtime import (
    THREADS_PER_BLOCK,
    Bound,
    BoundMemory,
    KernelCall,
    Runtime,
    compile_kernels,
    draw_distinct_streams,
    get_runtime,
    spin_ns,
)
from racefuzz.backends.cuda.staging import POISON, StagedCall, Staging, collect_observations, stage

__all__ = [
    "KERNEL_FILE",
    "POISON",
    "READ_FALLBACK",
    "SPIN_KERNEL",
    "THREADS_PER_BLOCK",
    "WRITE_FALLBACK",
    "Bound",
    "BoundMemory",
    "CudaConfig",
    "CudaExecutor",
    "KernelCall",
    "KernelCatalog",
    "PreparedRun",
    "Runtime",
    "StagedCall",
    "Staging",
    "StartedRun",
    "busy_wait_us",
    "collect_observations",
    "compile_kernels",
    "cuda_unavailable_reason",
    "draw_distinct_streams",
    "execute",
    "get_runtime",
    "import_cupy",
    "import_torch",
    "kernel_catalog",
    "one_line",
    "pip_line",
    "prepare",
    "read_kernels",
    "require",
    "spin_ns",
    "stage",
]
