"""An engine harness's `--device`, one mechanism for sglang and vLLM: `cpu` (virtual streams), `cuda` (a real
GPU: torch.cuda's streams and events), or `auto` (`cuda` where torch sees a CUDA device). Imports torch only to
ask whether it sees one.
"""

from __future__ import annotations

from racefuzz.errors import InvalidArgument

DEVICES = ("cpu", "cuda", "auto")


class NoGpu(InvalidArgument):
    """`--device cuda` on a machine where torch sees no CUDA device (one line, exit 2)."""


def resolve_device(device: str) -> str:
    """`cpu` / `cuda` as asked; `auto`: `cuda` if torch sees a CUDA device, else `cpu` (torch missing: none).
    `cuda` without one is `NoGpu`; any other name a `ValueError`."""
    if device == "cpu":
        return "cpu"
    try:
        import torch

        available = bool(torch.cuda.is_available())
    except ImportError:
        available = False
    if device == "auto":
        return "cuda" if available else "cpu"
    if device == "cuda" and not available:
        raise NoGpu("--device cuda: torch sees no CUDA device here (torch.cuda.is_available() is False)")
    if device != "cuda":
        raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {device!r}")
    return device
