"""Forced orders on real code: a launch held back on its stream until another stream's launch has run.

A real-code order is `(first, then)`, two launch points (`racefuzz.schedule.LaunchPoint`: (stream, n-th
launch on it)) on different streams, carried in a `racefuzz.schedule.Schedule` with the delays. The live
executor re-runs the step and, on the GPU, enqueues a gate as the CUDA backend does for a modelled
program (`racefuzz.backends.cuda.issue`): the backend's own `rf_gate_wait` on `then`'s stream right
before `then`, its `rf_gate_signal` on `first`'s stream right after `first` (after the snapshots the
oracle takes of `first`'s stores). So `then` starts only once `first` has completed, whichever the host
issued first: the order is forced, not hoped for, and a counterexample of orders replays 1 of 1.

Which orders may be forced (`OrderFacts`): only those that cannot deadlock. A gate waits on the device,
so an order whose `then` happens before its `first` in the reference run's happens-before -- a stream
wait or an event, or a host sync (the host waiting for `then`'s stream before it issues `first` would
wait for the gate, which waits for the host) -- would wait forever: such an order is refused with
`ScheduleInfeasible`, as are orders that together close a cycle. The candidates (`candidate_orders`) are
the races of the reference run: for each unordered conflicting pair (a, b) in issue order, b before a,
the order in which the race manifests (a WAR's write lands before its read; a RAW's read sees the old
bytes). A gate whose wait still times out (a host sync racefuzz did not see; `first` never launched) gives
up after `GATE_TIMEOUT_US`, marks itself and lets the run end: the run is reported, never judged, and
never hangs.

On the CPU a step executes eagerly and nothing can be held back: the candidates are reported, and that
they need a GPU (`racefuzz.trace.search.fuzz`'s `skipped`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from racefuzz.errors import InvalidArgument
from racefuzz.program import Launch
from racefuzz.schedule import LaunchPoint, Schedule, ScheduleInfeasible
from racefuzz.trace.builder import HOST

PointOrder = tuple[LaunchPoint, LaunchPoint]
"""A forced order of real code: (first, then), launch `first` completes before launch `then` starts."""

GATE_TIMEOUT_US = 1_000_000.0
"""How long a gate's wait waits for its signal before it gives up (1 s): a real step's host may run a lot
of Python between `then` and `first` (the wait spans it), and a gate that cannot be realized costs this
once per run."""


def launch_points(reference: Any) -> list[tuple[str, int]]:
    """(stream, n) of every device launch of the reference run, in host order: where delays may go. Not a
    CUDA graph's nodes (kind `graph`): a delay goes before or after a replay, whose two boundary launches
    are its points (`racefuzz.trace.graphs`)."""
    return list(launch_points_by_op(reference).values())


def launch_points_by_op(reference: Any) -> dict[int, tuple[str, int]]:
    """`launch_points` keyed by each launch's index in the reference run's program: a caller aiming a delay at
    a launch (a race's access) counts the points as the search does."""
    points: dict[int, tuple[str, int]] = {}
    counts: dict[str, int] = {}
    for op in reference.builder.ops:
        if type(op) is Launch and op.stream.name != HOST and op.info.get("kind") not in ("free", "copy", "graph"):
            stream = op.stream.name
            n = counts.get(stream, 0)
            counts[stream] = n + 1
            points[op.index] = (stream, n)
    return points


def describe_point(point: LaunchPoint) -> str:
    return f"launch {point[1]} on {point[0]}"


def describe_order(order: PointOrder) -> str:
    return f"{describe_point(order[0])} before {describe_point(order[1])}"


def candidate_orders(reference: Any, races: Sequence[Any]) -> list[PointOrder]:
    """The orders that make `races` (`racefuzz.trace.judge.TraceRace`s of `reference`, a `RunRecord`)
    manifest: for each race (a, b) in issue order, `(b, a)` -- b completes before a starts. Once each,
    in the races' order; a pair with a launch that is no launch point (a host access, a free, a copy torch
    made out of sight, a CUDA graph's node) gives none: no gate can go there."""
    points = launch_points_by_op(reference)
    found: dict[PointOrder, None] = {}
    for race in races:
        first, then = points.get(race.second.index), points.get(race.first.index)
        if first is not None and then is not None and first[0] != then[0]:
            found[(first, then)] = None
    return list(found)


class OrderFacts:
    """The reference run's happens-before, asked about launch points: which orders can be forced.

    Built on the core's: the reference run's `Program` (host syncs and host accesses included), its
    `racefuzz.hb.analysis` and the forced-order set of the model's `orders` scheduler
    (`racefuzz.schedulers.orders.ForcedSet`: reachability over happens-before plus the orders already
    forced)."""

    def __init__(self, reference: Any) -> None:
        from racefuzz.hb import analysis

        self.launches: dict[LaunchPoint, int] = {point: op for op, point in launch_points_by_op(reference).items()}
        """launch point -> its launch's op index in the program."""
        self.facts = analysis(reference.program)

    def forced(self) -> Any:
        from racefuzz.schedulers.orders import ForcedSet

        return ForcedSet(self.facts)

    def _index(self, point: LaunchPoint) -> int:
        index = self.launches.get(point)
        if index is None:
            raise ScheduleInfeasible(
                f"the forced order names {describe_point(point)}, which is no launch point of the step's reference "
                "run (a stream it does not launch on, or past its launches there)"
            )
        return index

    def consistent(self, orders: Sequence[PointOrder]) -> list[PointOrder]:
        """`orders` in turn, each kept unless happens-before (with those kept before it) already implies it
        or it would close a cycle: what a search draws becomes a schedule whose gates cannot deadlock."""
        forced = self.forced()
        kept = []
        for first, then in orders:
            if forced.add(self._index(first), self._index(then)):
                kept.append((first, then))
        return kept

    def check(self, orders: Sequence[PointOrder]) -> None:
        """`ScheduleInfeasible` (one line, naming the order) unless every order of `orders` can be forced
        together: `then` does not happen before `first` in the reference run, nor through the orders
        before it. An order happens-before already implies is kept (its gate holds at once)."""
        forced = self.forced()
        for first, then in orders:
            a, b = self._index(first), self._index(then)
            if forced.after(b, a):
                raise ScheduleInfeasible(
                    f"the forced order {describe_order((first, then))} cannot hold: in the step's reference run "
                    f"{describe_point(then)} happens before {describe_point(first)} (a stream wait, an event, a host "
                    "sync, or an order forced before it), so its gate would wait forever"
                )
            forced.add(a, b)


class GateKernels(Protocol):
    """What issues one run's gates (`CudaGates` on the GPU; a fake in the unit tests). Gate `k` is the k-th
    order of the run's schedule; `wait` and `signal` enqueue on the current stream (the launch's)."""

    def wait(self, gate: int) -> None: ...

    def signal(self, gate: int) -> None: ...

    def timed_out(self) -> list[int]:
        """After the run (the device synchronized): the gates whose wait gave up."""
        ...


@dataclass
class Gates:
    """One run's forced orders, by launch point: which gates wait before a point's launch (`waits`) and
    which signal after it (`signals`); the recorder asks at every launch point (`Recorder.delay`,
    `Recorder.after_launch`). `issued` lists what was enqueued, in host order: ("wait" | "signal", point, gate)."""

    orders: tuple[PointOrder, ...]
    kernels: GateKernels
    waits: dict[LaunchPoint, list[int]] = field(default_factory=dict)
    signals: dict[LaunchPoint, list[int]] = field(default_factory=dict)
    issued: list[tuple[str, LaunchPoint, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        for gate, (first, then) in enumerate(self.orders):
            self.waits.setdefault(then, []).append(gate)
            self.signals.setdefault(first, []).append(gate)

    @property
    def points(self) -> set[LaunchPoint]:
        """The launch points with a gate's wait or signal."""
        return set(self.waits) | set(self.signals)

    def before(self, point: LaunchPoint) -> bool:
        """Enqueue the waits that hold `point`'s launch back; whether a signal is due after it."""
        for gate in self.waits.get(point, ()):
            self.kernels.wait(gate)
            self.issued.append(("wait", point, gate))
        return point in self.signals

    def after(self, point: LaunchPoint) -> None:
        """Enqueue the signals of the orders whose `first` is `point`'s launch, which has just been issued."""
        for gate in self.signals.get(point, ()):
            self.kernels.signal(gate)
            self.issued.append(("signal", point, gate))

    def timed_out(self) -> list[PointOrder]:
        """The orders whose gate gave up (after the run): the run did not keep them and is not judged."""
        return [self.orders[gate] for gate in self.kernels.timed_out()]


class CudaGates:
    """`GateKernels` on the GPU: the CUDA backend's `rf_gate_wait` / `rf_gate_signal`
    (`racefuzz.backends.cuda.runtime.Runtime.gate_kernels`, compiled once per process and device) over two
    ints per gate (its flag, its timed-out mark) of one device array, zeroed before the run."""

    def __init__(self, count: int, timeout_us: float = GATE_TIMEOUT_US) -> None:
        import numpy as np
        import torch

        try:
            import cupy
        except ImportError:
            from racefuzz.errors import BackendUnavailable

            raise BackendUnavailable(
                "forced orders on real code need CuPy (the CUDA backend's gate kernels): pip install cupy-cuda12x"
            ) from None
        from racefuzz.backends.cuda.runtime import get_runtime, spin_ns

        self._np, self._torch = np, torch
        device = torch.cuda.current_device()
        with cupy.cuda.Device(device):
            self.runtime = get_runtime(torch, cupy, device)
        self.wait_kernel, self.signal_kernel = self.runtime.gate_kernels
        # Made and zeroed before the step runs (not a storage of the step), complete before any gate reads it.
        self.flags = torch.zeros(max(1, 2 * count), dtype=torch.int32, device=torch.device("cuda", device))
        torch.cuda.synchronize()
        self._base = self.flags.data_ptr()
        self._timeout = spin_ns(timeout_us)

    def _stream(self) -> Any:
        return self.runtime.external_stream(self._torch.cuda.current_stream().cuda_stream)

    def wait(self, gate: int) -> None:
        at = self._base + 8 * gate
        args = (self._np.uint64(at), self._np.uint64(at + 4), self._timeout)
        self.wait_kernel((1,), (1,), args, stream=self._stream())

    def signal(self, gate: int) -> None:
        self.signal_kernel((1,), (1,), (self._np.uint64(self._base + 8 * gate),), stream=self._stream())

    def timed_out(self) -> list[int]:
        self._torch.cuda.synchronize()
        marks = self.flags.cpu()[1::2]
        return [int(i) for i in marks.nonzero().flatten().tolist()]


def real_code_schedule(delays: Sequence[tuple[str, int, float]] = (), orders: Sequence[PointOrder] = ()) -> Schedule:
    """The `Schedule` of real code with these delay points ((stream, n, microseconds)) and forced orders."""
    return Schedule(device_delays={(stream, n): us for stream, n, us in delays}, orders=tuple(orders))


def gates_unavailable(device: str) -> str:
    """Why forced orders cannot be realized on `device` ("": they can): the CPU executes eagerly, and the
    GPU's gates are the CUDA backend's kernels, compiled by CuPy."""
    if not device.startswith("cuda"):
        return "the step executes eagerly on the CPU: forced orders need a GPU"
    try:
        import cupy  # noqa: F401
    except ImportError:
        return "CuPy is not installed (the gates are the CUDA backend's kernels): pip install cupy-cuda12x"
    return ""


def gate_kernels(device: str, count: int) -> GateKernels:
    """The gates of one run of `count` forced orders on `device`: the GPU's (`CudaGates`); on the CPU an
    `InvalidArgument` -- a step executes eagerly there, and nothing can hold a launch back."""
    if not device.startswith("cuda"):
        raise InvalidArgument(
            f"{count} forced order(s) cannot be realized on {device}: the step executes eagerly there; forced "
            "orders need a GPU (--device cuda)"
        )
    return CudaGates(count)


def schedule_text(schedule: Schedule) -> str:
    """A real-code schedule in words, as reports and replays print it: its delay points, its forced orders."""
    delays = ", ".join(f"{us:g} us before launch {n} on {s}" for (s, n), us in schedule.device_delays.items())
    orders = ", ".join(describe_order(order) for order in schedule.orders)
    return f"delays: {delays or 'none'}; forced orders: {orders or 'none'}"
