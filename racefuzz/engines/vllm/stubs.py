"""Stub modules for the packages vLLM's modules import but the runner's step never calls.

vLLM imports the server's dependency set at module level (ZeroMQ, uvloop, transformers, Triton, ...).
In the harness's own subprocess only, a meta-path finder (`racefuzz.engines.sglang.stubs.StubFinder`:
the same stub machinery, with vLLM's list of packages) answers every import of a stubbed package that is
not installed with a stub module; a stubbed Triton kernel that is launched raises `StubCalled` naming it.
Triton is always stubbed on the CPU (the harness replaces the one Triton kernel a step launches, the slot
mapping: `runner.py`); on a GPU it is real.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterable

from racefuzz.engines.sglang.stubs import StubCalled, StubFinder

STUBBED = (
    "triton",
    "transformers",
    "tokenizers",
    "zmq",
    "uvloop",
    "numba",
    "cachetools",
    "blake3",
    "openai",
    "fastapi",
    "starlette",
    "uvicorn",
    "prometheus_client",
    "prometheus_fastapi_instrumentator",
    "huggingface_hub",
    "safetensors",
    "sentencepiece",
    "gguf",
    "einops",
    "cbor2",
    "pybase64",
    "setproctitle",
    "outlines_core",
    "xgrammar",
    "llguidance",
    "lm_format_enforcer",
    "lark",
    "partial_json_parser",
    "diskcache",
    "compressed_tensors",
    "depyf",
    "watchfiles",
    "aiohttp",
    "tiktoken",
    "mistral_common",
    "cv2",
    "ray",
    "flashinfer",
    "vllm_flash_attn",
    "pynvml",
    "nvtx",
    "cupy",
    "torchvision",
    "torchaudio",
    "peft",
    "datasets",
    "ijson",
    "anthropic",
    "opentelemetry",
    "model_hosting_container_standards",
    "apache_tvm_ffi",
    "tvm_ffi",
    "quack",
    "deep_gemm",
    "deep_ep",
    "kernels",
    "soundfile",
    "librosa",
    "av",
    "pydantic_settings",
    "openai_harmony",
    "grpc",
    "triton_kernels",
    "flash_attn",
    "nixl",
    "mooncake",
    "lmcache",
    "gpt_oss",
    "cpuinfo",
    "xformers",
    "flashinfer_python",
    "nvidia",
    "cuda",
    "pplx_kernels",
    "aiter",
    "amdsmi",
    "tpu_info",
    "python_multipart",
    "multipart",
    "email_validator",
    "ninja",
    "setuptools_scm",
    "pillow_heif",
)
"""Top-level packages stubbed when not importable (an installed one wins, except Triton on the CPU)."""


def _settle_torch() -> None:
    """Let torch decide "no Triton" and import the inductor modules vLLM reaches before the stub exists:
    they check a real Triton's types at import."""
    import torch.utils._triton as torch_triton

    torch_triton.has_triton_package()
    torch_triton.has_triton()
    import torch._dynamo
    import torch._inductor.compile_fx
    import torch._inductor.kernel.flex.flex_attention
    import torch._inductor.select_algorithm  # noqa: F401


ALWAYS_STUBBED = ("transformers",)
"""Stubbed even where installed, on both devices, as the CPU CI (which does not install it) has it: a host's
transformers may import packages the host lacks (the H200 host's imports `soxr` from `audio_utils`, and both
0.10.2 and 0.33.0 failed there on it); the runner's step calls none of it."""

FORCE_ENV = "RACEFUZZ_VLLM_STUB"
"""Comma-separated packages to stub even when installed (ci/vllm_gpu.sh: light packages a bare GPU host
lacks, stubbed on the CPU too in its dry run)."""


def install(force: Iterable[str] = ("triton",)) -> list[str]:
    """Put a `StubFinder` first on `sys.meta_path` for every package of `STUBBED` not importable, and for
    `ALWAYS_STUBBED` and those in `force` or `$RACEFUZZ_VLLM_STUB` even when installed; returns the stubbed
    names (sorted). Subprocess only."""
    force = ALWAYS_STUBBED + tuple(force) + tuple(name for name in os.environ.get(FORCE_ENV, "").split(",") if name)
    if "triton" in force:
        _settle_torch()
    roots = []
    for name in STUBBED + tuple(n for n in force if n not in STUBBED):
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
    return sorted(roots)


__all__ = ["ALWAYS_STUBBED", "STUBBED", "StubCalled", "install"]
