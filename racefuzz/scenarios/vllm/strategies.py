"""Workloads of the vLLM KV-reuse scenario, decoded from Hypothesis-drawn bytes; the hazards.

As in the sglang scenario, one byte string per workload: every field is `minimum + byte % range`, a flag is
`byte % 2`, so shrinking the bytes toward zero and the string toward empty moves every field toward its
simplest value, and a bounded proof over bytes below 2 (`racefuzz prove --alphabet 2`) already reaches every
flag: a 4-byte header (async scheduling, pool slack, block size, steps; under the `offload` hazard a fifth
byte, the connector), then 5 bytes a request
(arrival, remote, eos, output length, prompt), the last one possibly cut short (its missing bytes read as
0), so that 11 bytes already hold two requests whose second is a remote one arriving later. A request
arrives 0 to 2 steps after the one before it, and a byte of 0 means the most steps (`max_steps - byte %
max_steps`): a drawn workload runs long enough for a request to finish and its blocks to be handed on,
and the structural minimizer (`minimize.py`) cuts the steps down.

The hazards (`hazards` restricts which a workload may contain, so a result can be attributed to one):

    async-scheduling  the batch queue of depth 2: step k+1 is scheduled and launched before step k's output
                      is processed (without it every step's output is processed before the next is scheduled)
    block-reuse       a tight block pool: blocks a finished request frees are handed to a later request
    kv-load           P/D-consumer requests whose prompt KV the KV connector writes into their new blocks

and one opt-in hazard, outside `HAZARDS`:

    offload           a workload's KV connector may be the CPU offloading connector (its own CUDA stream, which
                      waits on the compute stream before each transfer) instead of NIXL; it also stores
                      finished requests' blocks to the CPU, reading them on that stream. A header byte of its
                      own picks the connector, so NIXL workloads stay in the mix (where the negative
                      control races)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hypothesis import strategies as st

from racefuzz.errors import InvalidArgument
from racefuzz.scenarios.vllm.workload import RequestSpec, Workload

HAZARDS = ("async-scheduling", "block-reuse", "kv-load")
OPT_IN_HAZARDS = ("offload",)

MAX_BLOCK_SIZE = 4
MAX_PROMPT = 4
MAX_OUTPUT = 3
MAX_STEPS = 8

_HEADER = 4  # async scheduling, pool slack, block size, steps (and the connector under `offload`)
_REQUEST = 5  # arrival, remote, eos, output length, prompt


def decode_workload(
    data: bytes, *, hazards: frozenset[str], max_steps: int = MAX_STEPS, fixed_steps: bool = False
) -> Workload:
    """The workload a byte string stands for (see the module docstring)."""
    header = _HEADER + ("offload" in hazards)
    data = data.ljust(header, b"\0")
    block_size = 1 + data[2] % MAX_BLOCK_SIZE
    requests = []
    arrives = 0
    for at in range(header, len(data), _REQUEST):
        arrival, remote, eos, output, prompt = data[at : at + _REQUEST].ljust(_REQUEST, b"\0")
        arrives = min(arrives + arrival % 3, max_steps - 1)
        requests.append(
            RequestSpec(
                arrival=arrives,
                prompt_len=1 + prompt % MAX_PROMPT,
                output_len=1 + output % MAX_OUTPUT,
                eos=bool(eos % 2),
                remote="kv-load" in hazards and bool(remote % 2),
            )
        )
    if not requests:
        requests.append(RequestSpec())
    need = [-(-(r.prompt_len + r.output_len) // block_size) for r in requests]
    # A tight pool: from the largest request's own need (its blocks are reused once it finishes) up to all of
    # them; without block reuse, every request gets blocks nobody had before.
    slack = data[1] % (sum(need) - max(need) + 1) if "block-reuse" in hazards else sum(need) - max(need)
    num_blocks = max(need) + slack
    return Workload(
        requests=tuple(requests),
        steps=max_steps if fixed_steps else max_steps - data[3] % 3,
        block_size=block_size,
        num_blocks=num_blocks,
        async_scheduling="async-scheduling" in hazards and bool(data[0] % 2),
        connector="offloading" if "offload" in hazards and data[4] % 2 else "nixl",
    )


def workload_bytes(max_requests: int = 6) -> st.SearchStrategy[bytes]:
    """The raw bytes `decode_workload` decodes."""
    from hypothesis import strategies as st

    return st.binary(min_size=_HEADER + 2, max_size=_HEADER + 1 + _REQUEST * max_requests)


class VllmWorkloads:
    """The workload space of one search (`Scenario.workload_space`): bytes and their decoder.

    Options: `max_requests`, `max_iterations` (engine steps at most; the name the generic `prove` uses),
    `fixed_iterations` (exactly `max_iterations` steps).
    """

    OPTIONS = ("max_requests", "max_iterations", "fixed_iterations")

    def __init__(
        self,
        hazards: frozenset[str],
        *,
        max_requests: int = 6,
        max_iterations: int = MAX_STEPS,
        fixed_iterations: bool = False,
    ) -> None:
        unknown = sorted(set(hazards) - {*HAZARDS, *OPT_IN_HAZARDS})
        if unknown:
            raise InvalidArgument(f"unknown hazard(s) {unknown}; choose from {', '.join((*HAZARDS, *OPT_IN_HAZARDS))}")
        if type(max_requests) is not int or max_requests < 1:
            raise InvalidArgument(f"workloads: max_requests must be an integer >= 1, got {max_requests!r}")
        if type(max_iterations) is not int or not 1 <= max_iterations <= 64:
            raise InvalidArgument(f"workloads: max_iterations must be an integer in [1, 64], got {max_iterations!r}")
        self.hazards = frozenset(hazards)
        self.max_requests = max_requests
        self.max_steps = max_iterations
        self.fixed_steps = bool(fixed_iterations)

    def strategy(self) -> st.SearchStrategy[bytes]:
        return workload_bytes(self.max_requests)

    def decode(self, data: bytes) -> Workload:
        return decode_workload(data, hazards=self.hazards, max_steps=self.max_steps, fixed_steps=self.fixed_steps)
