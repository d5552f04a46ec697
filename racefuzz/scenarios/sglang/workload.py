"""The workload of the sglang overlap scenario: which requests arrive, how they prefill and decode.

A workload is plain data (JSON round-trips exactly), so that a counterexample can be written to a replay
file and re-run. Hypothesis draws workloads in `racefuzz.scenarios.sglang.strategies`; shrinking moves
every field toward its simplest value (fewer requests, one chunk, accept length 1, no rewrites, no plan stream).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from racefuzz.errors import InvalidArgument

READ_EXTENTS = ("exact", "rectangle", "reserved")
"""The forward's read extents (`Workload.read_extent`), simplest first. Citations (sglang at `6582fc1e5`):
rectangle: flashattention_backend.py `FlashAttentionBackend.init_forward_metadata` (:644, :666) and the
graph-replay metadata (:2463-2480) gather `req_to_token[req_pool_indices, :max_seq_len_k]`; reserved:
overlap_utils.py `FutureMap.resolve_seq_lens_cpu` (at `0178132`: without CPU seq lens it sets
`seq_len_cpu_ub = max(r.kv_allocated_len)`, the bound bound-safe backends size `max_seq_len_k` with) and
dflash_worker_v2.py (:1394-1710), which plans with the reserved (allocated) lengths."""


LIMITS: dict[str, tuple[int, int]] = {
    "iterations": (1, 1024),
    "block_size": (1, 64),
    "rows": (1, 256),
    "page_size": (1, 64),
    "requests": (0, 256),
    "arrival": (0, 1024),
    "prompt_len": (1, 4096),
    "chunk": (1, 4096),
    "accepts": (0, 256),
    "rewrite_at": (0, 256),
}
"""The range of every integer field of a workload (for `requests`, `accepts` and `rewrite_at`: their length),
far above what a search draws (8 iterations, 12-token prompts) and low enough that a replay file cannot ask
for a program that hangs or fills memory (`iterations: 10**9`, `prompt_len: 10**9`). Costs are finite
microseconds up to MAX_COST_US."""

MAX_COST_US = 1e7
"""The largest forward, host-work or launch-prep cost a workload may ask for (10 s)."""


def _check_int(what: str, name: str, value: object, length: bool = False) -> None:
    low, high = LIMITS[name]
    n = len(value) if length else value  # type: ignore[arg-type]
    if not length and (type(value) is not int):
        raise InvalidArgument(f"workload: {what} must be an integer in [{low}, {high}], got {value!r}")
    if not low <= n <= high:  # type: ignore[operator]
        size = "length of " if length else ""
        raise InvalidArgument(f"workload: {size}{what} must be in [{low}, {high}], got {n}")


@dataclass(frozen=True)
class RequestSpec:
    """One request.

    Args:
        arrival: the iteration at which it enters the waiting queue.
        prompt_len: tokens to prefill (>= 1).
        chunk: chunked-prefill chunk size; a prompt longer than it prefills over several iterations.
        accepts: the DFLASH accept length of each of its decode forwards, each in [1, block_size]; it
            finishes after the last one (and is still in the next, over-scheduled forward). Empty: it
            finishes at its prefill (max_new_tokens=1), still over-scheduled in the next decode forward.
        swa_recovery: with the SWA table (`Workload.swa_window`), the locked-full SWA recovery takes back
            this request's window slots once, in the decode prep of its second decode step, clearing their
            `full_to_swa_index_mapping` entries (#29352/#29353: "cache-ownership lifetime race").
        rewrite_at: non-empty (conventionally `(0,)`, result 0 being its prefill result): processing its
            prefill result re-caches it (`maybe_cache_unfinished_req`, batch_result_processor.py:242 at
            `6582fc1e5`), rewriting `R[row, cache_protected_len:prompt_len]` with new slot ids (radix
            de-duplication's worst case) while its first decode forward reads the row. sglang re-caches
            every unfinished request after its prefill; leaving it out lets a workload shrink without it.
            Decode results write nothing to req_to_token, so no other entry has an effect.
    """

    arrival: int = 0
    prompt_len: int = 4
    chunk: int = 64
    accepts: tuple[int, ...] = (1,)
    rewrite_at: tuple[int, ...] = ()
    swa_recovery: bool = False


WRITTEN_WHEN_ON = ("sglang_admission", "lifo_rows", "skip_finishing_decode", "filter_finished_each_step")
"""The fields `Workload.to_json` writes only when they are on: the replay files written before they existed
(which state every field then known) read back as themselves."""


@dataclass(frozen=True)
class Workload:
    """The overlap loop's input.

    Args:
        requests: the requests, in arrival order.
        iterations: overlap iterations to run.
        block_size: DFLASH block size B (speculative_num_draft_tokens).
        rows: req_to_token rows available to requests (row 0 is the padding row and is never handed out).
        plan_stream: run DFLASH's decode prep (over-allocation) on the plan stream.
        post_launch_rewrites: honour the requests' `rewrite_at` (prefill-result re-caching).
        forward_cost_us: duration of each forward's compute (draft and verify each take half).
        page_size: KV page size. Above 1, DFLASH decode prep reads `R[row, cur_alloc - 1]` (`get_last_loc`)
            on its stream before over-allocating (dflash_info_v2.py:203-222); 1 (the default) reads nothing.
            Only that read is modelled: slot ids still come from the counter, page alignment is not.
        read_extent: which cells the forward's page-table builds load (`READ_EXTENTS`), per attention
            backend: "exact" (flashinfer-style kv_indices: each row's own `R[row, 0:len]`), "rectangle"
            (FA3: `req_to_token[req_pool_indices, :max_seq_len_k]`, the batch rectangle; a short row's
            columns beyond its length are loaded and masked) or "reserved" (backends that plan without CPU
            seq lens: the rectangle up to the batch's largest *allocated* length, `R[rows, 0:max(cur_alloc)]`,
            masked beyond each row's length).
        cpu_seq_lens: the backends need CPU seq lens (`needs_cpu_seq_lens`, the base default, FA3
            inherits it): before a decode launch `FutureMap.resolve_seq_lens_cpu` gates the private D2H
            stream `fwd_prepare_d2h_stream` on `publish_ready`, copies the new seq lens to pinned memory
            and the host `synchronize()`s that stream (overlap_utils.py:294-299 at `6582fc1e5`): a host
            wait for the previous forward that #29556 moved off the schedule stream rather than removed.
        replay_reads: the verify is a CUDA-graph replay that re-reads req_to_token inside the graph
            (trtllm_mha's in-graph metadata kernel, #31686; a breakable-graph verify, #30261): the replay
            kernel loads the page table again, after `after_reads` (where `read_done` is recorded before
            the replay) -- decode_cuda_graph_runner.py:1225-1261 at `8905cbd42` records
            `read_done_post_replay` for these.
        swa_window: above 0, the model has a second shared table, `full_to_swa_index_mapping` (SWA models),
            with this sliding window: the allocations and rewrites of req_to_token also map each new slot
            on the same stream, the locked-full recovery clears entries (`RequestSpec.swa_recovery`), and
            the forward translates each row's window `[len - W, len)` in `load_batch` (its page-table
            build; trtllm_mha per layer inside the graph replay too, with `replay_reads`). sglang:
            docs/model/sglang-overlap-model.md section 2.4 point 3 and #26380, #29352/#29353, #31687.
        filter_batch_sync: DFLASH `filter_batch` at #29556 calls `new_indices.cpu()`
            (dflash_info_v2.py:245 at `6582fc1e5`, removed by #31468 `72c4ed1a3`): a host sync on the
            schedule stream in decode prep, which stalls the host for the whole previous forward once the
            schedule stream waits on the forward stream. Costs, not verdicts, are what it changes.
        mixed_chunk: mixed chunked prefill (the tensor-lifetime hazard, #34076): a prefill batch formed
            while requests are decoding is mixed with the running batch (`mix_with_running`,
            schedule_batch.py:2545 at `8905cbd42`), whose `req_pool_indices` tensor it aliases as
            `mix_running_indices`; the forward gathers through it (`resolve_forward_inputs`), its owner is
            dropped and the caching allocator hands its block to the next schedule-stream allocation (see
            `OverlapLoop.run_batch`). Only that index tensor is modelled: the running requests' own reads
            in the mixed forward are not added.
        sglang_admission: admit new requests as sglang's `get_new_batch_prefill` does (0.5.15 scheduler.py
            :2733-2870, the same from 0.5.14 to 0.5.23): at most `get_num_allocatable_reqs(running_bs) =
            min(max_running_requests - running_bs, free rows)` with `max_running_requests = rows`, where
            `running_bs` still counts the requests the host learned finished until `update_running_batch`
            filters them when it forms the next decode batch (after the prefill attempt); a waiting request
            that does not fit latches `batch_is_full`, and no prefill is tried again until a decode batch
            shrinks or empties (`update_running_batch`, :3041-3122). Off (the default): any free row is
            taken at once, the recycled-row-prefill hazard's admission. The differential test against
            sglang's own loop maps its workloads with it on (docs/model-fidelity.md).
        lifo_rows: hand out `req_to_token` rows from the free list's tail, as `ReqToTokenPool.alloc` does
            from sglang 0.5.18 (`free_slots[-n:]`, 0.5.18 memory_pool.py:309-313; 0.5.23 `alloc_rows`,
            :437-451; frees append to the tail), so a freed row is the next one taken. Off (the default):
            from its head, first freed first reused, as through 0.5.17 (`free_slots[:n]`, 0.5.17
            memory_pool.py:309).
        skip_finishing_decode: leave out of a decode batch every request whose in-flight result commits its
            last output token by length, as sglang's overlap loop does from 0.5.22 (`event_loop_overlap` sets
            `enable_skip_finishing_decode`, 0.5.23 scheduler.py:2063; `update_running_batch` filters
            `_reqs_finishing_inflight`, :4444-4465): no forward is over-scheduled with a finished request.
            Exact for accept length 1 (the host's `len(output_ids) + 1 >= max_new_tokens`). Off (the
            default): the finished request is still in the next forward, as through 0.5.21.
        filter_finished_each_step: with `sglang_admission`, drop the finished requests from the running
            batch at every step, before the prefill is tried (resetting `batch_is_full` when it shrinks),
            and clear the latch while the running batch is empty, as sglang 0.5.23's
            `get_next_batch_to_run` (scheduler.py:3963-3967) and `_get_new_batch_prefill_raw` (:4093-4096)
            do. Off (the default): only `update_running_batch` filters them, as through 0.5.22.
    """

    requests: tuple[RequestSpec, ...] = field(default_factory=lambda: (RequestSpec(),))
    iterations: int = 8
    block_size: int = 4
    rows: int = 4
    plan_stream: bool = False
    post_launch_rewrites: bool = True
    forward_cost_us: float = 40.0
    host_work_us: float = 0.0
    launch_prep_us: float = 0.0
    page_size: int = 1
    read_extent: str = "exact"
    cpu_seq_lens: bool = False
    replay_reads: bool = False
    swa_window: int = 0
    filter_batch_sync: bool = False
    mixed_chunk: bool = False
    sglang_admission: bool = False
    lifo_rows: bool = False
    skip_finishing_decode: bool = False
    filter_finished_each_step: bool = False

    def __post_init__(self) -> None:
        for name in ("iterations", "block_size", "rows", "page_size"):
            _check_int(name, name, getattr(self, name))
        _check_int("requests", "requests", self.requests, length=True)
        for name in ("forward_cost_us", "host_work_us", "launch_prep_us"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_COST_US:
                raise InvalidArgument(f"workload: {name} must be microseconds in [0, {MAX_COST_US:g}], got {value!r}")
        for i, r in enumerate(self.requests):
            for name in ("arrival", "prompt_len", "chunk"):
                _check_int(f"request {i} {name}", name, getattr(r, name))
            for name in ("accepts", "rewrite_at"):
                _check_int(f"request {i} {name}", name, getattr(r, name), length=True)
                for item in getattr(r, name):
                    if type(item) is not int:
                        raise InvalidArgument(f"workload: request {i} {name} must hold integers, got {item!r}")
        if self.read_extent not in READ_EXTENTS:
            raise InvalidArgument(f"workload: read_extent must be one of {READ_EXTENTS}, got {self.read_extent!r}")
        if type(self.swa_window) is not int or not 0 <= self.swa_window <= 256:
            raise InvalidArgument(f"workload: swa_window must be an int in [0, 256], got {self.swa_window!r}")
        if self.iterations < 1:
            raise InvalidArgument(f"workload: iterations must be >= 1, got {self.iterations}")
        if self.block_size < 1:
            raise InvalidArgument(f"workload: block_size must be >= 1, got {self.block_size}")
        if self.rows < 1:
            raise InvalidArgument(f"workload: rows must be >= 1, got {self.rows}")
        if isinstance(self.page_size, bool) or not isinstance(self.page_size, int) or self.page_size < 1:
            raise InvalidArgument(f"workload: page_size must be an int >= 1, got {self.page_size!r}")
        if not self.forward_cost_us >= 0:
            raise InvalidArgument(f"workload: forward_cost_us must be >= 0, got {self.forward_cost_us}")
        if not self.host_work_us >= 0:
            raise InvalidArgument(f"workload: host_work_us must be >= 0, got {self.host_work_us}")
        if not self.launch_prep_us >= 0:
            raise InvalidArgument(f"workload: launch_prep_us must be >= 0, got {self.launch_prep_us}")
        for i, r in enumerate(self.requests):
            if r.arrival < 0 or r.prompt_len < 1 or r.chunk < 1:
                raise InvalidArgument(f"workload: request {i} needs arrival >= 0, prompt_len >= 1, chunk >= 1")
            if any(not 1 <= a <= self.block_size for a in r.accepts):
                raise InvalidArgument(
                    f"workload: request {i} accept lengths must be in [1, {self.block_size}], got {r.accepts}"
                )

    @property
    def max_context(self) -> int:
        """Columns of req_to_token: enough for every request's prompt, accepted tokens and reservation."""
        longest = max((r.prompt_len + sum(r.accepts) for r in self.requests), default=1)
        return longest + 3 * self.block_size

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        for name in WRITTEN_WHEN_ON:
            if not data[name]:
                del data[name]
        return data

    @classmethod
    def from_json(cls, data: object) -> Workload:
        if not isinstance(data, dict):
            raise InvalidArgument("a workload is a JSON object")
        try:
            requests = tuple(
                RequestSpec(**{**r, "accepts": tuple(r["accepts"]), "rewrite_at": tuple(r.get("rewrite_at", ()))})
                for r in data.get("requests", ())
            )
            return cls(**{**data, "requests": requests})
        except (TypeError, KeyError) as exc:
            raise InvalidArgument(f"workload: malformed ({exc})") from None
