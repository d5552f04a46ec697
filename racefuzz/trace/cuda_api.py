"""`torch.cuda`'s stream, event and graph API routed through the active GPU recorder (patched once a process).

`patch()` wraps `torch.cuda.Event.record` / `.wait` / `.synchronize` / `.query`, `torch.cuda.Stream.
synchronize` / `.query` / `.wait_stream`, `torch.cuda.synchronize` and `torch.cuda.CUDAGraph`'s capture and
replay: each runs torch's own call, then reports to the active recorder of a GPU run. `unpatched()` puts
torch's own back for a block (the recording-cost benchmarks' baseline). Imports torch lazily.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from threading import get_ident
from typing import Any

from racefuzz.trace import graphs, torch_mode
from racefuzz.trace.recorder import Recorder, active

ABSENT = object()
"""What `ORIGINALS` holds for a patched name the owner's own `__dict__` did not have."""

ORIGINALS: list[tuple[Any, str, Any]] = []
"""`(owner, name, what owner.__dict__ had before the patch, or ABSENT)` of each patch `patch` installed."""


def _gpu_recorder() -> Recorder | None:
    """The active recorder if it records a GPU run and is not paused (its own copies and spins)."""
    recorder = active()
    return recorder if recorder is not None and recorder.on_gpu and not recorder.paused else None


def _syncing_recorder() -> Recorder | None:
    """`_gpu_recorder()` if this is the thread that records: a host sync orders only the thread that waited
    (another thread's `torch.cuda.synchronize()` tells the step's thread nothing). Records and waits count
    from any thread: they order the device itself."""
    recorder = _gpu_recorder()
    return recorder if recorder is not None and recorder.thread == get_ident() else None


def _raw_handle(stream: Any) -> int:
    """The `cudaStream_t` of a `torch.cuda.Stream`, or of a device-generic `torch.Stream` (which torch.cuda's
    methods accept too, and which has no `cuda_stream`)."""
    handle = getattr(stream, "cuda_stream", None)
    if handle is None:
        import torch

        handle = torch.cuda.Stream(
            stream_id=stream.stream_id, device_index=stream.device_index, device_type=stream.device_type
        ).cuda_stream
    return handle


@functools.cache  # once a process
def patch() -> None:
    """Route the step's stream and event operations through the active recorder (patched once per process).

    `torch.cuda.Event.record` / `.wait` / `.synchronize` / `.query`, `torch.cuda.Stream.synchronize` /
    `.wait_stream` and `torch.cuda.synchronize` run torch's own C calls, then report to the active GPU
    recorder (`wait_event` and `record_event` reach it through `Event.wait` / `Event.record`); outside a
    recording they only add one check. Not torch's GPU-trace callbacks: once activated those stay on for the
    process (torch has no way to turn them off) and call into Python for every allocation, free, event
    creation, record, wait and sync of every later test, recorded or not. Host syncs inside torch's C++ ops
    are known from the op instead (`racefuzz.trace.sync_rules`), frees from the storages themselves
    (`Recorder.allocated`). `torch.cuda.CUDAGraph.capture_begin` / `.capture_end` / `.replay` (which
    `torch.cuda.graph` calls) report a capture and its replays (`racefuzz.trace.graphs`).
    """
    import torch

    event_base, stream_base = torch._C._CudaEventBase, torch._C._CudaStreamBase
    record, wait = event_base.record, event_base.wait
    event_synchronize, event_query = event_base.synchronize, event_base.query
    stream_synchronize, stream_query = stream_base.synchronize, stream_base.query
    device_synchronize = torch.cuda.synchronize
    wait_stream = torch.cuda.Stream.wait_stream
    current_stream = torch.cuda.current_stream
    graph_class = torch.cuda.CUDAGraph
    capture_begin, capture_end, graph_replay = graph_class.capture_begin, graph_class.capture_end, graph_class.replay

    def event_record(self: Any, stream: Any = None) -> None:
        if stream is None:
            stream = current_stream()
        record(self, stream)
        recorder = _gpu_recorder()
        if recorder is not None:
            recorder.on_record(recorder.event_name(self.cuda_event, self), recorder.stream_name(_raw_handle(stream)))

    def event_wait(self: Any, stream: Any = None) -> None:
        if stream is None:
            stream = current_stream()
        wait(self, stream)
        recorder = _gpu_recorder()
        if recorder is not None and self.cuda_event:  # torch waits on no event before its first record
            recorder.on_wait(recorder.event_name(self.cuda_event, self), recorder.stream_name(_raw_handle(stream)))

    def event_sync(self: Any) -> None:
        event_synchronize(self)
        recorder = _syncing_recorder()
        if recorder is not None and self.cuda_event:
            recorder.on_event_sync(recorder.event_name(self.cuda_event, self))

    def event_done(self: Any) -> bool:
        # A query that answers True is an event sync: the host knows the recorded work has finished.
        done = event_query(self)
        recorder = _syncing_recorder() if done else None
        if recorder is not None and self.cuda_event:
            recorder.on_event_sync(recorder.event_name(self.cuda_event, self))
        return done

    def stream_sync(self: Any) -> None:
        stream_synchronize(self)
        recorder = _syncing_recorder()
        if recorder is not None:
            recorder.on_stream_sync(recorder.stream_name(self.cuda_stream))

    def stream_done(self: Any) -> bool:
        # As `Event.query`: a stream query that answers True is a sync of the stream.
        done = stream_query(self)
        recorder = _syncing_recorder() if done else None
        if recorder is not None:
            recorder.on_stream_sync(recorder.stream_name(self.cuda_stream))
        return done

    def synchronize(device: Any = None) -> None:
        device_synchronize(device)
        recorder = _syncing_recorder()
        if recorder is not None:
            recorder.on_device_sync()

    def pooled_wait_stream(self: Any, stream: Any) -> None:
        # torch's makes a new `torch.cuda.Event` per call (Python `__new__`, `record_event`, `Event.record`,
        # `wait_event`, `Event.wait`); this one records the recorder's one event on `stream` and makes `self`
        # wait on it: the same two CUDA calls, the same record and wait in the trace (a wait refers to the
        # event's latest record). Re-recording the event later cannot affect this wait: CUDA captures the
        # event's state at the wait. Only the thread that entered `recording` uses the event (another could
        # re-record it between this thread's record and wait: the wait would then be on the wrong work);
        # other threads, and streams on another device than the recorder's, get torch's own (which reaches
        # the recorder through `Event.record` / `Event.wait`).
        recorder = _gpu_recorder()
        if (
            recorder is None
            or recorder.thread != get_ident()
            or self.device_index != recorder.device_index
            or stream.device_index != recorder.device_index
        ):
            return wait_stream(self, stream)
        event = recorder.wait_stream_event
        if event is None:
            event = recorder.wait_stream_event = torch.cuda.Event()
        record(event, stream)
        wait(event, self)
        name = recorder.event_name(event.cuda_event)
        recorder.on_record(name, recorder.stream_name(_raw_handle(stream)))
        recorder.on_wait(name, recorder.stream_name(self.cuda_stream))

    def graph_capture_begin(self: Any, *args: Any, **kwargs: Any) -> None:
        capture_begin(self, *args, **kwargs)
        recorder = _syncing_recorder()
        if recorder is not None:
            graphs.begin(recorder, torch_mode.capture_mode)

    def graph_capture_end(self: Any) -> None:
        recorder = _syncing_recorder()
        try:
            capture_end(self)
        finally:
            if recorder is not None:
                graphs.end(recorder, self)

    def replay(self: Any) -> None:
        # The replay's boundary launches are recorded here, not in `graphs` (a launch names the line that
        # called the function launching it).
        recorder = _syncing_recorder()
        if recorder is None:
            return graph_replay(self)
        replaying = graphs.start_replay(recorder, self)
        recorder.launch(replaying.label, graphs.REPLAY, lambda: graph_replay(self), [], [])
        graphs.replayed(recorder, replaying)
        recorder.launch(replaying.end_label, graphs.REPLAY, graphs.nothing, [], [])
        return None

    for owner, name, replacement in (
        (graph_class, "capture_begin", graph_capture_begin),
        (graph_class, "capture_end", graph_capture_end),
        (graph_class, "replay", replay),
        (torch.cuda.Event, "record", event_record),
        (torch.cuda.Event, "wait", event_wait),
        (torch.cuda.Event, "synchronize", event_sync),
        (torch.cuda.Event, "query", event_done),
        (torch.cuda.Stream, "synchronize", stream_sync),
        (torch.cuda.Stream, "query", stream_done),
        (torch.cuda.Stream, "wait_stream", pooled_wait_stream),
        (torch.cuda, "synchronize", synchronize),
    ):
        ORIGINALS.append((owner, name, vars(owner).get(name, ABSENT)))
        setattr(owner, name, functools.wraps(getattr(owner, name))(replacement))


@contextlib.contextmanager
def unpatched() -> Iterator[None]:
    """torch's own `torch.cuda` methods inside the block, racefuzz's patches (`patch`) again after.

    For the recording-cost benchmarks only: an unrecorded run inside the block is the baseline of a user
    who never ran racefuzz, timed back to back with recorded runs in one process so that a host whose speed
    drifts moves both alike. Not for recording (a recording inside it would miss every stream and event
    operation) and not thread-safe (it swaps class attributes). A no-op where the patches are not installed.
    """
    patched = [(owner, name, getattr(owner, name)) for owner, name, _ in ORIGINALS]
    for owner, name, original in ORIGINALS:
        if original is ABSENT:
            delattr(owner, name)
        else:
            setattr(owner, name, original)
    try:
        yield
    finally:
        for owner, name, replacement in patched:
            setattr(owner, name, replacement)
