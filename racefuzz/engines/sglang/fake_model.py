"""The fake model: a worker with `TpModelWorker`'s interface whose forward launches small kernels that read
`req_to_token` the way sglang's attention backends do, and returns a `GenerationBatchResult`.

Real (sglang's): the pools it hands the scheduler (`ReqToTokenPool`, `TokenToKVPoolAllocator`, an
enabled `RadixCache` built from `CacheInitParams`), the `GenerationBatchResult` and `LogitsProcessorOutput`
types. Fake: the model itself. The forward, on the stream sglang made current (the forward stream):

* `attention_kv_indices`: reads `req_to_token[req_pool_indices[i], 0:seq_lens[i]]` for every request i
  into a flat `kv_indices` array (what `create_flashinfer_kv_indices_triton` and the FA3 page table
  gather read; recorded from an annotation, rows exact);
* `model_compute`: the layers, a function of the token ids and those indices (a few torch ops);
* the sampled next token of each request (greedy over fake logits).

It never reads a device value back to the host (that would be a sync of the forward stream that sglang's
own code does not make, hiding the race under test). It publishes no read-done event, as sglang 0.5.23's
eager non-speculative forward does not (`maybe_publish_prefill_shared_read_done` returns early unless the
speculative algorithm supports it; the decode fast path is the CUDA-graph runner's), so the scheduler's
`_apply_war_barrier` takes its coarse `wait_stream` path. `read_done="after"` records one right after the
reads into the runner's read-done slot (what a backend with a read-done fence does: the barrier's fast
path `schedule_stream.wait_event(ev)` then runs); `read_done="before"` records it before the reads (a
wrong publisher: the fast path then trusts an event that precedes the reads, a race the harness must
report). With `cuda_graph` its decodes go through `graph_runner.py` instead: graphs captured at init and
replayed by sglang's `DecodeCudaGraphRunner.execute`, which publishes the version's own read-done event.
"""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace
from typing import Any, ClassVar

from racefuzz.trace.annotations import WHOLE, annotate, rows
from racefuzz.trace.host_memory import DEVICE

VOCAB = 128
READ_DONE = ("none", "after", "before")
"""Where the fake forward publishes a read-done event: not at all, after its reads, before them."""


def _caller(frame: Any) -> str:
    filename = frame.f_code.co_filename
    at = filename.rfind(f"{os.sep}sglang{os.sep}srt{os.sep}")
    return f"{filename[at + 1 :] if at >= 0 else filename}:{frame.f_lineno} ({frame.f_code.co_name})"


def _trace_position() -> int:
    from racefuzz.trace.capture import active

    recorder = active()
    return len(recorder.builder.ops) if recorder is not None else -1


def _sglang_chain(frame: Any, depth: int = 6) -> str:
    """sglang's frames above `frame`, innermost first, up to the scheduler's `run_batch` (the phase of a
    forward that read: `prepare_for_verify <- forward_batch_generation <- run_batch` for DFLASH's verify,
    `run_batch` alone for the plain forward)."""
    links = []
    while frame is not None and len(links) < depth:
        if f"{os.sep}sglang{os.sep}srt{os.sep}" in frame.f_code.co_filename:
            links.append(_caller(frame))
            if frame.f_code.co_name == "run_batch":
                break
        frame = frame.f_back
    return " <- ".join(links)


def register_annotations() -> None:
    from racefuzz.engines.sglang.stubs import register_annotations as register_kernel_annotations

    register_kernel_annotations()
    annotate(
        "attention_kv_indices",
        reads={
            "req_to_token": rows("req_to_token", "req_pool_indices", lengths="seq_lens"),
            "req_pool_indices": WHOLE,
            "seq_lens": WHOLE,
        },
        writes={"kv_indices": WHOLE},
    )
    # On a GPU the fake forward launches sglang's own Triton kernel inside the launch above, and the recorder
    # sees that launch too: without its sets every argument would be read and written whole (a false WAW on
    # req_to_token, seen on the H200). Its parameter names are the same in 0.5.14-0.5.23.
    annotate(
        "create_flashinfer_kv_indices_triton",
        reads={
            "req_to_token_ptr": rows(
                "req_to_token_ptr", "req_pool_indices_ptr", lengths="page_kernel_lens_ptr", starts="kv_start_idx"
            ),
            "req_pool_indices_ptr": WHOLE,
            "page_kernel_lens_ptr": WHOLE,
            "kv_indptr": WHOLE,
            "kv_start_idx": WHOLE,
        },
        writes={"kv_indices_ptr": WHOLE},
    )


def _kv_indices(req_to_token: Any, req_pool_indices: Any, seq_lens: Any, kv_indices: Any, max_len: int) -> None:
    """The read, as a masked rectangle gather (no host read of the lengths): `kv_indices[i, :L_i]`."""
    import torch

    rect = req_to_token[req_pool_indices.long(), :max_len]
    mask = torch.arange(max_len, device=rect.device)[None, :] < seq_lens.long()[:, None]
    kv_indices.copy_(torch.where(mask, rect, torch.zeros_like(rect)))


class _Strict:
    """An object whose missing attribute is an error naming it (what the fake lacks, said plainly)."""

    _what = "object"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(f"the harness's fake {self._what} has no {name!r} (sglang's code asked for it)")


class FakeModelConfig:
    """The HF-derived model config: the fields the scheduler reads for a plain decoder; any other field is
    None (a feature that is off), and is listed in `asked` for the report."""

    asked: ClassVar[set[str]] = set()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        FakeModelConfig.asked.add(name)
        return None

    def __init__(self, context_len: int) -> None:
        self.context_len = context_len
        self.vocab_size = VOCAB
        self.is_generation = True
        self.is_multimodal = False
        self.is_multimodal_gen = False
        self.is_image_gen = False
        self.is_audio_model = False
        self.is_encoder_decoder = False
        self.is_hybrid_swa = False
        self.hf_eos_token_id = None
        self.hf_config = SimpleNamespace(architectures=["FakeForCausalLM"], model_type="fake")
        self.hf_text_config = self.hf_config
        self.num_attention_heads = 1
        self.num_key_value_heads = 1
        self.head_dim = 8
        self.num_hidden_layers = 1
        self.attention_arch = None
        self.think_end_ids = None
        self.self_opened_think_start_ids = None
        self.dtype = None
        self.model_path = "dummy"


def fake_model_config(sgl: Any, context_len: int) -> FakeModelConfig:
    return FakeModelConfig(context_len)


class FakeModelRunner:
    """`ModelRunner`'s fields the loop reads; any other is None (a feature that is off), listed in `asked`."""

    asked: ClassVar[set[str]] = set()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        FakeModelRunner.asked.add(name)
        return None

    def __init__(self, worker: FakeTpWorker, forward_stream: Any) -> None:
        self.forward_stream = forward_stream
        self.device = worker.device
        self.req_to_token_pool = worker.req_to_token_pool
        self.token_to_kv_pool_allocator = worker.token_to_kv_pool_allocator
        self.token_to_kv_pool = SimpleNamespace(post_capture_active=False)
        self.attn_backend = SimpleNamespace()
        self.canary_manager = None
        self.dcp_size = 1  # decode context parallelism: off (ForwardBatch.init_new compares it, 0.5.15)
        self.shared_read_done_event = None
        self.war_fastpath_read_done_event = None
        self.spec_algorithm = worker.spec_algorithm
        self.is_hybrid_swa = False
        self.model_config = worker.model_config
        self.server_args = worker.server_args
        self.max_running_requests = worker.max_running_requests
        self.model = _empty_module()
        self.ngram_embedding_manager = _ngram_embedding_manager(self)

    def prewarm_sampling(self) -> None:
        pass


def _empty_module() -> Any:
    import torch

    return torch.nn.Module()


def _ngram_embedding_manager(runner: FakeModelRunner) -> Any:
    """sglang's own manager, built as `ModelRunner.init_ngram_embedding_manager` does (off for this model:
    a pass-through); None in versions without it."""
    try:
        from sglang.srt.model_executor.model_runner_components.ngram_embedding_manager import NgramEmbeddingManager
    except ImportError:
        return None
    import inspect

    arguments = {
        "model": runner.model,
        "model_config": runner.model_config,
        "req_to_token_pool": runner.req_to_token_pool,
        "max_running_requests": runner.max_running_requests,
        "device": runner.device,
        "server_args": runner.server_args,  # 0.5.16 takes it
    }
    accepted = inspect.signature(NgramEmbeddingManager.from_model).parameters
    return NgramEmbeddingManager.from_model(**{k: v for k, v in arguments.items() if k in accepted})


class FakeTpWorker(_Strict):
    """`TpModelWorker`'s interface over sglang's real pools and a fake forward (see the module doc)."""

    _what = "model worker"

    def __init__(
        self,
        sgl: Any,
        adapter: Any,
        scheduler: Any,
        env: Any,
        context_len: int,
        pool_rows: int,
        kv_tokens: int,
        read_done: str = "none",
        attention: str = "flashinfer",
        radix_cache: bool = True,
        page_size: int = 1,
        cuda_graph: bool = False,
    ) -> None:
        from sglang.srt.mem_cache.memory_pool import ReqToTokenPool

        register_annotations()
        self.env = env
        self.adapter = adapter
        # On the CPU the device tensors are on the stand-in device and the host's on `cpu` (the loop runs inside
        # `device.host_memory_split()`, `scheduler.build_and_run`), so sglang's `*_cpu` tensors are host memory.
        self.device = "cuda" if getattr(env, "on_gpu", False) else DEVICE
        self.server_args = sgl.server_args
        self.model_config = scheduler.model_config
        self.spec_algorithm = scheduler.spec_algorithm
        self.context_len = context_len
        if read_done not in READ_DONE:
            raise ValueError(f"read_done must be one of {', '.join(READ_DONE)}, got {read_done!r}")
        self.read_done = read_done
        self.attention = attention
        self.radix_cache = radix_cache
        self.forwards = 0
        self.req_to_token_pool = ReqToTokenPool(pool_rows, context_len, self.device, False)
        env.name(self.req_to_token_pool.req_to_token, "req_to_token")
        self.page_size = page_size
        self.token_to_kv_pool_allocator = adapter.make_allocator(kv_tokens, self.device, page_size)
        self.forward_stream = sgl.device_module.Stream()
        self.max_total_num_tokens = kv_tokens
        self.max_running_requests = pool_rows
        self.dflash = bool(getattr(self.spec_algorithm, "is_dflash", lambda: False)())
        self.model_runner = FakeModelRunner(self, self.forward_stream)
        if self.dflash:  # what DFlashWorkerV2 reads of the target: its model and attention backend
            self.model_runner.model = FakeTargetModel(self.device)
            self.model_runner.attn_backend = FakeAttentionBackend(self)
        self.weight_load_time = 0.0
        self.callers: set[str] = set()
        self.read_sites: list[tuple[int, str]] = []
        """(trace position, sglang's callers) of every `read_kv_indices`: which phase a race's read was."""
        self.tree_cache = adapter.make_radix_cache(
            self.req_to_token_pool, self.token_to_kv_pool_allocator, radix_cache, page_size
        )
        self.graphs: Any = None
        if cuda_graph:  # captured at init, as sglang's init_all_cuda_graphs does (graph_runner.py)
            from racefuzz.engines.sglang.graph_runner import DecodeGraphs

            self.graphs = DecodeGraphs(self, range(1, pool_rows + 1))

    # -- what the scheduler's init reads --------------------------------------------------------------
    def get_worker_info(self) -> tuple[Any, ...]:
        max_req_len = self.context_len - 1
        return (
            self.max_total_num_tokens,
            self.max_total_num_tokens,  # max_prefill_tokens
            self.max_running_requests,
            1024,  # max_queued_requests
            max_req_len,
            max_req_len - 5,
            0,  # random_seed
            self.device,
            self.forward_stream,
            None,
            None,
            None,
        )

    def kv_cache_result(self) -> Any:
        return self.adapter.kv_cache_result(self)

    def get_pad_input_ids_func(self) -> None:
        return None

    def get_memory_pool(self) -> tuple[Any, Any]:
        return self.req_to_token_pool, self.token_to_kv_pool_allocator

    def get_tp_group(self) -> Any:
        from unittest import mock

        return mock.MagicMock(name="tp_group")

    @property
    def last_shared_read_runner(self) -> FakeModelRunner:
        return self.model_runner

    @property
    def war_fastpath_runner(self) -> FakeModelRunner:
        return self.model_runner

    def _publish_read_done(self) -> None:
        """Record a read-done event on the current stream into the slot the version's barrier reads: the
        runner's `war_fastpath_read_done_event` (0.5.14-0.5.17, via `war_fastpath_runner`) or
        `shared_read_done_event` (0.5.19 on, via `last_shared_read_runner`); both properties return the
        one fake runner, and the barrier clears the slot it reads."""
        event = self.env.event()
        event.record()
        self.model_runner.war_fastpath_read_done_event = event
        self.model_runner.shared_read_done_event = event

    # -- the forward -------------------------------------------------------------------------------------
    def read_kv_indices(self, req_pool_indices: Any, lengths: Any) -> Any:
        """The attention backend's read: `req_to_token[req_pool_indices[i], 0:lengths[i]]` into a private
        `[bs, context_len]` table (zeros past each length), on the current stream: the fake's
        `attention_kv_indices` launch on the CPU; on a GPU sglang's own `create_flashinfer_kv_indices_triton`
        inside it (`gpu.triton_kv_indices`). The same annotation either way: the rows are exact. With
        `attention="fa3"` every row is read to the batch's longest length (FA3's eager page table,
        `flashattention_backend.py` `req_to_token[req_pool_indices, :max_seq_len_k]`), and the columns past
        a row's own length are masked afterwards, in the private table, as FA3's kernel masks them. The read
        is token by token at any page size: FA3's eager page table reads this rectangle and keeps every
        page's first entry afterwards, in its copy (0.5.23 flashattention_backend.py:1004, :1330)."""
        own = lengths
        if self.attention == "fa3" and int(req_pool_indices.shape[0]) > 0:
            lengths = lengths.max().expand(int(req_pool_indices.shape[0])).contiguous()  # no host read
        table = self._read_rows(req_pool_indices, lengths)
        if lengths is not own:
            import torch

            cols = torch.arange(table.shape[1], device=table.device)[None, :]
            table = torch.where(cols < own.to(torch.int64)[:, None], table, torch.zeros_like(table))
        return table

    def _read_rows(self, req_pool_indices: Any, lengths: Any) -> Any:
        import torch

        from racefuzz.trace.capture import launch_kernel

        req_to_token = self.req_to_token_pool.req_to_token
        bs = int(req_pool_indices.shape[0])
        max_len = self.context_len
        self.read_sites.append((_trace_position(), _sglang_chain(sys._getframe(2))))
        if self.device != "cuda":
            kv_indices = torch.empty((bs, max_len), dtype=req_to_token.dtype, device=req_to_token.device)
            launch_kernel(
                "attention_kv_indices",
                _kv_indices,
                req_to_token=req_to_token,
                req_pool_indices=req_pool_indices,
                seq_lens=lengths,
                kv_indices=kv_indices,
                max_len=max_len,
            )
            return kv_indices
        from racefuzz.engines.sglang.gpu import triton_kv_indices

        kv_indptr = torch.zeros((bs + 1,), dtype=torch.int32, device=req_to_token.device)
        kv_indptr[1:] = torch.cumsum(lengths, dim=0)
        kv_flat = torch.zeros((bs * max_len,), dtype=req_to_token.dtype, device=req_to_token.device)
        launch_kernel(
            "attention_kv_indices",
            triton_kv_indices,
            req_to_token=req_to_token,
            req_pool_indices=req_pool_indices,
            seq_lens=lengths,
            kv_indptr=kv_indptr,
            kv_indices=kv_flat,
            max_len=max_len,
        )
        return kv_flat.view(bs, max_len)

    def forward_batch_generation(self, batch: Any = None, *args: Any, **kwargs: Any) -> Any:
        """The fake forward of `batch` (a `ScheduleBatch` or `ModelWorkerBatch`) on the current stream; with
        `forward_batch=` and `is_verify=True` (DFLASH's target verify, `dflash_worker_v2.py`
        forward_batch_generation) the verify forward over the table the attention backend read in
        `init_forward_metadata` (`FakeAttentionBackend`)."""
        import torch

        self.forwards += 1
        self.callers.add(_caller(sys._getframe(1)))
        if kwargs.get("is_verify"):
            return self._verify_forward(kwargs["forward_batch"])
        if self.graphs is not None and self.graphs.runs(batch):  # sglang's DecodeCudaGraphRunner.execute
            logits = self.graphs.forward(batch)
            return self.adapter.make_result(logits, torch.argmax(logits, dim=-1), None)
        req_pool_indices = batch.req_pool_indices
        seq_lens = batch.seq_lens
        bs = int(req_pool_indices.shape[0])
        if self.read_done == "before":
            self._publish_read_done()
        kv_indices = self.read_kv_indices(req_pool_indices, seq_lens)
        if self.read_done == "after":
            self._publish_read_done()
        # The model: a function of the KV locations read and the positions (no host read-back).
        hidden = (kv_indices.to(torch.int64).sum(dim=1) * 31 + seq_lens.to(torch.int64) * 7) % VOCAB
        logits = torch.zeros((bs, VOCAB), dtype=torch.float32, device=hidden.device)
        logits.scatter_(1, hidden[:, None], 1.0)  # not F.one_hot: it reads the maximum back to the host
        next_token_ids = torch.argmax(logits, dim=-1)
        hidden_states = None
        if self.dflash:  # DFLASH's prefill captures the target's hidden states of every prompt token
            hidden_states = _one_hot(batch.input_ids.to(torch.int64) % VOCAB)
        return self.adapter.make_result(logits, next_token_ids, hidden_states)

    def _verify_forward(self, forward_batch: Any) -> Any:
        """DFLASH's TARGET_VERIFY forward: logits for every token of each request's block, from the table
        the backend gathered in `init_forward_metadata` (a private copy: no read of `req_to_token` here,
        as the eager FA3 forward reads its page table). Token t at position p of a row whose gathered
        locations sum to s predicts `(t + 1 + s + [p % 3 == 0]) % VOCAB` (the fake draft proposes the chain
        without the last term: some drafts are accepted, some not)."""
        import torch

        table = self.model_runner.attn_backend.table
        block = int(forward_batch.spec_info.draft_token_num)
        bs = int(forward_batch.batch_size)
        tokens = forward_batch.input_ids.to(torch.int64).view(bs, block)
        positions = forward_batch.positions.to(torch.int64).view(bs, block)
        shift = table.to(torch.int64).sum(dim=1, keepdim=True)
        predicted = (tokens + 1 + shift + (positions % 3 == 0).to(torch.int64)) % VOCAB
        logits = _one_hot(predicted.reshape(-1))
        hidden_states = _one_hot(tokens.reshape(-1) % VOCAB)
        return self.adapter.make_result(logits, None, hidden_states)


def _one_hot(ids: Any) -> Any:
    """`[n, VOCAB]` float rows, 1 at `ids` (scatter: `F.one_hot` reads the maximum back to the host)."""
    import torch

    rows = torch.zeros((ids.shape[0], VOCAB), dtype=torch.float32, device=ids.device)
    rows.scatter_(1, ids.to(torch.int64)[:, None], 1.0)
    return rows


# -- DFLASH: the fake target and draft models sglang's own `DFlashWorkerV2` runs against -------------------

DFLASH_BLOCK = 4
"""`speculative_num_draft_tokens`: the DFLASH block (the bonus token and three drafts)."""
MASK_TOKEN_ID = VOCAB - 1


class FakeTargetModel:
    """The target model's parts `DFlashWorkerV2` reads: `get_input_embeddings()` and `lm_head.weight`. Both
    are the identity over the vocabulary (hidden size = VOCAB), so a token embeds to its one-hot row and
    a one-hot hidden state samples back to its token: what the fake draft proposes is exact."""

    def __init__(self, device: str) -> None:
        import torch

        eye = torch.eye(VOCAB, dtype=torch.float32, device=device)
        self.embed_tokens = torch.nn.Embedding(VOCAB, VOCAB, _weight=eye.clone())
        self.lm_head = SimpleNamespace(weight=eye)

    def get_input_embeddings(self) -> Any:
        return self.embed_tokens


class FakeAttentionBackend:
    """The target runner's attention backend: `init_forward_metadata` gathers the page table from
    `req_to_token` as FA3's eager path does (`metadata.page_table = req_to_token[req_pool_indices,
    :max_seq_len_k]`; TARGET_VERIFY reads `seq_lens + draft_token_num` columns per row), on the current
    stream; the verify forward then reads that private table."""

    def __init__(self, worker: FakeTpWorker) -> None:
        self.worker = worker
        self.table: Any = None

    def init_forward_metadata(self, forward_batch: Any) -> None:
        lengths = forward_batch.seq_lens
        spec_info = getattr(forward_batch, "spec_info", None)
        if forward_batch.forward_mode.is_target_verify() and spec_info is not None:
            lengths = lengths + int(spec_info.draft_token_num)
        self.table = self.worker.read_kv_indices(forward_batch.req_pool_indices, lengths)


class FakeDraftAttention:
    """One draft layer's attention: the key/value projection of the target's hidden states (two slices)
    and the identity for the norm and rope (`_append_target_hidden_*` of `DFlashWorkerV2` calls these)."""

    num_kv_heads = 1
    head_dim = 8
    qkv_proj = None  # no fused-QKV weight: sglang's fused KV-materialize path declines it (on a GPU)

    def __init__(self) -> None:
        self.attn = SimpleNamespace(layer_id=0, k_scale=None, v_scale=None)

    def kv_proj_only(self, hidden: Any) -> tuple[Any, Any]:
        return hidden[:, : self.head_dim].contiguous(), hidden[:, self.head_dim : 2 * self.head_dim].contiguous()

    def apply_k_norm(self, k: Any) -> Any:
        return k

    def apply_k_rope(self, positions: Any, k: Any) -> Any:
        return k


class FakeDraftModel:
    """The DFLASH draft model's parts the worker reads outside the forward: `project_target_hidden`
    (identity) and `layers` (one, `FakeDraftAttention`)."""

    def __init__(self) -> None:
        self.layers = [SimpleNamespace(self_attn=FakeDraftAttention())]
        self.block_size = DFLASH_BLOCK

    def project_target_hidden(self, hidden: Any) -> Any:
        return hidden

    def prepare_context_hidden_for_kv(self, layer: Any, hidden: Any) -> Any:  # 0.5.15's sequential append
        return hidden


class FakeDraftKVPool:
    """The draft's KV cache (`token_to_kv_pool`): one layer of keys and values indexed by KV slot; the
    worker materializes the target's hidden states into it at the verify block's slots."""

    def __init__(self, env: Any, kv_tokens: int, device: str) -> None:
        import torch

        self.k_buffer = torch.zeros((kv_tokens + 1, 1, FakeDraftAttention.head_dim), device=device)
        self.v_buffer = torch.zeros_like(self.k_buffer)
        env.name(self.k_buffer, "draft_k_cache")
        env.name(self.v_buffer, "draft_v_cache")

    def set_kv_buffer(self, layer: Any, loc: Any, k: Any, v: Any, k_scale: Any = None, v_scale: Any = None) -> None:
        self.k_buffer[loc] = k.to(self.k_buffer.dtype)
        self.v_buffer[loc] = v.to(self.v_buffer.dtype)

    def set_kv_buffer_prefix_valid(
        self, layer: Any, loc_2d: Any, commit_lens: Any, k: Any, v: Any, k_scale: Any = None, v_scale: Any = None
    ) -> None:
        """Only each row's first `commit_lens[i]` slots take the new values (a masked select would read the
        mask's count back to the host: the others are rewritten with what they hold)."""
        import torch

        block = loc_2d.shape[1]
        loc = loc_2d.reshape(-1)
        valid = (torch.arange(block, device=loc.device)[None, :] < commit_lens.to(torch.int64)[:, None]).reshape(-1)
        for buffer, new in ((self.k_buffer, k), (self.v_buffer, v)):
            old = buffer[loc]
            buffer[loc] = torch.where(valid[:, None, None], new.to(buffer.dtype), old)


class FakeDraftModelRunner:
    """The draft `ModelRunner`: its config (a DFLASH draft config: block, mask token id), model, KV pool,
    the aliased `req_to_token_pool` (sglang's `DFlashWorkerV2.alloc_memory_pool` passes the target's), and
    `forward`: the draft's attention reads `req_to_token[row, 0:seq_lens + block]` (the non-windowed
    draft attends over the shared over-allocated mapping), then proposes the block's tokens."""

    def __init__(self, worker: FakeTpWorker) -> None:
        self.target = worker
        self.device = worker.device
        self.model = FakeDraftModel()
        self.model_config = SimpleNamespace(
            hf_config={
                "num_hidden_layers": 1,
                "block_size": DFLASH_BLOCK,
                "dflash_config": {"mask_token": "<|mask|>", "mask_token_id": MASK_TOKEN_ID},
            },
            context_len=worker.context_len,
            vocab_size=VOCAB,
        )
        self.token_to_kv_pool = FakeDraftKVPool(worker.env, worker.max_total_num_tokens, worker.device)
        self.req_to_token_pool: Any = None
        self.attn_backend = SimpleNamespace()
        self.forwards = 0

    def forward(self, forward_batch: Any, *args: Any, **kwargs: Any) -> Any:
        """The draft forward: the table read, then for each row the chain `d_j = d_{j-1} + 1 + s` from the
        bonus token (`s` the sum of the locations read), as one-hot hidden states `[bs * block, VOCAB]`."""
        import torch
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput

        self.forwards += 1
        bs = int(forward_batch.batch_size)
        block = DFLASH_BLOCK
        table = self.target.read_kv_indices(forward_batch.req_pool_indices, forward_batch.seq_lens + block)
        shift = table.to(torch.int64).sum(dim=1, keepdim=True)
        embeds = forward_batch.input_embeds.view(bs, block, -1)
        bonus = torch.argmax(embeds[:, 0, :], dim=-1, keepdim=True)
        steps = torch.arange(block, device=bonus.device)[None, :]
        proposed = (bonus + steps * (1 + shift)) % VOCAB
        hidden = _one_hot(proposed.reshape(-1))
        return SimpleNamespace(
            logits_output=LogitsProcessorOutput(next_token_logits=None, hidden_states=hidden), can_run_graph=False
        )


class FakeDraftWorker(_Strict):
    """The draft `TpModelWorker` that `DFlashWorkerV2.__init__` builds (it loads the draft model): a
    runner (`FakeDraftModelRunner`) and the pool and backend steps the scheduler's init calls."""

    _what = "draft worker"

    def __init__(self, target: FakeTpWorker, **kwargs: Any) -> None:
        self.model_runner = FakeDraftModelRunner(target)

    def alloc_memory_pool(self, memory_pool_config: Any = None, req_to_token_pool: Any = None, **kwargs: Any) -> None:
        self.model_runner.req_to_token_pool = req_to_token_pool

    def init_attention_backends(self) -> None:
        pass

    def init_cuda_graphs(self) -> None:
        pass
