"""A device-module shim: what sglang asks `torch.get_device_module(device)` / `torch.cuda` for (`Stream`,
`Event`, `stream(...)`, `StreamContext`, `current_stream`, `synchronize`), answered with a `TraceEnv`'s
streams and events, so that every stream, event, record, wait and sync sglang's own code makes on the CPU
is recorded as it would be on a GPU.

On a GPU run the env's streams are real CUDA streams and the recorder sees torch.cuda's own methods; the
shim is only installed for CPU runs (`install(env)` patches `torch.get_device_module` for the run).

`host_memory_split()` is the CPU run's host/device split (`racefuzz.trace.host_memory`): the fake worker's
device is the stand-in `cpu:0`, so sglang's device tensors are on it and its host tensors (`*_cpu`, the
results it copies to the host) on `cpu`, recorded as the host's accesses, as a GPU run records pinned memory.
"""

from __future__ import annotations

import contextlib
import linecache
import re
import sys
from collections.abc import Iterator
from typing import Any


class _StreamContext:
    """`device_module.stream(s)` / `StreamContext(s)`: re-enterable (sglang keeps one as
    `forward_stream_ctx` and enters it every iteration)."""

    def __init__(self, env: Any, stream: Any) -> None:
        self._env = env
        self.stream = stream
        self._active: list[Any] = []

    def __enter__(self) -> Any:
        if self.stream is None:
            self._active.append(contextlib.nullcontext())
        else:
            self._active.append(self._env.use(self.stream))
        self._active[-1].__enter__()
        return self.stream

    def __exit__(self, *exc: Any) -> None:
        self._active.pop().__exit__(*exc)


_ASSIGNED = re.compile(r"^\s*(?:self\.)?(\w+)\s*(?::[^=]*)?=(?!=).*\bStream\(")
"""`self.name = ...Stream(`, `self.name: T = ...Stream(`, `name = None if x else ...Stream(`."""


def assigned_name(depth: int) -> str | None:
    """The name the caller's source line assigns the new stream to (`self.schedule_stream = ...Stream(`)."""
    frame = sys._getframe(depth)
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
    found = _ASSIGNED.search(line)
    return found.group(1) if found else None


class DeviceModule:
    """`torch.cuda`'s stream and event API over a `TraceEnv` (CPU run). A stream is named after the
    attribute sglang's line assigns it to (`self.schedule_stream = self.device_module.Stream(...)` makes
    `schedule_stream`), else `stream#k`."""

    def __init__(self, env: Any) -> None:
        self._env = env
        self._count = 0
        self.streams: list[Any] = []

    def Stream(self, *args: Any, **kwargs: Any) -> Any:
        name = assigned_name(2) or f"stream#{self._count}"
        taken = {stream.name for stream in self.streams}
        if name in taken:
            name = f"{name}#{self._count}"
        self._count += 1
        stream = self._env.stream(name)
        self.streams.append(stream)
        return stream

    def Event(self, *args: Any, **kwargs: Any) -> Any:
        return self._env.event()

    def stream(self, stream: Any) -> _StreamContext:
        return _StreamContext(self._env, stream)

    def StreamContext(self, stream: Any) -> _StreamContext:
        return _StreamContext(self._env, stream)

    def current_stream(self, device: Any = None) -> Any:
        return self._env.current_stream()

    def default_stream(self, device: Any = None) -> Any:
        return self._env.current_stream()

    def set_stream(self, stream: Any) -> None:
        raise NotImplementedError("set_stream is not faked: sglang's overlap loop uses stream contexts")

    def synchronize(self, device: Any = None) -> None:
        self._env.synchronize()

    def is_available(self) -> bool:
        return False

    def current_device(self) -> int:
        return 0

    def device_count(self) -> int:
        return 1

    def empty_cache(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        import torch

        return getattr(torch.cpu, name)


@contextlib.contextmanager
def installed(module: DeviceModule) -> Iterator[DeviceModule]:
    """`torch.get_device_module(anything)` returns `module` inside the block (CPU runs)."""
    import torch

    original = torch.get_device_module
    torch.get_device_module = lambda device=None: module  # type: ignore[assignment]
    try:
        yield module
    finally:
        torch.get_device_module = original  # type: ignore[assignment]


@contextlib.contextmanager
def host_memory_split() -> Iterator[Any]:
    """The CPU run's host/device split (module doc) for the block. sglang asks for the device's free
    memory once, at init (`Scheduler.init_model_worker` -> `get_available_gpu_memory(self.device, ...)`,
    0.5.14 scheduler.py:931, 0.5.15 :940, 0.5.23 :1264), which knows `cpu` but not `cpu:0`: the stand-in is
    answered as `cpu` there (a log line and a startup figure; nothing the loop reads)."""
    from sglang.srt.managers import scheduler

    from racefuzz.trace.host_memory import DEVICE, HostTensors

    asked = scheduler.get_available_gpu_memory

    def available_memory(device: Any, *args: Any, **kwargs: Any) -> Any:
        return asked("cpu" if str(device) == DEVICE else device, *args, **kwargs)

    scheduler.get_available_gpu_memory = available_memory
    try:
        with HostTensors().recorded() as host_tensors:
            yield host_tensors
    finally:
        scheduler.get_available_gpu_memory = asked
