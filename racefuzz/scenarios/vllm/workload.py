"""The workload of the vLLM KV-reuse scenario: which requests arrive, how long they run, where their KV comes from.

A workload is plain data (JSON round-trips exactly), so that a counterexample can be written to a replay file
and re-run. Hypothesis draws workloads in `racefuzz.scenarios.vllm.strategies`; shrinking moves every field
toward its simplest value (fewer and shorter requests, no stop token, no connector load, synchronous
scheduling, blocks never reused).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from racefuzz.errors import InvalidArgument

CONNECTORS = ("nixl", "offloading")
"""The KV connectors modelled (`Workload.connector`), simplest first."""

LIMITS: dict[str, tuple[int, int]] = {
    "steps": (1, 256),
    "block_size": (1, 64),
    "num_blocks": (1, 1024),
    "requests": (0, 64),
    "arrival": (0, 256),
    "prompt_len": (1, 1024),
    "output_len": (1, 256),
}
"""The range of every integer field (for `requests`: its length): far above what a search draws and low
enough that a replay file cannot ask for a program that hangs or fills memory."""

MAX_COST_US = 1e7
"""The largest forward or host-work cost a workload may ask for (10 s)."""


def _check_int(what: str, name: str, value: object) -> None:
    low, high = LIMITS[name]
    if type(value) is not int:
        raise InvalidArgument(f"workload: {what} must be an integer in [{low}, {high}], got {value!r}")
    if not low <= value <= high:
        raise InvalidArgument(f"workload: {what} must be in [{low}, {high}], got {value}")


@dataclass(frozen=True)
class RequestSpec:
    """One request.

    Args:
        arrival: the engine step at which it enters the waiting queue.
        prompt_len: prompt tokens (their KV fills positions 0 .. prompt_len - 1).
        output_len: tokens it generates; it finishes when the host processes the step that sampled the last.
        eos: it stops on a sampled stop token, which the scheduler cannot see coming: under async scheduling
            the step after its last one is already scheduled with it (an over-scheduled step that still
            writes its KV). False: it stops at `max_tokens`, which the async scheduler sees and schedules no
            extra step for (vllm/v1/core/sched/scheduler.py `Scheduler.schedule`, the
            `num_output_placeholders` check, at 0.33.0).
        remote: its prompt KV is loaded by the KV connector (a P/D consumer: `start_load_kv`) into the blocks
            the scheduler allocated, instead of being prefilled on the compute stream.
    """

    arrival: int = 0
    prompt_len: int = 4
    output_len: int = 1
    eos: bool = False
    remote: bool = False


@dataclass(frozen=True)
class Workload:
    """The engine loop's input.

    Args:
        requests: the requests, in arrival order.
        steps: engine steps to run (`EngineCore.step` / `step_with_batch_queue` calls).
        block_size: tokens per KV block.
        num_blocks: usable blocks of the pool (block 0, vLLM's null block, comes on top and is never handed
            out). Fewer blocks than the requests need in all: freed blocks are reallocated.
        async_scheduling: the batch queue of depth 2 (`max_concurrent_batches` 2): step k+1 is scheduled and
            launched before step k's output is processed. False: `EngineCore.step`, one step at a time.
        connector: the KV connector of remote requests' loads (`CONNECTORS`): "nixl" (a NIC/RDMA read into
            the local blocks, ordered with no CUDA stream) or "offloading" (the CPU offloading connector: its
            transfers run on its own CUDA stream after `wait_stream(current_stream())`, and it also stores
            finished requests' blocks to the CPU, reading them on that stream).
        forward_cost_us: the attention kernel's duration (the rest of a step costs the simulator's default).
        host_work_us: host scheduling work at the top of each engine step.
    """

    requests: tuple[RequestSpec, ...] = field(default_factory=lambda: (RequestSpec(),))
    steps: int = 6
    block_size: int = 2
    num_blocks: int = 8
    async_scheduling: bool = True
    connector: str = "nixl"
    forward_cost_us: float = 40.0
    host_work_us: float = 0.0

    def __post_init__(self) -> None:
        for name in ("steps", "block_size", "num_blocks"):
            _check_int(name, name, getattr(self, name))
        low, high = LIMITS["requests"]
        if not isinstance(self.requests, tuple) or not low <= len(self.requests) <= high:
            raise InvalidArgument(f"workload: requests must be a list of {low} to {high} requests")
        for i, r in enumerate(self.requests):
            if not isinstance(r, RequestSpec):
                raise InvalidArgument(f"workload: request {i} is not a request")
            for name in ("arrival", "prompt_len", "output_len"):
                _check_int(f"request {i} {name}", name, getattr(r, name))
            for name in ("eos", "remote"):
                if type(getattr(r, name)) is not bool:
                    raise InvalidArgument(f"workload: request {i} {name} must be true or false")
        for name in ("async_scheduling",):
            if type(getattr(self, name)) is not bool:
                raise InvalidArgument(f"workload: {name} must be true or false")
        if self.connector not in CONNECTORS:
            raise InvalidArgument(f"workload: connector must be one of {CONNECTORS}, got {self.connector!r}")
        for name in ("forward_cost_us", "host_work_us"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_COST_US:
                raise InvalidArgument(f"workload: {name} must be microseconds in [0, {MAX_COST_US:g}], got {value!r}")
        for i, r in enumerate(self.requests):
            if self.blocks_needed(r) > self.num_blocks:
                raise InvalidArgument(
                    f"workload: request {i} needs {self.blocks_needed(r)} blocks, the pool has {self.num_blocks}"
                )

    def blocks_needed(self, request: RequestSpec) -> int:
        """Blocks for every KV position the request can write: its prompt, its outputs and one over-scheduled."""
        return -(-(request.prompt_len + request.output_len) // self.block_size)

    @property
    def iterations(self) -> int:
        """`steps` under the name the generic layers use (`racefuzz run`'s JSON summary, `prove`'s bound)."""
        return self.steps

    @property
    def max_blocks_per_request(self) -> int:
        """Columns of the block table."""
        return max((self.blocks_needed(r) for r in self.requests), default=1)

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: object) -> Workload:
        if not isinstance(data, dict):
            raise InvalidArgument("a workload is a JSON object")
        try:
            if "requests" not in data:
                return cls(**data)
            raw = data["requests"]
            if not isinstance(raw, list):
                raise InvalidArgument("workload: requests must be a list")
            requests = []
            for r in raw:
                if not isinstance(r, dict):
                    raise InvalidArgument("workload: a request is a JSON object")
                requests.append(RequestSpec(**r))
            return cls(**{**data, "requests": tuple(requests)})
        except TypeError as exc:
            raise InvalidArgument(f"workload: malformed ({exc})") from None
