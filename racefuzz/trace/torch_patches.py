"""What a recording patches in torch besides its dispatch mode, for as long as it records.

* **A CPU run's stream API.** An engine's own code asks torch for streams and events itself:
  `torch.cuda.Stream()`, `torch.cuda.current_stream()`, `with torch.cuda.stream(s)`,
  `torch.get_device_module(device).Event()` (which is `torch.cuda` or `torch.cpu`), `t.record_stream(s)`.
  Inside a CPU recording these resolve to the run's virtual streams and events (`racefuzz.trace.env`), so
  the engine's unmodified code is recorded on the CPU as it is on a GPU: `torch.cuda` and `torch.cpu`'s
  `Stream`, `Event`, `current_stream`, `default_stream`, `stream`, `StreamContext`, `set_stream` and
  `synchronize`, and `Tensor.record_stream` of a virtual stream (torch's own refuses anything but a
  `torch.Stream`; a CPU tensor has no `record_stream` kernel either). `torch.Stream` / `torch.Event`
  (device-generic) and `torch.accelerator` are not patched.
* **A CPU run's CUDA graphs.** `torch.cuda.CUDAGraph`, `torch.cuda.graph`, `torch.cuda.graph_pool_handle` and
  `torch.cuda.is_current_stream_capturing` (torch's CPU build has none that work): a capture and its replays
  are recorded as a GPU run records them, the captured ops run at each replay (`racefuzz.trace.graphs`).
* **The host's reads that dispatch no op.** `Tensor.tolist()` and `Tensor.numpy()` read a CPU tensor's
  memory in C++ without an op the dispatch mode could see (`int()`, `float()`, `bool()`, `.item()` and
  iteration go through `_local_scalar_dense` or views and are seen there). In a GPU run such a read of a
  pinned tensor is the host's access (a non-blocking copy may still be writing it); a CUDA tensor's
  `.tolist()` is a blocking copy torch dispatches (seen as one). In a CPU run every tensor stands for a
  device tensor, so the read is what a GPU run records for a device tensor's `.tolist()`: a copy on the
  current stream reading it, then the host's sync of that stream (as `.item()` is recorded there).

Each patched callable checks that a recorder of the right kind records on the calling thread and else does
what torch's does; in a CPU recording a stream that is not one of the run's (made before it) is refused
with a `UserCodeError` (exit 4) rather than switched behind the recorder's back. Installed when the first
recording starts, removed when the last one ends.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from threading import get_ident
from typing import Any

from racefuzz.trace import graphs, torch_mode
from racefuzz.trace.env import VirtualEvent, VirtualStream
from racefuzz.trace.recorder import active

_ABSENT = object()


class _Patches:
    """One set of patches, installed while at least one recording that needs it is on.

    Made once and reinstalled as made (a CPU recording's stream API is some twenty functions and classes,
    whose making cost a recording more than its launches did), for as long as each patched attribute holds,
    when the set goes in again, what it held when the patches were made (they call torch's originals they
    closed over); else made afresh."""

    def __init__(self, install: Any) -> None:
        self.install = install
        self.depth = 0
        self.originals: list[tuple[Any, str, Any]] = []
        """`(owner, name, what owner.__dict__ had before, or _ABSENT)` of each installed patch."""
        self.made: list[tuple[Any, str, Any, Any]] = []
        """`(owner, name, patch, what owner.__dict__ had when it was made)` of each patch of the set."""

    def set(self, owner: Any, name: str, value: Any) -> None:
        before = vars(owner).get(name, _ABSENT)
        self.originals.append((owner, name, before))
        self.made.append((owner, name, value, before))
        setattr(owner, name, value)

    def _reinstall(self) -> bool:
        """Install the patches as made, if every attribute holds what it held then; else install nothing."""
        made = self.made
        if not made or any(vars(owner).get(name, _ABSENT) is not before for owner, name, _, before in made):
            return False
        for owner, name, value, before in made:
            self.originals.append((owner, name, before))
            setattr(owner, name, value)
        return True

    @contextlib.contextmanager
    def on(self) -> Iterator[None]:
        if self.depth == 0 and not self._reinstall():
            import torch

            self.made = []
            self.install(self, torch)
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            if self.depth == 0:
                while self.originals:
                    owner, name, before = self.originals.pop()
                    if before is _ABSENT:
                        delattr(owner, name)
                    else:
                        setattr(owner, name, before)


HOST_READ_KERNELS = {"tolist": "Tensor.tolist (host read)", "numpy": "Tensor.numpy (host read)"}
"""The kernel names of the host reads `Tensor.tolist` / `Tensor.numpy` of a pinned tensor (a GPU run)."""
READ_BACK_KERNELS = {"tolist": "Tensor.tolist (device-to-host copy)", "numpy": "Tensor.numpy (device-to-host copy)"}
"""Their kernel names in a CPU run: the copy a GPU run makes of a device tensor, on the current stream."""


def _recorder() -> Any:
    """The active recorder if it records on this thread and is not paused, else None."""
    recorder = active()
    if recorder is None or recorder.paused or recorder.thread != get_ident():
        return None
    return recorder


def _cpu_recorder() -> Any:
    recorder = _recorder()
    return recorder if recorder is not None and not recorder.on_gpu else None


@contextlib.contextmanager
def installed(on_gpu: bool) -> Iterator[None]:
    """The patches one recording needs, for its duration: the host reads always, the stream API in a CPU
    run (a GPU run's `torch.cuda` stays torch's, with `racefuzz.trace.cuda_api`'s permanent patches)."""
    with _HOST_READS.on():
        if on_gpu:
            yield
        else:
            with _CPU_STREAM_API.on():
                yield


def _install_stream_api(patches: _Patches, torch: Any) -> None:
    for module in (torch.cuda, torch.cpu):
        _install_module_stream_api(patches, module)
    _install_graph_api(patches, torch)
    for name in ("tensor", "as_tensor", "asarray"):
        patches.set(torch, name, _to_device(getattr(torch, name)))


def _to_device(torch_factory: Any) -> Any:
    """`torch.tensor(data, device=...)` (and `as_tensor`, `asarray`) in a CPU recording: a named device makes
    the tensor a device tensor copied from the host, as a GPU run records it (`Recorder.lifting_to_device`);
    without one it stays a host tensor, no launch, as in a GPU run."""

    def factory(*args: Any, **kwargs: Any) -> Any:
        recorder = _cpu_recorder()
        if recorder is None or kwargs.get("device") is None:  # `device` is keyword-only in all three
            return torch_factory(*args, **kwargs)
        recorder.lifting_to_device += 1
        try:
            return torch_factory(*args, **kwargs)
        finally:
            recorder.lifting_to_device -= 1

    factory.__name__ = factory.__qualname__ = torch_factory.__name__
    factory.__doc__ = torch_factory.__doc__
    return factory


def _install_module_stream_api(patches: _Patches, module: Any) -> None:
    """`module`'s (`torch.cuda`'s or `torch.cpu`'s) stream and event API, virtual in a CPU recording."""
    torch_stream, torch_event = module.Stream, module.Event
    torch_current, torch_stream_context = module.current_stream, module.stream
    torch_context_class = module.StreamContext
    torch_default = getattr(module, "default_stream", None)
    torch_set_stream = getattr(module, "set_stream", None)
    torch_synchronize = module.synchronize

    class Stream(VirtualStream):
        """`torch.cuda.Stream(...)` / `torch.cpu.Stream(...)`: a virtual stream in a CPU recording."""

        def __new__(cls, *args: Any, **kwargs: Any) -> Any:
            if _cpu_recorder() is None:
                return torch_stream(*args, **kwargs)
            return object.__new__(cls)

        def __init__(self, *args: Any, **kwargs: Any) -> None:  # device, priority: no meaning here
            recorder = _cpu_recorder()
            super().__init__(weakref.proxy(recorder), recorder.new_virtual_stream_name())

    class Event(VirtualEvent):
        """`torch.cuda.Event(...)` / `torch.cpu.Event(...)`: a virtual event in a CPU recording."""

        def __new__(cls, *args: Any, **kwargs: Any) -> Any:
            if _cpu_recorder() is None:
                return torch_event(*args, **kwargs)
            return object.__new__(cls)

        def __init__(self, *args: Any, **kwargs: Any) -> None:  # enable_timing, blocking, interprocess
            super().__init__(weakref.proxy(_cpu_recorder()))

    Stream.__qualname__, Event.__qualname__ = f"{module.__name__}.Stream", f"{module.__name__}.Event"

    def current_stream(device: Any = None) -> Any:
        recorder = _cpu_recorder()
        return torch_current(device) if recorder is None else recorder.virtual_current

    def default_stream(device: Any = None) -> Any:
        recorder = _cpu_recorder()
        return torch_default(device) if recorder is None else recorder.virtual_default

    class StreamContext:
        """`torch.cuda.StreamContext(s)` / `torch.cuda.stream(s)` of a virtual stream: `s` current inside
        (torch's would do nothing without a GPU); re-enterable, as a context kept and entered each step."""

        def __new__(cls, chosen: Any) -> Any:
            if _cpu_recorder() is None:
                return torch_context_class(chosen)
            _refuse_foreign(chosen, f"{module.__name__}.StreamContext")
            return object.__new__(cls)

        def __init__(self, chosen: Any) -> None:
            self.stream = chosen
            self._recorder = weakref.proxy(_cpu_recorder())
            self._previous: list[Any] = []

        def __enter__(self) -> None:
            if self.stream is not None:
                self._previous.append(self._recorder.virtual_current)
                self._recorder.virtual_current = self.stream

        def __exit__(self, *exc: object) -> None:
            if self.stream is not None:
                self._recorder.virtual_current = self._previous.pop()

    def stream(chosen: Any) -> Any:
        if _cpu_recorder() is None:
            return torch_stream_context(chosen)
        _refuse_foreign(chosen, f"{module.__name__}.stream")
        return StreamContext(chosen)

    def set_stream(chosen: Any) -> None:
        recorder = _cpu_recorder()
        if recorder is None:
            return torch_set_stream(chosen)
        _refuse_foreign(chosen, f"{module.__name__}.set_stream")
        if chosen is not None:
            recorder.virtual_current = chosen
        return None

    def synchronize(device: Any = None) -> None:
        recorder = _cpu_recorder()
        if recorder is None:
            return torch_synchronize(device)
        recorder.on_device_sync()
        return None

    patches.set(module, "Stream", Stream)
    patches.set(module, "Event", Event)
    patches.set(module, "current_stream", current_stream)
    patches.set(module, "stream", stream)
    patches.set(module, "StreamContext", StreamContext)
    patches.set(module, "synchronize", synchronize)
    if torch_default is not None:
        patches.set(module, "default_stream", default_stream)
    if torch_set_stream is not None:
        patches.set(module, "set_stream", set_stream)


def _install_graph_api(patches: _Patches, torch: Any) -> None:
    """`torch.cuda.CUDAGraph`, `torch.cuda.graph`, `torch.cuda.graph_pool_handle` and
    `torch.cuda.is_current_stream_capturing` in a CPU recording (torch's CPU build has no CUDA graphs): a
    capture and its replays recorded as a GPU run records them (`racefuzz.trace.graphs`)."""
    torch_graph_class, torch_graph_context = torch.cuda.CUDAGraph, torch.cuda.graph
    torch_pool_handle, torch_capturing = torch.cuda.graph_pool_handle, torch.cuda.is_current_stream_capturing
    pools = iter(range(1, 1 << 62))

    class CUDAGraph:
        """`torch.cuda.CUDAGraph()` in a CPU recording: its capture and replays are recorded, not run on a
        device (a captured op runs at each replay, on the CPU)."""

        def __new__(cls, *args: Any, **kwargs: Any) -> Any:
            if _cpu_recorder() is None:
                return torch_graph_class(*args, **kwargs)
            return object.__new__(cls)

        def __init__(self, keep_graph: bool = False) -> None:
            self._pool = (0, next(pools))

        def capture_begin(self, pool: Any = None, capture_error_mode: str = "global", **kwargs: Any) -> None:
            graphs.begin(_recording("CUDAGraph.capture_begin"), torch_mode.capture_mode)

        def capture_end(self) -> None:
            graphs.end(_recording("CUDAGraph.capture_end"), self)

        def replay(self) -> None:
            # The boundary launches are recorded here (a launch names the line that called its caller).
            recorder = _recording("CUDAGraph.replay")
            replaying = graphs.start_replay(recorder, self)
            recorder.launch(replaying.label, graphs.REPLAY, graphs.nothing, [], [])
            graphs.replayed(recorder, replaying)
            recorder.launch(replaying.end_label, graphs.REPLAY, graphs.nothing, [], [])

        def instantiate(self) -> None:
            """Nothing to instantiate on the CPU."""

        def reset(self) -> None:
            graphs.forget(self)

        def pool(self) -> tuple[int, int]:
            return self._pool

    class graph:
        """`torch.cuda.graph(g, pool=None, stream=None, ...)` in a CPU recording: torch's context, with a
        capture stream per run (torch's own is one per process, kept on the class: a stream of an ended run)."""

        def __new__(cls, *args: Any, **kwargs: Any) -> Any:
            if _cpu_recorder() is None:
                return torch_graph_context(*args, **kwargs)
            return object.__new__(cls)

        def __init__(
            self, cuda_graph: Any, pool: Any = None, stream: Any = None, capture_error_mode: str = "global", **_: Any
        ) -> None:
            recorder = _cpu_recorder()
            self.capture_stream = (
                stream if stream is not None else graphs.default_capture_stream(recorder, torch.cuda.Stream)
            )
            self.stream_ctx = torch.cuda.stream(self.capture_stream)
            self.cuda_graph = cuda_graph
            self.pool = () if pool is None else (pool,)
            self.capture_error_mode = capture_error_mode

        def __enter__(self) -> None:
            torch.cuda.synchronize()  # as torch's does
            self.stream_ctx.__enter__()
            self.cuda_graph.capture_begin(*self.pool, capture_error_mode=self.capture_error_mode)

        def __exit__(self, *exc: object) -> None:
            try:
                self.cuda_graph.capture_end()
            finally:
                self.stream_ctx.__exit__(*exc)

    CUDAGraph.__qualname__, graph.__qualname__ = "torch.cuda.CUDAGraph", "torch.cuda.graph"

    def graph_pool_handle() -> Any:
        return torch_pool_handle() if _cpu_recorder() is None else (0, next(pools))

    def is_current_stream_capturing() -> bool:
        recorder = _cpu_recorder()
        return torch_capturing() if recorder is None else graphs.capturing(recorder)

    for owner in (torch.cuda, torch.cuda.graphs):
        patches.set(owner, "CUDAGraph", CUDAGraph)
        patches.set(owner, "graph", graph)
        patches.set(owner, "graph_pool_handle", graph_pool_handle)
        patches.set(owner, "is_current_stream_capturing", is_current_stream_capturing)


def _recording(call: str) -> Any:
    """The CPU recording a stand-in graph's method is called in; a UserCodeError outside one."""
    recorder = _cpu_recorder()
    if recorder is None:
        from racefuzz.errors import UserCodeError

        raise UserCodeError(f"{call} of a graph made in a CPU recording, outside that recording")
    return recorder


def _refuse_foreign(stream: Any, call: str) -> None:
    """A CPU run records on its virtual streams only: a real stream (made before the run, or torch's own
    object) would switch a stream the recorder does not see, and every launch after would be recorded on
    the wrong one. A `UserCodeError` saying so instead."""
    if stream is not None and not isinstance(stream, VirtualStream):
        from racefuzz.errors import UserCodeError

        raise UserCodeError(
            f"{call}({stream!r}) in a CPU recording: only this run's streams can be made current there "
            "(env.stream(name), or torch.cuda.Stream() / torch.get_device_module(device).Stream() inside the step)"
        )


def _install_tensor_methods(patches: _Patches, torch: Any) -> None:
    tensor = torch.Tensor
    torch_record_stream = tensor.record_stream

    def record_stream(self: Any, stream: Any) -> None:
        recorder = _cpu_recorder()
        if recorder is None:
            return torch_record_stream(self, stream)
        _refuse_foreign(stream, "Tensor.record_stream")
        recorder.on_record_stream(self)
        return None

    patches.set(tensor, "record_stream", record_stream)
    for name in HOST_READ_KERNELS:
        patches.set(tensor, name, _host_read(name, getattr(tensor, name)))


def _host_read(name: str, torch_method: Any) -> Any:
    kernel, read_back = HOST_READ_KERNELS[name], READ_BACK_KERNELS[name]

    def read(self: Any, *args: Any, **kwargs: Any) -> Any:
        recorder = _recorder()
        if recorder is None or recorder.opaque or self.is_meta or not self.numel():
            return torch_method(self, *args, **kwargs)
        if recorder.on_gpu:
            if not self.is_cuda:
                recorder.paused += 1  # `is_pinned` is an op the mode would see
                try:
                    pinned = self.is_pinned()
                finally:
                    recorder.paused -= 1
                if pinned:
                    recorder.host_access(kernel, [self], [])
            return torch_method(self, *args, **kwargs)
        return recorder.launch(
            read_back, "torch", lambda: torch_method(self, *args, **kwargs), [self], [], host_sync=_after
        )

    read.__name__ = read.__qualname__ = name
    read.__doc__ = torch_method.__doc__
    return read


def _after(_out: Any) -> str:
    return "after"


_HOST_READS = _Patches(_install_tensor_methods)
_CPU_STREAM_API = _Patches(_install_stream_api)
