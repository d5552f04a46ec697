"""The fake parts around vLLM's `GPUModelRunner`: the model config (no HF model directory), the KV-cache
config and its one attention group (no real attention backend), and the model itself.

The model's forward, on the stream vLLM runs it on (the current stream), reads what vLLM's input
preparation put on the device the way attention and cache-write kernels do:

* `embed`: a gather of `input_ids` (the runner's `input_ids.gpu`);
* `kv_write`: the new tokens' keys written into the KV cache at `slot_mapping` (what
  `reshape_and_cache` does; an exact scatter, so only the slots written conflict);
* `kv_read`: every request's KV rows read through its block-table row, `seq_lens` long (what a paged
  attention kernel reads: `block_table[i, :ceil(seq_lens[i] / block_size)]`, a masked rectangle gather,
  no host read of the lengths);
* a few torch ops for the layers, and `compute_logits` (a matmul).

It never reads a device value back to the host: that would be a sync vLLM's own model does not make.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, ClassVar

VOCAB = 128
HIDDEN = 8
BLOCK_SIZE = 16
MAX_MODEL_LEN = 128
MAX_NUM_SEQS = 4
MAX_BATCHED_TOKENS = 128
LAYER = "model.layers.0.attn"


class FakeModelConfig:
    """`ModelConfig`'s fields the runner reads for a plain decoder; any other is None (a feature that is
    off) and is listed in `asked` for the report."""

    asked: ClassVar[set[str]] = set()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        FakeModelConfig.asked.add(name)
        return None

    def __init__(self, torch: Any) -> None:
        self.dtype = torch.float32
        self.max_model_len = MAX_MODEL_LEN
        self.runner_type = "generate"
        self.enable_prompt_embeds = False
        self.is_multimodal_raw_input_only_model = False
        self.is_mm_prefix_lm = False
        self.uses_mrope = False
        self.uses_xdrope_dim = 0  # 0.17-0.18 compare it with 0
        self.supports_multimodal_inputs = False
        self.is_encoder_decoder = False
        self.logprobs_mode = "raw_logprobs"
        self.use_fp64_gumbel = False
        self.logits_processors = None
        self.is_hybrid = False
        self.is_moe = False
        self.disable_cascade_attn = True
        self.hf_config = SimpleNamespace(architectures=["FakeForCausalLM"], model_type="fake")
        self.hf_text_config = self.hf_config

    def get_inputs_embeds_size(self) -> int:
        return HIDDEN

    def get_vocab_size(self) -> int:
        return VOCAB

    def get_hidden_size(self) -> int:
        return HIDDEN

    def get_sliding_window(self) -> None:
        return None

    def get_num_attention_heads(self, parallel_config: Any = None) -> int:
        return 1

    def get_num_kv_heads(self, parallel_config: Any = None) -> int:
        return 1

    def get_head_size(self) -> int:
        return HIDDEN

    def get_num_layers(self, parallel_config: Any = None) -> int:
        return 1


class FakeVllmConfig:
    """`VllmConfig` with vLLM's own cache, scheduler, parallel and compilation configs (real classes) and
    the fake model config; any other field is None (off), listed in `asked`."""

    asked: ClassVar[set[str]] = set()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        FakeVllmConfig.asked.add(name)
        return None


class FakeSpeculativeConfig:
    """`SpeculativeConfig` of an EAGLE/MTP-kind drafter proposing `num_speculative_tokens` per step with the
    padded drafter batch (the only kind async scheduling allows: 0.17.0 `config/vllm.py:
    VllmConfig.__post_init__`); the drafter itself is `runner.FakeDrafter`. Any other field is None."""

    method = "eagle"
    disable_padded_drafter_batch = False
    enforce_eager = True

    def __init__(self, num_speculative_tokens: int) -> None:
        self.num_speculative_tokens = num_speculative_tokens
        self.draft_model_config = SimpleNamespace(max_model_len=MAX_MODEL_LEN)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        FakeVllmConfig.asked.add(f"speculative_config.{name}")
        if name.startswith(("use_", "uses_")):  # the other drafter kinds' predicates (`use_dflash()`, ...)
            return lambda: False
        return None

    def use_eagle(self) -> bool:
        return True


def fake_vllm_config(async_scheduling: bool, spec_tokens: int = 0) -> FakeVllmConfig:
    """The config; `spec_tokens` > 0: speculative decoding of that many draft tokens on a hybrid model
    (`is_hybrid`: the runner then copies the accepted counts to the host, `_update_states_after_model_execute`),
    whose KV cache is still the one full-attention group (no Mamba state is kept: mamba_cache_mode "none")."""
    import torch
    from vllm.config import CacheConfig, CompilationConfig, CUDAGraphMode, ParallelConfig, SchedulerConfig

    config = FakeVllmConfig()
    config.model_config = FakeModelConfig(torch)
    config.model_config.is_hybrid = spec_tokens > 0
    config.speculative_config = FakeSpeculativeConfig(spec_tokens) if spec_tokens else None
    config.cache_config = CacheConfig(block_size=BLOCK_SIZE)
    config.scheduler_config = _scheduler_config(SchedulerConfig, async_scheduling)
    config.parallel_config = ParallelConfig()
    config.compilation_config = CompilationConfig(cudagraph_mode=CUDAGraphMode.NONE)
    config.num_speculative_tokens = spec_tokens
    for name in ("load_config", "offload_config", "observability_config"):
        setattr(config, name, _Loose(name))
    return config


def _scheduler_config(cls: Any, async_scheduling: bool) -> Any:
    """vLLM's `SchedulerConfig` with the arguments this version takes (0.33 needs `max_model_len`)."""
    import dataclasses

    wanted = {
        "max_num_batched_tokens": MAX_BATCHED_TOKENS,
        "max_num_seqs": MAX_NUM_SEQS,
        "max_model_len": MAX_MODEL_LEN,
        "async_scheduling": async_scheduling,
        "is_encoder_decoder": False,
    }
    names = {f.name for f in dataclasses.fields(cls)} | {"max_model_len", "is_encoder_decoder"}
    return cls(**{k: v for k, v in wanted.items() if k in names})


class _Loose:
    """A sub-config the runner only probes: every field None (off)."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        FakeVllmConfig.asked.add(f"{self._name}.{name}")
        return None


def kv_cache_config(num_blocks: int) -> Any:
    """vLLM's `KVCacheConfig` (real classes) of one full-attention group of one layer."""
    import dataclasses

    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    values = {
        "block_size": BLOCK_SIZE,
        "num_kv_heads": 1,
        "head_size": HIDDEN,
        "dtype": torch.float32,
        "use_mla": False,
    }
    names = {f.name for f in dataclasses.fields(FullAttentionSpec)}
    spec = FullAttentionSpec(**{k: v for k, v in values.items() if k in names})  # 0.10 needs use_mla
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec([LAYER], spec)])


class FakeMetadataBuilder:
    """An attention metadata builder that hands the forward vLLM's `CommonAttentionMetadata` itself (the
    block table, slot mapping, seq_lens and query_start_loc views the runner built)."""

    supports_update_block_table = False

    def build(self, common_prefix_len: int, common_attn_metadata: Any, fast_build: bool = False) -> Any:
        return common_attn_metadata


class FakeAttentionGroup:
    """`AttentionGroup`'s interface over `FakeMetadataBuilder` (a backend that writes the KV cache in its
    forward, as FlashAttention's does)."""

    def __init__(self) -> None:
        self.layer_names = [LAYER]
        self.backend = SimpleNamespace(forward_includes_kv_cache_update=True, get_name=lambda: "FAKE")
        self.metadata_builders = [FakeMetadataBuilder()]
        self.metadata_builder = self.metadata_builders[0]  # 0.10's single-builder name
        self.kv_cache_spec = None

    def get_metadata_builder(self, ubatch_id: int = 0) -> FakeMetadataBuilder:
        return self.metadata_builders[ubatch_id]

    def build_metadata(self, common_attn_metadata: Any, ubatch_id: int = 0, **kwargs: Any) -> Any:
        return common_attn_metadata

    def map_to_kernel_block_table(self, block_table: Any, ubatch_id: int = 0) -> Any:
        return block_table


def fake_model(num_blocks: int, device: Any, multimodal: bool = False) -> Any:
    """The fake model (a `torch.nn.Module`: vLLM's runner calls it and its `compute_logits`). `multimodal`:
    it also has what vLLM's runner calls on a multimodal model, `embed_input_ids` (vLLM's own
    `SupportsMultiModal.embed_input_ids`: the text embeddings, then `_merge_multimodal_embeddings`'s
    `masked_scatter_` of the image embeddings where `is_multimodal` is set, no host read), and
    `embed_image`, the fake encoder's output (`runner.fake_encoder`)."""
    import torch

    class FakeForCausalLM(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            generator = torch.Generator().manual_seed(0)
            self.embed = torch.randn(VOCAB, HIDDEN, generator=generator).to(device)
            self.head = torch.randn(HIDDEN, VOCAB, generator=generator).to(device)
            self.kv_cache = torch.zeros(num_blocks * BLOCK_SIZE, HIDDEN, device=device)
            self.forwards = 0

        def forward(
            self, input_ids: Any = None, positions: Any = None, inputs_embeds: Any = None, **kwargs: Any
        ) -> Any:
            from vllm.forward_context import get_forward_context

            self.forwards += 1
            metadata = get_forward_context().attn_metadata[LAYER]
            embeds = self.embed[input_ids.long()] if input_ids is not None else inputs_embeds  # embed
            tokens = embeds.shape[0]
            hidden = embeds + positions[:tokens, None].float() * 1e-3
            slots = metadata.slot_mapping[:tokens]
            self.kv_cache.index_put_((slots,), hidden)  # kv_write (reshape_and_cache)
            table = metadata.block_table_tensor[: metadata.num_reqs]
            width = table.shape[1] * BLOCK_SIZE
            offsets = torch.arange(width, device=table.device)
            slot_of = table.long().repeat_interleave(BLOCK_SIZE, dim=1) * BLOCK_SIZE + offsets % BLOCK_SIZE
            seq_lens = metadata.seq_lens[: metadata.num_reqs].long()
            mask = offsets[None, :] < seq_lens[:, None]
            context = (self.kv_cache[torch.where(mask, slot_of, 0)] * mask[..., None]).sum(1)  # kv_read
            query_start = metadata.query_start_loc[1 : metadata.num_reqs + 1]
            request_of = torch.searchsorted(query_start, torch.arange(tokens, device=table.device), right=True)
            return torch.tanh(hidden + context[request_of.clamp(max=metadata.num_reqs - 1)])

        def compute_logits(self, hidden_states: Any, sampling_metadata: Any = None) -> Any:  # 0.10 passes two
            return hidden_states @ self.head

    if not multimodal:
        return FakeForCausalLM()
    from vllm.model_executor.models.interfaces import SupportsMultiModal

    if not hasattr(SupportsMultiModal, "embed_input_ids"):
        from racefuzz.engines.harness_process import Unsupported

        raise Unsupported(
            "multimodal: this version's SupportsMultiModal has no embed_input_ids (get_input_embeddings before "
            "it); the multimodal workload drives 0.13.0 on"
        )

    class FakeMultiModalLM(FakeForCausalLM):
        embed_input_ids = SupportsMultiModal.embed_input_ids
        _embed_text_input_ids = SupportsMultiModal._embed_text_input_ids

        def get_language_model(self) -> Any:
            return SimpleNamespace(embed_input_ids=lambda input_ids: self.embed[input_ids.long()])

        def embed_image(self, tokens: int) -> Any:
            return torch.full((tokens, HIDDEN), 0.5, device=device)

    # The interface's flags at their defaults (supports_multimodal, requires_raw_input_tokens, 0.18's
    # _has_oov_mm_tokens, ...): the runner and embed_input_ids read them.
    for name, value in vars(SupportsMultiModal).items():
        if isinstance(value, bool):
            setattr(FakeMultiModalLM, name, value)
    return FakeMultiModalLM()
