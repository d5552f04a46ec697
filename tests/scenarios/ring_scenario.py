"""A second, tiny scenario: a producer/consumer ring buffer on two streams.

It exists to prove the scenario seam: it is written against `racefuzz.scenarios.Scenario` and the device
API only, and runs through `search`, `report`, `replay` and the pytest plugin without any of them knowing
it (tests/unit/test_second_scenario.py, tests/plugin/test_plugin.py).

Item i is produced into slot i % slots of `ring[0, :]` on the producer stream and consumed from it on the
consumer stream. Two orderings matter: the consumer must read a slot after its item was written (RAW),
and the producer must not overwrite a slot before the consumer read the previous item in it (WAR,
only with the `wraparound` hazard: fewer slots than items).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from types import SimpleNamespace

from hypothesis import strategies as st

from racefuzz.device import Device, StreamHandle
from racefuzz.errors import InvalidArgument
from racefuzz.program import Launch, Program

HOOKS = ("before_produce", "after_produce", "before_consume", "after_consume")


@dataclass(frozen=True)
class RingWorkload:
    items: int = 1
    slots: int = 1

    def __post_init__(self) -> None:
        if not (1 <= self.items <= 64 and 1 <= self.slots <= 64):
            raise InvalidArgument(f"ring workload: items and slots must be in [1, 64], got {self.items}, {self.slots}")

    def to_json(self) -> dict[str, object]:
        return asdict(self)


@dataclass
class RingContext:
    """What a ring design's hooks see."""

    device: Device
    producer_stream: StreamHandle
    consumer_stream: StreamHandle
    item: int = 0
    slot: int = 0
    state: dict[str, object] = field(default_factory=dict)


class RingSpace:
    def __init__(self, hazards: frozenset[str]) -> None:
        self.wraparound = "wraparound" in hazards

    def strategy(self) -> st.SearchStrategy[bytes]:
        return st.binary(min_size=2, max_size=2)

    def decode(self, data: bytes) -> RingWorkload:
        data = data.ljust(2, b"\0")
        items = 1 + data[0] % 6
        return RingWorkload(items, 1 + data[1] % 3 if self.wraparound else items)


def build(workload: RingWorkload, design: object) -> Program:
    device = Device()
    ctx = RingContext(device, device.stream("producer_stream"), device.stream("consumer_stream"))
    ring = device.buffer("ring", 1, workload.slots)

    def hook(name: str) -> None:
        method = getattr(design, name, None)
        if method is not None:
            method(ctx)

    for item in range(workload.items):
        ctx.item, ctx.slot = item, item % workload.slots
        hook("before_produce")
        cell = ring[0, ctx.slot : ctx.slot + 1]
        ctx.producer_stream.launch("produce", writes=[(cell, item + 1)], info={"item": item})
        hook("after_produce")
        hook("before_consume")
        ctx.consumer_stream.launch("consume", reads=[cell], info={"item": item})
        hook("after_consume")
    return device.finish()


class RingEvents:
    """Per-item events both ways: `produced` before the read, `consumed[slot]` before the slot's next write."""

    name = "ring-events"
    description = "produced/consumed events per slot: both orderings fenced"

    def after_produce(self, ctx: RingContext) -> None:
        ctx.state["produced"] = ctx.producer_stream.record_event("produced")

    def before_consume(self, ctx: RingContext) -> None:
        ctx.consumer_stream.wait_event(ctx.state["produced"])  # type: ignore[arg-type]

    def after_consume(self, ctx: RingContext) -> None:
        ctx.state[f"consumed{ctx.slot}"] = ctx.consumer_stream.record_event("consumed")

    def before_produce(self, ctx: RingContext) -> None:
        consumed = ctx.state.get(f"consumed{ctx.slot}")
        if consumed is not None:
            ctx.producer_stream.wait_event(consumed)  # type: ignore[arg-type]


class RingRawOnly(RingEvents):
    """Forgets the WAR fence: a slot can be overwritten before its previous item was read."""

    name = "ring-raw-only"
    description = "only the produced events: the slot's next write is not fenced (WAR on wraparound)"

    def before_produce(self, ctx: RingContext) -> None:
        pass


class RingScenario:
    name = "ring-buffer"
    spec = "ring_scenario:SCENARIO"
    table = "ring"
    hazards = ("wraparound",)
    opt_in_hazards = ()
    hook_names = HOOKS
    control_design = "ring-none"
    default_design = "ring-events"

    def designs(self) -> Mapping[str, object]:
        return {
            "ring-none": SimpleNamespace(name="ring-none", description="no fence at all: the negative control"),
            "ring-events": RingEvents(),
        }

    def mutants(self) -> Mapping[str, object]:
        return {}

    def check_design(self, design: object, spec: str) -> None:
        pass

    def workload_space(self, hazards: frozenset[str], **options: object) -> RingSpace:
        if options:
            raise InvalidArgument(f"the ring-buffer scenario has no workload options, got {sorted(options)}")
        return RingSpace(hazards)

    def build_program(self, workload: RingWorkload, design: object) -> Program:  # type: ignore[override]
        return build(workload, design)

    def workload_from_json(self, data: object) -> RingWorkload:
        if not isinstance(data, dict):
            raise InvalidArgument("a ring workload is a JSON object")
        try:
            return RingWorkload(**data)
        except TypeError as exc:
            raise InvalidArgument(f"ring workload: malformed ({exc})") from None

    def simpler_workloads(self, workload: RingWorkload) -> Iterator[RingWorkload]:  # type: ignore[override]
        if workload.items > 1:
            yield RingWorkload(workload.items - 1, min(workload.slots, workload.items - 1))

    def launch_identity(self, launch: Launch) -> Hashable:
        return (launch.stream.name, launch.kernel, launch.info.get("item"))

    def describe(self, workload: RingWorkload) -> str:  # type: ignore[override]
        return f"{workload.items} item(s) through {workload.slots} slot(s)"


SCENARIO = RingScenario()

raw_only = RingRawOnly()
raw_only.scenario = SCENARIO  # type: ignore[attr-defined]
"""A user-style design (loaded as `ring_scenario:raw_only`) that names its scenario itself."""
