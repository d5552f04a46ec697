"""The runtime on one device: compiled kernels, torch streams and their CuPy views, staging bound to memory.

`get_runtime(torch, cupy, device)` compiles the kernels of `kernels/req_to_token.cu` once per process and
device (a registry keyed by the device index) and returns that device's `Runtime`. A `Runtime` keeps
CuPy's view of every torch stream it has wrapped (torch's pool hands out the same few streams again and
again), binds a `Staging` to fresh device memory (`bind_memory`) and draws fresh, pairwise distinct
streams and never-recorded events for a run (`fresh_streams_and_events`); `bind` does both.

Delays are microseconds in the schedule; the kernels spin on `%globaltimer`, the GPU's nanosecond wall
clock, so a delay is passed as nanoseconds (`spin_ns`) and needs no calibration.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

import numpy as np

from racefuzz.backends.cuda.availability import one_line
from racefuzz.backends.cuda.catalog import KERNEL_FILE, KernelCatalog, read_kernels
from racefuzz.backends.cuda.staging import Staging
from racefuzz.errors import BackendUnavailable, InvalidArgument
from racefuzz.program import HostDelay, Program
from racefuzz.schedule import Schedule

THREADS_PER_BLOCK = 128
"""Threads of one block; a block covers one rectangle, striding over its cells."""

_MAX_REDRAWS = 64
"""Extra streams drawn when torch's pool hands back one already taken (two laps of its 32-stream pool)."""

GATE_TIMEOUT_US = 100_000.0
"""How long a gate's wait kernel waits for its signal beyond everything the run is scheduled to spend (its
device and host delays, its launches' costs and its host work, added per run) before it gives up and marks
the order infeasible: far above any real wait for a kernel, short enough that an infeasible schedule costs a
tenth of a second."""

_BOUND_CALLS_KEPT = 256
"""Bound call sets a runtime keeps (see `Runtime.bind_memory`); cleared when full."""

KernelCall = tuple[Any, tuple[int], tuple[Any, ...]]
"""A bound kernel call: (CuPy kernel, grid, argument tuple); the block is `THREADS_PER_BLOCK`."""

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


def spin_ns(us: float) -> np.int64:
    """A delay in microseconds as the kernels' spin argument: nanoseconds of %globaltimer."""
    return np.int64(round(us * 1000.0))


def compile_kernels(cupy: Any, source: str, names: Sequence[str]) -> dict[str, Any]:
    """Each named kernel of `source` as a CuPy `RawKernel`, compiled with NVRTC for the current device."""
    from cupy.cuda.compiler import CompileException

    try:
        module = cupy.RawModule(code=source, options=("--std=c++17",))
        return {name: module.get_function(name) for name in names}
    except CompileException as exc:
        raise BackendUnavailable(f"NVRTC could not compile {KERNEL_FILE}: {one_line(exc)}") from None
    except cupy.cuda.driver.CUDADriverError as exc:
        raise BackendUnavailable(f"the CUDA driver could not load {KERNEL_FILE}: {one_line(exc)}") from None


class BoundMemory(NamedTuple):
    """A staging uploaded to the device, with every kernel call's arguments built against it.

    `staged` is the device copy of `Staging.host`; `tables` are views into it. `launch_calls` holds each
    launch's kernel calls, `spins` each scheduled device delay and `costs` each launch's own duration
    (`Launch.cost_us`), both as `rf_spin` argument tuples. `waits[b]` are the `rf_gate_wait` argument
    tuples to issue right before launch b, `signals[a]` the `rf_gate_signal` ones right after launch a
    (one each per forced order (a, b) of the schedule).
    """

    staged: Any
    tables: list[Any]
    launch_calls: dict[int, list[KernelCall]]
    spins: dict[int, tuple[Any, ...]]
    costs: dict[int, tuple[Any, ...]]
    waits: dict[int, list[tuple[Any, ...]]]
    signals: dict[int, list[tuple[Any, ...]]]


@dataclass
class Bound:
    """The staged program bound to device memory and torch streams: ready to issue.

    The memory and the calls are those of `BoundMemory`; streams (torch's, and `ext`, CuPy's views of
    them) and events are fresh for every run.
    """

    tables: list[Any]
    staged: Any
    streams: list[Any]
    ext: list[Any]
    events: list[Any]
    launch_calls: dict[int, list[KernelCall]]
    spins: dict[int, tuple[Any, ...]]
    costs: dict[int, tuple[Any, ...]]
    waits: dict[int, list[tuple[Any, ...]]] = field(default_factory=dict)
    signals: dict[int, list[tuple[Any, ...]]] = field(default_factory=dict)


@dataclass
class Runtime:
    """The backend on one device: its compiled kernels, and CuPy's views of the torch streams it used.

    Made by `get_runtime`, which keeps one per process and device; its methods expect that device to be
    the current one.
    """

    torch: Any
    cupy: Any
    device: int
    catalog: KernelCatalog
    kernels: dict[str, Any]
    _external: dict[int, Any] = field(default_factory=dict, repr=False)
    _bound_calls: dict[tuple[int, int, int], tuple[Any, dict[int, list[KernelCall]]]] = field(
        default_factory=dict, repr=False
    )

    @property
    def gate_kernels(self) -> tuple[Any, Any]:
        """(`rf_gate_wait`, `rf_gate_signal`): a forced order's two kernels, launched as `(1,), (1,)`."""
        return self.kernels[self.catalog.gate_wait], self.kernels[self.catalog.gate_signal]

    @property
    def spin_kernel(self) -> Any:
        """The `rf_spin` kernel: `spin_kernel((1,), (1,), (spin_ns(us),), stream=ext)`."""
        return self.kernels[self.catalog.spin]

    def external_stream(self, handle: int) -> Any:
        """CuPy's view of the torch stream `handle`; cached, since torch's pool hands out the same few streams.

        CuPy 14 deprecates `ExternalStream` for `Stream.from_external`; `ExternalStream` still works and
        takes the raw handle on every CuPy since 9, so it stays, with its warning silenced here rather than
        globally.
        """
        stream = self._external.get(handle)
        if stream is None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                stream = self.cupy.cuda.ExternalStream(handle, self.device)
            self._external[handle] = stream
        return stream

    def bind_memory(self, program: Program, schedule: Schedule, staging: Staging) -> BoundMemory:
        """Upload `staging.host` (synchronously) and build every kernel call's arguments against it.

        torch's `copy_` from pageable host memory returns only once the copy has landed (it synchronizes
        the current stream), so the tables, descriptors and poisoned slots are in place before any IR
        stream runs.
        """
        torch = self.torch
        dev = torch.device("cuda", self.device)
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
        # A search runs each program several times, and torch's caching allocator hands a freed block of
        # the same size back at the same address: the calls bound against one address are kept for the
        # next run of the same staged calls there (tables sit after the gate slots: their count is keyed).
        # A schedule with read windows has calls of its own (`stage` copies them): bound afresh, not kept.
        key = (id(staging.calls), staged_ptr, staging.gate_count)
        kept = self._bound_calls.get(key)
        if kept is not None and kept[0] is staging.calls:
            launch_calls = kept[1]
        else:
            launch_calls = self._bind_calls(staging, staged_ptr, tables_arg)
            if not schedule.read_spins:
                if len(self._bound_calls) >= _BOUND_CALLS_KEPT:
                    self._bound_calls.clear()
                self._bound_calls[key] = (staging.calls, launch_calls)
        spins = {index: (spin_ns(us),) for index, us in schedule.device_delays.items()}
        costs = {
            launch.index: (spin_ns(launch.cost_us),)
            for launch in program.launches
            if launch.cost_us  # None (the backend's default: the kernel's own time) or 0: no spin
        }
        waits: dict[int, list[tuple[Any, ...]]] = {}
        signals: dict[int, list[tuple[Any, ...]]] = {}
        if schedule.orders:
            scheduled_us = sum(schedule.device_delays.values()) + sum(schedule.read_spins.values())
            scheduled_us += sum(launch.cost_us or 0.0 for launch in program.launches)
            # The host's own time too: a gate waits for a launch the host may issue only after its delays.
            scheduled_us += sum(schedule.host_delays.values())
            scheduled_us += sum(op.us for op in program.ops if isinstance(op, HostDelay))
            timeout = spin_ns(GATE_TIMEOUT_US + scheduled_us)
            for k, (first, then) in enumerate(schedule.orders):
                flag = np.uint64(staged_ptr + 4 * (staging.gates_at + 2 * k))
                timed_out = np.uint64(staged_ptr + 4 * (staging.gates_at + 2 * k + 1))
                waits.setdefault(then, []).append((flag, timed_out, timeout))
                signals.setdefault(first, []).append((flag,))
        return BoundMemory(staged, tables, launch_calls, spins, costs, waits, signals)

    def _bind_calls(
        self, staging: Staging, staged_ptr: int, tables_arg: list[tuple[Any, Any]]
    ) -> dict[int, list[KernelCall]]:
        """Every launch's kernel calls with their arguments, against the device array at `staged_ptr`."""
        values_arg = np.uint64(staged_ptr)
        observed_arg = np.uint64(staged_ptr + 4 * staging.observed_base)
        no_spin = np.int64(0)
        kernels = self.kernels
        launch_calls: dict[int, list[KernelCall]] = {}
        for index, calls in staging.calls.items():
            bound = []
            for call in calls:
                table, ld = tables_arg[call.buffer]
                rects = np.uint64(staged_ptr + 4 * call.rects_at)
                if call.reads:
                    spin = spin_ns(call.spin_us) if call.spin_us else no_spin
                    args: tuple[Any, ...] = (table, ld, rects, observed_arg, spin)
                else:
                    args = (table, ld, rects, values_arg)
                bound.append((kernels[call.kernel], (call.count,), args))
            launch_calls[index] = bound
        return launch_calls

    def fresh_streams_and_events(self, program: Program) -> tuple[list[Any], list[Any], list[Any]]:
        """Pairwise distinct torch streams (none the current one), their CuPy views, and never-recorded events."""
        torch = self.torch
        dev = torch.device("cuda", self.device)
        taken = {torch.cuda.current_stream(dev).cuda_stream}
        streams = draw_distinct_streams(len(program.streams), torch.cuda.Stream, lambda s: s.cuda_stream, taken)
        ext = [self.external_stream(s.cuda_stream) for s in streams]
        events = [torch.cuda.Event() for _ in program.events]
        return streams, ext, events

    def bind(self, program: Program, schedule: Schedule, staging: Staging) -> Bound:
        """Bind `staging` to fresh device memory, fresh streams and fresh events (see `Bound`)."""
        staged, tables, launch_calls, spins, costs, waits, signals = self.bind_memory(program, schedule, staging)
        streams, ext, events = self.fresh_streams_and_events(program)
        used_on_streams(staged, streams)
        return Bound(tables, staged, streams, ext, events, launch_calls, spins, costs, waits, signals)


def used_on_streams(staged: Any, streams: Sequence[Any]) -> None:
    """Tell torch's caching allocator that the device array `staged` is used on `streams` (`record_stream`).

    The array is allocated on the current stream, but its kernels run on the run's own streams, which the
    allocator knows nothing of: a run dropped before `finish` (a batch ended by an exception) would free the
    array to the next upload while its kernels still read their descriptors from it -- a use after free
    that shows as wrong loads or an illegal address in a later run. Recorded, the block is reused only once
    the work queued on these streams when it was freed has completed (the fix sglang #34076 made for its
    cross-stream per-batch tensors).
    """
    for stream in streams:
        staged.record_stream(stream)


_runtimes: dict[int, Runtime] = {}
"""device index -> its runtime: kernels are compiled once per process and device."""


def get_runtime(torch: Any, cupy: Any, device: int) -> Runtime:
    """The runtime of `device`, compiled on first use; the caller has made `device` current."""
    runtime = _runtimes.get(device)
    if runtime is None:
        source, catalog = read_kernels()
        kernels = compile_kernels(cupy, source, catalog.names)
        runtime = Runtime(torch, cupy, device, catalog, kernels)
        _runtimes[device] = runtime
    return runtime
