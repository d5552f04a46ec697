"""Whether the CUDA backend can run here: torch and CuPy imported lazily, with the install line when missing.

Nothing here runs at import: torch and CuPy are imported by the functions, so that importing the backend
stays free on a machine without them. The first question goes to the CUDA driver itself (`libcuda.so.1`
through ctypes, `driver_device_count`): on a machine without an NVIDIA driver or GPU the answer comes in
milliseconds, where importing torch to ask costs seconds and ~200 MB.
"""

from __future__ import annotations

import ctypes
import importlib.util
import sys
from typing import Any

from racefuzz.errors import BackendUnavailable, InvalidArgument


def pip_line(torch: Any | None = None) -> str:
    """The install line for the CUDA extra that matches torch's CUDA major version (CUDA 13 by default)."""
    cuda = getattr(getattr(torch, "version", None), "cuda", None) if torch is not None else None
    extra = "cuda12" if isinstance(cuda, str) and cuda.startswith("12") else "cuda13"
    return f"pip install 'racefuzz[{extra}]'"


def import_torch() -> Any:
    """torch, or `BackendUnavailable` with the install line."""
    try:
        import torch
    except ImportError as exc:
        raise BackendUnavailable(f"torch is not installed ({exc}): {pip_line()}") from None
    return torch


def import_cupy(torch: Any | None = None) -> Any:
    """CuPy, or `BackendUnavailable` with the install line."""
    try:
        import cupy
    except ImportError as exc:
        raise BackendUnavailable(f"CuPy is not installed ({exc}): {pip_line(torch)}") from None
    return cupy


def one_line(text: object) -> str:
    """`text` (an exception's message, say) on one line: its non-blank lines joined by ` | `."""
    return " | ".join(line.strip() for line in str(text).splitlines() if line.strip())


DRIVER_LIBRARIES = {"linux": ("libcuda.so.1",), "win32": ("nvcuda.dll",)}
"""The CUDA driver library by platform (none elsewhere: macOS has no CUDA)."""


def _installed(module: str) -> bool:
    """Whether `module` can be imported, found without importing it."""
    if module in sys.modules:
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def driver_device_count() -> tuple[int | None, str]:
    """(number of CUDA devices the driver reports, "") or (None, why it cannot tell), without torch or CuPy.

    `cuInit(0)` and `cuDeviceGetCount` of the driver API; it honours CUDA_VISIBLE_DEVICES as torch does."""
    names = DRIVER_LIBRARIES.get(sys.platform, ())
    library = None
    for name in names:
        try:
            library = ctypes.CDLL(name)
            break
        except OSError:
            continue
    if library is None:
        return 0, "no NVIDIA driver here (libcuda not found)"
    try:
        status = library.cuInit(0)
        if status != 0:
            return 0, f"the CUDA driver found no usable GPU (cuInit returned error {status})"
        count = ctypes.c_int(0)
        status = library.cuDeviceGetCount(ctypes.byref(count))
    except (AttributeError, OSError) as exc:  # not a CUDA driver library after all
        return None, f"cannot query the CUDA driver: {exc}"
    if status != 0:
        return None, f"cuDeviceGetCount returned error {status}"
    return count.value, "" if count.value else "the CUDA driver reports no GPU"


def cuda_unavailable_reason() -> str | None:
    """None when torch sees a CUDA GPU and CuPy works here; otherwise why not, in one line.

    It asks the CUDA driver first (after checking, without importing it, that torch is installed): when the
    driver reports no GPU, neither torch nor CuPy is imported. It
    checks the environment only; a kernel that fails to compile is reported by `execute`, so that a broken
    kernel source fails the GPU tests instead of skipping them.
    """
    if not _installed("torch"):  # say what to install, without importing anything
        try:
            import_torch()
        except BackendUnavailable as exc:
            return str(exc)
    count, why = driver_device_count()
    if count == 0:
        return why
    try:
        torch = import_torch()
    except BackendUnavailable as exc:
        return str(exc)
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build: install a CUDA build of torch and {pip_line()}"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA GPU (torch.cuda.is_available() is False)"
    try:
        cupy = import_cupy(torch)
    except BackendUnavailable as exc:
        return str(exc)
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CuPy built for another CUDA than the driver offers, and similar
        return f"CuPy {cupy.__version__} cannot reach the GPU: {one_line(exc)}; {pip_line(torch)}"
    if count < 1:
        return f"CuPy {cupy.__version__} sees no CUDA device"
    return None


_device_count: int | None = None
"""Set once the environment passed `cuda_unavailable_reason`: how many devices torch sees."""


def require(device: int) -> tuple[Any, Any]:
    """(torch, cupy) when the GPU backend can run on `device`, else `BackendUnavailable` (one line)."""
    global _device_count
    if _device_count is None:
        reason = cuda_unavailable_reason()
        if reason is not None:
            raise BackendUnavailable(f"the CUDA backend cannot run here: {reason}")
        import torch

        _device_count = torch.cuda.device_count()
    import cupy
    import torch

    if device >= _device_count:
        raise InvalidArgument(f"CudaConfig.device is {device}, but torch sees {_device_count} CUDA device(s)")
    return torch, cupy
