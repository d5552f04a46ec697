"""A delay schedule: where injected delays go, and how long they are. The replayable half of a run.

The program says what the host issues; the schedule says how the run is perturbed:
* `device_delays[i]`: a spin of that many microseconds enqueued on op i's stream right before op i
  (op i must be enqueued on a stream: a launch, record or wait);
* `read_spins[i]`: launch i spins that long *inside* the kernel before its loads, stretching its read
  window (launch i must read something);
* `host_delays[i]`: the host sleeps that long before issuing op i;
* `orders`: forced orders, pairs `(first, then)` of launches: launch `first` finishes before launch `then`
  starts, whichever the host issued first. A backend realizes each with a gate: `then`'s stream waits
  (a wait kernel right before `then`) until a signal kernel right after `first` on its stream has run.
  An order that cannot hold (a cycle with the program's own edges, or a host sync that waits for `then`
  before the host issues `first`) makes the run fail with `ScheduleInfeasible`, never hang.

Keys are op indices into the program the schedule was drawn for -- or, for real code (`racefuzz trace`),
launch points: `(stream, n)`, the n-th launch (0-based) on that stream, which names the same launch in
every run of a step whose launch sequence does not change. One schedule uses one kind of key. A real-code
schedule takes `device_delays` (a spin before the point's launch) and `orders` (each point on its own
stream); it is realized by the live executor of `racefuzz.trace.orders`, not checked against a `Program`.
Delays are microseconds, >= 0; zero entries are dropped so that "no delay" has exactly one spelling.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from racefuzz.errors import InvalidArgument, RacefuzzError
from racefuzz.program import Launch, Program, StreamOp

MAX_DELAY_US = 50_000.0
"""The largest single delay accepted (50 ms): longer spins only slow runs down and trip GPU watchdogs."""


class ScheduleInfeasible(RacefuzzError):
    """A schedule's forced orders cannot all hold on its program: a gate would wait forever (the simulator
    sees the deadlock; on the GPU the wait kernel's timeout says so)."""


LaunchPoint = tuple[str, int]
"""A launch of real code: (stream name, n), its n-th launch (0-based) on that stream."""

Point = int | LaunchPoint
"""What a schedule's keys name: an op index of a program, or a launch point of real code."""

Order = tuple[Any, Any]
"""A forced order `(first, then)` of two points (op indices, or launch points): launch `first` finishes
before launch `then` starts."""


def _point(name: str, value: object) -> Point:
    """`value` as a point (an op index, or a launch point given as a tuple or a JSON list); InvalidArgument if
    it is neither."""
    if isinstance(value, (tuple, list)) and len(value) == 2:
        stream, n = value
        if not isinstance(stream, str) or not stream:
            raise InvalidArgument(f"{name}: a launch point's stream must be a stream name, got {stream!r}")
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InvalidArgument(f"{name}: a launch point's n must be a non-negative int, got {n!r}")
        return (stream, n)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgument(
            f"{name}: op index must be a non-negative int (or a (stream, n) launch point), got {value!r}"
        )
    return value


def _describe(point: Point) -> str:
    return f"op {point}" if isinstance(point, int) else f"launch {point[1]} on {point[0]}"


def _clean_orders(orders: object) -> tuple[Order, ...]:
    cleaned = set()
    for pair in orders:  # type: ignore[attr-defined]
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise InvalidArgument(f"orders: each forced order is a (first, then) pair of points, got {pair!r}")
        first, then = (_point("orders", value) for value in pair)
        if first == then:
            raise InvalidArgument(f"orders: {_describe(first)} cannot be forced before itself")
        if isinstance(first, tuple) != isinstance(then, tuple):
            raise InvalidArgument(f"orders ({first!r}, {then!r}): an op index and a launch point in one order")
        if isinstance(first, tuple) and first[0] == then[0]:  # type: ignore[index]
            raise InvalidArgument(
                f"orders ({_describe(first)}, {_describe(then)}): both launches are on one stream (FIFO orders them)"
            )
        cleaned.add((first, then))
    return tuple(sorted(cleaned, key=lambda pair: (isinstance(pair[0], tuple), pair)))


def _clean(name: str, delays: Mapping[Any, float]) -> dict[Any, float]:
    cleaned: dict[Any, float] = {}
    for raw, value in delays.items():
        key = _point(name, raw)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise InvalidArgument(f"{name}[{key}]: delay must be a number of microseconds, got {value!r}")
        if value < 0:
            raise InvalidArgument(f"{name}[{key}]: delay must be >= 0 microseconds, got {value}")
        if value > MAX_DELAY_US:
            raise InvalidArgument(f"{name}[{key}]: delay {value} us is above the cap of {MAX_DELAY_US:.0f} us")
        if value > 0:
            cleaned[key] = float(value)
    return dict(sorted(cleaned.items(), key=lambda item: (isinstance(item[0], tuple), item[0])))


@dataclass(frozen=True)
class Schedule:
    """Injected delays, in microseconds, and forced orders, keyed by op index or (real code) by launch
    point (see the module doc). Validated on construction."""

    device_delays: Mapping[Any, float] = field(default_factory=dict)
    read_spins: Mapping[Any, float] = field(default_factory=dict)
    host_delays: Mapping[Any, float] = field(default_factory=dict)
    orders: tuple[Order, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "device_delays", _clean("device_delays", self.device_delays))
        object.__setattr__(self, "read_spins", _clean("read_spins", self.read_spins))
        object.__setattr__(self, "host_delays", _clean("host_delays", self.host_delays))
        object.__setattr__(self, "orders", _clean_orders(self.orders))
        kinds = {isinstance(key, tuple) for key in self._keys()}
        if len(kinds) > 1:
            raise InvalidArgument("a schedule names op indices or launch points (stream, n), not both")
        if True in kinds and (self.read_spins or self.host_delays):
            raise InvalidArgument(
                "a real-code schedule (launch points) takes device_delays and orders only: read spins and host "
                "delays need a modelled program"
            )

    def _keys(self) -> list[Point]:
        keys: list[Point] = [*self.device_delays, *self.read_spins, *self.host_delays]
        for pair in self.orders:
            keys.extend(pair)
        return keys

    @property
    def of_real_code(self) -> bool:
        """Whether its points are launch points of real code (`(stream, n)`), not op indices of a program."""
        return any(isinstance(key, tuple) for key in self._keys())

    @property
    def nonzero_delays(self) -> int:
        return len(self.device_delays) + len(self.read_spins) + len(self.host_delays)

    def scaled(self, factor: float) -> Schedule:
        """Every delay times `factor`, capped at `MAX_DELAY_US`; the forced orders as they are."""

        def scale(delays: Mapping[Any, float]) -> dict[Any, float]:
            return {point: min(MAX_DELAY_US, us * factor) for point, us in delays.items()}

        return Schedule(scale(self.device_delays), scale(self.read_spins), scale(self.host_delays), self.orders)

    def check_against(self, program: Program) -> None:
        """Raise `InvalidArgument` unless every key names an op of `program` that can take that delay."""
        if self.of_real_code:
            raise InvalidArgument("this schedule names launch points of real code (stream, n), not ops of a program")
        ops = program.ops
        for index in self.device_delays:
            if index >= len(ops) or not isinstance(ops[index], StreamOp):
                raise InvalidArgument(f"device_delays[{index}]: op {index} is not a stream op of this program")
        for index in self.read_spins:
            if index >= len(ops) or not isinstance(ops[index], Launch) or not ops[index].reads:
                raise InvalidArgument(f"read_spins[{index}]: op {index} is not a reading launch of this program")
        for index in self.host_delays:
            if index >= len(ops):
                raise InvalidArgument(f"host_delays[{index}]: the program has only {len(ops)} ops")
        for first, then in self.orders:
            for index in (first, then):
                if index >= len(ops) or not isinstance(ops[index], Launch):
                    raise InvalidArgument(f"orders ({first}, {then}): op {index} is not a launch of this program")
            if ops[first].stream == ops[then].stream:  # type: ignore[union-attr]
                raise InvalidArgument(f"orders ({first}, {then}): both launches are on one stream (FIFO orders them)")

    def to_json(self) -> dict[str, object]:
        """The schedule as JSON; `orders` only when there are some, so delay-only schedules read as before. A
        launch point is `"stream/n"` as a key and `[stream, n]` in an order."""
        data: dict[str, object] = {
            "device_delays": {_json_key(k): v for k, v in self.device_delays.items()},
            "read_spins": {_json_key(k): v for k, v in self.read_spins.items()},
            "host_delays": {_json_key(k): v for k, v in self.host_delays.items()},
        }
        if self.orders:
            data["orders"] = [[_json_point(point) for point in pair] for pair in self.orders]
        return data

    @classmethod
    def from_json(cls, data: object) -> Schedule:
        if not isinstance(data, dict):
            raise InvalidArgument(f"a schedule is a JSON object, got {type(data).__name__}")
        unknown = set(data) - {"device_delays", "read_spins", "host_delays", "orders"}
        if unknown:
            raise InvalidArgument(f"schedule: unknown keys {sorted(unknown)}")
        parts: dict[str, dict[int, float]] = {}
        for name in ("device_delays", "read_spins", "host_delays"):
            raw = data.get(name, {})
            if not isinstance(raw, dict):
                raise InvalidArgument(f"schedule.{name} must be an object of op index -> microseconds")
            try:
                parts[name] = {_from_json_key(k): v for k, v in raw.items()}
            except ValueError as exc:
                raise InvalidArgument(f"schedule.{name}: keys must be op indices or stream/n ({exc})") from None
        orders = data.get("orders", [])
        if not isinstance(orders, list):
            raise InvalidArgument("schedule.orders must be a list of [first, then] pairs of points")
        return cls(**parts, orders=tuple(tuple(pair) if isinstance(pair, list) else pair for pair in orders))


def _json_key(point: Point) -> str:
    return str(point) if isinstance(point, int) else f"{point[0]}/{point[1]}"


def _json_point(point: Point) -> object:
    return point if isinstance(point, int) else [point[0], point[1]]


def _from_json_key(key: str) -> Point:
    """`"3"` -> 3, `"forward/2"` -> ("forward", 2) (the stream is what precedes the last `/`)."""
    stream, slash, n = key.rpartition("/")
    if not slash:
        return int(key)
    if not stream:
        raise ValueError(f"no stream before the / of {key!r}")
    return (stream, int(n))


NO_DELAYS = Schedule()
