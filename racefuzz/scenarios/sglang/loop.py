"""sglang's overlap event loop over `req_to_token`, as a host program on the device API.

One iteration k of `Scheduler.event_loop_overlap` (see docs/model/sglang-overlap-model.md, section 2):

1. loop top: the design's `loop_top` hook (the global WAR barrier lives here until #31687);
2. `get_next_batch_to_run` on the schedule stream S:
   a. `stash_chunked_request`: a chunked request's previous chunk is re-cached (radix
      `cache_unfinished_req`), a write to cells the previous forward reads;
   b. prefill (`alloc_for_extend`): new requests take rows from the free list -- recycled rows included --
      and write `R[row, done:done+chunk]`; a prefill batch takes priority over decode;
   c. otherwise decode: DFLASH `prepare_for_decode` over-allocates `R[row, cur_alloc:reserved]` with
      `reserved = max(cur_alloc, committed_host + 2B)`, on S or on the plan stream P; with
      `page_size > 1` it first loads `R[row, cur_alloc - 1]` there (`get_last_loc`);
3. `run_batch`: a decode batch's S waits on `publish_ready` (FutureMap.resolve_seq_lens_cpu waits only
   when `spec_info.future_indices` is set; a prefill batch returns early), F waits on S (the RAW edge),
   then forward k reads on F: decode reads the draft block `R[row, P:P+B]`, the draft metadata and the
   verify page table `R[row, 0:P+B]`; prefill reads `R[row, 0:done+chunk]` (wider under the workload's
   read extent). Then compute, `publish_ready` (one reused event, FutureMap.publish), and the copy
   stream's D2H of the results behind `copy_done`;
4. `pop_and_process` of forward k-1's result: the host blocks on `copy_done(k-1)` (this bounds the
   in-flight window to one forward), then reads the copied-back tokens / accept lengths on the host
   (the `host` pseudo-stream), learns accept lengths (committed lengths lag the GPU by one forward),
   frees finished requests' rows -- while forward k, which still contains them, may read them -- and,
   for a prefill result, re-caches each unfinished request (`maybe_cache_unfinished_req`,
   batch_result_processor.py:242 at `6582fc1e5`: radix `cache_unfinished_req` rewrites
   `R[row, cache_protected_len:len]`, radix_cache.py:533) while forward k, the request's first decode,
   reads that row (post-launch rewrites, unfenced until #31687). Decode results write nothing to R.

The design's hooks are called at the points where sglang's sync code sits. Slot ids come from a counter
and are never reused, so a clobbered read always shows a different value; rewrites always write new
slot ids (the worst case of radix de-duplication).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from racefuzz.device import Device, EventHandle, StreamHandle
from racefuzz.execution import HOST
from racefuzz.program import Buffer, CellRange, Program
from racefuzz.scenarios.sglang.workload import RequestSpec, Workload

HOST_STREAM = HOST
"""The host as a participant: its reads of copied-back results are launches on this pseudo-stream. Nothing
waits on it and it waits on nothing, so only the host's own syncs order it (a host sync joins every
stream's clock): the same happens-before as a thread reading pinned memory."""
SCHEDULE_STREAM = "schedule_stream"
FORWARD_STREAM = "forward_stream"
PLAN_STREAM = "plan_stream"
D2H_STREAM = "fwd_prepare_d2h_stream"
COPY_STREAM = "copy_stream"
TABLE = "req_to_token"
SWA_TABLE = "full_to_swa_index_mapping"
MIX_INDICES = "mix_running_indices"
SWA_SLOT_BASE = 1 << 20
"""SWA slot ids are the full slot's id plus this: unique, and never equal to a full slot id."""


@dataclass
class LoopContext:
    """What a sync design sees at each hook.

    Args:
        device: the device API (`device.event(...)`, `device.synchronize()`).
        schedule_stream, forward_stream, copy_stream: sglang's streams.
        plan_stream: DFLASH's overlap plan stream, or None when the workload runs without one.
        iteration: the overlap iteration k.
        is_decode: whether this iteration's batch is a decode batch (False: prefill, or no batch).
        state: the design's own memory across iterations (for example the events it recorded).
    """

    device: Device
    schedule_stream: StreamHandle
    forward_stream: StreamHandle
    copy_stream: StreamHandle
    plan_stream: StreamHandle | None
    iteration: int = 0
    is_decode: bool = False
    state: dict[str, object] = field(default_factory=dict)


@dataclass
class _Request:
    rid: int
    spec: RequestSpec
    row: int
    done: int = 0  # prompt tokens prefilled so far (on the GPU and the host alike)
    chunk_start: int = 0  # first column of the latest chunk
    gpu_prefix: int = 0  # P: the committed length the next forward uses
    committed_host: int = 0  # what the host knows of it: lags the GPU by one forward
    cur_alloc: int = 0  # allocation watermark
    steps: int = 0  # decode forwards launched
    final_forward: int | None = None  # the iteration of its last decode forward
    released: bool = False
    filtered: bool = False  # left out of decode batches before its release (Workload.skip_finishing_decode)

    @property
    def prefilled(self) -> bool:
        return self.done == self.spec.prompt_len


@dataclass
class _Batch:
    iteration: int
    is_decode: bool
    requests: list[_Request]
    accepts: dict[int, int]  # rid -> accept length of this forward (decode, not over-scheduled)
    steps: dict[int, int]  # rid -> which decode step this forward was
    copy_done: EventHandle
    recache: dict[int, tuple[int, int]]  # rid -> (cache_protected_len, len): prefill results to re-cache


class Hooks:
    """Calls a design's optional hooks; the structural ones fall back to what sglang does."""

    NAMES = (
        "loop_top",
        "prepare_decode",
        "plan_enter",
        "plan_fence",
        "plan_exit",
        "before_verify",
        "after_reads",
        "forward_end",
        "after_launch",
        "wait_result",
    )

    def __init__(self, design: object) -> None:
        self.design = design
        # Looked up once per program (a build calls a dozen hooks an iteration).
        self._hooks = {name: getattr(design, name, None) for name in self.NAMES}

    def _get(self, name: str):
        return self._hooks[name]

    def call(self, name: str, ctx: LoopContext) -> None:
        hook = self._hooks[name]
        if hook is not None:
            hook(ctx)

    def plan_enter(self, ctx: LoopContext) -> None:
        # dflash_info_v2.py:193 plan_stream.wait_stream(caller_stream): see the filter/merge writes.
        hook = self._get("plan_enter")
        if hook is not None:
            hook(ctx)
        else:
            assert ctx.plan_stream is not None
            ctx.plan_stream.wait_stream(ctx.schedule_stream)

    def plan_exit(self, ctx: LoopContext) -> None:
        # dflash_info_v2.py:238 caller_stream.wait_stream(plan_stream), outside the plan-stream context.
        hook = self._get("plan_exit")
        if hook is not None:
            hook(ctx)
        else:
            assert ctx.plan_stream is not None
            ctx.schedule_stream.wait_stream(ctx.plan_stream)

    def wait_result(self, ctx: LoopContext, copy_done: EventHandle) -> None:
        # batch_result_processor.py: result.copy_done.synchronize() before processing forward k-1.
        hook = self._get("wait_result")
        if hook is not None:
            hook(ctx, copy_done)
        else:
            copy_done.synchronize()

    @property
    def recycle_chunked_rows(self) -> bool:
        """The pre-#17850 allocator: a chunked request's row is freed and allocated again between chunks."""
        return bool(getattr(self.design, "recycle_chunked_rows", False))

    @property
    def record_stream_mix_indices(self) -> bool:
        """#34076's fix: `mix_running_indices.record_stream(forward_stream)` before its owner is dropped."""
        return bool(getattr(self.design, "record_stream_mix_indices", False))

    @property
    def headroom_blocks(self) -> int:
        """Over-allocation headroom in blocks: `reserved = committed_host + headroom_blocks * B`."""
        return int(getattr(self.design, "headroom_blocks", 2))


class OverlapLoop:
    """Builds the program of `workload.iterations` overlap iterations under one design."""

    def __init__(self, workload: Workload, design: object) -> None:
        self.workload = workload
        self.hooks = Hooks(design)
        self.device = Device()
        d = self.device
        self.ctx = LoopContext(
            device=d,
            schedule_stream=d.stream(SCHEDULE_STREAM),
            forward_stream=d.stream(FORWARD_STREAM),
            copy_stream=d.stream(COPY_STREAM),
            plan_stream=d.stream(PLAN_STREAM) if workload.plan_stream else None,
        )
        # Row 0 is sglang's padding row; rows 1..rows are handed out FIFO, as ReqToTokenPool does.
        self.table: Buffer = d.buffer(TABLE, workload.rows + 1, workload.max_context, fill=0)
        self.hidden = d.buffer("hidden_states", 1, 2)  # forward-private scratch of the compute kernels
        # Pinned D2H targets of the results, one column per forward (each batch result owns its tensors).
        self.output = d.buffer("output_tokens_cpu", 1, workload.iterations)
        self.host = d.stream(HOST_STREAM)
        self.publish_ready = d.event("publish_ready")  # FutureMap.publish_ready: one event, re-recorded
        if workload.cpu_seq_lens:
            self.d2h = d.stream(D2H_STREAM)
            self.seq_lens_cpu = d.buffer("seq_lens_cpu", 1, 1)  # the pinned mirror only the D2H stream writes
        # The SWA table, indexed here by token position (the full slot at R[row, col] maps to swa[row, col]).
        self.swa: Buffer | None = (
            d.buffer(SWA_TABLE, workload.rows + 1, workload.max_context, fill=0) if workload.swa_window else None
        )
        # The caching-allocator block behind `mix_running_indices` (one index per row), with mixed chunks.
        self.mix_block: Buffer | None = (
            d.buffer(MIX_INDICES, 1, workload.rows, fill=0) if workload.mixed_chunk else None
        )
        self.mix_running: list[_Request] = []  # the running requests a mixed prefill batch aliases
        self.free_rows: deque[int] = deque(range(1, workload.rows + 1))
        self.used_rows: set[int] = set()
        self.waiting: deque[int] = deque()
        self.live: list[_Request] = []
        self.next_slot = 1
        self.pending: _Batch | None = None
        # With `Workload.sglang_admission`: the requests released since the last decode batch formed (still
        # in sglang's running batch, counted by get_num_allocatable_reqs) and the batch_is_full latch.
        self.unfiltered: list[_Request] = []
        self.batch_is_full = False

    # -- helpers ---------------------------------------------------------------------------------------

    def _slots(self, n: int) -> np.ndarray:
        first = self.next_slot
        self.next_slot += n
        return np.arange(first, first + n, dtype=np.int32)

    def _with_swa(self, writes: list[tuple[CellRange, np.ndarray]]) -> list[tuple[CellRange, np.ndarray]]:
        """`writes` of req_to_token plus, with the SWA table, the mapping of each new full slot to a fresh SWA
        slot (the SWA allocator's `full_to_swa_index_mapping[full] = swa`, in the same launch and stream)."""
        if self.swa is None:
            return writes
        mapped = [(self.swa[cells.row0, cells.col0 : cells.col1], slots + SWA_SLOT_BASE) for cells, slots in writes]
        return writes + mapped

    def _swa_window(self, r: _Request, length: int) -> list[CellRange]:
        """The mapping entries a translate of `r`'s sliding window `[length - W, length)` loads."""
        if self.swa is None or length == 0:
            return []
        return [self.swa[r.row, max(0, length - self.workload.swa_window) : length]]

    def _info(self, requests: list[_Request], **extra: object) -> dict[str, object]:
        return {"iteration": self.ctx.iteration, "requests": [r.rid for r in requests], **extra}

    def page_table(self, batch: list[_Request], lengths: list[int]) -> tuple[list[CellRange], list[CellRange]]:
        """The cells a page-table build loads under the workload's read extent: each row's used
        `R[row, 0:length]`, and the masked columns the backend loads beyond it (see `Workload.read_extent`)."""
        table, extent = self.table, self.workload.read_extent
        used = [table[r.row, 0:n] for r, n in zip(batch, lengths, strict=True)]
        if extent == "exact":
            return used, []
        width = max(lengths)
        if extent == "reserved":
            width = max(width, *(r.cur_alloc for r in batch))
        width = min(width, table.cols)
        masked = [table[r.row, n:width] for r, n in zip(batch, lengths, strict=True) if n < width]
        return used, masked

    # -- the loop --------------------------------------------------------------------------------------

    def build(self) -> Program:
        for k in range(self.workload.iterations):
            self.iteration(k)
        return self.device.finish()

    def iteration(self, k: int) -> None:
        ctx, hooks, w = self.ctx, self.hooks, self.workload
        ctx.iteration = k
        ctx.is_decode = False
        for rid, spec in enumerate(w.requests):
            if spec.arrival == k:
                self.waiting.append(rid)
        if w.host_work_us:
            self.device.host_delay(w.host_work_us)  # recv_requests / process_input_requests
        hooks.call("loop_top", ctx)

        if w.sglang_admission and w.filter_finished_each_step:
            # get_next_batch_to_run filters the running batch every step (0.5.23 scheduler.py:3963-3967), and an
            # empty running batch clears the latch (:4093-4096).
            if self.unfiltered:
                self.unfiltered.clear()
                self.batch_is_full = False
            if not any(r.prefilled and not r.filtered for r in self.live):
                self.batch_is_full = False
        requests = self.prefill_batch() or self.decode_batch()
        if requests and w.launch_prep_us:
            self.device.host_delay(w.launch_prep_us)  # run_batch: ForwardBatch construction before the launch
        launched = self.run_batch(requests) if requests else None
        if launched is not None:
            hooks.call("after_launch", ctx)
        self.process_result()
        self.pending = launched

    def prefill_batch(self) -> list[_Request] | None:
        """stash_chunked_request, then admit new requests: the prefill path of get_next_batch_to_run."""
        s, table = self.ctx.schedule_stream, self.table
        batch: list[_Request] = []
        chunked = [r for r in self.live if not r.prefilled]
        recycle = bool(chunked) and self.hooks.recycle_chunked_rows
        if recycle:
            # Pre-#17850 (`027f31405`): the chunked request's row is freed and it takes the free list's front,
            # where its whole prefix is written again.
            for r in chunked:
                self.free_rows.append(r.row)
                r.row = self.free_rows.popleft()
        if chunked:
            starts = [0 if recycle else r.chunk_start for r in chunked]
            writes = [(table[r.row, a : r.done], self._slots(r.done - a)) for r, a in zip(chunked, starts, strict=True)]
            s.launch(
                "stash_rewrite", writes=self._with_swa(writes), info=self._info(chunked, site="stash_chunked_request")
            )
            batch.extend(chunked)
        recycled: list[int] = []
        # sglang's bound (Workload.sglang_admission); a chunked request in flight bypasses it, as in sglang.
        allocatable = self.allocatable() if self.workload.sglang_admission and not chunked else None
        admitted: list[_Request] = []
        while self.waiting and self.free_rows:
            if allocatable is not None and len(admitted) >= allocatable:
                self.batch_is_full = True  # get_new_batch_prefill: len(can_run_list) >= allocatable
                break
            spec = self.workload.requests[self.waiting[0]]
            if chunked and spec.prompt_len > spec.chunk:
                break  # one chunked request at a time, as sglang's single chunked_req
            rid = self.waiting.popleft()
            row = self.free_rows.pop() if self.workload.lifo_rows else self.free_rows.popleft()
            if row in self.used_rows:
                recycled.append(row)
            self.used_rows.add(row)
            request = _Request(rid, spec, row)
            self.live.append(request)
            batch.append(request)
            admitted.append(request)
            if spec.prompt_len > spec.chunk:
                chunked = [request]
        if self.workload.lifo_rows:
            # ReqToTokenPool.alloc_rows hands a batch `free_slots[-n:]` in list order: popped tail first, the
            # first request gets the n-th row from the tail.
            for request, row in zip(admitted, reversed([r.row for r in admitted]), strict=True):
                request.row = row
        if not batch:
            return None
        if self.mix_block is not None:
            self.mix_running = [r for r in self.live if r.prefilled and not r.released and r not in batch]
        if self.mix_block is not None and self.mix_running:
            # mix_with_running (schedule_batch.py:2545 at `8905cbd42`): the mixed batch aliases the running
            # batch's req_pool_indices, a tensor made on the schedule stream (values are fresh ids, so that
            # a clobbered gather shows a different value).
            n = len(self.mix_running)
            s.launch(
                "running_indices_write",
                writes=[(self.mix_block[0, 0:n], self._slots(n))],
                info=self._info(self.mix_running, site="mix_with_running"),
            )
        writes = []
        for r in batch:
            n = min(r.spec.chunk, r.spec.prompt_len - r.done)
            r.chunk_start = r.done
            writes.append((table[r.row, r.done : r.done + n], self._slots(n)))
            r.done += n
        rows = [r.row for r in batch]
        s.launch(
            "prefill_write", writes=self._with_swa(writes), info=self._info(batch, rows=rows, recycled_rows=recycled)
        )
        return batch

    def allocatable(self) -> int:
        """sglang's admission bound (`Workload.sglang_admission`): 0 while `batch_is_full` is latched, else
        `get_num_allocatable_reqs(running_bs)` (0.5.15 scheduler.py:2728-2731) with `max_running_requests =
        rows` and `running_bs` counting the finished requests update_running_batch has not filtered yet."""
        if self.batch_is_full:
            return 0  # get_new_batch_prefill returns None while batch_is_full (scheduler.py:2769-2772)
        running_bs = sum(1 for r in self.live if r.prefilled and not r.filtered) + len(self.unfiltered)
        return max(0, min(self.workload.rows - running_bs, len(self.free_rows)))

    def decode_batch(self) -> list[_Request] | None:
        """update_running_batch -> DFLASH prepare_for_decode: over-allocation, on S or the plan stream."""
        if self.unfiltered:
            # update_running_batch's filter_batch drops the finished requests; a batch that shrank or emptied
            # resets batch_is_full (0.5.15 scheduler.py:3045-3047, :3121-3122).
            self.unfiltered.clear()
            self.batch_is_full = False
        batch = [r for r in self.live if r.prefilled and not r.released and not r.filtered]
        pending = self.pending
        if self.workload.skip_finishing_decode and pending is not None:
            # _reqs_finishing_inflight: the in-flight result commits their last output; filtered now, the
            # batch shrank, so batch_is_full resets (update_running_batch).
            finishing = [r for r in batch if r.final_forward == pending.iteration]
            for r in finishing:
                r.filtered = True
            if finishing:
                self.batch_is_full = False
                batch = [r for r in batch if not r.filtered]
        if not batch:
            return None
        ctx, hooks, w = self.ctx, self.hooks, self.workload
        ctx.is_decode = True
        if w.filter_batch_sync:
            self.ctx.schedule_stream.synchronize()  # filter_batch's new_indices.cpu() (Workload.filter_batch_sync)
        hooks.call("prepare_decode", ctx)
        stream = ctx.plan_stream or ctx.schedule_stream
        if ctx.plan_stream is not None:
            hooks.plan_enter(ctx)
            hooks.call("plan_fence", ctx)
        growth = []
        for r in batch:
            reserved = max(r.cur_alloc, r.committed_host + hooks.headroom_blocks * w.block_size)
            reserved = min(reserved, self.table.cols)  # the workload's max_context
            if reserved > r.cur_alloc:
                growth.append((r, reserved))
        if w.page_size > 1 and growth:
            # dflash_info_v2.py:203-222: with page_size > 1, `get_last_loc(req_to_token, req_pool_indices,
            # cur_kv_lens)` loads each request's last allocated slot, R[row, cur_alloc - 1], on this stream
            # (the paged allocator extends that slot's page): a read of cells the schedule stream wrote.
            last = [self.table[r.row, r.cur_alloc - 1 : r.cur_alloc] for r, _ in growth if r.cur_alloc > 0]
            if last:
                stream.launch("get_last_loc", reads=last, info=self._info([r for r, _ in growth], site=stream.name))
        recovered = [r for r in batch if r.spec.swa_recovery and r.steps == 1 and self.swa is not None]
        if recovered:
            # Locked-full SWA recovery (#29352): the SWA allocator takes back a running request's window
            # slots, clearing their full_to_swa entries, while the in-flight forward may still translate them.
            clears = [
                (self.swa[r.row, max(0, r.committed_host - w.swa_window) : r.committed_host], 0) for r in recovered
            ]
            stream.launch("swa_recovery_clear", writes=clears, info=self._info(recovered, site=stream.name))
        writes = []
        grown = []
        for r, reserved in growth:
            writes.append((self.table[r.row, r.cur_alloc : reserved], self._slots(reserved - r.cur_alloc)))
            grown.append(r)
            r.cur_alloc = reserved
        if writes:
            stream.launch("overalloc_write", writes=self._with_swa(writes), info=self._info(grown, site=stream.name))
        if ctx.plan_stream is not None:
            hooks.plan_exit(ctx)
        return batch

    def run_batch(self, batch: list[_Request]) -> _Batch:
        ctx, hooks, w, table = self.ctx, self.hooks, self.workload, self.table
        s, f, c = ctx.schedule_stream, ctx.forward_stream, ctx.copy_stream
        if ctx.is_decode and self.pending is not None:
            # FutureMap.resolve_seq_lens_cpu (overlap_utils.py): publish_ready.wait() on the schedule
            # stream, only for a batch whose inputs come from the FutureMap (decode).
            s.wait_event(self.publish_ready)
            if w.cpu_seq_lens:
                # ... then, when the backends need CPU seq lens, the D2H on its private stream and a host
                # synchronize() of that stream (see `Workload.cpu_seq_lens`).
                self.d2h.wait_event(self.publish_ready)
                self.d2h.launch(
                    "seq_lens_d2h", writes=[(self.seq_lens_cpu[0, 0:1], ctx.iteration)], info=self._info(batch)
                )
                self.d2h.synchronize()
        f.wait_stream(s)  # run_batch: forward_stream.wait_stream(schedule_stream), the RAW edge
        info = self._info(batch)
        mixed = self.mix_block is not None and not ctx.is_decode and bool(self.mix_running)
        if mixed:
            assert self.mix_block is not None
            mix_cells = self.mix_block[0, 0 : len(self.mix_running)]
            # resolve_forward_inputs (overlap_utils.py:84-104 at `8905cbd42`), first on the forward stream:
            # `output_tokens_buf[batch.mix_running_indices]`, then `batch.mix_running_indices = None`.
            f.launch("mix_indices_gather", reads=[mix_cells], info=self._info(self.mix_running, site=f.name))
            # Recorded only for a design that calls record_stream (the allocator's event, see reuse_mix_block).
            gathered = f.record_event("mix_gather_done") if hooks.record_stream_mix_indices else None
        B = w.block_size
        accepts: dict[int, int] = {}
        steps: dict[int, int] = {}
        if ctx.is_decode:
            for r in batch:
                if r.gpu_prefix + B > r.cur_alloc:
                    # RAW on cells nobody wrote for this request: stale slots of the row's previous owner
                    # or the fill value. Neither other oracle sees it (no write races the read).
                    self.device.violation(
                        f"iteration {ctx.iteration}: forward reads {table[r.row, r.cur_alloc : r.gpu_prefix + B]} of "
                        f"request {r.rid}, beyond its allocation (cur_alloc {r.cur_alloc})"
                    )
            f.launch("block_gather", reads=[table[r.row, r.gpu_prefix : r.gpu_prefix + B] for r in batch], info=info)
            page_table, masked = self.page_table(batch, [r.gpu_prefix + B for r in batch])
            f.launch("draft_metadata", reads=page_table, unused_reads=masked, info=info)
            f.launch("draft_forward", writes=[(self.hidden[0, 0:1], 1)], cost_us=w.forward_cost_us / 2, info=info)
            hooks.call("before_verify", ctx)
            translate = [cells for r in batch for cells in self._swa_window(r, r.gpu_prefix + B)]
            f.launch("verify_page_table", reads=page_table + translate, unused_reads=masked, info=info)
        else:
            page_table, masked = self.page_table(batch, [r.done for r in batch])
            translate = [cells for r in batch for cells in self._swa_window(r, r.done)]
            f.launch("extend_page_table", reads=page_table + translate, unused_reads=masked, info=info)
        hooks.call("after_reads", ctx)
        cost = w.forward_cost_us / 2 if ctx.is_decode else w.forward_cost_us
        replay_reads = ctx.is_decode and w.replay_reads  # in-graph metadata re-reads R (Workload.replay_reads)
        f.launch(
            "verify_forward" if ctx.is_decode else "extend_forward",
            reads=page_table + translate if replay_reads else (),  # and trtllm_mha's per-layer SWA translate
            unused_reads=masked if replay_reads else (),
            writes=[(self.hidden[0, 1:2], 1)],
            cost_us=cost,
            info=info,
        )
        self.publish_ready.record(f)
        hooks.call("forward_end", ctx)
        c.wait_stream(f)
        k = ctx.iteration
        c.launch("copy_to_cpu", writes=[(self.output[0, k : k + 1], k + 1)], info=info)
        copy_done = c.record_event("copy_done")
        if mixed:
            self.reuse_mix_block(mix_cells, gathered)
        recache: dict[int, tuple[int, int]] = {}
        # What the GPU now knows: prefixes advance by the accepted tokens.
        for r in batch:
            if not ctx.is_decode:
                if r.prefilled:
                    r.gpu_prefix = r.committed_host = r.cur_alloc = r.spec.prompt_len
                    if not r.spec.accepts:  # max_new_tokens=1: the prefill forward was its last
                        r.final_forward = ctx.iteration
                    elif w.post_launch_rewrites and r.spec.rewrite_at:
                        # Earlier chunks were re-cached by stash_chunked_request: protected up to this chunk.
                        recache[r.rid] = (r.chunk_start, r.spec.prompt_len)
                continue
            steps[r.rid] = r.steps
            if r.steps < len(r.spec.accepts):  # else over-scheduled: finished, not yet known to the host
                accepts[r.rid] = r.spec.accepts[r.steps]
                r.gpu_prefix += accepts[r.rid]
                if r.steps == len(r.spec.accepts) - 1:
                    r.final_forward = ctx.iteration
            r.steps += 1
        return _Batch(ctx.iteration, ctx.is_decode, batch, accepts, steps, copy_done, recache)

    def reuse_mix_block(self, cells: CellRange, gathered: EventHandle | None) -> None:
        """The host has dropped the last owner of `mix_running_indices` (the staging reference is cleared
        in resolve_forward_inputs, the running batch aged out of `last_batch` and the record ring: #34076),
        and the caching allocator hands its block to the next allocation on the schedule stream, whose
        write is modelled here, before the design's WAR barrier. That placement is the allocator settings #34076
        measured corrupting (expandable segments, cudaMallocAsync: 19/20 runs): the free is ordered on
        the allocating stream at the point the host dropped it, which precedes the barrier -- "wait_stream
        orders execution but does not protect deallocation" (the PR). The default allocator's host-time
        reuse, which the barrier would order (0/40 in the PR), is the benign case and not modelled.
        """
        s = self.ctx.schedule_stream
        if gathered is not None:
            # record_stream(forward_stream): at the free the allocator records an event on the forward
            # stream and reuses the block only once it has completed. That event follows every forward-
            # stream launch issued before the free, the gather included, so an edge from the gather to the
            # reuse is what the allocator guarantees (the real one orders at least as much). The wait is on
            # the schedule stream because the reuse is; it adds order only behind forward-stream work up to
            # the gather, which every later schedule-stream write already follows under the designs that
            # carry it (their barrier waits on the whole forward or its read_done).
            s.wait_event(gathered)
        n = cells.col1 - cells.col0
        s.launch(
            "mix_block_reuse",
            writes=[(cells, self._slots(n))],
            info=self._info(self.mix_running, site="caching allocator reuse"),
        )

    def process_result(self) -> None:
        """pop_and_process of the previous batch, after this iteration's launch."""
        batch = self.pending
        if batch is None:
            return
        self.hooks.wait_result(self.ctx, batch.copy_done)
        k = batch.iteration
        # The host reads the copied-back next tokens / accept lengths (process_batch_result_*).
        self.host.launch(
            "result_read",
            reads=[self.output[0, k : k + 1]],
            info=self._info(batch.requests, site="process_batch_result", result_of=k),
        )
        rewrites: list[_Request] = []
        for r in batch.requests:
            r.committed_host += batch.accepts.get(r.rid, 0)
            if r.final_forward == batch.iteration and not r.released:
                r.released = True  # release_kv_cache: the row is free while forward k may still read it
                self.free_rows.append(r.row)
                self.live.remove(r)
                if self.workload.sglang_admission and not r.filtered:
                    self.unfiltered.append(r)
            elif r.rid in batch.recache and not r.released:
                rewrites.append(r)
        if rewrites:
            writes = []
            for r in rewrites:
                protected, length = batch.recache[r.rid]
                writes.append((self.table[r.row, protected:length], self._slots(length - protected)))
            self.ctx.schedule_stream.launch(
                "post_launch_rewrite",
                writes=self._with_swa(writes),
                info=self._info(rewrites, site="maybe_cache_unfinished_req"),
            )


def build_program(workload: Workload, design: object) -> Program:
    """The host program of `workload` under `design` (any object with some of `Hooks.NAMES`)."""
    return OverlapLoop(workload, design).build()
