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
* A forced order `(a, b)` of `Schedule.orders` is a gate: launch b's stream waits, right before b, until
  launch a has finished, plus `gate_cost_us` (`_GatedMachine`; b may be issued before a).

When accesses happen inside a kernel: **a launch's loads and stores both take effect at its end**, loads
first. A reader therefore reads at the end of its window, and its read spin (the GPU reader's spin before
its loads) stretches the window during which another stream's store can clobber what it is about to
load. Accesses of different launches that take effect at the same instant apply in host issue order.
The GPU kernels in `kernels/` follow the same shape: readers spin, then load; writers store at once.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

from racefuzz.errors import InvalidArgument

# HOST, Execution and Span live in racefuzz.execution; they stay importable from here.
from racefuzz.execution import HOST, Execution, Span
from racefuzz.hb import analysis
from racefuzz.memory import in_order_loads, replay_in_order
from racefuzz.program import (
    DeviceSync,
    EventSync,
    HostDelay,
    Launch,
    OpVisitor,
    Program,
    Record,
    StreamOp,
    StreamSync,
    WaitEvent,
    WaitStream,
    per_program,
)
from racefuzz.schedule import NO_DELAYS, Schedule, ScheduleInfeasible


@dataclass(frozen=True)
class SimConfig:
    """Costs of the simulated machine.

    Args:
        launch_cost_us: host time to enqueue one stream op (a kernel launch is ~5 us on a real GPU).
        kernel_cost_us: duration of a launch that declares no `cost_us`.
        gate_cost_us: how long a forced order's wait kernel runs once released (> 0, so that the launch it
            holds back takes effect strictly after the one it waited for, whatever their costs).
    """

    launch_cost_us: float = 5.0
    kernel_cost_us: float = 5.0
    gate_cost_us: float = 1.0

    def __post_init__(self) -> None:
        for name in ("launch_cost_us", "kernel_cost_us"):
            value = getattr(self, name)
            if not value >= 0:
                raise InvalidArgument(f"SimConfig.{name} must be >= 0, got {value!r}")
        if not self.gate_cost_us > 0:
            raise InvalidArgument(f"SimConfig.gate_cost_us must be > 0, got {self.gate_cost_us!r}")


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
    spans: list[Span] = []
    # Appending spans is a third of the loop's cost; without a timeline they go to a list never read.
    timeline = spans if record_timeline else _Discard()
    machine = (_GatedMachine if schedule.orders else _Machine)(program, schedule, config, timeline)
    host_delays = schedule.host_delays
    dispatch = machine.dispatcher()
    for op in program.ops:
        index = op.index
        if index in host_delays:
            delay = host_delays[index]
            host = machine.host
            machine.timeline.append(Span(index, HOST, "host_delay", host, host + delay, "scheduled host delay"))
            machine.host = host + delay
        dispatch[type(op)](op)
    machine.drained()
    access_time = machine.access_time
    end = max([machine.host, *machine.tail])
    facts = _facts(program)
    if not track_writers and all((access_time[a], a) < (access_time[b], b) for a, b in facts.unordered_conflicts):
        # Every conflicting pair took effect in issue order: the loads are the sequential ones.
        return Execution(in_order_loads(program), spans, end, None, access_time)
    order = sorted(facts.launches, key=lambda launch: (access_time[launch.index], launch.index))
    replay = replay_in_order(program, order, track_writers=track_writers)
    return Execution(replay.observations, spans, end, replay.writers, access_time)


class _ProgramFacts(NamedTuple):
    """What every run of one program shares, computed at its first run.

    `unordered_conflicts`: the (first, second) launch indices of every race `hb.analysis` reports.
    The simulator realizes every happens-before edge (a launch ordered after another starts after it
    ended, and ties apply in issue order), so a run whose accesses apply these pairs in issue order
    applies every conflicting pair in issue order, and its loads are the sequential ones
    (`memory.in_order_loads`, the same object every time) with no replay. `tests/unit/test_sim.py` checks
    the shortcut against the replay.
    """

    launches: list[Launch]
    unordered_conflicts: tuple[tuple[int, int], ...]


@per_program
def _facts(program: Program) -> _ProgramFacts:
    pairs = tuple(dict.fromkeys((race.first.index, race.second.index) for race in analysis(program).races))
    return _ProgramFacts(program.launches, pairs)


class _Machine(OpVisitor[None]):
    """The simulated host and streams, advanced by one op at a time (the time model of the module doc).

    `host` is the host clock, `tail[s]` the completion time of everything enqueued on stream s so far,
    `record_done[e]` the completion time of the latest record of event e (None: never recorded).
    """

    __slots__ = (
        "access_time",
        "device_delays",
        "host",
        "kernel_cost",
        "launch_cost",
        "names",
        "read_spins",
        "record_done",
        "tail",
        "timeline",
    )

    def __init__(self, program: Program, schedule: Schedule, config: SimConfig, timeline: list[Span] | _Discard):
        self.device_delays, self.read_spins = schedule.device_delays, schedule.read_spins
        self.launch_cost, self.kernel_cost = config.launch_cost_us, config.kernel_cost_us
        self.names = [s.name for s in program.streams]
        self.tail = [0.0] * len(program.streams)
        self.record_done: list[float | None] = [None] * len(program.events)
        self.host = 0.0
        self.timeline = timeline
        self.access_time: dict[int, float] = {}

    # The four stream ops repeat the enqueue (host launch cost, then the scheduled device delay as a spin on
    # the stream) inline: this loop is the simulator's hot path, and a helper call costs a tenth of it.

    def visit_launch(self, op: Launch) -> None:
        index, s, tail = op.index, op.stream.id, self.tail
        host = self.host = self.host + self.launch_cost
        if index in self.device_delays:
            start = max(host, tail[s])
            tail[s] = start + self.device_delays[index]
            self.timeline.append(Span(index, self.names[s], "spin", start, tail[s], "injected delay"))
        start = tail[s]
        if host > start:
            start = host
        end = start + (self.kernel_cost if op.cost_us is None else op.cost_us) + self.read_spins.get(index, 0.0)
        tail[s] = end
        self.access_time[index] = end
        self.timeline.append(Span(index, self.names[s], "kernel", start, end, op.kernel))

    def visit_record(self, op: Record) -> None:
        index, s, tail = op.index, op.stream.id, self.tail
        host = self.host = self.host + self.launch_cost
        if index in self.device_delays:
            start = max(host, tail[s])
            tail[s] = start + self.device_delays[index]
            self.timeline.append(Span(index, self.names[s], "spin", start, tail[s], "injected delay"))
        tail[s] = max(host, tail[s])
        self.record_done[op.event.id] = tail[s]

    def visit_wait_event(self, op: WaitEvent) -> None:
        index, s, tail = op.index, op.stream.id, self.tail
        host = self.host = self.host + self.launch_cost
        if index in self.device_delays:
            start = max(host, tail[s])
            tail[s] = start + self.device_delays[index]
            self.timeline.append(Span(index, self.names[s], "spin", start, tail[s], "injected delay"))
        done = self.record_done[op.event.id]
        if done is not None:
            tail[s] = max(tail[s], done)

    def visit_wait_stream(self, op: WaitStream) -> None:
        index, s, tail = op.index, op.stream.id, self.tail
        host = self.host = self.host + self.launch_cost
        if index in self.device_delays:
            start = max(host, tail[s])
            tail[s] = start + self.device_delays[index]
            self.timeline.append(Span(index, self.names[s], "spin", start, tail[s], "injected delay"))
        tail[s] = max(tail[s], tail[op.other.id])

    def visit_host_delay(self, op: HostDelay) -> None:
        host = self.host
        self.timeline.append(Span(op.index, HOST, "host_delay", host, host + op.us, "host work"))
        self.host = host + op.us

    def _block_until(self, index: int, until: float, label: str) -> None:
        """The host blocks in a sync until `until`."""
        self.timeline.append(Span(index, HOST, "sync", self.host, until, label))
        self.host = until

    def visit_event_sync(self, op: EventSync) -> None:
        done = self.record_done[op.event.id]
        until = self.host if done is None else max(self.host, done)
        self._block_until(op.index, until, f"{op.event}.synchronize()")

    def visit_stream_sync(self, op: StreamSync) -> None:
        self._block_until(op.index, max(self.host, self.tail[op.stream.id]), f"{op.stream}.synchronize()")

    def visit_device_sync(self, op: DeviceSync) -> None:
        self._block_until(op.index, max([self.host, *self.tail]), "device synchronize")

    def drained(self) -> None:
        """Called after the last op: every stream op ran (nothing to check without forced orders)."""


_Pending = tuple[StreamOp, float, tuple[int, ...]]
"""A stream op not run yet: the op, the host time it was issued at, the ops it waits for (by index)."""


class _GatedMachine(_Machine):
    """The machine with forced orders (`Schedule.orders`): a gate holds launch `then`'s stream until launch
    `first` has finished, plus `gate_cost_us` for the wait kernel.

    `then` may be issued before `first`, so a stream op cannot always be timed when the host issues it. A
    stream whose next op waits for an op not yet run is blocked: it and everything enqueued on it after it
    queue in `pending[s]` with their issue times, and run as soon as what they wait for has run (a launch
    waits for its gates' `first` launches, `wait_event` for the record it binds to, `wait_stream` for the
    other stream's last op at the call: dependencies fixed when the host issues the op, as in CUDA). A host
    sync that needs a queued op, or a queue left at the end, is a deadlock on the GPU (the host never issues
    the `first` a gate waits for, or two gates wait for each other): `ScheduleInfeasible`.

    `done[i]`: when stream op i completed (its stream's tail just after it).
    """

    __slots__ = (
        "done",
        "gate_cost",
        "gates",
        "kernels",
        "last_on",
        "latest_record",
        "pending",
        "released",
        "waiters",
    )

    def __init__(self, program: Program, schedule: Schedule, config: SimConfig, timeline: list[Span] | _Discard):
        super().__init__(program, schedule, config, timeline)
        self.gate_cost = config.gate_cost_us
        self.gates: dict[int, list[int]] = {}
        for first, then in schedule.orders:
            self.gates.setdefault(then, []).append(first)
        self.kernels = {first: program.ops[first].kernel for first, _ in schedule.orders}  # type: ignore[union-attr]
        self.done: dict[int, float] = {}
        self.pending: list[deque[_Pending]] = [deque() for _ in program.streams]
        self.waiters: dict[int, list[int]] = {}
        self.last_on: list[int | None] = [None] * len(program.streams)
        self.latest_record: list[int | None] = [None] * len(program.events)
        self.released: list[int] = []  # streams whose next queued op may now run

    def _enqueue(self, op: StreamOp, deps: tuple[int, ...]) -> None:
        s = op.stream.id
        self.host += self.launch_cost
        self.last_on[s] = op.index
        entry = (op, self.host, deps)
        if self.pending[s] or not self._try(entry):
            self.pending[s].append(entry)
        self._drain()

    def _try(self, entry: _Pending) -> bool:
        """Run `entry` if everything it waits for has run; else register its stream as waiting."""
        op, issued, deps = entry
        for dep in deps:
            if dep not in self.done:
                self.waiters.setdefault(dep, []).append(op.stream.id)
                return False
        self._run(op, issued, deps)
        return True

    def _run(self, op: StreamOp, issued: float, deps: tuple[int, ...]) -> None:
        index, s, tail, done = op.index, op.stream.id, self.tail, self.done
        if index in self.device_delays:
            start = max(issued, tail[s])
            tail[s] = start + self.device_delays[index]
            self.timeline.append(Span(index, self.names[s], "spin", start, tail[s], "injected delay"))
        if type(op) is Launch:
            start = max(issued, tail[s])
            if deps:
                released = max(done[first] for first in deps) + self.gate_cost
                waited = ", ".join(f"op #{first} {self.kernels[first]}" for first in deps)
                self.timeline.append(
                    Span(index, self.names[s], "gate", start, max(start, released), f"gate: after {waited}")
                )
                start = max(start, released)
            end = start + (self.kernel_cost if op.cost_us is None else op.cost_us) + self.read_spins.get(index, 0.0)
            tail[s] = end
            self.access_time[index] = end
            self.timeline.append(Span(index, self.names[s], "kernel", start, end, op.kernel))
        elif type(op) is Record:
            tail[s] = max(issued, tail[s])
        else:  # a wait: its stream goes on once what it binds to has completed
            tail[s] = max([tail[s], *(done[dep] for dep in deps)])
        done[index] = tail[s]
        self.released.extend(self.waiters.pop(index, ()))

    def _drain(self) -> None:
        """Run what the ops run so far released, stream by stream, in FIFO order on each (a worklist, not
        recursion: a chain of gates across streams can be as long as the program)."""
        released = self.released
        while released:
            queue = self.pending[released.pop()]
            while queue and self._try(queue[0]):
                queue.popleft()

    def visit_launch(self, op: Launch) -> None:
        self._enqueue(op, tuple(self.gates.get(op.index, ())))

    def visit_record(self, op: Record) -> None:
        self._enqueue(op, ())
        self.latest_record[op.event.id] = op.index

    def visit_wait_event(self, op: WaitEvent) -> None:
        record = self.latest_record[op.event.id]
        self._enqueue(op, () if record is None else (record,))

    def visit_wait_stream(self, op: WaitStream) -> None:
        last = self.last_on[op.other.id]
        self._enqueue(op, () if last is None else (last,))

    def _need(self, index: int | None, what: str) -> float:
        """When stream op `index` completed, for a host sync; ScheduleInfeasible if it has not run."""
        if index is None:
            return self.host
        if index not in self.done:
            raise ScheduleInfeasible(
                f"the forced orders deadlock: the host blocks in {what} on op #{index}, which a gate holds "
                "back until a launch the host has not issued yet"
            )
        return max(self.host, self.done[index])

    def visit_event_sync(self, op: EventSync) -> None:
        until = self._need(self.latest_record[op.event.id], f"{op.event}.synchronize()")
        self._block_until(op.index, until, f"{op.event}.synchronize()")

    def visit_stream_sync(self, op: StreamSync) -> None:
        until = self._need(self.last_on[op.stream.id], f"{op.stream}.synchronize()")
        self._block_until(op.index, until, f"{op.stream}.synchronize()")

    def visit_device_sync(self, op: DeviceSync) -> None:
        until = max([self.host, *(self._need(last, "device synchronize") for last in self.last_on)])
        self._block_until(op.index, until, "device synchronize")

    def drained(self) -> None:
        for queue in self.pending:
            if queue:
                op = queue[0][0]
                raise ScheduleInfeasible(
                    f"the forced orders deadlock: op #{op.index} on {op.stream} waits for a gate that never "
                    "opens (the orders form a cycle with the program's own edges)"
                )


class _Discard:
    """A sink with list's `append` that keeps nothing."""

    __slots__ = ()

    def append(self, item: object) -> None:
        pass
