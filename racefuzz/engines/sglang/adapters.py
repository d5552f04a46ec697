"""Per-version differences of sglang that the harness absorbs: how the server config is published, how
requests arrive, what a worker exposes for the barrier's read-done slot, where modules live.

`adapter_for(version, python_dir)` picks one by what the sources define; a version the harness cannot
drive raises `Unsupported` with one line naming what is missing (`check`, `adapter_for`). Most of the
churn between versions needs no adapter: the harness runs sglang's own `Scheduler.__init__` and replaces
only its heavy init steps, by name, so the ~200 attributes the loop reads are set by each version itself.
"""

from __future__ import annotations

import ast
import contextlib
import re
import sys
from array import array
from collections.abc import Iterator
from typing import Any
from unittest import mock

from racefuzz.engines.harness_process import Unsupported
from racefuzz.engines.sglang.workload import Request

EMBED_WIDTH = 8
"""The width of a `Request.embeds` prompt's embedding rows (the fake model has no hidden size)."""


def parse_version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def process_group(name: str) -> Any:
    """A stand-in for a world-size-1 `GroupCoordinator` (collectives are never reached at size 1)."""
    group = mock.MagicMock(name=name)
    group.world_size = 1
    group.rank = 0
    group.rank_in_group = 0
    group.is_first_rank = True
    group.is_last_rank = True
    group.ranks = [0]
    group.cpu_group.size.return_value = 1
    return group


class Adapter:
    """sglang 0.5.23 (and what later versions keep)."""

    name = "runtime_context.publish (0.5.21+)"

    required = (
        ("sglang.srt.managers.scheduler", "Scheduler"),
        ("sglang.srt.managers.scheduler", "Scheduler._apply_war_barrier"),
        ("sglang.srt.managers.scheduler", "Scheduler.event_loop_overlap"),
        ("sglang.srt.managers.overlap_utils", "FutureMap"),
        ("sglang.srt.mem_cache.radix_cache", "RadixCache"),
        ("sglang.srt.mem_cache.memory_pool", "ReqToTokenPool"),
    )

    def check(self, sgl: Any) -> None:
        """`Unsupported` naming the first thing of `required` these sources lack."""
        import importlib

        for module_name, attr in self.required:
            try:
                target: Any = importlib.import_module(module_name)
            except Exception as exc:  # an import error is the one line to report
                raise Unsupported(f"cannot import {module_name}: {type(exc).__name__}: {exc}") from None
            for part in attr.split("."):
                if not hasattr(target, part):
                    raise Unsupported(f"{module_name} has no {attr} (the harness drives that)")
                target = getattr(target, part)

    def scheduler_class(self, sgl: Any) -> type:
        from sglang.srt.managers.scheduler import Scheduler

        return Scheduler

    def take_cuda_sides(self) -> list[str]:
        """`cuda_record_streams()` and `cuda_host_copies()` once per process (the CPU harness's runs share the
        recompiled functions)."""
        taken = getattr(self, "_cuda_sides_taken", None)
        if taken is None:
            taken = self._cuda_sides_taken = cuda_record_streams() + cuda_host_copies()
        return taken

    def server_args(
        self,
        sgl: Any,
        spec: str = "none",
        radix_cache: bool = True,
        chunked_prefill: int = 0,
        mixed_chunk: bool = False,
        page_size: int = 1,
    ) -> Any:
        """The server config the harness runs: a plain decoder on the torch attention path, no CUDA graphs,
        KV pages of `page_size` tokens; with `spec="dflash"` sglang's DFLASH (worker v2) with a block of `DFLASH_BLOCK`;
        `radix_cache` False sets `disable_radix_cache`; `chunked_prefill` tokens is `chunked_prefill_size`
        (0: -1, no chunking) and `mixed_chunk` is `enable_mixed_chunk` (a prefill mixed with the running
        decodes, `ScheduleBatch.mix_with_running`)."""
        from sglang.srt.server_args import ServerArgs

        from racefuzz.engines.sglang.fake_model import DFLASH_BLOCK

        speculative: dict[str, Any] = {}
        if spec == "dflash":
            speculative = {
                "speculative_algorithm": "DFLASH",
                "speculative_draft_model_path": "dummy-draft",
                "speculative_num_draft_tokens": DFLASH_BLOCK,
            }
        return ServerArgs(
            **speculative,
            model_path="dummy",
            device="cpu",
            skip_tokenizer_init=True,
            page_size=page_size,
            chunked_prefill_size=chunked_prefill or -1,
            enable_mixed_chunk=mixed_chunk,
            max_running_requests=8,
            disable_cuda_graph=True,
            attention_backend="torch_native",
            sampling_backend="pytorch",
            random_seed=0,
            disable_radix_cache=not radix_cache,
        )

    @contextlib.contextmanager
    def published(self, server_args: Any) -> Iterator[None]:
        """`runtime_context.publish` as sglang's own `published_topology` test helper does."""
        from sglang.srt.runtime_context import SpawnRanks, publish, reset_context

        reset_context()
        # A process with a device names its index (0.5.23 Scheduler.init_model_worker reads
        # get_device().gpu_id for get_available_gpu_memory when the device is cuda); none on the CPU.
        gpu_id = 0 if getattr(server_args, "device", "cpu") == "cuda" else None
        publish(server_args, role="test", ranks=SpawnRanks(world_rank=0, dp_rank=None, gpu_id=gpu_id))
        try:
            with self.override_groups():
                yield
        finally:
            reset_context()

    def parallel_fields(self) -> frozenset[str]:
        from sglang.srt.runtime_context import _parallel_fields

        return _parallel_fields()

    def override_groups(self) -> Any:
        """Every process group of the parallel context as a world-size-1 mock (no torch.distributed)."""
        from sglang.srt.runtime_context import get_parallel

        names = sorted(name for name in self.parallel_fields() if name.endswith("_group"))
        return get_parallel().override(**{name: process_group(name) for name in names})

    def init_args(self, sgl: Any) -> tuple[Any, ...]:
        port_args = mock.MagicMock(name="port_args")
        port_args.nccl_port = 0
        return (sgl.server_args, port_args)

    @contextlib.contextmanager
    def patched_runtime(self, sgl: Any, env: Any, worker_holder: dict[str, Any]) -> Iterator[None]:
        """The distributed runtime and the KV-cache builder: replaced (world size 1, real pools)."""
        import sglang.srt.managers.scheduler as scheduler_module

        with contextlib.ExitStack() as stack:
            stack.enter_context(self.published(sgl.server_args))
            bootstrap = getattr(scheduler_module, "bootstrap", None)
            if bootstrap is not None:
                stack.enter_context(mock.patch.object(bootstrap, "init_parallel_runtime", lambda **kw: None))
                stack.enter_context(mock.patch.object(bootstrap, "init_layer_runtime", lambda **kw: None))
            builder = getattr(scheduler_module, "kv_cache_builder", None)
            if builder is not None:
                stack.enter_context(
                    mock.patch.object(builder, "build_kv_cache", lambda **kw: worker_holder["worker"].kv_cache_result())
                )
            stack.enter_context(mock.patch.object(scheduler_module, "get_dp_tp_group", mock.MagicMock(), create=True))
            yield

    def make_allocator(self, kv_tokens: int, device: str, page_size: int = 1) -> Any:
        """The KV allocator sglang builds for `page_size` (0.5.15 model_runner_kv_cache_mixin.py:1131-1147,
        0.5.23 kv_cache_configurator.py: `TokenToKVPoolAllocator` at page size 1, else
        `PagedTokenToKVPoolAllocator`), with no KV pool behind it (the fake model has none)."""
        import torch

        if page_size == 1:
            from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator

            return TokenToKVPoolAllocator(kv_tokens, torch.int32, device, None, False)
        from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator

        return PagedTokenToKVPoolAllocator(kv_tokens, page_size, torch.int32, device, None, False)

    def make_radix_cache(self, req_to_token_pool: Any, allocator: Any, enabled: bool = True, page_size: int = 1) -> Any:
        """An ENABLED `RadixCache` (with `disable=True` a prefill result never rewrites its row); with
        `enabled` False the cache sglang builds when the radix cache is disabled, `ChunkCache` (its
        `cache_unfinished_req` only copies the row's indices out)."""
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams

        params = CacheInitParams(
            disable=not enabled,
            req_to_token_pool=req_to_token_pool,
            token_to_kv_pool_allocator=allocator,
            page_size=page_size,
        )
        if not enabled:
            from sglang.srt.mem_cache.chunk_cache import ChunkCache

            return ChunkCache(params)
        from sglang.srt.mem_cache.radix_cache import RadixCache

        return RadixCache(params)

    def kv_cache_result(self, worker: Any) -> Any:
        """What `kv_cache_builder.build_kv_cache` returns, over the fake worker's real pools."""
        from sglang.srt.mem_cache.kv_cache_builder import KVCacheBuildResult

        return KVCacheBuildResult(
            is_hybrid_swa=False,
            is_hybrid_ssm=False,
            sliding_window_size=None,
            full_tokens_per_layer=None,
            swa_tokens_per_layer=None,
            req_to_token_pool=worker.req_to_token_pool,
            token_to_kv_pool_allocator=worker.token_to_kv_pool_allocator,
            disable_radix_cache=not worker.radix_cache,
            tree_cache=worker.tree_cache,
        )

    def make_result(self, logits: Any, next_token_ids: Any, hidden_states: Any = None) -> Any:
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput
        from sglang.srt.managers.utils import GenerationBatchResult

        return GenerationBatchResult(
            logits_output=LogitsProcessorOutput(next_token_logits=logits, hidden_states=hidden_states),
            next_token_ids=next_token_ids,
            can_run_cuda_graph=False,
        )

    @contextlib.contextmanager
    def dflash_runtime(self, env: Any, worker_holder: dict[str, Any], plan_stream: bool, fence: bool) -> Iterator[None]:
        """What a DFLASH run replaces around sglang's own `DFlashWorkerV2` and `DFlashDraftInputV2`:

        * `dflash_worker_v2.TpModelWorker` (the draft worker `DFlashWorkerV2.__init__` builds: it loads the
          draft model) is `fake_model.FakeDraftWorker` over the target fake;
        * `dflash_worker_v2.compute_position` (the prefill's draft-KV positions) is a device-only
          equivalent: sglang's torch path (`compute_position_torch`, taken for the harness's
          `torch_native` backend) reads every length back to the host, a sync of the forward stream that
          the Triton path of FlashInfer or FA3 does not make, and that would order the prefill forward's
          reads before everything after it;
        * the plan stream: `SGLANG_ENABLE_OVERLAP_PLAN_STREAM` as `plan_stream` says, and sglang's own cache
          of it (`dflash_info_v2._OVERLAP_PLAN_STREAMS`, module-global) holds this run's stream, named
          `plan_stream` (the cache would otherwise keep an earlier run's);
        * `fence` False (the negative control): `prepare_for_decode` finds no `verify_done` (0.5.14's
          self-event: neither its host `synchronize()` nor the plan stream's `wait_event` runs); a version
          without `verify_done` (0.5.15 on) is unchanged by this, its fence is the barrier."""
        import os

        import sglang.srt.speculative.dflash_info_v2 as info_module
        import sglang.srt.speculative.dflash_worker_v2 as worker_module

        from racefuzz.engines.sglang.fake_model import FakeDraftWorker

        def draft_worker(**kwargs: Any) -> FakeDraftWorker:
            return FakeDraftWorker(worker_holder["worker"], **kwargs)

        original_prepare = info_module.DFlashDraftInputV2.prepare_for_decode

        def prepare_without_fence(self: Any, batch: Any) -> Any:
            if getattr(self, "verify_done", None) is not None:
                self.verify_done = None
            return original_prepare(self, batch)

        previous = os.environ.get("SGLANG_ENABLE_OVERLAP_PLAN_STREAM")
        os.environ["SGLANG_ENABLE_OVERLAP_PLAN_STREAM"] = "1" if plan_stream else "0"
        info_module._OVERLAP_PLAN_STREAMS.clear()
        try:
            with contextlib.ExitStack() as stack:
                stack.enter_context(mock.patch.object(worker_module, "TpModelWorker", draft_worker))
                stack.enter_context(mock.patch.object(worker_module, "compute_position", device_positions))
                if not fence:
                    stack.enter_context(
                        mock.patch.object(info_module.DFlashDraftInputV2, "prepare_for_decode", prepare_without_fence)
                    )
                yield
        finally:
            info_module._OVERLAP_PLAN_STREAMS.clear()
            if previous is None:
                os.environ.pop("SGLANG_ENABLE_OVERLAP_PLAN_STREAM", None)
            else:
                os.environ["SGLANG_ENABLE_OVERLAP_PLAN_STREAM"] = previous

    def prepare_dflash_worker(self, worker: Any, on_gpu: bool) -> None:
        """On the CPU, the DFLASH worker takes the path `DFlashWorkerV2.__init__` chooses on a GPU
        (`_use_triton_prepare_block = is_cuda() or is_hip()`): its Triton draft-block kernel, which reads
        `req_to_token`, runs as its torch equivalent (`stubs.CPU_EQUIVALENTS`). sglang's CPU branch is not
        runnable: its fallback `assign_extend_cache_locs_func` returns None off CUDA, HIP, MUSA (and XPU in
        0.5.15). The accept/bonus step stays on sglang's eager torch path (`_use_triton_accept_bonus`
        False off a GPU; it touches no shared table)."""
        if not on_gpu:
            worker._use_triton_prepare_block = True

    def install_plan_stream(self, env: Any, device: str) -> None:
        """This run's plan stream into sglang's cache of it (see `dflash_runtime`)."""
        import sglang.srt.speculative.dflash_info_v2 as info_module

        info_module._OVERLAP_PLAN_STREAMS[str(device)] = env.stream("plan_stream")

    def after_ipc(self, scheduler: Any) -> None:
        pass

    def install_receiver(self, scheduler: Any, receiver: Any) -> None:
        """Requests arrive through `request_receiver.recv_requests` (0.5.23's `ingest_requests`)."""
        scheduler.request_receiver = mock.MagicMock(name="request_receiver")
        scheduler.request_receiver.recv_requests = receiver

    def make_input(self, scheduler: Any, request: Request) -> Any:
        """A `TokenizedGenerateReqInput` as the tokenizer manager sends it (greedy, fixed length)."""
        from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
        from sglang.srt.sampling.sampling_params import SamplingParams

        params = SamplingParams(max_new_tokens=request.output_len, ignore_eos=True, temperature=0.0)
        params.normalize(None)
        params.verify(scheduler.model_config.vocab_size)
        ids = [(7 * i + len(request.rid)) % 97 + 3 for i in range(request.prompt_len)]
        return TokenizedGenerateReqInput(
            rid=request.rid,
            input_text="",
            input_ids=array("q", ids),
            # A prompt as embeddings (`Request.embeds`): sglang keeps such a prefill out of a mixed batch; the
            # fake model reads neither ids nor embeddings, so their values are immaterial.
            input_embeds=[[0.0] * EMBED_WIDTH for _ in ids] if request.embeds else None,
            mm_inputs=None,
            token_type_ids=None,
            sampling_params=params,
            return_logprob=False,
            logprob_start_len=-1,
            top_logprobs_num=0,
            token_ids_logprob=None,
            stream=False,
        )


RECORD_STREAM_GUARDED = ("sglang.srt.managers.overlap_utils",)
"""The modules whose CPU guards around `record_stream` the CPU harness takes as on CUDA (`cuda_record_streams`)."""


def _is_cpu_guard(node: ast.If) -> bool:
    """`if X.device.type != "cpu":` whose body calls `record_stream` (0.5.22 overlap_utils.py:99, :453)."""
    test = node.test
    if not (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.NotEq)
        and isinstance(test.left, ast.Attribute)
        and test.left.attr == "type"
        and isinstance(test.left.value, ast.Attribute)
        and test.left.value.attr == "device"
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value == "cpu"
    ):
        return False
    return any(
        isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "record_stream"
        for statement in node.body
        for call in ast.walk(statement)
    )


class _GuardTransformer(ast.NodeTransformer):
    """A rewrite of a function's host-side tests; `changed` counts the tests it rewrote."""

    def __init__(self) -> None:
        self.changed = 0


class _TakeCudaSide(_GuardTransformer):
    def visit_If(self, node: ast.If) -> ast.AST:
        self.generic_visit(node)
        if _is_cpu_guard(node):
            self.changed += 1
            node.test = ast.copy_location(ast.Constant(True), node.test)
        return node


def _device_of(node: ast.AST) -> ast.expr | None:
    """`X` of `X.device`, else None."""
    if isinstance(node, ast.Attribute) and node.attr == "device":
        return node.value
    return None


def _is_cuda(tensor: ast.expr, like: ast.AST) -> ast.expr:
    return ast.copy_location(ast.Attribute(value=tensor, attr="is_cuda", ctx=ast.Load()), like)


class _AskAsCuda(_GuardTransformer):
    """`X.device.type == "cpu"` -> `not X.is_cuda`; `is_pin_memory_available(X.device)` -> `X.is_cuda`."""

    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        self.generic_visit(node)
        if (
            len(node.ops) == 1
            and isinstance(node.ops[0], ast.Eq)
            and isinstance(node.left, ast.Attribute)
            and node.left.attr == "type"
            and isinstance(node.comparators[0], ast.Constant)
            and node.comparators[0].value == "cpu"
        ):
            tensor = _device_of(node.left.value)
            if tensor is not None:
                self.changed += 1
                return ast.copy_location(ast.UnaryOp(op=ast.Not(), operand=_is_cuda(tensor, node)), node)
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if (
            isinstance(node.func, ast.Name)
            and node.func.id == "is_pin_memory_available"
            and len(node.args) == 1
            and not node.keywords
        ):
            tensor = _device_of(node.args[0])
            if tensor is not None:
                self.changed += 1
                return _is_cuda(tensor, node)
        return node


def cuda_record_streams(module_names: tuple[str, ...] = RECORD_STREAM_GUARDED) -> list[str]:
    """On the CPU, make sglang's own `record_stream` calls run where a CPU guard skips them.

    sglang 0.5.22 added #34076's fix as `if batch.mix_running_indices.device.type != "cpu":
    batch.mix_running_indices.record_stream(...)` (overlap_utils.py:99-102; the FutureMap one, :453, got the
    same guard): "CPU has no cross-stream reuse hazard (and record_stream rejects CPU tensors)". The CPU
    harness does have the hazard (its virtual streams) and the recorder takes `record_stream` of a CPU tensor
    on a virtual stream (`racefuzz.trace.torch_patches`), so the harness runs what a GPU runs: each function
    holding such a guard is recompiled from the version's own source with the guard's test `True` (its line
    numbers kept) and put where the module and every module that imported it (under any name) had the old one.
    Returns `module:function` for each function replaced (none in a version without the guard)."""
    return _recompiled(module_names, _TakeCudaSide)


HOST_COPIES = (("sglang.srt.utils.common", "async_d2h"),)
"""The functions whose host-side questions the CPU harness answers as on CUDA (`cuda_host_copies`)."""


def cuda_host_copies(functions: tuple[tuple[str, str], ...] = HOST_COPIES) -> list[str]:
    """On the CPU, make sglang's copy of a device tensor to the host take its accelerator branch, as on CUDA.

    sglang 0.5.23's `async_d2h` (utils/common.py:608) asks `tensor.device.type == "cpu"` (then: the tensor
    itself) and `is_pin_memory_available(tensor.device)` (else: a blocking `tensor.to("cpu")`) where 0.5.16's
    `_async_d2h` (managers/utils.py:25) and 0.5.21-0.5.22's asked `tensor.is_cuda`. In the CPU recording's
    host/device split the device stand-in `cpu:0` is of type `cpu` (torch's `device` cannot say otherwise),
    and sglang's platform there is the base one, which has no pinned memory (platforms/device_mixin.py:170).
    So a device tensor came back as itself: `copy_to_cpu` (managers/utils.py) left `next_token_ids` on the
    device and its `.tolist()` (`_normalize_decode_outputs`, batch_result_processor.py:1127) was a device
    read-back with a sync of the schedule stream, a sync the H200 run does not make (it reads the pinned
    copy after `copy_done`'s event). The function is recompiled from the version's own source with
    `X.device.type == "cpu"` read as `not X.is_cuda` and `is_pin_memory_available(X.device)` as `X.is_cuda`
    (CUDA's answer, platforms/cuda.py:60: pinned memory for any device but `cpu`); in the split `is_cuda` is
    True for a device tensor only (`racefuzz.trace.host_memory`). Replaced where every module had it, under
    any name (managers/utils.py imports it as `_async_d2h`). Returns `module:function` for each function
    replaced (none in a version whose function asks neither)."""
    wanted: dict[str, set[str]] = {}
    for module_name, name in functions:
        wanted.setdefault(module_name, set()).add(name)
    return _recompiled(tuple(wanted), _AskAsCuda, wanted)


def _recompiled(
    module_names: tuple[str, ...], transformer_class: type[_GuardTransformer], names: dict[str, set[str]] | None = None
) -> list[str]:
    """Each function of `module_names` (by `names` where given) that `transformer_class` changes, recompiled
    from the version's own source (its line numbers kept) and put where its module and every module that
    bound it (under any name) had the old one; `module:function` for each."""
    import importlib
    import inspect

    replaced: list[str] = []
    for module_name in module_names:
        module = importlib.import_module(module_name)
        path = inspect.getsourcefile(module)
        if path is None:
            continue
        with open(path) as file:
            tree = ast.parse(file.read(), filename=path)
        for owner, node in _functions(tree):
            if names is not None and node.name not in names.get(module_name, ()):
                continue
            transformer = transformer_class()
            node = transformer.visit(node)
            if not transformer.changed:
                continue
            code = compile(ast.Module(body=[node], type_ignores=[]), path, "exec")
            namespace: dict[str, Any] = {}
            exec(code, module.__dict__, namespace)  # the version's own source, its guards' tests changed
            target: Any = getattr(module, owner) if owner else module
            old = inspect.getattr_static(target, node.name)
            new = namespace[node.name]
            setattr(target, node.name, new)
            if not owner:
                for other in list(sys.modules.values()):
                    for bound, value in list(getattr(other, "__dict__", {}).items()):
                        if value is old:
                            setattr(other, bound, new)
            replaced.append(f"{module_name}:{owner + '.' if owner else ''}{node.name}")
    return replaced


def _functions(tree: ast.Module) -> Iterator[tuple[str, ast.FunctionDef]]:
    """The module's top-level functions (owner "") and its classes' methods (owner: the class name)."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            yield "", node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    yield node.name, item


def device_positions(attn_backend: str, extend_prefix_lens: Any, extend_seq_lens: Any, extend_seq_lens_sum: int) -> Any:
    """`compute_position`'s result (each extended token's position, and each request's start in the flat
    token array) without reading a length back to the host: `extend_seq_lens_sum` is the host's count."""
    import torch

    lens = extend_seq_lens.to(torch.int64)
    start_loc = torch.zeros_like(extend_seq_lens)
    start_loc[1:] = torch.cumsum(extend_seq_lens[:-1], dim=0)
    total = int(extend_seq_lens_sum)
    offsets = torch.repeat_interleave(start_loc.to(torch.int64), lens, output_size=total)
    prefixes = torch.repeat_interleave(extend_prefix_lens.to(torch.int64), lens, output_size=total)
    positions = torch.arange(total, device=lens.device) - offsets + prefixes
    return positions, start_loc


class Adapter0515(Adapter):
    """sglang 0.5.14 to 0.5.16: the server config is published by the legacy setter
    (`server_args.set_global_server_args_for_scheduler`, 0.5.15 server_args.py:7108), the parallel
    context has a fixed field set (`runtime_context._PARALLEL_FIELDS`), and `Scheduler.__init__` takes
    the ranks as arguments."""

    name = "legacy config publication (0.5.14-0.5.20)"

    @contextlib.contextmanager
    def published(self, server_args: Any) -> Iterator[None]:
        from sglang.srt import runtime_context
        from sglang.srt.distributed import parallel_state
        from sglang.srt.server_args import set_global_server_args_for_scheduler

        # 0.5.14 has no reset_context (its context holds only the parallel overrides and server args).
        reset_context = getattr(runtime_context, "reset_context", lambda: None)

        reset_context()
        set_global_server_args_for_scheduler(server_args)
        names = ("_WORLD", "_TP", "_ATTN_TP", "_ATTN_CP", "_MOE_DP", "_MOE_EP", "_MOE_TP", "_PP")
        try:
            with contextlib.ExitStack() as stack:
                for name in names:  # the module-level groups `get_tp_group()` & co. return
                    if hasattr(parallel_state, name):
                        stack.enter_context(mock.patch.object(parallel_state, name, process_group(name)))
                stack.enter_context(self.override_groups())
                yield
        finally:
            reset_context()

    def parallel_fields(self) -> frozenset[str]:
        from sglang.srt.runtime_context import _PARALLEL_FIELDS

        return _PARALLEL_FIELDS

    def init_args(self, sgl: Any) -> tuple[Any, ...]:
        server_args, port_args = super().init_args(sgl)
        # gpu_id, tp_rank, moe_ep_rank, pp_rank, attn_cp_rank, moe_dp_rank, dp_rank
        return (server_args, port_args, 0, 0, 0, 0, 0, 0, None)


MINIMUM = (0, 5, 14)
"""The oldest version the harness drives (its `_apply_war_barrier` and `FutureMap`)."""


def adapter_for(version_text: str, python_dir: str | None = None) -> Adapter:
    """The adapter for these sources: by what they define (sglang's config publication moved to
    `runtime_context.publish(..., ranks=SpawnRanks(...))` between 0.5.20 and 0.5.21: `Adapter`; before it,
    the legacy setter and rank arguments: `Adapter0515`), refusing versions older than `MINIMUM`."""
    import os

    version = parse_version(version_text)
    if version and version < MINIMUM:
        raise Unsupported(
            f"sglang {version_text}: older than {'.'.join(map(str, MINIMUM))}: its WAR barrier is inline in the "
            "loop and enabled by is_cuda() alone (no SGLANG_ENABLE_WAR_BARRIER), which the CPU harness cannot "
            "turn on"
        )
    if python_dir is not None:
        path = os.path.join(python_dir, "sglang", "srt", "runtime_context.py")
        try:
            with open(path) as file:
                text = file.read()
        except OSError:
            raise Unsupported(f"{path} is missing: the harness drives sglang 0.5.14 and later") from None
        return Adapter() if "class SpawnRanks" in text else Adapter0515()
    if not version:
        raise Unsupported(f"sglang {version_text}: unknown version and no sources to look at")
    return Adapter() if version >= (0, 5, 21) else Adapter0515()
