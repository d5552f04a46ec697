"""A deterministic discrete-event simulator of CUDA stream semantics.

Time model (microseconds):
* The host issues ops in program order. Enqueuing any stream op costs it `launch_cost_us`; the op is
  issued at the host time after that cost. `HostDelay` ops and scheduled host delays advance the host
  clock; blocking syncs move it to the completion time of what they wait for.
* Each stream runs its ops in FIFO order. An op starts at the later of its issue time and its stream's
  tail (the completion time of everything enqueued before it on that stream). A scheduled device delay
  is a spin kernel enqueued right before the op on the same stream.
* A launch runs for `cost_us` (or `kernel_cost_us`) plus its scheduled read spin.
* `event.record(s)` completes when `s` drains up to it; `s.wait_event(e)` raises `s`'s tail to the
  completion of the latest record of `e` issued before the wait (never recorded: no-op);
  `s.wait_stream(o)` raises it to `o`'s tail at that host instant (a snapshot: later work on `o` is not
  covered).

When accesses happen inside a kernel: **a launch's loads and stores both take effect at its end**, loads
first. A reader therefore reads at the end of its window, and its read spin (the GPU reader's spin before
its loads) stretches the window during which another stream's store can clobber what it is about to
load. Accesses of different launches that take effect at the same instant apply in host issue order.
The GPU kernels in `kernels/` follow the same shape: readers spin, then load; writers store at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from racefuzz.errors import InvalidArgument
from racefuzz.memory import Observations, replay_in_order
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

HOST = "host"
"""The track name of host-side spans in a timeline."""


@dataclass(frozen=True)
class SimConfig:
    """Costs of the simulated machine.

    Args:
        launch_cost_us: host time to enqueue one stream op (a kernel launch is ~5 us on a real GPU).
        kernel_cost_us: duration of a launch that declares no `cost_us`.
    """

    launch_cost_us: float = 5.0
    kernel_cost_us: float = 5.0

    def __post_init__(self) -> None:
        for name in ("launch_cost_us", "kernel_cost_us"):
            value = getattr(self, name)
            if not value >= 0:
                raise InvalidArgument(f"SimConfig.{name} must be >= 0, got {value!r}")


class Span(NamedTuple):
    """One interval of a timeline: op `op_index` (or the spin before it) on `track`, [start_us, end_us)."""

    op_index: int
    track: str
    kind: str
    start_us: float
    end_us: float
    label: str


@dataclass
class Execution:
    """The outcome of one run: what each reading launch loaded, and when everything happened.

    `writers` (launch index -> which launch stored each loaded cell) is filled when asked for, to name
    the writer that clobbered a read.
    """

    observations: Observations
    timeline: list[Span]
    host_end_us: float
    writers: Observations | None = None
    access_time_us: dict[int, float] = field(default_factory=dict)


def simulate(
    program: Program,
    schedule: Schedule = NO_DELAYS,
    config: SimConfig | None = None,
    *,
    track_writers: bool = False,
    record_timeline: bool = True,
) -> Execution:
    """Run `program` under `schedule` on the simulated machine.

    `record_timeline=False` leaves `Execution.timeline` empty (the search's hot loop needs only the
    loads; reports and cost measures re-run with it).
    """
    config = config or SimConfig()
    schedule.check_against(program)
    device_delays, read_spins, host_delays = schedule.device_delays, schedule.read_spins, schedule.host_delays
    launch_cost, kernel_cost = config.launch_cost_us, config.kernel_cost_us
    names = [s.name for s in program.streams]
    tail = [0.0] * len(program.streams)
    record_done: list[float | None] = [None] * len(program.events)
    host = 0.0
    spans: list[Span] = []
    # Appending spans is a third of the loop's cost; without a timeline they go to a list never read.
    timeline = spans if record_timeline else _Discard()
    access_time: dict[int, float] = {}
    for op in program.ops:
        index = op.index
        if index in host_delays:
            delay = host_delays[index]
            timeline.append(Span(index, HOST, "host_delay", host, host + delay, "scheduled host delay"))
            host += delay
        if isinstance(op, Launch):
            host += launch_cost
            s = op.stream.id
            if index in device_delays:
                start = max(host, tail[s])
                tail[s] = start + device_delays[index]
                timeline.append(Span(index, names[s], "spin", start, tail[s], "injected delay"))
            start = max(host, tail[s])
            end = start + (kernel_cost if op.cost_us is None else op.cost_us) + read_spins.get(index, 0.0)
            tail[s] = end
            access_time[index] = end
            timeline.append(Span(index, names[s], "kernel", start, end, op.kernel))
        elif isinstance(op, (Record, WaitEvent, WaitStream)):
            host += launch_cost
            s = op.stream.id
            if index in device_delays:
                start = max(host, tail[s])
                tail[s] = start + device_delays[index]
                timeline.append(Span(index, names[s], "spin", start, tail[s], "injected delay"))
            if isinstance(op, Record):
                tail[s] = max(host, tail[s])
                record_done[op.event.id] = tail[s]
            elif isinstance(op, WaitEvent):
                done = record_done[op.event.id]
                if done is not None:
                    tail[s] = max(tail[s], done)
            else:
                tail[s] = max(tail[s], tail[op.other.id])
        elif isinstance(op, HostDelay):
            timeline.append(Span(index, HOST, "host_delay", host, host + op.us, "host work"))
            host += op.us
        else:
            if isinstance(op, EventSync):
                done = record_done[op.event.id]
                until = host if done is None else max(host, done)
                label = f"{op.event}.synchronize()"
            elif isinstance(op, StreamSync):
                until = max(host, tail[op.stream.id])
                label = f"{op.stream}.synchronize()"
            else:
                assert isinstance(op, DeviceSync)
                until = max([host, *tail])
                label = "device synchronize"
            timeline.append(Span(index, HOST, "sync", host, until, label))
            host = until
    order = sorted(program.launches, key=lambda launch: (access_time[launch.index], launch.index))
    replay = replay_in_order(program, order, track_writers=track_writers)
    return Execution(replay.observations, spans, max([host, *tail]), replay.writers, access_time)


class _Discard:
    """A sink with list's `append` that keeps nothing."""

    __slots__ = ()

    def append(self, item: object) -> None:
        pass
