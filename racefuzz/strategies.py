"""Hypothesis strategies for workloads of the overlap loop and for delay schedules.

Both are decoded from a byte string that Hypothesis draws and shrinks (in the manner of libFuzzer's
FuzzedDataProvider): Hypothesis pays per draw, and one `binary()` draw per example is several times
faster than dozens of integer draws, which is what lets the simulator run hundreds of examples a
second. Every field is `minimum + byte % range`, so shrinking bytes toward zero and the string toward
empty moves every field toward its simplest value: fewer and shorter requests, one chunk, accept length
1, no rewrites, no plan stream; fewer delays, each toward zero.

`hazards` restricts which hazards a workload may contain, so a result can be attributed to one:

    recycled-row-prefill  requests finish and free rows that a later prefill reuses (tight row pool)
    chunked-stash         prompts longer than the chunk size (stash rewrites of the previous chunk)
    post-launch-rewrite   result processing rewrites live rows' prefixes
    plan-stream           DFLASH decode prep runs on the plan stream

and one opt-in hazard, outside `HAZARDS` so that the default workloads (and every seed's examples) stay
what they were:

    paged-get-last-loc    page_size > 1: decode prep loads each request's last allocated slot
                          (`get_last_loc`, dflash_info_v2.py:203-222) on its stream -- on the plan stream,
                          a read of cells the schedule stream wrote (sglang #28034's plan-stream reads)
"""

from __future__ import annotations

from collections.abc import Collection

from hypothesis import strategies as st

from racefuzz.errors import InvalidArgument
from racefuzz.program import Program
from racefuzz.scenarios.workload import RequestSpec, Workload
from racefuzz.schedule import Schedule

HAZARDS = ("recycled-row-prefill", "chunked-stash", "post-launch-rewrite", "plan-stream")
PRE_LAUNCH_HAZARDS = ("recycled-row-prefill", "chunked-stash", "plan-stream")
"""Every hazard but the post-launch rewrite: what a loop-top WAR barrier can fence."""
OPT_IN_HAZARDS = ("paged-get-last-loc",)
"""Hazards a search draws only when asked for by name (not part of the default `HAZARDS`)."""
ALL_HAZARDS = HAZARDS + OPT_IN_HAZARDS

MAX_BLOCK_SIZE = 4
MAX_PROMPT = 12
MAX_DECODE_STEPS = 6
MAX_ITERATIONS = 8
DELAY_STEP_US = 20.0
"""A delay byte b means b * 20 us: 0 to 5.1 ms, far longer than the simulated kernels."""

_HEADER = 4  # block size, iterations, rows, plan stream (bit 0) and page size (bit 1)
_REQUEST = 7  # arrival, prompt, chunk, steps, accept digits (2 bytes), rewrite bits
_DELAY = 4  # kind, op (2 bytes), length


def check_hazards(hazards: Collection[str]) -> frozenset[str]:
    unknown = set(hazards) - set(ALL_HAZARDS)
    if unknown:
        raise InvalidArgument(f"unknown hazard(s) {sorted(unknown)}; choose from {', '.join(ALL_HAZARDS)}")
    return frozenset(hazards)


def decode_workload(
    data: bytes,
    *,
    hazards: frozenset[str],
    max_iterations: int,
    plan_stream: bool | None,
    fixed_iterations: bool = False,
) -> Workload:
    """The workload a byte string stands for (see the module docstring)."""
    data = data.ljust(_HEADER, b"\0")
    block_size = 1 + data[0] % MAX_BLOCK_SIZE
    chunked = "chunked-stash" in hazards
    rewrites = "post-launch-rewrite" in hazards
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
                rewrite_at=tuple(i for i in range(steps) if mask >> i & 1) if rewrites else (),
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
    return Workload(
        requests=tuple(requests),
        iterations=max_iterations if fixed_iterations else 1 + data[1] % max_iterations,
        block_size=block_size,
        rows=rows,
        plan_stream=plan_stream,
        post_launch_rewrites=rewrites,
        page_size=page_size,
    )


def workload_bytes(max_requests: int = 8) -> st.SearchStrategy[bytes]:
    """The raw bytes `workloads()` decodes (for searches that decode themselves, to save draws)."""
    if max_requests < 1:
        raise InvalidArgument("workloads: max_requests must be >= 1")
    return st.binary(min_size=_HEADER + _REQUEST, max_size=_HEADER + _REQUEST * max_requests)


def schedule_bytes(max_delays: int = 4) -> st.SearchStrategy[bytes]:
    """The raw bytes `schedules()` decodes."""
    if max_delays < 0:
        raise InvalidArgument(f"schedules: max_delays must be >= 0, got {max_delays}")
    return st.binary(max_size=_DELAY * max_delays)


def workloads(
    *,
    hazards: Collection[str] = HAZARDS,
    max_requests: int = 8,
    max_iterations: int = MAX_ITERATIONS,
    plan_stream: bool | None = None,
    fixed_iterations: bool = False,
) -> st.SearchStrategy[Workload]:
    """Workloads with 1 to `max_requests` requests over 1 to `max_iterations` iterations.

    `plan_stream` forces the plan stream on or off; None lets the `plan-stream` hazard decide.
    `fixed_iterations` runs exactly `max_iterations` iterations (requests still arrive at random ones).
    """
    allowed = check_hazards(hazards)
    if max_iterations < 1:
        raise InvalidArgument("workloads: max_iterations must be >= 1")
    return workload_bytes(max_requests).map(
        lambda data: decode_workload(
            data,
            hazards=allowed,
            max_iterations=max_iterations,
            plan_stream=plan_stream,
            fixed_iterations=fixed_iterations,
        )
    )


def decode_schedule(data: bytes, program: Program, *, min_delay_us: float = 0.0) -> Schedule:
    """The delays a byte string stands for on `program`: each 4 bytes are (kind, launch, launch, length).

    Delays attach to launches only -- a read spin on a reading launch, a spin on the stream before a
    launch, a host delay before issuing a launch -- chosen by position among the launches. Designs add
    sync ops but not launches, so the same bytes put the same delays on the same kernels under every
    design of one workload: that is what lets designs be compared on the same schedule.

    `min_delay_us` is added to every delay: with it far above kernel and launch costs the schedule is
    delay-dominated, the regime in which the simulator's verdict must be the GPU's.
    """
    launches = program.launches
    readers = [op.index for op in launches if op.reads]
    device_delays: dict[int, float] = {}
    read_spins: dict[int, float] = {}
    host_delays: dict[int, float] = {}
    for at in range(0, len(data) - _DELAY + 1, _DELAY):
        kind, lo, hi, length = data[at : at + _DELAY]
        where, us = lo | hi << 8, min_delay_us + length * DELAY_STEP_US
        if kind % 3 == 0 and readers:
            read_spins[readers[where % len(readers)]] = us
        elif kind % 3 == 1 and launches:
            device_delays[launches[where % len(launches)].index] = us
        elif launches:
            host_delays[launches[where % len(launches)].index] = us
    return Schedule(device_delays, read_spins, host_delays)


def schedules(program: Program, *, max_delays: int = 4, min_delay_us: float = 0.0) -> st.SearchStrategy[Schedule]:
    """Up to `max_delays` injected delays on `program`: read spins, spins before launches, host delays."""
    return schedule_bytes(max_delays).map(lambda data: decode_schedule(data, program, min_delay_us=min_delay_us))
