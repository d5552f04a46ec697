"""Stub modules for the packages sglang imports but its overlap loop's sync path never calls.

sglang's modules import the server's whole dependency set at module level (tokenizers, ZeroMQ, FastAPI,
Triton, ...). The harness runs the scheduler's loop against a fake model on the CPU: none of those packages
is *called* there. So, in the harness's own subprocess only, a meta-path finder answers every import of a
stubbed top-level package with a `StubModule` whose attributes are `StubType` classes (subclassable,
callable, decorators pass functions through). A stub that is *called* in a way that matters raises
`StubCalled` naming itself, so a version whose loop reaches a stubbed package fails loudly instead of
silently doing nothing.

Triton is special: `@triton.jit` kernels must not be launchable silently. `triton.jit(fn)` returns a
`StubKernel` whose launch (`kernel[grid](...)`) raises `StubCalled` with the kernel's name; the harness
configures sglang so that its sync path takes the torch branches (see `scheduler.py`).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from collections.abc import Callable, Iterable
from typing import Any

STUBBED = (
    # Light packages imported at module level that a bare torch host (the H200's) lacks; the CPU CI has some
    # of them real (pip's own dependencies), and 0.5.14, 0.5.15, 0.5.16, 0.5.23 give the same verdicts
    # with all of them stubbed.
    "IPython",
    "PIL",
    "requests",
    "yaml",
    "tqdm",
    "pydantic",
    "pydantic_core",
    "annotated_types",
    "typing_inspection",
    "certifi",
    "charset_normalizer",
    "idna",
    "urllib3",
    "triton",
    "torchvision",
    "transformers",
    "tokenizers",
    "zmq",
    "msgspec",
    "aiohttp",
    "starlette",
    "fastapi",
    "uvicorn",
    "uvloop",
    "huggingface_hub",
    "setproctitle",
    "tvm_ffi",
    "sentencepiece",
    "compressed_tensors",
    "gguf",
    "openai",
    "partial_json_parser",
    "einops",
    "dill",
    "pybase64",
    "psutil",
    "orjson",
    "xgrammar",
    "outlines",
    "llguidance",
    "flashinfer",
    "sgl_kernel",
    "safetensors",
    "tiktoken",
    "interegular",
    "blobfile",
    "sglang_router",
    "torchao",
    "prometheus_client",
    "decord",
    "soundfile",
    "pynvml",
    "cuda",
    "modelscope",
    "hf_transfer",
    "datasets",
    "timm",
    "cv2",
    "av",
    "python_multipart",
    "multipart",
    "ipdb",
    "mooncake",
    "nixl",
    "deep_gemm",
    "deep_ep",
    "flash_attn",
    "vllm",
    "kernels",
    "watchfiles",
    "anthropic",
    "accelerate",
    "peft",
    "quack",
    "apache_tvm_ffi",
    "mlx",
    "triton_kernels",
    "ray",
    "aiofiles",
    "websockets",
    "wandb",
    "nvtx",
    "cuda_python",
    "torch_memory_saver",
    "pydantic_settings",
)
"""Top-level packages the harness stubs when they are not importable (a real installed one wins, except
Triton on the CPU: see `install`)."""


class StubCalled(RuntimeError):
    """A stubbed package was used in a way the harness cannot fake: its code is on the path being run."""


_DUNDERS_SERVED = frozenset({"__class_validators__"})
"""The only dunder names a stub answers (sglang patches transformers' validators at import); Python, torch
and pydantic probe objects for the others, and a stub must not claim any of those protocols."""


def _refused(name: str) -> bool:
    return (name.startswith("__") and name not in _DUNDERS_SERVED) or name.startswith("_abc")


class _StubMeta(type):
    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if (
            cls.__module__ == "stub"
            and cls.__qualname__.startswith(("triton.runtime.", "triton.testing."))
            and not (len(args) == 1 and not kwargs and callable(args[0]))
        ):
            raise StubCalled(f"{cls.__qualname__} was called, and Triton is stubbed on the CPU harness")
        return super().__call__(*args, **kwargs)

    def __getattr__(cls, name: str) -> Any:
        if _refused(name):
            raise AttributeError(name)
        child = _stub_type(f"{cls.__qualname__}.{name}")
        setattr(cls, name, child)
        return child

    def __getitem__(cls, item: Any) -> Any:
        return cls

    def __setitem__(cls, item: Any, value: Any) -> None:
        pass

    def __contains__(cls, item: Any) -> bool:
        return False

    def __or__(cls, other: Any) -> Any:
        return cls

    def __ror__(cls, other: Any) -> Any:
        return cls

    def __iter__(cls) -> Any:
        return iter(())

    def __len__(cls) -> int:
        return 0

    def __bool__(cls) -> bool:
        return False


class StubType(metaclass=_StubMeta):
    """A stubbed name: a class (so it can be subclassed, used in isinstance and annotations); calling it
    with one function or class returns that object (decorators), anything else makes an instance."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and (callable(args[0]) and hasattr(args[0], "__name__")):
            return args[0]
        return super().__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __init_subclass__(cls, **kwargs: Any) -> None:
        pass

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        return core_schema.any_schema()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and callable(args[0]) and hasattr(args[0], "__name__"):
            return args[0]
        return self

    def __getattr__(self, name: str) -> Any:
        if _refused(name):
            raise AttributeError(name)
        return getattr(type(self), name)

    def __getitem__(self, item: Any) -> Any:
        return self if not isinstance(item, slice) else []

    def __setitem__(self, item: Any, value: Any) -> None:
        pass

    def __contains__(self, item: Any) -> bool:
        return False

    def __iter__(self) -> Any:
        return iter(())

    def __len__(self) -> int:
        return 0

    def __bool__(self) -> bool:
        return False


def _stub_type(qualname: str) -> type:
    stub = _StubMeta(qualname.rsplit(".", 1)[-1], (StubType,), {"__qualname__": qualname, "__module__": "stub"})
    return stub


def _assign_req_to_token_pool(**a: Any) -> None:
    """sglang's `assign_req_to_token_pool` (speculative/triton_ops/cache_locs.py, the same in 0.5.14 and
    0.5.15): `req_to_token[req_pool_indices[i], start_offset[i]:end_offset[i]]` takes the next
    `end - start` entries of `out_cache_loc`, the rows in order. Device ops only (no host read)."""
    import torch

    table, rows = a["req_to_token"], a["req_pool_indices"].to(torch.int64)
    start, end = a["start_offset"].to(torch.int64), a["end_offset"].to(torch.int64)
    source = a["out_cache_loc"]
    before = torch.cumsum(end - start, dim=0) - (end - start)
    cols = torch.arange(table.shape[1], device=table.device)[None, :]
    inside = (cols >= start[:, None]) & (cols < end[:, None])
    at = (before[:, None] + cols - start[:, None]).clamp(0, max(int(source.numel()) - 1, 0))
    values = source.reshape(-1)[at].to(table.dtype) if source.numel() else torch.zeros_like(table[rows])
    table[rows] = torch.where(inside, values, table[rows])


def _prepare_dflash_draft_block(**a: Any) -> None:
    """sglang's `_prepare_dflash_draft_block_contig_kernel` (0.5.14 speculative/triton_ops/
    dflash_prepare_block.py; 0.5.15 triton_ops/dflash.py, its first argument renamed `bonus_tokens_ptr`):
    row i's block is the bonus token then `mask_token_id`s, its positions `prefix_lens[i] + j`, and its
    KV slots `req_to_token[req_pool_indices[i], prefix_lens[i] + j]` (0 past the table's width)."""
    import torch

    first = a["verified_id_ptr"] if "verified_id_ptr" in a else a["bonus_tokens_ptr"]
    table = a["req_to_token_ptr"]
    block, width = int(a["block_size"]), int(a["req_to_token_width"])
    positions = a["prefix_lens_ptr"].to(torch.int64)[:, None] + torch.arange(block, device=table.device)[None, :]
    valid = positions < width
    rows = a["req_pool_indices_ptr"].to(torch.int64)[:, None]
    slots = torch.where(valid, table[rows, positions.clamp(max=width - 1)], torch.zeros_like(positions))
    ids = torch.full_like(positions, int(a["mask_token_id"]))
    ids[:, 0] = first.to(torch.int64)
    a["block_ids_out_ptr"].copy_(ids)
    a["positions_out_ptr"].copy_(positions)
    a["cache_loc_out_ptr"].copy_(slots)


def _block_reads(args: Any) -> list[Any]:
    """The rows `_prepare_dflash_draft_block_contig_kernel` reads: `req_to_token[row_i, p_i : p_i + block]`."""
    table = args["req_to_token_ptr"]
    block, width = int(args["block_size"]), int(args["req_to_token_width"])
    rows = [int(x) for x in args["req_pool_indices_ptr"].tolist()]
    starts = [int(x) for x in args["prefix_lens_ptr"].tolist()]
    return [
        table[row, start : min(start + block, width)] for row, start in zip(rows, starts, strict=True) if start < width
    ]


def _alloc_extend(**a: Any) -> None:
    """sglang's `alloc_extend_kernel` (0.5.15 mem_cache/triton_ops/allocator.py, 0.5.23
    kernels/ops/memory/allocator.py; the paged allocator's `alloc_extend` launches it wherever Triton runs):
    request i's `seq_lens[i] - pre_lens[i]` new slots, in order, go to `out_indices` from the running sum of
    the earlier requests' extends: first the rest of its last page (`last_loc[i] + 1 + j`), then whole new
    pages, then a partial one, its new pages taken in order from `free_page_ptr` after the earlier requests'.
    Device ops only (no host read): the same arithmetic as 0.5.23's own torch fallback `alloc_extend_naive`
    (allocator/paged.py), which 0.5.15's allocator does not call."""
    import torch

    prefix, seq = a["pre_lens_ptr"].to(torch.int64), a["seq_lens_ptr"].to(torch.int64)
    last_loc, free_pages, out = a["last_loc_ptr"].to(torch.int64), a["free_page_ptr"], a["out_indices"]
    page = int(a["page_size"])
    total = int(out.shape[0])
    if total == 0:
        return
    extend = seq - prefix
    end_pos = torch.cumsum(extend, 0)
    start_pos = end_pos - extend
    j = torch.arange(total, device=out.device, dtype=torch.int64)
    owner = torch.searchsorted(end_pos, j, right=True)
    local = j - start_pos[owner]
    ceil_prefix = (prefix + page - 1) // page * page
    floor_seq = seq // page * page
    num1 = torch.clamp(seq, max=ceil_prefix) - prefix
    done_after_1 = (prefix + num1) == seq
    num2 = torch.where(done_after_1, torch.zeros_like(num1), floor_seq - ceil_prefix)
    num3 = torch.where(done_after_1, torch.zeros_like(num1), seq - floor_seq)
    pages_per_req = num2 // page + (num3 > 0).to(torch.int64)
    end_new_pages = torch.cumsum(pages_per_req, 0)
    start_new_pages = end_new_pages - pages_per_req
    last = max(int(free_pages.numel()) - 1, 0)
    pool = free_pages.to(torch.int64) if free_pages.numel() else torch.zeros(1, dtype=torch.int64, device=out.device)
    rel2 = torch.clamp(local - num1[owner], min=0)
    phase2 = pool[torch.clamp(start_new_pages[owner] + rel2 // page, 0, last)] * page + rel2 % page
    rel3 = torch.clamp(local - num1[owner] - num2[owner], min=0)
    phase3 = pool[torch.clamp(end_new_pages[owner] - 1, 0, last)] * page + rel3
    in_phase1 = local < num1[owner]
    in_phase2 = (~in_phase1) & (local < num1[owner] + num2[owner])
    value = torch.where(in_phase1, last_loc[owner] + 1 + local, torch.where(in_phase2, phase2, phase3))
    out.copy_(value.to(out.dtype))


def _alloc_decode(**a: Any) -> None:
    """sglang's `alloc_decode_kernel` (as `alloc_extend_kernel`, beside it): request i's one new slot is
    `last_loc[i] + 1`, or, when its new length `seq_lens[i]` starts a page, the first slot of the next free
    page (the pages taken in request order). Device ops only."""
    import torch

    seq, last_loc = a["seq_lens_ptr"].to(torch.int64), a["last_loc_ptr"].to(torch.int64)
    free_pages, out, page = a["free_page_ptr"], a["out_indices"], int(a["page_size"])
    if int(out.shape[0]) == 0:
        return
    starts_page = ((seq - 1) % page == 0).to(torch.int64)
    rank = torch.cumsum(starts_page, 0) - starts_page
    last = max(int(free_pages.numel()) - 1, 0)
    pool = free_pages.to(torch.int64) if free_pages.numel() else torch.zeros(1, dtype=torch.int64, device=out.device)
    value = torch.where(starts_page.bool(), pool[rank.clamp(0, last)] * page, last_loc + 1)
    out.copy_(value.to(out.dtype))


CPU_EQUIVALENTS: dict[str, Callable[..., None]] = {
    "assign_req_to_token_pool": _assign_req_to_token_pool,
    "_prepare_dflash_draft_block_contig_kernel": _prepare_dflash_draft_block,
    "alloc_extend_kernel": _alloc_extend,
    "alloc_decode_kernel": _alloc_decode,
}
"""The Triton kernels of sglang's DFLASH path that touch `req_to_token`, and of the paged KV allocator
(`PagedTokenToKVPoolAllocator.alloc_extend` / `alloc_decode`: 0.5.15 launches them whatever the device), as
torch ops: under the stubbed Triton a launch of one of these runs its equivalent through
`racefuzz.trace.launch_kernel` (one launch, recorded with `register_annotations`'s read and write sets), so
the CPU harness runs the code path a GPU takes. Any other kernel still refuses (`StubCalled`)."""


def register_annotations() -> None:
    """The read and write sets of `CPU_EQUIVALENTS`' kernels (the same names on a GPU, where the recorder
    sees sglang's real Triton launches): the rows each touches, exactly; and of DFLASH's accept/bonus
    kernel (0.5.14 `triton_ops/dflash_accept_bonus.py`, 0.5.15 `triton_ops/dflash.py`, the same names)."""
    from racefuzz.trace.annotations import WHOLE, annotate, rows

    annotate(
        "assign_req_to_token_pool",
        reads={"req_pool_indices": WHOLE, "start_offset": WHOLE, "end_offset": WHOLE, "out_cache_loc": WHOLE},
        writes={"req_to_token": rows("req_to_token", "req_pool_indices", starts="start_offset", ends="end_offset")},
    )
    annotate(
        "_prepare_dflash_draft_block_contig_kernel",
        reads={
            "req_to_token_ptr": _block_reads,
            "verified_id_ptr": WHOLE,
            "bonus_tokens_ptr": WHOLE,
            "prefix_lens_ptr": WHOLE,
            "req_pool_indices_ptr": WHOLE,
        },
        writes={"block_ids_out_ptr": WHOLE, "positions_out_ptr": WHOLE, "cache_loc_out_ptr": WHOLE},
    )
    # The paged allocator's kernels: they read the lengths, the last slots and the free pages and write only
    # their output (the allocator then re-slices `free_pages` on the host side).
    annotate(
        "alloc_extend_kernel",
        reads={"pre_lens_ptr": WHOLE, "seq_lens_ptr": WHOLE, "last_loc_ptr": WHOLE, "free_page_ptr": WHOLE},
        writes={"out_indices": WHOLE},
    )
    annotate(
        "alloc_decode_kernel",
        reads={"seq_lens_ptr": WHOLE, "last_loc_ptr": WHOLE, "free_page_ptr": WHOLE},
        writes={"out_indices": WHOLE},
    )
    # Launched for real on a GPU only (the CPU takes sglang's eager accept path): without its sets the
    # recorder would take `prefix_lens_ptr` (the batch's seq_lens) as written too.
    annotate(
        "_dflash_accept_bonus_contig_kernel",
        reads={"candidates_ptr": WHOLE, "target_top1_ptr": WHOLE, "prefix_lens_ptr": WHOLE},
        writes={
            "accept_lens_out_ptr": WHOLE,
            "commit_lens_out_ptr": WHOLE,
            "bonus_ids_out_ptr": WHOLE,
            "out_tokens_ptr": WHOLE,
            "new_seq_lens_out_ptr": WHOLE,
        },
    )


LAUNCH_SITES: list[tuple[int, str]] = []
"""(trace position, sglang's callers) of every `CPU_EQUIVALENTS` launch, for a race report to name the
sglang line that launched the kernel (the recorder's own source line is this module's launcher)."""


def _launch_site(frame: Any, depth: int = 4) -> str:
    links = []
    while frame is not None and len(links) < depth:
        name = frame.f_code.co_filename
        at = name.rfind(f"{os.sep}sglang{os.sep}srt{os.sep}")
        if at >= 0:
            links.append(f"{name[at + 1 :]}:{frame.f_lineno} ({frame.f_code.co_name})")
        frame = frame.f_back
    return " <- ".join(links)


class StubKernel:
    """`triton.jit(fn)` in a stubbed Triton: launching it runs its `CPU_EQUIVALENTS` entry, else raises
    `StubCalled` naming the kernel."""

    def __init__(self, fn: Any = None, **kwargs: Any) -> None:
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", "kernel")
        self.__doc__ = getattr(fn, "__doc__", None)

    def __getitem__(self, grid: Any) -> Any:
        equivalent = CPU_EQUIVALENTS.get(self.__name__)

        def launch(*args: Any, **kwargs: Any) -> Any:
            if equivalent is None:
                raise StubCalled(
                    f"the Triton kernel {self.__name__} was launched, and Triton is stubbed on the CPU harness "
                    "(install triton, or keep this kernel off the harness's path)"
                )
            import inspect

            from racefuzz.trace.capture import active, launch_kernel

            recorder = active()
            position = len(recorder.builder.ops) if recorder is not None else -1
            LAUNCH_SITES.append((position, _launch_site(sys._getframe(1))))

            parameters = inspect.signature(self.fn).parameters
            bound = dict(zip(parameters, args, strict=False))  # args may stop before the defaults
            bound.update({k: v for k, v in kwargs.items() if k in parameters})  # not num_warps & co.
            return launch_kernel(self.__name__, equivalent, kind="triton", **bound)

        return launch

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and callable(args[0]):
            return StubKernel(args[0])
        raise StubCalled(f"the Triton function {self.__name__} was called outside a kernel")


def _triton_decorator(*args: Any, **kwargs: Any) -> Any:
    if len(args) == 1 and not kwargs and callable(args[0]):
        return StubKernel(args[0])
    return lambda fn: StubKernel(fn)


class StubModule(types.ModuleType):
    """A stubbed module: every attribute is a `StubType` (or a stubbed submodule, when imported as one)."""

    __path__: list[str]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        if self.__name__.split(".")[0] == "triton" and name in ("jit", "autotune", "heuristics"):
            value: Any = _triton_decorator
        elif self.__name__.split(".")[0] == "triton" and name == "cdiv":
            value = lambda a, b: -(-a // b)  # noqa: E731
        elif self.__name__.split(".")[0] == "triton" and name == "next_power_of_2":
            value = lambda n: 1 << max(0, int(n) - 1).bit_length()  # noqa: E731
        else:
            value = _stub_type(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _StubLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = StubModule(spec.name)
        module.__path__ = []
        module.__file__ = f"<racefuzz stub {spec.name}>"
        if spec.name == "triton":
            module.__version__ = "3.5.0"
        else:
            module.__version__ = "99.0.0"
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class StubFinder(importlib.abc.MetaPathFinder):
    """Answers imports of the stubbed top-level packages (and everything under them) with stub modules."""

    def __init__(self, roots: Iterable[str]) -> None:
        self.roots = frozenset(roots)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(fullname, _StubLoader(), is_package=True)
        return None


def _settle_torch_before_triton_stub() -> None:
    """Let torch decide "no Triton" before the stub exists: torch probes for Triton (cached) and its
    inductor modules check a real Triton's types at import; imported first, they see none."""
    import torch
    import torch.utils._triton as torch_triton

    torch_triton.has_triton_package()
    torch_triton.has_triton()
    import torch._dynamo
    import torch._inductor.compile_fx

    del torch


STUBBED_OPERATORS = {
    "sgl_kernel": (
        "moe_fused_gate(Tensor input_tensor, Tensor bias, int num_expert_group, int topk_group, int topk, "
        "int num_fused_shared_experts=0, float routed_scaling_factor=0, "
        "bool apply_routed_scaling_factor_on_output=False) -> (Tensor, Tensor)",
    ),
}
"""Operator schemas a stubbed package's C++ library would register, for sglang code that names them at
import: sglang 0.5.14's `srt/layers/moe/topk.py` (module level, under `if _is_cuda:`, so on a GPU only)
calls `torch.library.register_fake("sgl_kernel::moe_fused_gate")`, which needs the operator to exist
(the real `sgl_kernel` defines it when it loads; 0.5.15 dropped the registration). Schema only: calling
one raises (no kernel), and the sync path never does."""

_LIBRARIES: list[Any] = []
"""The `torch.library.Library` fragments holding `STUBBED_OPERATORS` (alive for the process)."""


def define_stubbed_operators(packages: Iterable[str]) -> list[str]:
    """Define `STUBBED_OPERATORS`' schemas of the stubbed `packages` that do not exist yet; their names."""
    import torch

    defined = []
    for package in packages:
        for schema in STUBBED_OPERATORS.get(package, ()):
            name = f"{package}::{schema.split('(', 1)[0]}"
            try:
                torch._C._dispatch_find_schema_or_throw(name, "")
                continue  # defined already (an earlier call, or the package's own library)
            except RuntimeError:
                pass
            library = torch.library.Library(package, "FRAGMENT")
            library.define(schema)
            _LIBRARIES.append(library)
            defined.append(name)
    return defined


ALWAYS_STUBBED = ("transformers", "huggingface_hub", "tokenizers", "safetensors")
"""Stubbed even where installed, on both devices, so that every host runs the loop against what the CPU CI
(which installs none of them) has: a host's newer transformers registers model configs that sglang 0.5.14-0.5.16
register again at import ("'qwen3_asr' is already used by a Transformers config"), a host's transformers may
import audio packages it lacks (`soxr` on the H200 host), and a real huggingface_hub under a stubbed
transformers refuses sglang's config classes ("must be a dataclass before applying @strict"). The loop calls
none of them."""

FORCE_ENV = "RACEFUZZ_SGLANG_STUB"
"""Comma-separated packages to stub even when installed (besides Triton and `ALWAYS_STUBBED`)."""


def install(force: Iterable[str] = ("triton",)) -> list[str]:
    """Put a `StubFinder` first on `sys.meta_path` for every package of `STUBBED` that is not importable,
    and for `ALWAYS_STUBBED` and those in `force` even when they are; returns the stubbed names (sorted).
    Call it in the harness's subprocess only: it changes imports for the whole process."""
    _settle_torch_before_triton_stub()
    force = ALWAYS_STUBBED + tuple(force) + tuple(name for name in os.environ.get(FORCE_ENV, "").split(",") if name)
    roots = []
    for name in (*STUBBED, *(name for name in force if name not in STUBBED)):
        if name in force:
            roots.append(name)
            continue
        try:
            found = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            found = None
        if found is None:
            roots.append(name)
    for name in list(sys.modules):
        if name.split(".")[0] in force:
            del sys.modules[name]
    sys.meta_path.insert(0, StubFinder(roots))
    define_stubbed_operators(roots)
    return sorted(roots)
