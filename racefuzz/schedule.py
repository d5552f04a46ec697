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

Keys are op indices into the program the schedule was drawn for. Delays are microseconds, >= 0; zero
entries are dropped so that "no delay" has exactly one spelling.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from racefuzz.errors import InvalidArgument, RacefuzzError
from racefuzz.program import Launch, Program, StreamOp

MAX_DELAY_US = 50_000.0
"""The largest single delay accepted (50 ms): longer spins only slow runs down and trip GPU watchdogs."""


class ScheduleInfeasible(RacefuzzError):
    """A schedule's forced orders cannot all hold on its program: a gate would wait forever (the simulator
    sees the deadlock; on the GPU the wait kernel's timeout says so)."""


Order = tuple[int, int]
"""A forced order `(first, then)`: launch `first` finishes before launch `then` starts."""


def _clean_orders(orders: object) -> tuple[Order, ...]:
    cleaned = set()
    for pair in orders:  # type: ignore[attr-defined]
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise InvalidArgument(f"orders: each forced order is a (first, then) pair of op indices, got {pair!r}")
        first, then = pair
        for value in (first, then):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidArgument(f"orders: op index must be a non-negative int, got {value!r}")
        if first == then:
            raise InvalidArgument(f"orders: op {first} cannot be forced before itself")
        cleaned.add((first, then))
    return tuple(sorted(cleaned))


def _clean(name: str, delays: Mapping[int, float]) -> dict[int, float]:
    cleaned: dict[int, float] = {}
    for key, value in delays.items():
        if isinstance(key, bool) or not isinstance(key, int) or key < 0:
            raise InvalidArgument(f"{name}: op index must be a non-negative int, got {key!r}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise InvalidArgument(f"{name}[{key}]: delay must be a number of microseconds, got {value!r}")
        if value < 0:
            raise InvalidArgument(f"{name}[{key}]: delay must be >= 0 microseconds, got {value}")
        if value > MAX_DELAY_US:
            raise InvalidArgument(f"{name}[{key}]: delay {value} us is above the cap of {MAX_DELAY_US:.0f} us")
        if value > 0:
            cleaned[key] = float(value)
    return dict(sorted(cleaned.items()))


@dataclass(frozen=True)
class Schedule:
    """Injected delays, in microseconds, keyed by op index. Validated on construction."""

    device_delays: Mapping[int, float] = field(default_factory=dict)
    read_spins: Mapping[int, float] = field(default_factory=dict)
    host_delays: Mapping[int, float] = field(default_factory=dict)
    orders: tuple[Order, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "device_delays", _clean("device_delays", self.device_delays))
        object.__setattr__(self, "read_spins", _clean("read_spins", self.read_spins))
        object.__setattr__(self, "host_delays", _clean("host_delays", self.host_delays))
        object.__setattr__(self, "orders", _clean_orders(self.orders))

    @property
    def nonzero_delays(self) -> int:
        return len(self.device_delays) + len(self.read_spins) + len(self.host_delays)

    def check_against(self, program: Program) -> None:
        """Raise `InvalidArgument` unless every key names an op of `program` that can take that delay."""
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
        """The schedule as JSON; `orders` only when there are some, so delay-only schedules read as before."""
        data: dict[str, object] = {
            "device_delays": {str(k): v for k, v in self.device_delays.items()},
            "read_spins": {str(k): v for k, v in self.read_spins.items()},
            "host_delays": {str(k): v for k, v in self.host_delays.items()},
        }
        if self.orders:
            data["orders"] = [list(pair) for pair in self.orders]
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
                parts[name] = {int(k): v for k, v in raw.items()}
            except ValueError as exc:
                raise InvalidArgument(f"schedule.{name}: keys must be op indices ({exc})") from None
        orders = data.get("orders", [])
        if not isinstance(orders, list):
            raise InvalidArgument("schedule.orders must be a list of [first, then] op index pairs")
        return cls(**parts, orders=tuple(tuple(pair) if isinstance(pair, list) else pair for pair in orders))


NO_DELAYS = Schedule()
