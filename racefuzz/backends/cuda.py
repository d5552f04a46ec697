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
order, the device is synchronized, and the observation slots alone are copied back. A re-run of the same
(program, schedule) objects -- the k-of-k reproduction of a search -- reuses the staging, the device
array (re-uploaded, which resets the tables and slots) and the argument tuples of the previous run.
`prepare(p, s).start().finish()` is the same run split in three (`CudaExecutor`, a `PreparingExecutor`):
a search stages and uploads the next example while the GPU still runs this one.

Delays are microseconds in the schedule; the kernels spin on `%globaltimer`, the GPU's nanosecond wall
clock, so a delay is passed as nanoseconds and needs no calibration. (An earlier version counted
`clock64()` SM cycles against a per-process calibration; on an H200 whose SM clock moved between 1307
and 1980 MHz within one session, its spins came out 30% short and flipped delay-dominated verdicts.)
The `timeline=True` spans show the real durations.
"""

from __future__ import annotations

import re
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

import numpy as np

from racefuzz.errors import BackendUnavailable, InvalidArgument
from racefuzz.kernel_sources import kernel_source
from racefuzz.memory import Observations
from racefuzz.program import (
    DeviceSync,
    EventSync,
    HostDelay,
    Launch,
    Program,
    Record,
    StreamSync,
    WaitEvent,
    WaitStream,
)
from racefuzz.schedule import NO_DELAYS, Schedule
from racefuzz.sim import HOST, Execution, Span

KERNEL_FILE = "req_to_token.cu"
WRITE_FALLBACK = "rf_write_cells"
READ_FALLBACK = "rf_read_cells"
SPIN_KERNEL = "rf_spin"
THREADS_PER_BLOCK = 128
"""Threads of one block; a block covers one rectangle, striding over its cells."""

POISON = int(np.iinfo(np.int32).min)
"""What every observation slot holds before its reader stores into it."""

_WRITER_PARAMS = ("int*", "int", "const int*", "const int*")  # table, ld, rects, values
_READER_PARAMS = ("const int*", "int", "const int*", "int*", "long long")  # table, ld, rects, observed, spin
_GLOBAL_RE = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(\w+)\s*\(([^)]*)\)')
_MAX_REDRAWS = 64
"""Extra streams drawn when torch's pool hands back one already taken (two laps of its 32-stream pool)."""


def _pip_line(torch: Any | None = None) -> str:
    """The install line for the CUDA extra that matches torch's CUDA major version (CUDA 13 by default)."""
    cuda = getattr(getattr(torch, "version", None), "cuda", None) if torch is not None else None
    extra = "cuda12" if isinstance(cuda, str) and cuda.startswith("12") else "cuda13"
    return f"pip install 'racefuzz[{extra}]'"


@dataclass(frozen=True)
class CudaConfig:
    """How to run on the GPU.

    Args:
        timeline: record CUDA timing events around every kernel and spin and return real spans (µs from
            the run's start; host spans from `time.perf_counter`). Off, `Execution.timeline` is empty.
        device: the CUDA device index to run on.
    """

    timeline: bool = False
    device: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.device, bool) or not isinstance(self.device, int) or self.device < 0:
            raise InvalidArgument(f"CudaConfig.device must be a device index >= 0, got {self.device!r}")


# -- availability ------------------------------------------------------------------------------------------


def _import_torch() -> Any:
    """torch, or `BackendUnavailable` with the install line."""
    try:
        import torch
    except ImportError as exc:
        raise BackendUnavailable(f"torch is not installed ({exc}): {_pip_line()}") from None
    return torch


def _import_cupy(torch: Any | None = None) -> Any:
    """CuPy, or `BackendUnavailable` with the install line."""
    try:
        import cupy
    except ImportError as exc:
        raise BackendUnavailable(f"CuPy is not installed ({exc}): {_pip_line(torch)}") from None
    return cupy


def _one_line(text: object) -> str:
    return " | ".join(line.strip() for line in str(text).splitlines() if line.strip())


def cuda_unavailable_reason() -> str | None:
    """None when torch sees a CUDA GPU and CuPy works here; otherwise why not, in one line.

    It checks the environment only; a kernel that fails to compile is reported by `execute`, so that a
    broken kernel source fails the GPU tests instead of skipping them.
    """
    try:
        torch = _import_torch()
    except BackendUnavailable as exc:
        return str(exc)
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build: install a CUDA build of torch and {_pip_line()}"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA GPU (torch.cuda.is_available() is False)"
    try:
        cupy = _import_cupy(torch)
    except BackendUnavailable as exc:
        return str(exc)
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CuPy built for another CUDA than the driver offers, and similar
        return f"CuPy {cupy.__version__} cannot reach the GPU: {_one_line(exc)}; {_pip_line(torch)}"
    if count < 1:
        return f"CuPy {cupy.__version__} sees no CUDA device"
    return None


_device_count: int | None = None
"""Set once the environment passed `cuda_unavailable_reason`: how many devices torch sees."""


def _require(device: int) -> tuple[Any, Any]:
    """(torch, cupy) when the GPU backend can run on `device`, else `BackendUnavailable` (one line)."""
    global _device_count
    if _device_count is None:
        reason = cuda_unavailable_reason()
        if reason is not None:
            raise BackendUnavailable(f"the CUDA backend cannot run here: {reason}")
        import torch

        _device_count = torch.cuda.device_count()
    import cupy
    import torch

    if device >= _device_count:
        raise InvalidArgument(f"CudaConfig.device is {device}, but torch sees {_device_count} CUDA device(s)")
    return torch, cupy


# -- kernels -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelCatalog:
    """The `__global__` kernels of the source, by role, as told by their parameter lists.

    Writers take `(int* table, int ld, const int* rects, const int* values)`; readers take
    `(const int* table, int ld, const int* rects, int* observed, long long spin_ns)`.
    """

    writers: frozenset[str]
    readers: frozenset[str]
    spin: str = SPIN_KERNEL

    def writer_for(self, kernel: str) -> str:
        return kernel if kernel in self.writers else WRITE_FALLBACK

    def reader_for(self, kernel: str) -> str:
        return kernel if kernel in self.readers else READ_FALLBACK

    @property
    def names(self) -> tuple[str, ...]:
        return (self.spin, *sorted(self.writers), *sorted(self.readers))


def _param_type(param: str) -> str:
    """`const int *rects` -> `const int*`: the declared type with the parameter name dropped."""
    words = " ".join(param.split())
    match = re.fullmatch(r"(.*?)\s*\b\w+", words)
    declared = match.group(1) if match else words
    return re.sub(r"\s*\*", "*", declared).strip()


def kernel_catalog(source: str) -> KernelCatalog:
    """Classify the `extern "C" __global__` kernels of `source`; `BackendUnavailable` if a fallback is missing."""
    writers: set[str] = set()
    readers: set[str] = set()
    spins: set[str] = set()
    for name, params in _GLOBAL_RE.findall(source):
        types = tuple(_param_type(p) for p in params.split(",") if p.strip())
        if types == _WRITER_PARAMS:
            writers.add(name)
        elif types == _READER_PARAMS:
            readers.add(name)
        elif types == ("long long",):
            spins.add(name)
    missing = [
        n for n, found in ((WRITE_FALLBACK, writers), (READ_FALLBACK, readers), (SPIN_KERNEL, spins)) if n not in found
    ]
    if missing:
        raise BackendUnavailable(f"{KERNEL_FILE} lacks the kernel(s) {', '.join(missing)} with the expected signature")
    return KernelCatalog(frozenset(writers), frozenset(readers))


# -- staging (pure: no torch, no CuPy) ---------------------------------------------------------------------


class StagedCall(NamedTuple):
    """One kernel call of a launch: `kernel` over `count` rectangles of buffer `buffer`.

    Its descriptors are `count` runs of five ints (row0, nrows, col0, ncols, offset) at `rects_at` in the
    staging array. A writer's `offset` indexes the staging array itself (the values follow the
    descriptors); a reader's indexes the observation slots, which start at `Staging.observed_base`.
    `spin_us` is the reader's read window (only the first read call of a launch spins: the later ones
    load right after it, inside the same window).
    """

    kernel: str
    buffer: int
    rects_at: int
    count: int
    reads: bool
    spin_us: float = 0.0


@dataclass(frozen=True)
class Staging:
    """Everything the device needs before the first op, built on the host.

    Args:
        host: int32: every call's descriptors, then every write's values (row-major), then one observation
            slot per read cell, holding `POISON` until a reader stores into it, then every buffer's initial
            contents (row-major, its `fill`). One copy to the device carries all of it; one copy of the
            slots back carries every observation.
        observed_base: where the observation slots start in `host`.
        observed_size: how many slots there are (the sum of all read ranges' sizes).
        calls: launch index -> its kernel calls, in issue order (reads first).
        observed_at: launch index -> where each of its read ranges starts, counted from `observed_base`.
        tables_at: buffer id -> where that buffer's cells start in `host` (after the observation slots).
    """

    host: np.ndarray
    observed_base: int
    observed_size: int
    calls: dict[int, tuple[StagedCall, ...]]
    observed_at: dict[int, tuple[int, ...]]
    tables_at: tuple[int, ...] = ()


def _overlaps(a: Any, b: Any) -> bool:
    return a.row0 < b.row1 and b.row0 < a.row1 and a.col0 < b.col1 and b.col0 < a.col1


def stage(program: Program, schedule: Schedule, catalog: KernelCatalog) -> Staging:
    """Pack `program`'s launches into kernel calls and one int32 array (see `Staging`).

    It runs once per example, so it is written for speed: descriptors go into one flat list and values
    into one list of chunks, each copied into the array in a single step at the end.
    """
    launches = program.launches
    values_base = 5 * sum(len(launch.reads) + len(launch.writes) for launch in launches)
    descriptors: list[int] = []
    chunks: list[np.ndarray] = []
    value_cursor, observed_cursor = values_base, 0
    calls: dict[int, tuple[StagedCall, ...]] = {}
    observed_at: dict[int, tuple[int, ...]] = {}
    read_spins = schedule.read_spins

    def emit(kernel: str, buffer: int, rects: list[tuple[Any, int]], reads: bool, spin_us: float) -> StagedCall:
        at = len(descriptors)
        for cells, offset in rects:
            descriptors.extend((cells.row0, cells.row1 - cells.row0, cells.col0, cells.col1 - cells.col0, offset))
        return StagedCall(kernel, buffer, at, len(rects), reads, spin_us)

    for launch in launches:
        out: list[StagedCall] = []
        if launch.reads:
            by_buffer: dict[int, list[tuple[Any, int]]] = {}
            starts: list[int] = []
            for cells in launch.reads:
                starts.append(observed_cursor)
                by_buffer.setdefault(cells.buffer.id, []).append((cells, observed_cursor))
                observed_cursor += (cells.row1 - cells.row0) * (cells.col1 - cells.col0)
            observed_at[launch.index] = tuple(starts)
            reader = catalog.reader_for(launch.kernel)
            spin_us = read_spins.get(launch.index, 0.0)
            for buffer, rects in by_buffer.items():
                out.append(emit(reader, buffer, rects, True, spin_us))
                spin_us = 0.0
        if launch.writes:
            # Per buffer, a list of calls; a store joins its buffer's last call unless it overlaps a store
            # already there, since the blocks of one call run in no fixed order.
            groups: dict[int, list[list[tuple[Any, int]]]] = {}
            for cells, values in zip(launch.writes, launch.values, strict=True):
                chunks.append(values.reshape(-1))
                buffer_calls = groups.setdefault(cells.buffer.id, [[]])
                if any(_overlaps(cells, other) for other, _ in buffer_calls[-1]):
                    buffer_calls.append([])
                buffer_calls[-1].append((cells, value_cursor))
                value_cursor += values.size
            writer = catalog.writer_for(launch.kernel)
            for buffer, buffer_calls in groups.items():
                out.extend(emit(writer, buffer, rects, False, 0.0) for rects in buffer_calls)
        calls[launch.index] = tuple(out)
    tables_base = value_cursor + observed_cursor
    tables_at = []
    cursor = tables_base
    for buffer in program.buffers:
        tables_at.append(cursor)
        cursor += buffer.rows * buffer.cols
    total = cursor
    if total >= 2**31:
        raise InvalidArgument(f"program too large for int32 offsets: {total} staged ints")
    assert len(descriptors) == values_base
    host = np.empty(max(1, total), dtype=np.int32)  # never empty: a device pointer is taken from it
    host[:values_base] = descriptors
    if chunks:
        np.concatenate(chunks, out=host[values_base:value_cursor])
    host[value_cursor:tables_base] = POISON
    for buffer, at in zip(program.buffers, tables_at, strict=True):
        host[at : at + buffer.rows * buffer.cols] = buffer.fill
    return Staging(host, value_cursor, observed_cursor, calls, observed_at, tuple(tables_at))


T = TypeVar("T")


def draw_distinct_streams(
    count: int, new_stream: Callable[[], T], handle: Callable[[T], int], taken: set[int]
) -> list[T]:
    """`count` streams from `new_stream` whose handles are pairwise distinct and not in `taken`.

    torch hands streams out round-robin from a fixed pool, so two draws can return the same CUDA stream
    (after a lap of the pool, or when another thread draws in between); two IR streams on one CUDA stream
    would be silently ordered and hide every race between them. Aliased draws are dropped and redrawn
    (as sglang #31681 does); `InvalidArgument` when the pool cannot supply `count` distinct streams.
    """
    seen = set(taken)
    streams: list[T] = []
    for _ in range(count + _MAX_REDRAWS):
        if len(streams) == count:
            break
        stream = new_stream()
        key = handle(stream)
        if key not in seen:
            seen.add(key)
            streams.append(stream)
    if len(streams) < count:
        raise InvalidArgument(
            f"could not draw {count} distinct CUDA streams from torch's stream pool (got {len(streams)}); "
            "the program has more streams than the pool holds"
        )
    return streams


def busy_wait_us(us: float) -> None:
    """Spin the host for `us` microseconds on `time.perf_counter` (sleep overshoots short waits)."""
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


# -- the per-process runtime: compiled kernels -----------------------------------


def _ns(us: float) -> np.int64:
    """A delay in microseconds as the kernels' spin argument: nanoseconds of %globaltimer."""
    return np.int64(round(us * 1000.0))


@dataclass
class _Runtime:
    catalog: KernelCatalog
    kernels: dict[str, Any]


_runtimes: dict[int, _Runtime] = {}


def _compile(cupy: Any, source: str, names: Sequence[str]) -> dict[str, Any]:
    """Each named kernel of `source` as a CuPy `RawKernel`, compiled with NVRTC for the current device."""
    from cupy.cuda.compiler import CompileException

    try:
        module = cupy.RawModule(code=source, options=("--std=c++17",))
        return {name: module.get_function(name) for name in names}
    except CompileException as exc:
        raise BackendUnavailable(f"NVRTC could not compile {KERNEL_FILE}: {_one_line(exc)}") from None
    except cupy.cuda.driver.CUDADriverError as exc:
        raise BackendUnavailable(f"the CUDA driver could not load {KERNEL_FILE}: {_one_line(exc)}") from None


_external: dict[tuple[int, int], Any] = {}


def _external_stream(cupy: Any, handle: int, device: int) -> Any:
    """CuPy's view of the torch stream `handle`; cached, since torch's pool hands out the same few streams.

    CuPy 14 deprecates `ExternalStream` for `Stream.from_external`; `ExternalStream` still works and takes
    the raw handle on every CuPy since 9, so it stays, with its warning silenced here rather than globally.
    """
    key = (device, handle)
    stream = _external.get(key)
    if stream is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            stream = cupy.cuda.ExternalStream(handle, device)
        _external[key] = stream
    return stream


def _runtime(torch: Any, cupy: Any, device: int) -> _Runtime:
    """Compile once per process and device; the caller has made `device` current."""
    runtime = _runtimes.get(device)
    if runtime is None:
        source = kernel_source(KERNEL_FILE)
        catalog = kernel_catalog(source)
        kernels = _compile(cupy, source, catalog.names)
        runtime = _Runtime(catalog, kernels)
        _runtimes[device] = runtime
    return runtime


# -- execution ---------------------------------------------------------------------------------------------


@dataclass
class _GpuMark:
    """A device interval to read back once the run finished: two timing events and what they bracket."""

    op_index: int
    track: str
    kind: str
    label: str
    begin: Any
    end: Any


KernelCall = tuple[Any, tuple[int], tuple[Any, ...]]
"""A bound kernel call: (CuPy kernel, grid, argument tuple); the block is `THREADS_PER_BLOCK`."""


@dataclass
class _Bound:
    """The staged program bound to device memory and torch streams: ready to issue.

    `staged` is the device copy of `Staging.host`; `tables` are views into it. `launch_calls` holds each
    launch's kernel calls, `spins` each scheduled device delay and `costs` each launch's own duration
    (`Launch.cost_us`), both as `rf_spin` argument tuples. Streams and events are fresh for every run.
    """

    tables: list[Any]
    staged: Any
    streams: list[Any]
    ext: list[Any]
    events: list[Any]
    launch_calls: dict[int, list[KernelCall]]
    spins: dict[int, tuple[Any, ...]]
    costs: dict[int, tuple[Any, ...]]


def _bind_memory(
    torch: Any, runtime: _Runtime, program: Program, schedule: Schedule, staging: Staging, device: int
) -> tuple[Any, list[Any], dict[int, list[KernelCall]], dict[int, tuple[Any, ...]], dict[int, tuple[Any, ...]]]:
    """Upload `staging.host` (synchronously) and build every kernel call's arguments against it.

    Returns (device array, table views, launch calls, device-delay spins, launch-cost spins). torch's
    `copy_` from pageable host memory returns only once the copy has landed (it synchronizes the current
    stream), so the tables, descriptors and poisoned slots are in place before any IR stream runs.
    """
    dev = torch.device("cuda", device)
    staged = torch.from_numpy(staging.host).to(dev)
    staged_ptr = staged.data_ptr()
    tables = [
        staged[at : at + b.rows * b.cols].view(b.rows, b.cols)
        for b, at in zip(program.buffers, staging.tables_at, strict=True)
    ]
    # Argument objects shared between calls where they can be: this loop runs once per example.
    tables_arg = [
        (np.uint64(staged_ptr + 4 * at), np.int32(b.cols))
        for b, at in zip(program.buffers, staging.tables_at, strict=True)
    ]
    values_arg = np.uint64(staged_ptr)
    observed_arg = np.uint64(staged_ptr + 4 * staging.observed_base)
    no_spin = np.int64(0)
    kernels = runtime.kernels
    launch_calls: dict[int, list[KernelCall]] = {}
    for index, calls in staging.calls.items():
        bound = []
        for call in calls:
            table, ld = tables_arg[call.buffer]
            rects = np.uint64(staged_ptr + 4 * call.rects_at)
            if call.reads:
                spin = _ns(call.spin_us) if call.spin_us else no_spin
                args: tuple[Any, ...] = (table, ld, rects, observed_arg, spin)
            else:
                args = (table, ld, rects, values_arg)
            bound.append((kernels[call.kernel], (call.count,), args))
        launch_calls[index] = bound
    spins = {index: (_ns(us),) for index, us in schedule.device_delays.items()}
    costs = {
        launch.index: (_ns(launch.cost_us),)
        for launch in program.launches
        if launch.cost_us  # None (the backend's default: the kernel's own time) or 0: no spin
    }
    return staged, tables, launch_calls, spins, costs


def _bind(
    torch: Any, cupy: Any, runtime: _Runtime, program: Program, schedule: Schedule, staging: Staging, device: int
) -> _Bound:
    """Bind `staging` to fresh device memory, fresh streams and fresh events (see `_Bound`)."""
    staged, tables, launch_calls, spins, costs = _bind_memory(torch, runtime, program, schedule, staging, device)
    streams, ext, events = _fresh_streams_and_events(torch, cupy, program, device)
    return _Bound(tables, staged, streams, ext, events, launch_calls, spins, costs)


def _fresh_streams_and_events(torch: Any, cupy: Any, program: Program, device: int) -> tuple[list, list, list]:
    """Pairwise distinct torch streams (none the current one), their CuPy views, and never-recorded events."""
    dev = torch.device("cuda", device)
    taken = {torch.cuda.current_stream(dev).cuda_stream}
    streams = draw_distinct_streams(len(program.streams), torch.cuda.Stream, lambda s: s.cuda_stream, taken)
    ext = [_external_stream(cupy, s.cuda_stream, device) for s in streams]
    events = [torch.cuda.Event() for _ in program.events]
    return streams, ext, events


@dataclass
class _Cached:
    """The last run's staging and bound memory, reused when the same (program, schedule) runs again."""

    program: Program
    schedule: Schedule
    device: int
    staging: Staging
    bound: _Bound


_last: _Cached | None = None


def forget_cached_run() -> None:
    """Drop the reused staging of the previous run, so the next `execute` stages and binds afresh."""
    global _last
    _last = None


def _prepare(
    torch: Any, cupy: Any, runtime: _Runtime, program: Program, schedule: Schedule, device: int
) -> tuple[Staging, _Bound]:
    """Staging and binding for one run; a repeat of the previous run's very objects skips the rebuild.

    The cache holds one entry and keys on identity (`is`), so a program or schedule that is merely equal
    is staged afresh. A repeat re-uploads the same host array into the same device array (resetting the
    tables and the observation slots) and draws fresh streams and events.
    """
    global _last
    cached = _last
    if cached is not None and cached.program is program and cached.schedule is schedule and cached.device == device:
        staged = cached.bound.staged
        staged.copy_(torch.from_numpy(cached.staging.host))  # synchronous from pageable memory, as in _bind
        streams, ext, events = _fresh_streams_and_events(torch, cupy, program, device)
        old = cached.bound
        bound = _Bound(old.tables, staged, streams, ext, events, old.launch_calls, old.spins, old.costs)
        cached.bound = bound
        return cached.staging, bound
    _last = None  # drop the previous device array before allocating the next
    staging = stage(program, schedule, runtime.catalog)
    bound = _bind(torch, cupy, runtime, program, schedule, staging, device)
    _last = _Cached(program, schedule, device, staging, bound)
    return staging, bound


def execute(program: Program, schedule: Schedule = NO_DELAYS, config: CudaConfig | None = None) -> Execution:
    """Run `program` under `schedule` on the GPU; the result has the simulator's shape.

    Returns an `Execution` whose `observations` hold, for every reading launch, one int32 array per entry
    of `launch.reads` shaped like that range; `host_end_us` is the host time from the first op to the end
    of the final device synchronize; `timeline` holds real spans when `config.timeline` (else it is
    empty), and then `access_time_us` maps each launch to the end of its kernel span (its cost spin
    included); `writers` is None (the GPU does not track which launch stored a cell).

    Every run starts from the buffers' fill values and poisoned observation slots, on fresh streams and
    never-recorded events, whether or not it reuses the previous run's staging (see `_prepare`).

    Raises:
        BackendUnavailable: no usable GPU, torch or CuPy here, or the kernels failed to compile.
        InvalidArgument: the schedule does not fit the program, or a bad device index.
    """
    config = config or CudaConfig()
    schedule.check_against(program)
    torch, cupy = _require(config.device)
    with torch.cuda.device(config.device):
        runtime = _runtime(torch, cupy, config.device)
        staging, bound = _prepare(torch, cupy, runtime, program, schedule, config.device)
        # The upload synchronized its stream; this also orders any earlier work of the caller's.
        torch.cuda.synchronize()
        run = PreparedRun(torch, program, schedule, staging, bound, runtime, config)
        return run.start().finish()


def prepare(program: Program, schedule: Schedule = NO_DELAYS, config: CudaConfig | None = None) -> PreparedRun:
    """Stage and bind a run without issuing it: `prepare(p, s).start().finish()` is `execute(p, s)`.

    This is the asynchronous form of `execute`, for a caller that overlaps its own host work with the GPU
    (the search builds and prepares example i+1 while example i runs): `prepare` touches neither the
    streams nor the memory of a run still in flight -- it uploads into a fresh device array (on the
    current stream, which torch's non-blocking pool streams do not wait for) and draws fresh streams and
    events -- and it does not synchronize the device. The caller must `finish` the run in flight before it
    `start`s this one, so that each run has the GPU to itself, as under `execute`. It bypasses the
    one-entry re-run cache of `execute`.
    """
    config = config or CudaConfig()
    schedule.check_against(program)
    torch, cupy = _require(config.device)
    with torch.cuda.device(config.device):
        runtime = _runtime(torch, cupy, config.device)
        staging = stage(program, schedule, runtime.catalog)
        bound = _bind(torch, cupy, runtime, program, schedule, staging, config.device)
    return PreparedRun(torch, program, schedule, staging, bound, runtime, config)


class CudaExecutor:
    """The CUDA backend as a search executor: a call is `execute`; `prepare` is its asynchronous form."""

    def __init__(self, config: CudaConfig | None = None) -> None:
        self.config = config or CudaConfig()

    def __call__(self, program: Program, schedule: Schedule) -> Execution:
        return execute(program, schedule, self.config)

    def prepare(self, program: Program, schedule: Schedule) -> PreparedRun:
        return prepare(program, schedule, self.config)


def collect_observations(program: Program, staging: Staging, observed: np.ndarray) -> Observations:
    """Cut the observation slots (`host[observed_base:]` as copied back) into per-launch, per-range arrays."""
    observations: Observations = {}
    for launch in program.launches:
        if launch.reads:
            starts = staging.observed_at[launch.index]
            observations[launch.index] = tuple(
                observed[at : at + cells.size].reshape(cells.shape)
                for cells, at in zip(launch.reads, starts, strict=True)
            )
    return observations


def _host_span(index: int, kind: str, start: float, t0: float, label: str) -> Span:
    """A host span from `start` (a perf_counter reading) to now, in µs since `t0`."""
    return Span(index, HOST, kind, (start - t0) * 1e6, (time.perf_counter() - t0) * 1e6, label)


class PreparedRun:
    """A run staged and bound to device memory, streams and events: ready to `start` (see `prepare`)."""

    def __init__(
        self,
        torch: Any,
        program: Program,
        schedule: Schedule,
        staging: Staging,
        bound: _Bound,
        runtime: _Runtime,
        config: CudaConfig,
    ) -> None:
        self._torch, self._runtime, self._config = torch, runtime, config
        self.program, self.schedule, self.staging, self.bound = program, schedule, staging, bound

    def start(self) -> StartedRun:
        """Issue every op in host order, as the modelled host would, and return once the last is issued.

        Host delays and host syncs happen here, so this blocks for as long as the program's host does; the
        device work after the last issued op is still running on return.
        """
        with self._torch.cuda.device(self._config.device):
            return _issue(
                self._torch, self.program, self.schedule, self.staging, self.bound, self._runtime, self._config
            )


class StartedRun:
    """A run whose ops are all issued; `finish` waits for the device and reads the loads back."""

    def __init__(
        self,
        torch: Any,
        program: Program,
        staging: Staging,
        bound: _Bound,
        config: CudaConfig,
        t0: float,
        origin: Any,
        marks: list[_GpuMark],
        host_spans: list[Span],
    ) -> None:
        self._torch, self._config = torch, config
        # Holding `bound` keeps the run's device array alive until `finish`: freed earlier, torch's
        # caching allocator could hand it to the next upload while these kernels still use it.
        self.program, self.staging, self.bound = program, staging, bound
        self._t0, self._origin, self._marks, self._host_spans = t0, origin, marks, host_spans
        self._execution: Execution | None = None

    def done(self) -> bool:
        """Whether every stream of the run has finished its work (non-blocking)."""
        return self._execution is not None or all(stream.query() for stream in self.bound.streams)

    def finish(self) -> Execution:
        """Synchronize the device and return the run's `Execution` (see `execute`); idempotent.

        `host_end_us` is taken here: a caller that finishes late (a batched search working ahead) gets the
        later time."""
        if self._execution is None:
            with self._torch.cuda.device(self._config.device):
                self._execution = self._collect()
        return self._execution

    def _collect(self) -> Execution:
        torch, staging, program = self._torch, self.staging, self.program
        torch.cuda.synchronize()
        host_end_us = (time.perf_counter() - self._t0) * 1e6
        base = staging.observed_base
        observed = self.bound.staged[base : base + staging.observed_size].cpu().numpy()
        observations = collect_observations(program, staging, observed)

        spans: list[Span] = []
        access_time: dict[int, float] = {}
        if self._config.timeline:
            origin = self._origin
            assert origin is not None
            for mark in self._marks:
                begin_us = origin.elapsed_time(mark.begin) * 1000.0
                end_us = origin.elapsed_time(mark.end) * 1000.0
                spans.append(Span(mark.op_index, mark.track, mark.kind, begin_us, end_us, mark.label))
                if mark.kind == "kernel":
                    access_time[mark.op_index] = end_us
            spans.extend(self._host_spans)
            spans.sort(key=lambda span: (span.start_us, span.op_index))
        return Execution(observations, spans, host_end_us, None, access_time)


def _issue(
    torch: Any,
    program: Program,
    schedule: Schedule,
    staging: Staging,
    bound: _Bound,
    runtime: _Runtime,
    config: CudaConfig,
) -> StartedRun:
    timeline = config.timeline
    host_delays, spins, costs, launch_calls = schedule.host_delays, bound.spins, bound.costs, bound.launch_calls
    streams, ext, events = bound.streams, bound.ext, bound.events
    spin_kernel = runtime.kernels[runtime.catalog.spin]
    names = [s.name for s in program.streams]
    block = (THREADS_PER_BLOCK,)
    one = (1,)
    marks: list[_GpuMark] = []
    host_spans: list[Span] = []
    perf = time.perf_counter

    def timing_event() -> Any:
        return torch.cuda.Event(enable_timing=True)

    origin = None
    if timeline:
        origin = timing_event()
        origin.record(torch.cuda.current_stream())  # completes at once: every stream is idle here
    t0 = perf()
    for op in program.ops:
        index = op.index
        if index in host_delays:
            start = perf()
            busy_wait_us(host_delays[index])
            if timeline:
                host_spans.append(_host_span(index, "host_delay", start, t0, "scheduled host delay"))
        if isinstance(op, (Launch, Record, WaitEvent, WaitStream)):
            s = op.stream.id
            if index in spins:
                mark = (
                    _GpuMark(index, names[s], "spin", "injected delay", timing_event(), timing_event())
                    if timeline
                    else None
                )
                if mark is not None:
                    mark.begin.record(streams[s])
                spin_kernel(one, one, spins[index], stream=ext[s])
                if mark is not None:
                    mark.end.record(streams[s])
                    marks.append(mark)
            if isinstance(op, Launch):
                mark = (
                    _GpuMark(index, names[s], "kernel", op.kernel, timing_event(), timing_event()) if timeline else None
                )
                if mark is not None:
                    mark.begin.record(streams[s])
                if index in costs:
                    spin_kernel(one, one, costs[index], stream=ext[s])
                for kernel, grid, args in launch_calls[index]:
                    kernel(grid, block, args, stream=ext[s])
                if mark is not None:
                    mark.end.record(streams[s])
                    marks.append(mark)
            elif isinstance(op, Record):
                events[op.event.id].record(streams[s])
            elif isinstance(op, WaitEvent):
                streams[s].wait_event(events[op.event.id])
            else:
                streams[s].wait_stream(streams[op.other.id])
        elif isinstance(op, HostDelay):
            start = perf()
            busy_wait_us(op.us)
            if timeline:
                host_spans.append(_host_span(index, "host_delay", start, t0, "host work"))
        else:
            start = perf()
            if isinstance(op, EventSync):
                events[op.event.id].synchronize()
                label = f"{op.event}.synchronize()"
            elif isinstance(op, StreamSync):
                streams[op.stream.id].synchronize()
                label = f"{op.stream}.synchronize()"
            else:
                assert isinstance(op, DeviceSync)
                torch.cuda.synchronize()
                label = "device synchronize"
            if timeline:
                host_spans.append(_host_span(index, "sync", start, t0, label))
    return StartedRun(torch, program, staging, bound, config, t0, origin, marks, host_spans)
