"""`TraceEnv`: what a traced step receives: its device, named streams and events, and names for tensors.

On a GPU the streams and events are real `torch.cuda` ones (the step may as well create its own with
torch's API: the recorder sees them through `torch.cuda`'s methods and names them `stream#k`). On the
CPU, for CI without a GPU, they are `VirtualStream` / `VirtualEvent` objects with the same methods: work is
executed eagerly, but every launch is recorded on the stream the step made current, and every record, wait
and sync is recorded as it would be on a GPU. So the happens-before verdict of a step is the same on both.
Inside a CPU recording, code that asks torch for streams and events itself (`torch.cuda.Stream()`,
`torch.cuda.current_stream()`, `torch.cuda.stream(s)`, `torch.get_device_module(device).Event()`,
`t.record_stream(s)`: an engine's unmodified code) gets this run's virtual ones (`racefuzz.trace.torch_patches`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Protocol


class StreamRecorder(Protocol):
    """What the env and its virtual streams and events call on the run's recorder
    (`racefuzz.trace.recorder.Recorder`). A protocol, not an import of the recorder: the recorder makes
    its default `VirtualStream`, so it imports this module."""

    virtual_current: Any
    paused: int

    def new_event_name(self) -> str: ...

    def on_record(self, event: str, stream: str) -> None: ...

    def on_wait(self, event: str, stream: str) -> None: ...

    def on_stream_sync(self, stream: str) -> None: ...

    def on_event_sync(self, event: str) -> None: ...

    def on_device_sync(self) -> None: ...

    def name_stream(self, handle: int, name: str) -> None: ...

    def name_storage(self, tensor: Any, name: str) -> None: ...

    def name_virtual_stream(self, stream: Any, name: str) -> None: ...

    def given_event_name(self, name: str) -> str: ...

    def name_event(self, event: Any, name: str) -> None: ...


class VirtualStream:
    """A stream of a CPU trace: records what a `torch.cuda.Stream` would report (see the module doc).

    Inside a CPU recording `torch.cuda.Stream(...)` and `torch.cpu.Stream(...)` make one of these too
    (`racefuzz.trace.torch_patches`), named `stream#k` as a GPU run names a stream the step made itself."""

    def __init__(self, recorder: StreamRecorder, name: str) -> None:
        self._recorder = recorder
        self.name = name

    @property
    def recorder(self) -> StreamRecorder:
        """The run's recorder; a UserCodeError if this is the default stream of a run that has ended (it
        holds its recorder weakly: a step that kept `env.current_stream()` and uses it in a later run)."""
        return _live(self._recorder, f"stream {self.name!r}")

    def wait_stream(self, other: VirtualStream) -> None:
        """As torch's: `self.wait_event(other.record_event())`."""
        self.wait_event(other.record_event())

    def record_event(self, event: VirtualEvent | None = None) -> VirtualEvent:
        event = event or VirtualEvent(self.recorder)
        event.record(self)
        return event

    def wait_event(self, event: VirtualEvent) -> None:
        self.recorder.on_wait(event.name, self.name)

    def synchronize(self) -> None:
        self.recorder.on_stream_sync(self.name)

    def query(self) -> bool:
        """True, and a sync of the stream: a CPU run has done the work, and on a GPU a query that answered
        True told the host the same (the host may go on as after `synchronize()`)."""
        self.recorder.on_stream_sync(self.name)
        return True

    def __repr__(self) -> str:
        return f"VirtualStream({self.name!r})"


class VirtualEvent:
    """An event of a CPU trace (`torch.cuda.Event(...)` inside a CPU recording makes one too)."""

    def __init__(self, recorder: StreamRecorder, name: str | None = None) -> None:
        self._recorder = recorder
        self.name = recorder.new_event_name() if name is None else recorder.given_event_name(name)

    @property
    def recorder(self) -> StreamRecorder:
        """The run's recorder; a UserCodeError if the event was made by an ended run's default stream."""
        return _live(self._recorder, f"event {self.name!r}")

    def record(self, stream: VirtualStream | None = None) -> None:
        recorder = self.recorder
        recorder.on_record(self.name, (stream or recorder.virtual_current).name)

    def wait(self, stream: VirtualStream | None = None) -> None:
        (stream or self.recorder.virtual_current).wait_event(self)

    def synchronize(self) -> None:
        self.recorder.on_event_sync(self.name)

    def query(self) -> bool:
        """True, and a sync of the event (as a GPU run records a query that answered True)."""
        self.recorder.on_event_sync(self.name)
        return True

    def elapsed_time(self, end_event: VirtualEvent) -> float:
        """0.0: a CPU trace has no device clock (timing is not part of the happens-before verdict)."""
        return 0.0

    def __repr__(self) -> str:
        return f"VirtualEvent({self.name!r})"


def _live(recorder: StreamRecorder, what: str) -> StreamRecorder:
    """`recorder`, or a UserCodeError naming `what` if it is the weak proxy of a recorder that is gone."""
    try:
        recorder.paused  # noqa: B018 - touches a weak proxy
    except ReferenceError:
        from racefuzz.errors import UserCodeError

        raise UserCodeError(
            f"{what} belongs to a run that has ended: take streams and events from this run's env "
            "(env.current_stream(), env.stream(name), env.event()), not from an earlier one"
        ) from None
    return recorder


_DEDICATED: dict[tuple[str, int], Any] = {}
"""The GPU streams `TraceEnv.stream` hands out, per (device, k-th call in a run), made once per process."""


def _dedicated_stream(device: str, k: int) -> Any:
    """The `k`-th stream a run's `env.stream(...)` returns on `device`: the same CUDA stream in every run of
    the process, and never one of torch's pooled streams.

    Why: `torch.cuda.Stream()` hands out a pool of 32 streams round-robin, so a stream the step or torch makes
    later in the process (`torch.cuda.graph`'s capture stream, an engine's own streams) can be the very CUDA
    stream an earlier run named `schedule`; the recorder names streams by handle, so a fuzzed run would then
    see a launch on `schedule` that the reference run saw on `stream#3` (a control-flow divergence that no
    schedule caused). A stream created outside the pool (CuPy's `cudaStreamCreateWithFlags`, non-blocking as
    torch's pooled streams are) is never handed out again. Without CuPy the pooled stream is kept per process
    (stable across runs; it aliases only if the step makes 32 streams of its own)."""
    import torch

    key = (device, k)
    stream = _DEDICATED.get(key)
    if stream is None:
        index = torch.device(device).index
        index = torch.cuda.current_device() if index is None else index
        try:
            import cupy
        except ImportError:
            with torch.cuda.device(index):
                stream = torch.cuda.Stream()
        else:
            with cupy.cuda.Device(index):
                handle = cupy.cuda.runtime.streamCreateWithFlags(cupy.cuda.runtime.streamNonBlocking)
            stream = torch.cuda.ExternalStream(handle, device=torch.device("cuda", index))
        _DEDICATED[key] = stream
    return stream


class TraceEnv:
    """What racefuzz hands a step: `device`, `stream(name)`, `use(stream)`, `event(name)`, `synchronize()`,
    `name(tensor, name)`. A step written against it runs on the GPU and, recorded, on the CPU."""

    def __init__(self, recorder: StreamRecorder, device: str) -> None:
        self._recorder = recorder
        self.device = device
        self._streams_made = 0

    @property
    def on_gpu(self) -> bool:
        return self.device.startswith("cuda")

    def stream(self, name: str) -> Any:
        """A new stream named `name` (a `torch.cuda.Stream` on the GPU)."""
        if self.on_gpu:
            stream = _dedicated_stream(self.device, self._streams_made)
            self._streams_made += 1
            self._recorder.name_stream(stream.cuda_stream, name)
            return stream
        stream = VirtualStream(self._recorder, name)
        self._recorder.name_virtual_stream(stream, name)
        return stream

    def current_stream(self) -> Any:
        if self.on_gpu:
            import torch

            return torch.cuda.current_stream()
        return self._recorder.virtual_current

    @contextlib.contextmanager
    def use(self, stream: Any) -> Iterator[None]:
        """Make `stream` current for the block (`torch.cuda.stream(stream)` on the GPU)."""
        if self.on_gpu:
            import torch

            with torch.cuda.stream(stream):
                yield
            return
        previous = self._recorder.virtual_current
        self._recorder.virtual_current = stream
        try:
            yield
        finally:
            self._recorder.virtual_current = previous

    def event(self, name: str | None = None) -> Any:
        """A new event (a `torch.cuda.Event` on the GPU), called `name` in reports (else `event#k`; a name
        given twice gets `#2`, `#3`: each event is its own)."""
        if self.on_gpu:
            import torch

            event = torch.cuda.Event()
            if name is not None:
                self._recorder.name_event(event, name)
            return event
        return VirtualEvent(self._recorder, name)

    def synchronize(self) -> None:
        """`torch.cuda.synchronize()`."""
        if self.on_gpu:
            import torch

            torch.cuda.synchronize()
        else:
            self._recorder.on_device_sync()

    def name(self, tensor: Any, name: str) -> Any:
        """Name `tensor`'s storage `name` in reports and in `watch`; returns `tensor`."""
        self._recorder.name_storage(tensor, name)
        return tensor
