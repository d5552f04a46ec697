"""Running a program on the GPU: issue its ops in host order, then wait and read the loads back.

`execute(program, schedule)` issues the program's ops in host order, the way the modelled host would:
records, waits and syncs are torch's own calls on fresh torch streams and never-recorded events; kernels
are the runtime's CuPy kernels, launched on those streams through their CuPy views;
`schedule.device_delays[i]` is an `rf_spin` kernel on op i's stream right before op i;
`schedule.read_spins[i]` is launch i's own in-kernel spin before its loads (its read window); a forced
order (a, b) of `schedule.orders` is a gate: `rf_gate_wait` on b's stream right before b (after b's
scheduled spin), `rf_gate_signal` on a's stream right after a, around a flag reset for every run; a wait
that times out makes `finish` raise `ScheduleInfeasible`; host delays
(scheduled, and `HostDelay` ops) busy-wait on `time.perf_counter`, since `time.sleep` overshoots by tens
of microseconds. A launch that both reads and writes issues its read calls, then its write calls, on its
stream: loads first, as in the replay. `Launch.cost_us` is an `rf_spin` of that length on the launch's
stream right before its kernel calls, inside its timeline span.

`prepare(p, s).start().finish()` is the same run split in three (`PreparedRun`, `StartedRun`): a search
stages and uploads the next example while the GPU still runs this one. `CudaExecutor` is the backend as a
search executor (a `PreparingExecutor`); it keeps its last run's staging and device memory, so that a
re-run of the same (program, schedule) objects -- the k-of-k reproduction of a search -- re-uploads
instead of restaging.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from racefuzz.backends.cuda.availability import require
from racefuzz.backends.cuda.runtime import THREADS_PER_BLOCK, Bound, Runtime, get_runtime, used_on_streams
from racefuzz.backends.cuda.staging import Staging, collect_observations, stage, timed_out_gates
from racefuzz.backends.protocol import HOST, Execution, Span
from racefuzz.errors import InvalidArgument
from racefuzz.program import (
    DeviceSync,
    EventSync,
    HostDelay,
    Launch,
    OpVisitor,
    Program,
    Record,
    StreamSync,
    WaitEvent,
    WaitStream,
)
from racefuzz.schedule import NO_DELAYS, Schedule, ScheduleInfeasible


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


def busy_wait_us(us: float) -> None:
    """Spin the host for `us` microseconds on `time.perf_counter` (sleep overshoots short waits)."""
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def execute(program: Program, schedule: Schedule = NO_DELAYS, config: CudaConfig | None = None) -> Execution:
    """Run `program` under `schedule` on the GPU; the result has the simulator's shape.

    Returns an `Execution` whose `observations` hold, for every reading launch, one int32 array per entry
    of `launch.reads` shaped like that range; `host_end_us` is the host time from the first op to the end
    of the final device synchronize; `timeline` holds real spans when `config.timeline` (else it is
    empty), and then `access_time_us` maps each launch to the end of its kernel span (its cost spin
    included); `writers` is None (the GPU does not track which launch stored a cell).

    Every run starts from the buffers' fill values and poisoned observation slots, on fresh streams and
    never-recorded events. This stages afresh; re-running the same objects through one `CudaExecutor`
    reuses the staging.

    Raises:
        BackendUnavailable: no usable GPU, torch or CuPy here, or the kernels failed to compile.
        InvalidArgument: the schedule does not fit the program, or a bad device index.
    """
    return CudaExecutor(config)(program, schedule)


def prepare(program: Program, schedule: Schedule = NO_DELAYS, config: CudaConfig | None = None) -> PreparedRun:
    """Stage and bind a run without issuing it: `prepare(p, s).start().finish()` is `execute(p, s)`.

    This is the asynchronous form of `execute`, for a caller that overlaps its own host work with the GPU
    (the search builds and prepares example i+1 while example i runs): `prepare` touches neither the
    streams nor the memory of a run still in flight -- it uploads into a fresh device array (on the
    current stream, which torch's non-blocking pool streams do not wait for) and draws fresh streams and
    events -- and it does not synchronize the device. The caller must `finish` the run in flight before it
    `start`s this one, so that each run has the GPU to itself, as under `execute`. It never reuses a
    `CudaExecutor`'s last staging.
    """
    config = config or CudaConfig()
    schedule.check_against(program)
    torch, cupy = require(config.device)
    with torch.cuda.device(config.device):
        runtime = get_runtime(torch, cupy, config.device)
        staging = stage(program, schedule, runtime.catalog)
        bound = runtime.bind(program, schedule, staging)
    return PreparedRun(program, schedule, staging, bound, runtime, config)


@dataclass
class _LastRun:
    """A `CudaExecutor`'s last run: its staging and bound memory, reused when the same objects run again."""

    program: Program
    schedule: Schedule
    device: int
    staging: Staging
    bound: Bound


class CudaExecutor:
    """The CUDA backend as a search executor: a call runs to the end (`execute`); `prepare` is its
    asynchronous form.

    It holds its last call's staging and device array (one entry, keyed on the identity of the program and
    schedule objects, so a merely equal pair is staged afresh) for as long as it lives or until `forget`:
    a call repeating the previous call's very objects re-uploads the same host array into the same device
    array (resetting the tables and the observation slots) and draws fresh streams and events.
    """

    def __init__(self, config: CudaConfig | None = None) -> None:
        self.config = config or CudaConfig()
        self._last: _LastRun | None = None

    def __call__(self, program: Program, schedule: Schedule) -> Execution:
        config = self.config
        schedule.check_against(program)
        torch, cupy = require(config.device)
        with torch.cuda.device(config.device):
            runtime = get_runtime(torch, cupy, config.device)
            staging, bound = self._stage_and_bind(runtime, program, schedule)
            # The upload synchronized its stream; this also orders any earlier work of the caller's.
            torch.cuda.synchronize()
            run = PreparedRun(program, schedule, staging, bound, runtime, config)
            return run.start().finish()

    def prepare(self, program: Program, schedule: Schedule) -> PreparedRun:
        return prepare(program, schedule, self.config)

    def forget(self) -> None:
        """Drop the last run's staging and device array, so that the next call stages and binds afresh."""
        self._last = None

    def _stage_and_bind(self, runtime: Runtime, program: Program, schedule: Schedule) -> tuple[Staging, Bound]:
        """Staging and binding for one call; a repeat of the previous call's very objects skips the rebuild."""
        device = runtime.device
        last = self._last
        if last is not None and last.program is program and last.schedule is schedule and last.device == device:
            staged = last.bound.staged
            staged.copy_(runtime.torch.from_numpy(last.staging.host))  # synchronous from pageable memory
            streams, ext, events = runtime.fresh_streams_and_events(program)
            used_on_streams(staged, streams)
            old = last.bound
            bound = Bound(
                old.tables, staged, streams, ext, events, old.launch_calls, old.spins, old.costs, old.waits, old.signals
            )
            last.bound = bound
            return last.staging, bound
        self._last = None  # drop the previous device array before allocating the next
        staging = stage(program, schedule, runtime.catalog)
        bound = runtime.bind(program, schedule, staging)
        self._last = _LastRun(program, schedule, device, staging, bound)
        return staging, bound


@dataclass
class _GpuMark:
    """A device interval to read back once the run finished: two timing events and what they bracket."""

    op_index: int
    track: str
    kind: str
    label: str
    begin: Any
    end: Any


def _host_span(index: int, kind: str, start: float, t0: float, label: str) -> Span:
    """A host span from `start` (a perf_counter reading) to now, in µs since `t0`."""
    return Span(index, HOST, kind, (start - t0) * 1e6, (time.perf_counter() - t0) * 1e6, label)


class PreparedRun:
    """A run staged and bound to device memory, streams and events: ready to `start` (see `prepare`).

    `start` may be called again on the same bound streams and memory (a cost measure replays one binding);
    the tables then start from what the previous start left in them.
    """

    def __init__(
        self,
        program: Program,
        schedule: Schedule,
        staging: Staging,
        bound: Bound,
        runtime: Runtime,
        config: CudaConfig,
    ) -> None:
        self._runtime, self._config = runtime, config
        self.program, self.schedule, self.staging, self.bound = program, schedule, staging, bound

    def start(self) -> StartedRun:
        """Issue every op in host order, as the modelled host would, and return once the last is issued.

        Host delays and host syncs happen here, so this blocks for as long as the program's host does; the
        device work after the last issued op is still running on return.
        """
        with self._runtime.torch.cuda.device(self._config.device):
            return _issue(self.program, self.schedule, self.staging, self.bound, self._runtime, self._config)


class StartedRun:
    """A run whose ops are all issued; `finish` waits for the device and reads the loads back."""

    def __init__(
        self,
        torch: Any,
        program: Program,
        staging: Staging,
        bound: Bound,
        config: CudaConfig,
        t0: float,
        origin: Any,
        marks: list[_GpuMark],
        host_spans: list[Span],
        schedule: Schedule = NO_DELAYS,
    ) -> None:
        self._torch, self._config = torch, config
        self.schedule = schedule  # its forced orders name the gates that timed out, if any
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
        torch, staging = self._torch, self.staging
        torch.cuda.synchronize()
        host_end_us = (time.perf_counter() - self._t0) * 1e6
        base = staging.observed_base
        readback = self.bound.staged[base : base + staging.readback_size].cpu().numpy()
        if staging.gate_count:
            stuck = timed_out_gates(staging, readback)
            if stuck:
                orders = ", ".join(f"op #{a} before op #{b}" for a, b in (self.schedule.orders[k] for k in stuck))
                raise ScheduleInfeasible(
                    f"the forced order(s) {orders} could not be realized: the gate's wait timed out (the host "
                    "never issued the first launch in time, or the gates wait for each other)"
                )
        observations = collect_observations(staging, readback)

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


class _Issuer(OpVisitor[None]):
    """Issues one op at a time on the bound streams and events; with a timeline, brackets what it issues.

    The four stream ops first issue the op's scheduled device delay (an `rf_spin` on its stream), then
    the op itself; host delays busy-wait; syncs block the host in torch's own calls.
    """

    def __init__(self, torch: Any, program: Program, bound: Bound, runtime: Runtime, timeline: bool) -> None:
        self.torch, self.timeline = torch, timeline
        self.spins, self.costs, self.launch_calls = bound.spins, bound.costs, bound.launch_calls
        self.streams, self.ext, self.events = bound.streams, bound.ext, bound.events
        self.spin_kernel = runtime.spin_kernel
        self.gate_wait, self.gate_signal = runtime.gate_kernels
        self.waits, self.signals = bound.waits, bound.signals
        self.names = [s.name for s in program.streams]
        self.block = (THREADS_PER_BLOCK,)
        self.one = (1,)
        self.marks: list[_GpuMark] = []
        self.host_spans: list[Span] = []
        self.origin: Any = None
        if timeline:
            self.origin = self.timing_event()
            self.origin.record(torch.cuda.current_stream())  # completes at once: every stream is idle here
        self.t0 = 0.0  # set by `_issue` right before the first op

    def timing_event(self) -> Any:
        return self.torch.cuda.Event(enable_timing=True)

    def host_delay(self, index: int, us: float, label: str) -> None:
        start = time.perf_counter()
        busy_wait_us(us)
        if self.timeline:
            self.host_spans.append(_host_span(index, "host_delay", start, self.t0, label))

    def _spin(self, index: int, s: int) -> None:
        """The scheduled device delay of op `index`: an `rf_spin` on its stream `s`."""
        mark = (
            _GpuMark(index, self.names[s], "spin", "injected delay", self.timing_event(), self.timing_event())
            if self.timeline
            else None
        )
        if mark is not None:
            mark.begin.record(self.streams[s])
        self.spin_kernel(self.one, self.one, self.spins[index], stream=self.ext[s])
        if mark is not None:
            mark.end.record(self.streams[s])
            self.marks.append(mark)

    def _gate(self, index: int, s: int) -> None:
        """The waits of the forced orders that hold launch `index` back: `rf_gate_wait`s on its stream `s`."""
        mark = (
            _GpuMark(index, self.names[s], "gate", "gate", self.timing_event(), self.timing_event())
            if self.timeline
            else None
        )
        if mark is not None:
            mark.begin.record(self.streams[s])
        for args in self.waits[index]:
            self.gate_wait(self.one, self.one, args, stream=self.ext[s])
        if mark is not None:
            mark.end.record(self.streams[s])
            self.marks.append(mark)

    def visit_launch(self, op: Launch) -> None:
        index, s = op.index, op.stream.id
        if index in self.spins:
            self._spin(index, s)
        if index in self.waits:
            self._gate(index, s)
        stream, ext, block = self.streams[s], self.ext[s], self.block
        mark = (
            _GpuMark(index, self.names[s], "kernel", op.kernel, self.timing_event(), self.timing_event())
            if self.timeline
            else None
        )
        if mark is not None:
            mark.begin.record(stream)
        if index in self.costs:
            self.spin_kernel(self.one, self.one, self.costs[index], stream=ext)
        for kernel, grid, args in self.launch_calls[index]:
            kernel(grid, block, args, stream=ext)
        if mark is not None:
            mark.end.record(stream)
            self.marks.append(mark)
        for args in self.signals.get(index, ()):
            self.gate_signal(self.one, self.one, args, stream=ext)

    def visit_record(self, op: Record) -> None:
        s = op.stream.id
        if op.index in self.spins:
            self._spin(op.index, s)
        self.events[op.event.id].record(self.streams[s])

    def visit_wait_event(self, op: WaitEvent) -> None:
        s = op.stream.id
        if op.index in self.spins:
            self._spin(op.index, s)
        self.streams[s].wait_event(self.events[op.event.id])

    def visit_wait_stream(self, op: WaitStream) -> None:
        s = op.stream.id
        if op.index in self.spins:
            self._spin(op.index, s)
        self.streams[s].wait_stream(self.streams[op.other.id])

    def visit_host_delay(self, op: HostDelay) -> None:
        self.host_delay(op.index, op.us, "host work")

    def visit_event_sync(self, op: EventSync) -> None:
        start = time.perf_counter()
        self.events[op.event.id].synchronize()
        if self.timeline:
            self.host_spans.append(_host_span(op.index, "sync", start, self.t0, f"{op.event}.synchronize()"))

    def visit_stream_sync(self, op: StreamSync) -> None:
        start = time.perf_counter()
        self.streams[op.stream.id].synchronize()
        if self.timeline:
            self.host_spans.append(_host_span(op.index, "sync", start, self.t0, f"{op.stream}.synchronize()"))

    def visit_device_sync(self, op: DeviceSync) -> None:
        start = time.perf_counter()
        self.torch.cuda.synchronize()
        if self.timeline:
            self.host_spans.append(_host_span(op.index, "sync", start, self.t0, "device synchronize"))


def _issue(
    program: Program, schedule: Schedule, staging: Staging, bound: Bound, runtime: Runtime, config: CudaConfig
) -> StartedRun:
    """Issue every op of `program` in host order (see `PreparedRun.start`)."""
    torch = runtime.torch
    issuer = _Issuer(torch, program, bound, runtime, config.timeline)
    host_delays = schedule.host_delays
    dispatch = issuer.dispatcher()
    issuer.t0 = time.perf_counter()
    for op in program.ops:
        index = op.index
        if index in host_delays:
            issuer.host_delay(index, host_delays[index], "scheduled host delay")
        dispatch[type(op)](op)
    return StartedRun(
        torch, program, staging, bound, config, issuer.t0, issuer.origin, issuer.marks, issuer.host_spans, schedule
    )
