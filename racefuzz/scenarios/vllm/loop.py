"""vLLM V1's engine loop over the KV block pool, as a host program on the device API (vLLM 0.33.0).

One engine step k (docs/vllm-kv-model.md gives every citation; paths are under `vllm/` of the 0.33.0 wheel):

1. `Scheduler.schedule` (v1/core/sched/scheduler.py): running requests get one decode token each, and a
   new block from the pool when the token crosses into one (`KVCacheManager.allocate_slots` ->
   `BlockPool.get_new_blocks`, `free_block_queue.popleft_n`); a request that stops at `max_tokens` is not
   scheduled past it (the `num_output_placeholders` check); waiting requests are admitted in arrival order
   while their prompt's blocks are free: a local one is prefilled in this step, a remote one (a P/D consumer)
   waits for the KV connector to load its prompt KV into them (`reqs_to_recv`). Under async scheduling the
   scheduler does not yet know step k-1's sampled tokens, so a request that sampled its stop token in
   step k-1 is scheduled again: an over-scheduled step that still writes its KV.
2. `GPUModelRunner.execute_model` (v1/worker/gpu_model_runner.py), on the compute stream: the design's
   `input_prep_enter` (where `synchronize_input_prep` calls `prepare_inputs_event.synchronize()`); the host
   writes the new block ids into the pinned block table (`BlockTable.add_row` / `append_row` on
   `block_table.np`, v1/worker/block_table.py); `commit_block_table` copies its rows to the GPU
   non-blocking (`CpuGpuBuffer.copy_to_gpu`, v1/utils.py); `compute_slot_mapping` turns block-table rows
   into slots; `input_prep_exit` (where `prepare_inputs_event.record()` sits); the forward (the
   FlashAttention backend, v1/attention/backends/flash_attn.py): `FlashAttentionImpl.do_kv_cache_update`'s
   `reshape_and_cache_flash` writes each scheduled token's KV into its slot, `FlashAttentionImpl.forward`'s
   `flash_attn_varlen_func` reads the request's KV through the block table; the sampler writes the sampled
   ids; `step_end`; then, after the forward launch (`KVConnectorModelRunnerMixin._get_kv_connector_output`,
   v1/worker/kv_connector_model_runner_mixin.py), `start_load_kv` writes the loaded requests' blocks: NIXL
   (`NixlPullConnectorWorker.start_load_kv` -> `_read_blocks_for_req`,
   distributed/kv_transfer/kv_connector/v1/nixl/pull_worker.py) with a NIC read into the blocks that no CUDA
   stream orders; the offloading connector (`SingleDirectionOffloadingHandler.transfer_async`,
   v1/kv_offload/cpu/gpu_worker.py) with a copy on its own stream after `stream.wait_stream(current_stream())`.
   Last, `AsyncGPUModelRunnerOutput` copies the sampled ids to the host on its copy stream after
   `wait_stream(default_stream)` and records `async_copy_ready_event`.
3. `EngineCore.step_with_batch_queue` (v1/engine/core.py) with a queue of depth 2 processes the oldest step
   once two are in flight: the host blocks on its `async_copy_ready_event` (`get_output`), reads the
   sampled ids (the `host` pseudo-stream), and `Scheduler.update_from_output` frees the blocks of the
   requests that finished (`_free_request` -> `_free_blocks` -> `_free_request_blocks`): at once
   (`BlockPool.free_blocks` puts a freed, uncached block at the *front* of the free queue, tail block
   first) or, with `defer_block_free` (#45357), behind the newest scheduled step (`deferred_frees`,
   drained once `processed_step_seq` reaches the fence). Load completions are observed here too
   (`get_finished` -> `finished_recving`; modelled as a host sync on the transfer's end). Without async
   scheduling (`EngineCore.step`) each step's output is processed before the next is scheduled.

The race of #45357: a request R samples its stop token in step k; step k+1, already launched, writes R's
next KV slot; processing step k frees R's blocks, the scheduler hands them to a remote request R' in step
k+2, and the connector's write of R''s prompt KV is not ordered after step k+1's stale write, which can
land on top of it: R''s later decode steps read R's KV as their own. A local R' is safe: its prefill is on
the compute stream behind step k+1 (vLLM #45096 says the same).

Slot values come from a counter and are never reused, so a clobbered read always shows a different value.
The design's hooks are called where vLLM's sync code sits; `Hooks` gives the structural ones vLLM's own
behaviour as their default.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from racefuzz.device import Device, EventHandle, StreamHandle
from racefuzz.execution import HOST
from racefuzz.program import CellRange, Program
from racefuzz.scenarios.vllm.workload import RequestSpec, Workload

HOST_STREAM = HOST
"""The host as a participant: its writes of the pinned block table and its reads of the copied-back sampled
ids are launches on this pseudo-stream, ordered only by the host's own syncs (and, for the writes, by the
copy the host issues after them: `compute_stream.wait_stream(host)`)."""
COMPUTE_STREAM = "compute_stream"
COPY_STREAM = "async_output_copy_stream"
KV_STREAM = "kv_connector"
TABLE = "kv_cache"
BLOCK_TABLE_CPU = "block_table_cpu"
BLOCK_TABLE = "block_table"
SLOT_MAPPING = "slot_mapping"
SAMPLED = "sampled_token_ids"
SAMPLED_CPU = "sampled_token_ids_cpu"


@dataclass
class StepContext:
    """What a sync design sees at each hook.

    Args:
        device: the device API (`device.event(...)`, `device.synchronize()`).
        compute_stream: vLLM's current stream: the H2D copies, the slot mapping and the forward.
        copy_stream: `async_output_copy_stream`, the D2H of the sampled ids.
        kv_stream: the KV connector's transfers (NIXL: the NIC; offloading: its CUDA stream).
        step: the engine step k.
        reused_from: at `before_kv_load`, the last step whose batch contained a previous owner of any of the
            blocks about to be written (None: fresh blocks).
        revealed_at: at `before_kv_load`, the step whose processed output freed those blocks (None: fresh).
        state: the design's own memory across steps (for example the events it recorded).
    """

    device: Device
    compute_stream: StreamHandle
    copy_stream: StreamHandle
    kv_stream: StreamHandle
    step: int = 0
    reused_from: int | None = None
    revealed_at: int | None = None
    state: dict[str, object] = field(default_factory=dict)


class Hooks:
    """Calls a design's optional hooks; the structural ones fall back to what vLLM 0.33.0 does."""

    NAMES = ("input_prep_enter", "input_prep_exit", "step_end", "before_kv_load", "transfer_enter", "flush_stores")

    def __init__(self, design: object) -> None:
        self.design = design
        self._hooks = {name: getattr(design, name, None) for name in self.NAMES}

    def call(self, name: str, ctx: StepContext) -> None:
        hook = self._hooks[name]
        if hook is not None:
            hook(ctx)

    def transfer_enter(self, ctx: StepContext) -> None:
        # v1/kv_offload/cpu/gpu_worker.py `transfer_async`: stream.wait_stream(current_platform.current_stream())
        # ("Stores must wait for the model to finish writing the KV they read. Loads must wait for pending
        # writes ... to their destination blocks"); the wait on the previous transfer's end event is the
        # stream order of the one modelled transfer stream.
        hook = self._hooks["transfer_enter"]
        if hook is not None:
            hook(ctx)
        else:
            ctx.kv_stream.wait_stream(ctx.compute_stream)

    def flush_stores(self, ctx: StepContext, ends: list[EventHandle]) -> None:
        # distributed/kv_transfer/kv_connector/v1/offloading/worker.py `handle_preemptions`:
        # `self.worker.wait(jobs_to_flush)` (the end events of the stores of reallocated blocks).
        hook = self._hooks["flush_stores"]
        if hook is not None:
            hook(ctx, ends)
        else:
            for end in ends:
                end.synchronize()

    @property
    def defer_block_free(self) -> bool:
        """#45357: a freed request's blocks return to the pool only once its last scheduled step was processed."""
        return bool(getattr(self.design, "defer_block_free", False))

    @property
    def fence_slack(self) -> int:
        """Steps by which the deferral's fence test is loosened (0 in vLLM: `last_sched_seq <= processed_step_seq`)."""
        return int(getattr(self.design, "fence_slack", 0))


@dataclass
class _Request:
    rid: int
    spec: RequestSpec
    blocks: list[int] = field(default_factory=list)
    row: int | None = None
    computed: int = 0  # KV positions written or scheduled to be (vLLM advances num_computed_tokens at schedule)
    sampled: int = 0  # tokens the scheduled steps (or the remote prefill) produce
    status: str = "waiting"  # waiting, loading, loaded, running, finished
    last_step: int = -1  # the last engine step whose batch contained it
    last_sched_seq: int = 0  # vLLM's request.last_sched_seq
    in_table: int = 0  # block ids written to its block-table row so far


@dataclass
class _Step:
    step: int
    batch: list[_Request]
    loads: list[tuple[_Request, EventHandle]]
    copy_ready: EventHandle | None
    had_tokens: bool
    finishing: list[_Request]  # requests whose last token this step samples (the host learns it on processing)


@dataclass
class _Store:
    request: _Request
    blocks: list[int]
    cells: list[CellRange]
    end: EventHandle | None = None  # None: not submitted yet


class EngineLoop:
    """Builds the program of `workload.steps` engine steps under one design."""

    def __init__(self, workload: Workload, design: object) -> None:
        self.workload = w = workload
        self.hooks = Hooks(design)
        self.device = d = Device()
        self.ctx = StepContext(d, d.stream(COMPUTE_STREAM), d.stream(COPY_STREAM), d.stream(KV_STREAM))
        self.host = d.stream(HOST_STREAM)
        # Block 0 is vLLM's null block (`BlockPool.__init__` pops it off the free queue); 1..num_blocks are pooled.
        self.kv = d.buffer(TABLE, w.num_blocks + 1, w.block_size, fill=0)
        rows, cols = max(len(w.requests), 1), w.max_blocks_per_request
        self.table_cpu = d.buffer(BLOCK_TABLE_CPU, rows, cols, fill=0)
        self.table_gpu = d.buffer(BLOCK_TABLE, rows, cols, fill=0)
        self.table_np = np.zeros((rows, cols), dtype=np.int32)  # what the host has written to the pinned rows
        max_tokens = max(sum(r.prompt_len for r in w.requests) + len(w.requests), 1)
        self.slot_mapping = d.buffer(SLOT_MAPPING, 1, max_tokens, fill=-1)
        self.sampled_gpu = d.buffer(SAMPLED, 1, w.steps)  # one fresh tensor per step
        self.sampled_cpu = d.buffer(SAMPLED_CPU, 1, w.steps)
        self.free_queue: deque[int] = deque(range(1, w.num_blocks + 1))
        self.requests = [_Request(i, spec) for i, spec in enumerate(w.requests)]
        self.waiting: deque[_Request] = deque()
        self.free_rows: list[int] = list(range(rows))
        self.rows_to_release: list[_Request] = []  # finished: their rows go at the next `_update_states`
        self.block_last_step: dict[int, int] = {}  # block -> the last step a previous owner was scheduled in
        self.block_revealed_at: dict[int, int] = {}  # block -> the step whose processed output freed it
        self.deferred: deque[tuple[int, list[int], int, int]] = deque()  # (fence, blocks, last step, revealed at)
        self.sched_step_seq = 0
        self.processed_step_seq = 0
        self.stores: list[_Store] = []  # offloading: store jobs not yet waited for
        self.allocated: set[int] = set()  # blocks handed out by this step's schedule
        self._next_value = 1
        self.deferred_blocks = 0  # blocks whose return the deferral held back (a cost, for `compare`)
        self.admitted_at: dict[int, int] = {}  # request -> the step it was admitted in

    # -- helpers --------------------------------------------------------------------------------------------

    def _values(self, n: int) -> list[int]:
        start = self._next_value
        self._next_value += n
        return list(range(start, start + n))

    def _cells(self, r: _Request, start: int, stop: int) -> list[CellRange]:
        """The kv_cache cells of positions [start, stop) of `r`, one range per block."""
        B, cells, p = self.workload.block_size, [], start
        while p < stop:
            block, offset = r.blocks[p // B], p % B
            end = min(stop, p - offset + B)
            cells.append(self.kv[block, offset : offset + end - p])
            p = end
        return cells

    def _allocate(self, n: int) -> list[int]:
        blocks = [self.free_queue.popleft() for _ in range(n)]
        self.allocated.update(blocks)
        return blocks

    def _info(self, requests: list[_Request], **more: object) -> dict[str, object]:
        return {"step": self.ctx.step, "requests": ",".join(str(r.rid) for r in requests) or "-", **more}

    # -- the loop -------------------------------------------------------------------------------------------

    def build(self) -> Program:
        w, d = self.workload, self.device
        in_flight: deque[_Step] = deque()
        for k in range(w.steps):
            self.ctx.step = k
            if w.host_work_us:
                d.host_delay(w.host_work_us)
            for r in self.requests:
                if r.spec.arrival == k:
                    self.waiting.append(r)
            batch, loads = self.schedule(k)
            if batch or loads:
                in_flight.append(self.execute(k, batch, loads))
            if in_flight and (not w.async_scheduling or len(in_flight) == 2 or not (batch or loads)):
                self.process(in_flight.popleft())
        while in_flight:
            self.process(in_flight.popleft())
        return d.finish()

    @property
    def admission_wait_steps(self) -> int:
        """Steps the arrived requests waited for blocks, summed (one never admitted: until the last step)."""
        steps = self.workload.steps
        arrived = [r for r in self.requests if r.spec.arrival < steps]
        return sum(self.admitted_at.get(r.rid, steps) - r.spec.arrival for r in arrived)

    def schedule(self, k: int) -> tuple[list[_Request], list[_Request]]:
        """`Scheduler.schedule`: decode tokens for the running requests, then admissions in arrival order."""
        B = self.workload.block_size
        self.allocated = set()
        batch: list[_Request] = []
        for r in self.requests:
            if r.status == "loaded":
                r.status = "running"  # finished_recving: it decodes from this step on
            if r.status != "running":
                continue
            if not r.spec.eos and r.sampled >= r.spec.output_len:
                continue  # max_tokens reached: the async scheduler schedules no extra step (scheduler.py:800-813)
            need = -(-(r.computed + 1) // B) - len(r.blocks)
            if need > len(self.free_queue):
                continue  # vLLM would preempt a request here; the model leaves it out of this step
            r.blocks += self._allocate(need)
            batch.append(r)
        loads: list[_Request] = []
        while self.waiting:
            r = self.waiting[0]
            need = -(-r.spec.prompt_len // B)
            if need > len(self.free_queue):
                break  # FCFS: the queue's head waits for blocks, and everything behind it
            self.waiting.popleft()
            self.admitted_at[r.rid] = k
            r.blocks = self._allocate(need)
            if r.spec.remote:
                r.status = "loading"  # WAITING_FOR_REMOTE_KVS
                loads.append(r)
            else:
                r.status = "running"
                batch.append(r)
        if batch:
            self.sched_step_seq += 1
        for r in batch:
            r.last_step, r.last_sched_seq = k, self.sched_step_seq
        return batch, loads

    def execute(self, k: int, batch: list[_Request], loads: list[_Request]) -> _Step:
        ctx, hooks, w = self.ctx, self.hooks, self.workload
        c = ctx.compute_stream
        if w.connector == "offloading":
            self.submit_stores()
        hooks.call("input_prep_enter", ctx)
        finishing: list[_Request] = []
        if batch:
            self.update_states(batch)
            finishing = self.prepare_and_forward(k, batch)  # calls input_prep_exit after the input copies
            hooks.call("step_end", ctx)
        else:
            hooks.call("input_prep_exit", ctx)  # kv_connector_no_forward: the context still closes
        started = [(r, self.start_load(r)) for r in loads]
        copy_ready = None
        if batch:
            cs = ctx.copy_stream
            cs.wait_stream(c)  # AsyncGPUModelRunnerOutput: async_output_copy_stream.wait_stream(default_stream)
            cs.launch(
                "sampled_token_ids_d2h",
                reads=[self.sampled_gpu[0, k : k + 1]],
                writes=[(self.sampled_cpu[0, k : k + 1], k + 1)],
                info=self._info(batch),
            )
            copy_ready = cs.record_event("async_copy_ready_event")
        return _Step(k, batch, started, copy_ready, bool(batch), finishing)

    def update_states(self, batch: list[_Request]) -> None:
        """`GPUModelRunner._update_states`: the worker drops finished requests' rows, then writes new block ids."""
        for r in self.rows_to_release:
            assert r.row is not None
            self.free_rows.append(r.row)
            r.row = None
        self.rows_to_release = []
        self.free_rows.sort()  # InputBatch fills the lowest free index first
        writes = []
        for r in batch:
            if r.row is None:
                r.row = self.free_rows.pop(0)
                r.in_table = 0  # add_row: the row starts over
            if len(r.blocks) > r.in_table:
                new = r.blocks[r.in_table :]
                writes.append((self.table_cpu[r.row, r.in_table : len(r.blocks)], new))
                self.table_np[r.row, r.in_table : len(r.blocks)] = new
                r.in_table = len(r.blocks)
        if writes:
            self.host.launch("block_table_write", writes=writes, info=self._info(batch, site="add_row/append_row"))
            # The host issues the copy after it stored the ids: program order, not a design choice.
            self.ctx.compute_stream.wait_stream(self.host)

    def prepare_and_forward(self, k: int, batch: list[_Request]) -> list[_Request]:
        """`_prepare_inputs` and the forward on the compute stream; returns the requests this step finishes."""
        ctx, hooks, w = self.ctx, self.hooks, self.workload
        c, B = ctx.compute_stream, w.block_size
        n = max(r.row for r in self.requests if r.row is not None) + 1  # num_reqs: rows 0 .. n-1 are copied
        c.launch(
            "block_table_h2d",  # commit_block_table -> CpuGpuBuffer.copy_to_gpu(num_reqs), non_blocking
            reads=[self.table_cpu[0:n, :]],
            writes=[(self.table_gpu[0:n, :], self.table_np[0:n, :].ravel())],
            info=self._info(batch, rows=n),
        )
        positions = []  # (request, first position written, positions after the step)
        for r in batch:
            first = r.computed
            r.computed = r.spec.prompt_len if first == 0 and not r.spec.remote else first + 1
            positions.append((r, first, r.computed))
        slots = [r.blocks[p // B] * B + p % B for r, a, b in positions for p in range(a, b)]
        tokens = len(slots)
        rows = [self.table_gpu[r.row, 0 : len(r.blocks)] for r in batch]  # type: ignore[index]
        c.launch(
            "compute_slot_mapping",
            reads=rows,
            writes=[(self.slot_mapping[0, 0:tokens], slots)],
            info=self._info(batch),
        )
        hooks.call("input_prep_exit", ctx)
        over = [r for r in batch if r.sampled >= r.spec.output_len]  # over-scheduled: its output is discarded
        kv_writes = [(cells, self._values(cells.size)) for r, a, b in positions for cells in self._cells(r, a, b)]
        c.launch(
            "reshape_and_cache_flash",
            reads=[self.slot_mapping[0, 0:tokens]],
            writes=kv_writes,
            info=self._info(batch, over_scheduled=",".join(str(r.rid) for r in over) or "-"),
        )
        used = [cells for r in batch if r not in over for cells in self._cells(r, 0, r.computed)]
        unused = [cells for r in over for cells in self._cells(r, 0, r.computed)]
        c.launch(
            "flash_attn_varlen_func",
            reads=rows + used,
            unused_reads=unused,
            cost_us=w.forward_cost_us,
            info=self._info(batch),
        )
        c.launch("sample", writes=[(self.sampled_gpu[0, k : k + 1], k + 1)], info=self._info(batch))
        finishing = []
        for r in batch:
            if r not in over:
                r.sampled += 1
                if r.sampled == r.spec.output_len:
                    finishing.append(r)
        return finishing

    def start_load(self, r: _Request) -> EventHandle:
        """`start_load_kv` after the forward launch: the connector writes r's prompt KV into its new blocks."""
        ctx, w = self.ctx, self.workload
        previous = [b for b in r.blocks if b in self.block_last_step]
        ctx.reused_from = max((self.block_last_step[b] for b in previous), default=None)
        ctx.revealed_at = max((self.block_revealed_at[b] for b in previous), default=None)
        self.hooks.call("before_kv_load", ctx)
        ctx.reused_from = ctx.revealed_at = None
        # Whole blocks: the transfer is block-granular (remote block ids to local block ids).
        writes = [(self.kv[b, :], self._values(w.block_size)) for b in r.blocks]
        if w.connector == "nixl":
            ctx.kv_stream.launch("nixl_read_blocks", writes=writes, info=self._info([r], site="_read_blocks_for_req"))
            return ctx.kv_stream.record_event("nixl_xfer_done")
        self.hooks.transfer_enter(ctx)
        ctx.kv_stream.launch("swap_blocks_h2d", writes=writes, info=self._info([r], site="transfer_async load"))
        return ctx.kv_stream.record_event("transfer_end_event")

    def submit_stores(self) -> None:
        """Offloading `handle_preemptions`: submit the stores not yet submitted, then wait for those whose blocks
        this step's schedule reallocated (`jobs_to_flush`, offloading/scheduler.py: "Flush jobs that contain
        re-allocated blocks"). A store is made when its request's finish is processed (`finish`) and submitted
        here, at the start of the next `execute_model` (vLLM makes the job in the next schedule and defers it
        once more, to "the beginning of the next engine step": offloading/worker.py `prepare_store_kv`)."""
        ctx = self.ctx
        for store in self.stores:
            if store.end is None:
                self.hooks.transfer_enter(ctx)
                ctx.kv_stream.launch(
                    "swap_blocks_d2h", reads=store.cells, info=self._info([store.request], site="transfer_async store")
                )
                store.end = ctx.kv_stream.record_event("transfer_end_event")
        flush = [s for s in self.stores if self.allocated.intersection(s.blocks)]
        if flush:
            self.hooks.flush_stores(ctx, [s.end for s in flush if s.end is not None])
            self.stores = [s for s in self.stores if s not in flush]

    def process(self, step: _Step) -> None:
        """`get_output` and `Scheduler.update_from_output` of one step (vLLM has no sync-design hook here)."""
        hooks = self.hooks
        if step.copy_ready is not None:
            step.copy_ready.synchronize()  # AsyncGPUModelRunnerOutput.get_output
            self.host.launch(
                "process_sampled_tokens",
                reads=[self.sampled_cpu[0, step.step : step.step + 1]],
                info={"step": step.step, "site": "update_from_output"},
            )
        if step.had_tokens and hooks.defer_block_free:
            self.processed_step_seq += 1
            while self.deferred and self.deferred[0][0] <= self.processed_step_seq + hooks.fence_slack:
                _, blocks, last, revealed = self.deferred.popleft()
                self.release(blocks, last, revealed)
        elif step.had_tokens:
            self.processed_step_seq += 1
        for r in step.finishing:
            self.finish(r, step.step)
        for r, done in step.loads:
            done.synchronize()  # get_finished -> finished_recving, reported in this step's output
            if r.spec.output_len == 1:  # the remote prefill sampled its only token
                r.sampled = 1
                self.finish(r, step.step)
            else:
                r.computed, r.sampled, r.status = r.spec.prompt_len, 1, "loaded"

    def finish(self, r: _Request, revealed_at: int) -> None:
        """`_free_request`: bookkeeping at once, the blocks at once or behind the fence (`_free_request_blocks`)."""
        r.status = "finished"
        if r.row is not None:
            self.rows_to_release.append(r)
        if self.workload.connector == "offloading" and not r.spec.remote and r.computed:
            self.stores.append(_Store(r, list(r.blocks), self._cells(r, 0, r.computed)))
        hooks = self.hooks
        if not hooks.defer_block_free or r.last_sched_seq <= self.processed_step_seq + hooks.fence_slack:
            self.release(r.blocks, r.last_step, revealed_at)
        else:
            self.deferred.append((self.sched_step_seq, r.blocks, r.last_step, revealed_at))
            self.deferred_blocks += len(r.blocks)

    def release(self, blocks: list[int], last_step: int, revealed_at: int) -> None:
        """`BlockPool.free_blocks(reversed(blocks))` for uncached blocks: `prepend_n`, the tail block first."""
        for b in blocks:
            self.free_queue.appendleft(b)
            if last_step >= 0:
                self.block_last_step[b], self.block_revealed_at[b] = last_step, revealed_at
            else:  # its owner was only ever loaded, behind a host sync: nothing of a step to wait for
                self.block_last_step.pop(b, None)
                self.block_revealed_at.pop(b, None)


def build_program(workload: Workload, design: object) -> Program:
    """The host program of `workload` under `design` (any object with some of `Hooks.NAMES`)."""
    return EngineLoop(workload, design).build()
