"""Hypothesis strategies for workloads of the overlap loop.

A workload is decoded from a byte string that Hypothesis draws and shrinks (in the manner of libFuzzer's
FuzzedDataProvider): Hypothesis pays per draw, and one `binary()` draw per example is several times
faster than dozens of integer draws, which is what lets the simulator run hundreds of examples a
second (delay schedules are drawn the same way: `racefuzz.schedulers`). Every field is
`minimum + byte % range`, so shrinking bytes toward zero and the string toward empty moves every field
toward its simplest value: fewer and shorter requests, one chunk, accept length 1, no rewrites, no plan
stream.

`hazards` restricts which hazards a workload may contain, so a result can be attributed to one:

    recycled-row-prefill  requests finish and free rows that a later prefill reuses (tight row pool)
    chunked-stash         prompts longer than the chunk size (stash rewrites of the previous chunk)
    post-launch-rewrite   prefill result processing re-caches unfinished requests' rows
    plan-stream           DFLASH decode prep runs on the plan stream

and one opt-in hazard, outside `HAZARDS` so that the default workloads (and every seed's examples) stay
what they were:

    paged-get-last-loc    page_size > 1: decode prep loads each request's last allocated slot
                          (`get_last_loc`, dflash_info_v2.py:203-222) on its stream -- on the plan stream,
                          a read of cells the schedule stream wrote (sglang #28034's plan-stream reads)

The forward's read extent (`Workload.read_extent`: exact, the FA3 batch rectangle, reserved lengths) is
not a hazard but the attention backend's shape: bits 2-3 of the header's plan-stream byte draw it unless a
search fixes it (`read_extent=`), and shrinking moves it to "exact".
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # Hypothesis is imported when a strategy is made, not to load the scenario (a fast CLI start)
    from hypothesis import strategies as st

from racefuzz.errors import InvalidArgument
from racefuzz.scenarios.sglang.workload import READ_EXTENTS, RequestSpec, Workload

HAZARDS = ("recycled-row-prefill", "chunked-stash", "post-launch-rewrite", "plan-stream")
PRE_LAUNCH_HAZARDS = ("recycled-row-prefill", "chunked-stash", "plan-stream")
"""Every hazard but the post-launch rewrite: what a loop-top WAR barrier can fence."""
OPT_IN_HAZARDS = ("paged-get-last-loc",)
"""Hazards a search draws only when asked for by name (not part of the default `HAZARDS`)."""
ALL_HAZARDS = HAZARDS + OPT_IN_HAZARDS
"""The hazards `war-after-launch` (#31687) fences: what the mutants' base is clean under."""
LATER_HAZARDS = ("replay-reads", "swa-mapping")
"""Opt-in hazards of sglang's later code that `war-after-launch` does not fence (outside `ALL_HAZARDS`):

    replay-reads  the verify runs as a CUDA graph whose replay re-reads req_to_token (trtllm_mha's
                  in-graph metadata, #31686; breakable-graph verify, #30261): a `read_done` recorded
                  before the replay no longer follows every read (`read-done-post-replay` is the fix)
    swa-mapping   a second shared table, `full_to_swa_index_mapping` (window 2B), written with every
                  allocation and rewrite and cleared by the locked-full recovery (#29352), translated by
                  the forward; with replay-reads also inside the graph replay
"""
LIFETIME_HAZARDS = ("tensor-lifetime",)
"""The opt-in cross-stream tensor-lifetime hazard (#34076), outside `LATER_HAZARDS` because no design of
sglang's history up to `8905cbd42` fences it (`read-done-post-replay` races on it; `record-stream` does not):

    tensor-lifetime  mixed chunked prefill: the running batch's `req_pool_indices`, aliased as
                     `mix_running_indices`, is gathered on the forward stream after its owner was dropped,
                     and the caching allocator hands its block to the next schedule-stream allocation
"""

MAX_BLOCK_SIZE = 4
MAX_PROMPT = 12
MAX_DECODE_STEPS = 6
MAX_ITERATIONS = 8

_HEADER = 4  # block size, iterations, rows, plan stream (bit 0) and page size (bit 1)
_REQUEST = 7  # arrival, prompt, chunk, steps, accept digits (2 bytes), re-cache bit


def check_hazards(hazards: Collection[str]) -> frozenset[str]:
    known = ALL_HAZARDS + LATER_HAZARDS + LIFETIME_HAZARDS
    unknown = set(hazards) - set(known)
    if unknown:
        raise InvalidArgument(f"unknown hazard(s) {sorted(unknown)}; choose from {', '.join(known)}")
    return frozenset(hazards)


def decode_workload(
    data: bytes,
    *,
    hazards: frozenset[str],
    max_iterations: int,
    plan_stream: bool | None,
    fixed_iterations: bool = False,
    read_extent: str | None = None,
) -> Workload:
    """The workload a byte string stands for (see the module docstring); `read_extent` None: drawn."""
    data = data.ljust(_HEADER, b"\0")
    block_size = 1 + data[0] % MAX_BLOCK_SIZE
    chunked = "chunked-stash" in hazards
    rewrites = "post-launch-rewrite" in hazards
    swa = "swa-mapping" in hazards
    requests = []
    for at in range(_HEADER, len(data) - _REQUEST + 1, _REQUEST):
        arrival, prompt, chunk, steps, lo, hi, mask = data[at : at + _REQUEST]
        steps = 1 + steps % MAX_DECODE_STEPS
        pattern = lo | hi << 8
        requests.append(
            RequestSpec(
                arrival=arrival % max_iterations,
                prompt_len=1 + prompt % MAX_PROMPT,
                chunk=1 + chunk % MAX_PROMPT if chunked else 64,
                accepts=tuple(1 + (pattern >> (2 * i)) % block_size for i in range(steps)),
                rewrite_at=(0,) if rewrites and mask & 1 else (),
                swa_recovery=swa and bool(mask & 2),
            )
        )
    if not requests:
        requests.append(RequestSpec(accepts=(1,)))
    requests.sort(key=lambda r: r.arrival)
    # A tight row pool recycles rows; one row per request never does.
    rows = 1 + data[2] % len(requests) if "recycled-row-prefill" in hazards else len(requests)
    if plan_stream is None:
        plan_stream = "plan-stream" in hazards and bool(data[3] & 1)
    # Bit 1 of the plan-stream byte: shrinking clears it, back to page_size 1 (no get_last_loc read).
    page_size = 2 if "paged-get-last-loc" in hazards and data[3] & 2 else 1
    if read_extent is None:
        read_extent = READ_EXTENTS[(data[3] >> 2 & 3) % len(READ_EXTENTS)]
    return Workload(
        requests=tuple(requests),
        iterations=max_iterations if fixed_iterations else 1 + data[1] % max_iterations,
        block_size=block_size,
        rows=rows,
        plan_stream=plan_stream,
        post_launch_rewrites=rewrites,
        page_size=page_size,
        read_extent=read_extent,
        replay_reads="replay-reads" in hazards,
        swa_window=2 * block_size if swa else 0,
        mixed_chunk="tensor-lifetime" in hazards,
    )


def workload_bytes(max_requests: int = 8) -> st.SearchStrategy[bytes]:
    """The raw bytes `workloads()` decodes (for searches that decode themselves, to save draws)."""
    if max_requests < 1:
        raise InvalidArgument("workloads: max_requests must be >= 1")
    from hypothesis import strategies as st

    return st.binary(min_size=_HEADER + _REQUEST, max_size=_HEADER + _REQUEST * max_requests)


def workloads(
    *,
    hazards: Collection[str] = HAZARDS,
    max_requests: int = 8,
    max_iterations: int = MAX_ITERATIONS,
    plan_stream: bool | None = None,
    fixed_iterations: bool = False,
    read_extent: str | None = None,
) -> st.SearchStrategy[Workload]:
    """Workloads with 1 to `max_requests` requests over 1 to `max_iterations` iterations.

    `plan_stream` forces the plan stream on or off; None lets the `plan-stream` hazard decide.
    `read_extent` fixes the forward's read extent (`READ_EXTENTS`); None draws it.
    `fixed_iterations` runs exactly `max_iterations` iterations (requests still arrive at random ones).
    """
    allowed = check_hazards(hazards)
    if max_iterations < 1:
        raise InvalidArgument("workloads: max_iterations must be >= 1")
    check_read_extent(read_extent)
    return workload_bytes(max_requests).map(
        lambda data: decode_workload(
            data,
            hazards=allowed,
            max_iterations=max_iterations,
            plan_stream=plan_stream,
            fixed_iterations=fixed_iterations,
            read_extent=read_extent,
        )
    )


def check_read_extent(read_extent: str | None) -> None:
    if read_extent is not None and read_extent not in READ_EXTENTS:
        raise InvalidArgument(f"unknown read extent {read_extent!r}; choose from {', '.join(READ_EXTENTS)}")


class OverlapWorkloads:
    """The workload space of one search (`Scenario.workload_space`): bytes and their decoder.

    Options: `plan_stream` (force the plan stream on or off; None lets the `plan-stream` hazard decide),
    `fixed_iterations` (exactly `max_iterations` iterations), `max_requests`, `max_iterations`,
    `read_extent` (fix the forward's read extent; None draws it).
    """

    OPTIONS = ("plan_stream", "fixed_iterations", "max_requests", "max_iterations", "read_extent")

    def __init__(
        self,
        hazards: frozenset[str],
        *,
        plan_stream: bool | None = None,
        fixed_iterations: bool = False,
        max_requests: int = 8,
        max_iterations: int = MAX_ITERATIONS,
        read_extent: str | None = None,
    ) -> None:
        check_read_extent(read_extent)
        if max_iterations < 1:
            raise InvalidArgument("workloads: max_iterations must be >= 1")
        if max_requests < 1:
            raise InvalidArgument("workloads: max_requests must be >= 1")
        self.hazards = check_hazards(hazards)
        self.plan_stream = plan_stream
        self.fixed_iterations = fixed_iterations
        self.max_requests = max_requests
        self.max_iterations = max_iterations
        self.read_extent = read_extent

    def strategy(self) -> st.SearchStrategy[bytes]:
        return workload_bytes(self.max_requests)

    def decode(self, data: bytes) -> Workload:
        return decode_workload(
            data,
            hazards=self.hazards,
            max_iterations=self.max_iterations,
            plan_stream=self.plan_stream,
            fixed_iterations=self.fixed_iterations,
            read_extent=self.read_extent,
        )
