"""Building vLLM's own `GPUModelRunner` around a fake model, and driving it as vLLM's engine core does.

The runner is made by vLLM's own `GPUModelRunner.__init__` (its `InputBatch`, `MultiGroupBlockTable`,
the persistent `CpuGpuBuffer`s, the async output copy stream and `prepare_inputs_event` under async
scheduling), with a fake config (`fake_model.fake_vllm_config`: vLLM's own cache, scheduler, parallel and
compilation configs, a fake model config). What `initialize_kv_cache` and `load_model` would set is set
here: the KV-cache config (vLLM's classes, one full-attention group), one fake attention group, the fake
model. Everything a step runs afterwards is vLLM's code: `execute_model` (`synchronize_input_prep`,
`_update_states`, `_prepare_inputs` with `commit_block_table`'s non-blocking copy and the other
`copy_to_gpu`s, `_build_attention_metadata`, `_preprocess`, `_model_forward`), `sample_tokens` (the
real `Sampler`, `_bookkeeping_sync`, `AsyncGPUModelRunnerOutput`'s D2H copy on its side stream), and
`get_output`.

Faked: the scheduler (`FakeScheduler`: it builds vLLM's own `SchedulerOutput` / `NewRequestData` /
`CachedRequestData` from a workload, with its own block allocator instead of vLLM's `KVCacheManager`), the
model, the attention backend, and the slot-mapping Triton kernel on the CPU and by default on a GPU
(`SlotMappingKernel`, the same arithmetic in torch ops: Triton does not run on the CPU; a GPU run keeps
the version's own kernel with `--slot-mapping vllm`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from racefuzz.engines.vllm.fake_model import (
    BLOCK_SIZE,
    MAX_BATCHED_TOKENS,
    MAX_NUM_SEQS,
    FakeAttentionGroup,
    fake_model,
    fake_vllm_config,
    kv_cache_config,
)
from racefuzz.engines.vllm.workload import Request, Workload, image_range


@dataclass
class StepRun:
    """What one run of the loop did."""

    steps: int = 0
    forwards: int = 0
    outputs: dict[str, list[int]] = field(default_factory=dict)


@dataclass
class _Tracked:
    request: Request
    blocks: list[int] = field(default_factory=list)
    computed: int = 0  # tokens whose KV the runner has (or will have once the scheduled step runs)
    scheduled_outputs: int = 0  # steps scheduled that sample (each ends with at least one output token)
    generated: int = 0  # output tokens those steps produce (a decode with drafts more than one)
    state: str = "waiting"  # waiting, running, preempted, finished


def build(cls: Any, **values: Any) -> Any:
    """A vLLM dataclass from the fields this version has (others default)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in values.items() if k in names})


class FakeScheduler:
    """A scheduler with vLLM's scheduling outcomes for a workload: decodes first, then whole prefills
    while the token budget and the blocks allow (no chunking), a request's blocks freed when it finishes
    or is preempted, a preempted request resumed the next step with fresh blocks and its tokens recomputed
    (vLLM's recompute preemption). Under async scheduling a step's outputs are known one step late, as in
    vLLM's `AsyncScheduler`; the fake counts scheduled outputs, so it ends a request after its last step."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self.free = list(range(1, workload.num_blocks))  # block 0 is vLLM's null block
        self.tracked = {r.rid: _Tracked(r) for r in workload.requests}
        self.order = [r.rid for r in sorted(workload.requests, key=lambda r: r.arrival)]
        self.step = 0
        self.pending_finished: set[str] = set()

    def done(self) -> bool:
        return all(t.state == "finished" for t in self.tracked.values()) or self.step >= self.workload.max_steps

    def _allocate(self, tracked: _Tracked, tokens: int) -> list[int] | None:
        needed = -(-tokens // BLOCK_SIZE) - len(tracked.blocks)
        if needed > len(self.free):
            return None
        new = [self.free.pop(0) for _ in range(max(0, needed))]
        tracked.blocks += new
        return new

    def _release(self, tracked: _Tracked) -> None:
        self.free = sorted(self.free + tracked.blocks)
        tracked.blocks = []

    def schedule(self) -> Any:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput

        step = self.step
        self.step += 1
        finished, self.pending_finished = self.pending_finished, set()
        preempted: set[str] = set()
        new_reqs: list[tuple[str, list[int], int, bool]] = []
        cached: list[tuple[str, list[int] | None, int, bool]] = []
        num_scheduled: dict[str, int] = {}
        spec_tokens: dict[str, list[int]] = {}
        generated_before: dict[str, int] = {}
        budget = MAX_BATCHED_TOKENS
        for rid in self.order:  # decodes of running requests first
            tracked = self.tracked[rid]
            if tracked.state != "running":
                continue
            if tracked.request.preempt_at == step:
                tracked.state, tracked.computed = "preempted", 0
                self._release(tracked)
                preempted.add(rid)
                continue
            tokens = 1 + self.workload.spec_tokens  # the sampled token and the drafts to verify
            new_blocks = self._allocate(tracked, tracked.computed + tokens)
            if new_blocks is None:
                continue
            cached.append((rid, new_blocks or None, tracked.computed, False))
            num_scheduled[rid] = tokens
            if self.workload.spec_tokens:
                # vLLM's async scheduler schedules placeholders; the runner scatters the drafts it kept on the
                # device into their slots (`_prepare_input_ids`).
                spec_tokens[rid] = [-1] * self.workload.spec_tokens
            budget -= tokens
        for rid in self.order:  # then (re)prefills, whole
            tracked = self.tracked[rid]
            resuming = tracked.state == "preempted" and rid not in preempted
            if not (tracked.state == "waiting" and tracked.request.arrival <= step) and not resuming:
                continue
            tokens = tracked.request.prompt_len + (tracked.scheduled_outputs if resuming else 0)
            if tokens > budget or len(num_scheduled) >= MAX_NUM_SEQS:
                continue
            if self._allocate(tracked, tokens) is None:
                continue
            if resuming:
                cached.append((rid, list(tracked.blocks), 0, True))
            else:
                new_reqs.append((rid, list(tracked.blocks), 0, False))
            num_scheduled[rid] = tokens
            budget -= tokens
            tracked.state = "running"
        for rid, tokens in num_scheduled.items():
            tracked = self.tracked[rid]
            generated_before[rid] = tracked.generated
            # A decode with drafts yields them all (the fake rejection sampler accepts every draft), a prefill one.
            tracked.generated += 1 + (len(spec_tokens.get(rid, ())))
            tracked.computed += tokens
            tracked.scheduled_outputs += 1
            if tracked.scheduled_outputs >= tracked.request.output_len:
                tracked.state = "finished"
                self._release(tracked)
                self.pending_finished.add(rid)
        prefills = [c[0] for c in new_reqs] + [c[0] for c in cached if c[3]]
        encoder_inputs = {rid: [0] for rid in prefills if self._image(rid)}  # each image is its request's input 0
        greedy = SamplingParams(temperature=0.0, max_tokens=64)
        sampled = SamplingParams(temperature=1.0, max_tokens=64)
        scheduled_new = [
            build(
                NewRequestData,
                req_id=rid,
                prompt_token_ids=_prompt(self.tracked[rid].request),
                mm_features=self._image(rid),
                mm_inputs=[],
                mm_kwargs=[],
                mm_hashes=[],
                mm_positions=[],
                sampling_params=sampled if self.tracked[rid].request.random else greedy,
                pooling_params=None,
                block_ids=(blocks,),
                num_computed_tokens=computed,
                lora_request=None,
            )
            for rid, blocks, computed, _ in new_reqs
        ]
        cached_data = build(
            CachedRequestData,
            req_ids=[c[0] for c in cached],
            resumed_req_ids={c[0] for c in cached if c[3]},
            resumed_from_preemption=[c[3] for c in cached],
            new_token_ids=[[] for _ in cached],
            all_token_ids={c[0]: _all_tokens(self.tracked[c[0]]) for c in cached if c[3]},
            new_block_ids=[(c[1],) if c[1] else None for c in cached],
            num_computed_tokens=[c[2] for c in cached],
            num_output_tokens=[generated_before[c[0]] for c in cached],
        )
        return build(
            SchedulerOutput,
            scheduled_new_reqs=scheduled_new,
            scheduled_cached_reqs=cached_data,
            num_scheduled_tokens=num_scheduled,
            total_num_scheduled_tokens=sum(num_scheduled.values()),
            scheduled_spec_decode_tokens=spec_tokens,
            scheduled_encoder_inputs=encoder_inputs,
            num_common_prefix_blocks=[0],
            finished_req_ids=finished,
            free_encoder_mm_hashes=[],
            free_encoder_input_ids=[],
            structured_output_request_ids={},
            grammar_bitmask=None,
            preempted_req_ids=preempted,
            kv_connector_metadata=None,
        )

    def _image(self, rid: str) -> list[Any]:
        """`rid`'s multimodal features: vLLM's `MultiModalFeatureSpec` for its image (`workload.image_range`),
        its data None (the fake encoder, `fake_encoder`, makes the embeddings), or none."""
        placement = image_range(self.tracked[rid].request) if self.workload.multimodal else None
        if placement is None:
            return []
        from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange

        offset, length = placement
        return [
            build(
                MultiModalFeatureSpec,
                data=None,
                modality="image",
                identifier=f"image-{rid}",
                mm_hash=f"image-{rid}",
                mm_position=PlaceholderRange(offset=offset, length=length),
            )
        ]


def fake_encoder(runner: Any, scheduler_output: Any) -> list[Any]:
    """What vLLM's `_execute_mm_encoder` does, with the fake model's encoder (`FakeForCausalLM.embed_image`,
    a device op on the current stream) instead of `embed_multimodal` over the image's processed inputs: each
    scheduled image's embeddings into `runner.encoder_cache` under its identifier, where vLLM's own
    `_gather_mm_embeddings` looks them up."""
    outputs = []
    for rid, inputs in scheduler_output.scheduled_encoder_inputs.items():
        for index in inputs:
            feature = runner.requests[rid].mm_features[index]
            output = runner.model.embed_image(feature.mm_position.length)
            runner.encoder_cache[feature.identifier] = output
            outputs.append(output)
    return outputs


def _all_tokens(tracked: _Tracked) -> list[int]:
    """A resumed request's tokens: its prompt, then a stand-in for each output so far (the fake model's
    values do not matter to the schedule)."""
    return _prompt(tracked.request) + [1] * (tracked.scheduled_outputs - 1)


def _prompt(request: Request) -> list[int]:
    return [(7 * i + len(request.rid)) % 100 + 1 for i in range(request.prompt_len)]


class _NoSyncEvent:
    """The negative control: `prepare_inputs_event` whose `synchronize` does nothing (its `record` is
    the real one), so the host rewrites the persistent pinned buffers while the previous step's
    non-blocking copies may still read them."""

    def __init__(self, event: Any) -> None:
        self._event = event

    def record(self, *args: Any, **kwargs: Any) -> None:
        self._event.record(*args, **kwargs)

    def synchronize(self) -> None:
        pass


class FakeDrafter:
    """The drafter in place of vLLM's `EagleProposer` (what `GPUModelRunner.__init__` builds for an EAGLE/MTP
    config: a draft model). The runner's `propose_draft_token_ids` is replaced by `HarnessRunner`'s, which
    does what the version's EAGLE branch does with the target's output: the next tokens and the valid sampled
    counts on the device, then vLLM's own `_copy_valid_sampled_token_count` (the D2H copy of the counts on
    its side stream, `valid_sampled_token_count_event`); the drafts are the next token repeated. No draft
    model runs (no second forward)."""

    kv_cache_gid = 0
    eagle3_use_aux_hidden_state = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Every step's counts, held for the run: vLLM's drafter allocates them afresh each step
        # (0.33.0 `spec_decode/llm_base_proposer.py: prepare_next_token_ids_padded`) and the side stream's copy
        # reads them without `record_stream`; whether their block is reused too early is the allocator's
        # question, not one of the buffers judged here, so no block of theirs is ever freed.
        self.kept: list[Any] = []


class FakeRejectionSampler:
    """`RejectionSampler` (its kernels are Triton) as greedy verification that accepts every draft: each
    request's output is the target's argmax at its draft positions and its bonus position, none rejected
    (the fake scheduler's optimistic token counts then stay right). torch ops on the device, as the kernels."""

    def __call__(self, metadata: Any, draft_probs: Any, logits: Any, sampling_metadata: Any, *args: Any) -> Any:
        import torch
        from vllm.v1.outputs import SamplerOutput

        target = logits.argmax(dim=-1).to(torch.int32)
        num_reqs = len(metadata.num_draft_tokens)
        width = max(metadata.num_draft_tokens) + 1
        sampled = torch.full((num_reqs, width), -1, dtype=torch.int32, device=logits.device)
        start = 0
        for index, drafts in enumerate(metadata.num_draft_tokens):  # a host list, as vLLM's metadata has it
            sampled[index, : drafts + 1] = target[start : start + drafts + 1]
            start += drafts + 1
        return SamplerOutput(sampled_token_ids=sampled, logprobs_tensors=None)


def propose_drafts(runner: Any, sampled_token_ids: Any) -> Any:
    """What the EAGLE branch of `GPUModelRunner.propose_draft_token_ids` does with the target's output before
    its draft model runs (0.17.0: `self.drafter.prepare_next_token_ids_padded`, then
    `self._copy_valid_sampled_token_count`), with the drafter's kernels as torch ops: each request's
    valid sampled count and its last valid token; the drafts are that token, `num_spec_tokens` times."""
    import torch

    valid = (sampled_token_ids != -1).sum(dim=1)
    next_token_ids = sampled_token_ids.gather(1, (valid - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
    runner.drafter.kept += [valid, next_token_ids]
    runner._copy_valid_sampled_token_count(next_token_ids, valid)
    return next_token_ids.unsqueeze(1).expand(-1, runner.num_spec_tokens).to(torch.int64)


def watch_numpy_reads(array: Any) -> Any:
    """`array` (a `HostArray`) as one whose reads by indexing (`a[i]`, `a[:n]`, `a[index_array]`) are recorded
    too, as the host's reads of those bytes (through an index array: their bounding range): vLLM reads the
    accepted-token counts the device copied to the host through NumPy
    (`input_batch.num_accepted_tokens_cpu[:num_reqs]`), and `HostArray` records NumPy writes only. Indexing
    that NumPy does inside a write (`a[:n] = b`) is the write, not a read."""
    import sys

    import numpy as np

    from racefuzz.trace.host_memory import HostArray

    writing = HostArray.__setitem__.__code__

    class ReadRecorded(HostArray):
        def __getitem__(self, key: Any) -> Any:
            value = super().__getitem__(key)
            if sys._getframe(1).f_code is not writing:  # NumPy indexing the target of a write is no read
                _record_numpy_read(self, key)
            return value

    view = np.asarray(array).view(ReadRecorded)
    view._owner = array._owner
    return view


NUMPY_READ = "numpy read (host)"


def _record_numpy_read(array: Any, key: Any) -> None:
    """The host's read of `array[key]` on its owner's storage, named by the vLLM line that indexed it."""
    import sys

    import numpy as np

    from racefuzz.trace.capture import active
    from racefuzz.trace.host_memory import torch_view

    recorder = active()
    if recorder is None or recorder.paused or array._owner is None:
        return
    plain = np.asarray(array)
    positions = np.arange(plain.size).reshape(plain.shape)[key]
    flat = np.ravel(positions)
    if flat.size == 0:
        return
    offsets = sum(
        index * stride for index, stride in zip(np.unravel_index(flat, plain.shape), plain.strides, strict=True)
    )
    first, last = int(offsets.min()), int(offsets.max())
    region = torch_view(array._owner, plain, first, (last - first) // plain.itemsize + 1, None)
    caller = sys._getframe(2)  # the frame that indexed the array (past ReadRecorded.__getitem__)
    source = f"{caller.f_code.co_filename}:{caller.f_lineno} ({caller.f_code.co_name})"
    recorder.host_access(NUMPY_READ, [region], [], source)


class SlotMappingKernel:
    """`block_table.ComputeSlotMappingKernel` restated in torch ops for the CPU (Triton does not run there):
    the same arguments, the same arithmetic for one context-parallel rank (`slot = block_table[req,
    pos // block_size] * block_size + pos % block_size`, the tail up to `max_num_tokens` PAD_SLOT_ID), the
    same reads (the block-table entries the positions select, through an exact gather) and writes."""

    def register_warmup(self, **kwargs: Any) -> None:
        pass

    def __call__(
        self,
        num_reqs: int,
        num_tokens: int,
        max_num_tokens: int,
        query_start_loc: Any,
        positions: Any,
        block_table: Any,
        block_table_stride: int,
        slot_mapping: Any,
        block_size: int,
        *context_parallel: int,
    ) -> None:
        import torch

        tokens = torch.arange(num_tokens, device=positions.device)
        request_of = torch.searchsorted(query_start_loc[1 : num_reqs + 1], tokens, right=True)
        position = positions[:num_tokens]
        blocks = block_table[request_of, position // block_size]
        slot_mapping[:num_tokens] = blocks.long() * block_size + position % block_size
        slot_mapping[num_tokens:max_num_tokens].fill_(-1)


class SlotMappingLaunch:
    """The `@triton.jit` slot-mapping kernel launched directly (0.19.0 `v1/worker/block_table.py:
    BlockTable.compute_slot_mapping`: `_compute_slot_mapping_kernel[(num_reqs + 1,)](num_tokens,
    max_num_tokens, query_start_loc, positions, block_table, stride, block_size, slot_mapping, ...)`) as
    `SlotMappingKernel`'s torch ops, for the CPU."""

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        def launch(
            num_tokens: int,
            max_num_tokens: int,
            query_start_loc: Any,
            positions: Any,
            block_table: Any,
            block_table_stride: int,
            block_size: int,
            slot_mapping: Any,
            **constants: Any,
        ) -> None:
            SlotMappingKernel()(
                grid[0] - 1,
                num_tokens,
                max_num_tokens,
                query_start_loc,
                positions,
                block_table,
                block_table_stride,
                slot_mapping,
                block_size,
            )

        return launch


def annotate_slot_mapping_kernel() -> None:
    """The read and write sets of the version's `@triton.jit` slot-mapping kernel (0.33.0
    v1/worker/block_table.py: `ComputeSlotMappingKernel.kernel`; 0.10.2 and 0.11.0 compute the slot mapping
    on the host, `BlockTable.compute_slot_mapping`, and launch no kernel): it reads the query start
    locations, the positions and the block table, and writes only the slot mapping (the default would have
    it write every argument)."""
    from racefuzz.trace.annotations import WHOLE, annotate

    annotate(
        "kernel",
        reads={"query_start_loc_ptr": WHOLE, "positions_ptr": WHOLE, "block_table_ptr": WHOLE},
        writes={"slot_mapping_ptr": WHOLE},
    )


def watch_pinned_numpy_writes() -> None:
    """Every `CpuGpuBuffer` made from here on gets a `HostArray` as its `np` (`host_memory.py`): the host's
    NumPy writes to the pinned half become recorded host accesses (CPU runs; on a GPU too they dispatch no
    op). The modules that imported the class by name share it, so the patch of its `__init__` reaches them."""
    from vllm.v1 import utils

    from racefuzz.engines.vllm import host_memory

    cls = utils.CpuGpuBuffer
    if getattr(cls, "_racefuzz_watched", False):
        return
    original = cls.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if hasattr(self, "np"):
            self.np = host_memory.wrap(self.np, self.cpu)

    cls.__init__ = __init__
    cls._racefuzz_watched = True


def watch_input_batch_numpy_writes(input_batch: Any) -> None:
    """The input batch's NumPy views of its CPU tensors (`token_ids_cpu` of `token_ids_cpu_tensor`,
    `temperature_cpu`, `num_computed_tokens_cpu`, ...; `gpu_input_batch.py: InputBatch.__init__`) as
    `HostArray`s, so the host's writes through them are recorded (`host_memory.py`)."""
    import numpy as np

    from racefuzz.engines.vllm import host_memory

    for name, value in list(vars(input_batch).items()):
        tensor = getattr(input_batch, f"{name}_tensor", None)
        if name.endswith("_cpu") and isinstance(value, np.ndarray) and tensor is not None:
            setattr(input_batch, name, host_memory.wrap(value, tensor))


class _SingleRankGroup:
    """A `GroupCoordinator` of one rank (no process group: the harness runs one rank, world size 1)."""

    world_size = 1
    rank = 0
    rank_in_group = 0
    local_rank = 0
    ranks = (0,)
    is_first_rank = True
    is_last_rank = True
    device_group = cpu_group = None

    def all_reduce(self, tensor: Any) -> Any:
        return tensor

    def all_gather(self, tensor: Any, dim: int = -1) -> Any:
        return tensor

    def broadcast_tensor_dict(self, tensor_dict: Any = None, src: int = 0) -> Any:
        return tensor_dict


def single_process_groups() -> None:
    """vLLM's parallel-state groups, each one rank (what `init_distributed_environment` would make for
    world size 1, without a process group)."""
    from vllm.distributed import parallel_state

    group = _SingleRankGroup()
    for name in ("_WORLD", "_TP", "_ETP", "_DCP", "_PP", "_DP", "_EP", "_EPLB", "_PCP"):
        if hasattr(parallel_state, name):
            setattr(parallel_state, name, group)


def build_runner(workload: Workload, device: Any, control: bool, slot_mapping: str = "torch") -> Any:
    """vLLM's `GPUModelRunner` made by its own `__init__`, with the KV cache, attention group and model
    that `initialize_kv_cache` / `load_model` would set faked. `control` makes the `synchronize` of
    `prepare_inputs_event` (needs async scheduling: the event exists only then) and of the other
    `CONTROL_EVENTS` the runner has a no-op. `workload.spec_tokens`: speculative decoding, with
    `FakeDrafter` as vLLM's `EagleProposer`, `FakeRejectionSampler` and the accepted counts' NumPy reads
    recorded (`watch_numpy_reads`). `slot_mapping`: `torch`
    replaces the version's Triton slot-mapping kernel by `SlotMappingKernel` (always on the CPU), `vllm`
    keeps the version's own (a GPU; the recorder records its launch, `annotate_slot_mapping_kernel`)."""
    import torch
    from vllm.v1.worker import block_table
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    single_process_groups()
    # The host's NumPy writes of pinned buffers dispatch no torch op on either device.
    watch_pinned_numpy_writes()
    if slot_mapping == "torch" or device.type == "cpu":
        if hasattr(block_table, "_COMPUTE_SLOT_MAPPING_KERNEL"):
            block_table._COMPUTE_SLOT_MAPPING_KERNEL = SlotMappingKernel()
        elif hasattr(block_table, "_compute_slot_mapping_kernel"):  # 0.19: the Triton kernel launched directly
            block_table._compute_slot_mapping_kernel = SlotMappingLaunch()
    else:
        annotate_slot_mapping_kernel()

    class HarnessRunner(GPUModelRunner):  # type: ignore[misc, valid-type]
        def _init_device_properties(self) -> None:
            # What 0.10-0.14 do themselves (gpu_model_runner.py _init_device_properties). 0.17-0.19 ask
            # `num_compute_units`, which asks the platform: the harness pins vLLM's `UnspecifiedPlatform`
            # (`pin_platform`), which raises NotImplementedError; CudaPlatform.num_compute_units (0.17.0
            # platforms/cuda.py:577) answers the device's multi_processor_count, as here.
            if device.type == "cuda":
                self.device_properties = torch.cuda.get_device_properties(self.device)
            else:  # torch.cuda.get_device_properties: no GPU on the CPU
                self.device_properties = SimpleNamespace(multi_processor_count=1, name="racefuzz-cpu")
            self.num_sms = self.device_properties.multi_processor_count

        def propose_draft_token_ids(self, scheduler_output: Any, sampled_token_ids: Any, *args: Any) -> Any:
            return propose_drafts(self, sampled_token_ids)

        def _execute_mm_encoder(self, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
            return fake_encoder(self, scheduler_output)

    if workload.spec_tokens:
        from vllm.v1.worker import gpu_model_runner

        if not hasattr(GPUModelRunner, "_copy_valid_sampled_token_count"):
            raise ValueError(
                "spec_tokens: this version's runner has no _copy_valid_sampled_token_count (EAGLE under "
                "async scheduling came later)"
            )
        gpu_model_runner.EagleProposer = FakeDrafter  # what __init__ builds and the runner's isinstance checks name
    with multimodal_model(workload.multimodal):
        runner = HarnessRunner(fake_vllm_config(workload.async_scheduling, workload.spec_tokens), device)
    runner.kv_cache_config = kv_cache_config(workload.num_blocks)
    runner.attn_groups = [[FakeAttentionGroup()]]
    runner.model = fake_model(workload.num_blocks, device, workload.multimodal)
    watch_input_batch_numpy_writes(runner.input_batch)
    if workload.spec_tokens:
        runner.rejection_sampler = FakeRejectionSampler()
        batch = runner.input_batch
        batch.num_accepted_tokens_cpu = watch_numpy_reads(batch.num_accepted_tokens_cpu)
    if control:
        if runner.prepare_inputs_event is None:
            raise ValueError("the control needs async scheduling (prepare_inputs_event exists only then)")
        for name in CONTROL_EVENTS:
            if getattr(runner, name, None) is not None:
                setattr(runner, name, _NoSyncEvent(getattr(runner, name)))
    return runner


@contextlib.contextmanager
def multimodal_model(multimodal: bool) -> Iterator[None]:
    """While `GPUModelRunner.__init__` runs: vLLM's multimodal registry says the fake model takes multimodal
    inputs (`supports_multimodal_inputs`, which would build the model's HF processor info), so vLLM's own
    `__init__` makes `is_mm_embed` (0.14.0: `is_mm_embed_buffers`) and `_preprocess` takes its multimodal
    branch; `MultiModalBudget` (the encoder budget, read only by profiling and the dummy runs) is None."""
    if not multimodal:
        yield
        return
    from vllm.v1.worker import gpu_model_runner

    registry = gpu_model_runner.MULTIMODAL_REGISTRY
    budget = gpu_model_runner.MultiModalBudget
    registry.supports_multimodal_inputs = lambda model_config: True
    gpu_model_runner.MultiModalBudget = lambda *args, **kwargs: None
    try:
        yield
    finally:
        del registry.supports_multimodal_inputs  # the class's method again
        gpu_model_runner.MultiModalBudget = budget


CONTROL_EVENTS = ("prepare_inputs_event", "valid_sampled_token_count_event", "num_accepted_tokens_event")
"""The runner's events whose `synchronize` the control makes a no-op: every one that orders the host's input
preparation after the device's earlier work (the input-prep event; with speculative decoding the valid
sampled counts' and, from 0.18.0, the accepted counts')."""


def control_events(runner: Any) -> list[str]:
    """The `CONTROL_EVENTS` this runner has whose synchronize is a no-op (a control's)."""
    return [name for name in CONTROL_EVENTS if isinstance(getattr(runner, name, None), _NoSyncEvent)]


@contextlib.contextmanager
def device_generic_events() -> Iterator[None]:
    """`torch.Event()` as `torch.cuda.Event()` for the block: vLLM makes some of its events device-generic
    (0.33's `transfer_event`, `draft_token_ids_event`), and a CPU recording resolves `torch.cuda.Event` to a
    virtual event but not `torch.Event` (docs/trace.md), whose CPU backend has no events at all."""
    import torch

    generic = torch.Event
    torch.Event = torch.cuda.Event  # type: ignore[misc, assignment]
    try:
        yield
    finally:
        torch.Event = generic  # type: ignore[misc]


def name_buffers(env: Any, runner: Any) -> None:
    """Name the runner's, its input batch's and its block tables' tensors after their attributes in
    reports (`query_start_loc.cpu`, `input_batch.temperature_cpu_tensor`, `block_table[0].block_table.cpu`)."""
    import torch
    from vllm.v1.utils import CpuGpuBuffer

    batch = runner.input_batch
    owners: list[tuple[str, Any]] = [("", runner), ("input_batch.", batch)]
    for index, table in enumerate(getattr(batch.block_table, "block_tables", [])):
        owners.append((f"block_table[{index}].", table))
    for prefix, owner in owners:
        for name, value in vars(owner).items():
            if isinstance(value, CpuGpuBuffer):
                env.name(value.cpu, f"{prefix}{name}.cpu")
                env.name(value.gpu, f"{prefix}{name}.gpu")
            elif isinstance(value, list) and value and all(isinstance(v, CpuGpuBuffer) for v in value):
                for index, buffer in enumerate(value):  # 0.14.0's is_mm_embed_buffers
                    env.name(buffer.cpu, f"{prefix}{name}[{index}].cpu")
                    env.name(buffer.gpu, f"{prefix}{name}[{index}].gpu")
            elif isinstance(value, torch.Tensor) and value.numel():
                env.name(value, f"{prefix}{name}")


def run_loop(runner: Any, workload: Workload) -> StepRun:
    """vLLM's engine-core loop over the runner: with async scheduling a batch queue of depth 2
    (`EngineCore.step_with_batch_queue`: schedule and launch step N+1 before taking step N's output),
    else `EngineCore.step` (execute, sample, take the output)."""
    scheduler = FakeScheduler(workload)
    run = StepRun()
    in_flight: deque[Any] = deque()
    while not scheduler.done() or in_flight:
        if not scheduler.done():
            output = scheduler.schedule()
            run.steps += 1
            if output.total_num_scheduled_tokens == 0 and not output.finished_req_ids:
                if in_flight:
                    _take(in_flight.popleft(), run)
                continue
            result = runner.execute_model(output)
            if result is None:  # 0.33: sampling is a second call (`sample_tokens`); 0.10-0.11 sample in one
                result = runner.sample_tokens(None)
            in_flight.append(result)
            if workload.async_scheduling and len(in_flight) < 2 and not scheduler.done():
                continue
        _take(in_flight.popleft(), run)
    run.forwards = runner.model.forwards
    return run


def _take(output: Any, run: StepRun) -> None:
    result = output.get_output() if hasattr(output, "get_output") else output
    for rid, tokens in zip(result.req_ids or [], result.sampled_token_ids or [], strict=False):
        run.outputs.setdefault(rid, []).extend(int(t) for t in tokens)
