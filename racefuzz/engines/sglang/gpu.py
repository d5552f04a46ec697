"""What the harness does differently on a real GPU (`racefuzz sglang --device cuda`).

* **Streams and events are torch.cuda's own.** The recorder sees `torch.cuda`'s methods on a GPU run
  (`racefuzz.trace.capture`'s patches), so the CPU's device shim (`device.DeviceModule`) is not used.
  `CudaDeviceModule` is `torch.cuda` itself except for one thing: a stream sglang makes is named after the
  attribute its line assigns it to (`schedule_stream`, `forward_stream`, `copy_stream`), as on the CPU, so
  that a GPU run's JSON names the same streams (`Recorder.name_stream` on the new stream's handle).
* **The fake forward reads `req_to_token` with sglang's own Triton kernel**,
  `create_flashinfer_kv_indices_triton` (the CPU runs a torch stand-in: Triton is stubbed there), found in
  the version's sources (`KV_INDICES_MODULES`), and launched as sglang's attention backends launch it:
  `kernel[(bs,)](req_to_token, req_pool_indices, seq_lens, kv_indptr, None, kv_indices, stride)`.
* **The negative control** cannot use `SGLANG_ENABLE_WAR_BARRIER=0` on a GPU: `run_event_loop` computes
  `self._war_barrier_enabled = is_cuda() or envs.SGLANG_ENABLE_WAR_BARRIER.get()` (0.5.15 scheduler.py:1512,
  0.5.16 :1498, 0.5.23 :2007; 0.5.14 :1482 adds `and not self.spec_algorithm.is_dflash()`), and `is_cuda()`
  is True there. The harness's `Scheduler` subclass overrides `_apply_war_barrier` for the control run
  only (`scheduler.build_and_run`): it sets `_war_barrier_enabled = False` and calls the version's own
  method, whose first statement is `if not self._war_barrier_enabled: return` (0.5.15 :1522, 0.5.16
  :1509, 0.5.23 :2015, 0.5.14 :1494). Why this and not patching `is_cuda`: `is_cuda()` decides many other
  CUDA branches of the loop (FutureMap's pinned buffers, the stream-alias redraw, `schedule_stream`'s
  synchronize), which the control must keep as the run under test has them; the override is confined to
  the harness's own subclass and changes only the barrier's flag, through the version's own guard.

Nothing here is imported on a CPU run. Each CUDA-only call checks `torch.cuda.is_available()` first.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any

from racefuzz.engines.sglang.device import assigned_name

KV_INDICES_MODULES = (
    "sglang.kernels.ops.attention.kv_indices",  # 0.5.23
    "sglang.kernels.ops.kvcache.kv_indices",  # 0.5.16
    "sglang.srt.layers.attention.triton_ops.kv_indices",  # 0.5.14, 0.5.15
)
"""Where `create_flashinfer_kv_indices_triton` lives, newest first (it moved between versions)."""


class CudaDeviceModule:
    """`torch.cuda`, with the streams sglang makes named after the attribute they are assigned to."""

    def __init__(self, env: Any) -> None:
        import torch

        self._env = env
        self._cuda = torch.cuda
        self._count = 0
        self.streams: list[Any] = []

    def Stream(self, *args: Any, **kwargs: Any) -> Any:
        stream = self._cuda.Stream(*args, **kwargs)
        name = assigned_name(2) or f"stream#{self._count}"
        if name in {given for given, _ in self.streams}:
            name = f"{name}#{self._count}"
        self._count += 1
        self._env._recorder.name_stream(stream.cuda_stream, name)
        self.streams.append((name, stream))
        return stream

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cuda, name)


@contextlib.contextmanager
def installed(module: CudaDeviceModule) -> Iterator[CudaDeviceModule]:
    """`torch.get_device_module("cuda")` (or no argument) returns `module` inside the block; any other
    device gets torch's own answer."""
    import torch

    original = torch.get_device_module

    def get_device_module(device: Any = None) -> Any:
        if device is None or "cuda" in str(device):
            return module
        return original(device)

    torch.get_device_module = get_device_module  # type: ignore[assignment]
    try:
        yield module
    finally:
        torch.get_device_module = original  # type: ignore[assignment]


def kv_indices_kernel() -> Any:
    """sglang's `create_flashinfer_kv_indices_triton` from the version's sources (real Triton)."""
    for name in KV_INDICES_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        kernel = getattr(module, "create_flashinfer_kv_indices_triton", None)
        if kernel is not None:
            return kernel
    raise RuntimeError(
        "create_flashinfer_kv_indices_triton is in none of " + ", ".join(KV_INDICES_MODULES) + " (the GPU fake "
        "forward launches it)"
    )


def triton_kv_indices(
    req_to_token: Any, req_pool_indices: Any, seq_lens: Any, kv_indptr: Any, kv_indices: Any, max_len: int
) -> None:
    """The fake forward's read on a GPU: sglang's kernel, on the current stream, as the FlashInfer and
    Triton backends launch it (one program per request; `kv_start_idx` None). `kv_indices` is flat, sized
    for `bs * max_len` (no host read of the lengths)."""
    kernel = kv_indices_kernel()
    bs = int(req_pool_indices.shape[0])
    kernel[(bs,)](
        req_to_token,
        req_pool_indices,
        seq_lens,
        kv_indptr,
        None,
        kv_indices,
        req_to_token.shape[1],
    )
