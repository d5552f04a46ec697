"""racefuzz.trace on a real GPU: what torch.cuda's stream and event API, Triton launches, CuPy kernels and
the caching allocator give the recorder, and the delay search manifesting a race beside a clean control.

Each test prints what it saw (run with `-s` for the record)."""

from __future__ import annotations

import pytest

from racefuzz.trace import WHOLE, annotate, cupy_kernel, fuzz
from racefuzz.trace.annotations import _REGISTRY
from racefuzz.trace.example import racy_step, synced_step
from racefuzz.trace.judge import trace_races
from racefuzz.trace.search import run_once

pytestmark = pytest.mark.cuda


def races(step):
    return trace_races(run_once(step, "cuda", serialize=True).program)


def test_the_example_races_on_the_gpu_exactly_where_it_does_on_the_cpu():
    found = races(racy_step)
    print(*found, sep="\n")
    assert [r.where for r in found] == [("req_to_token[1, 0:8]",)]
    assert races(synced_step) == []


def test_wait_stream_and_item_reach_the_recorder_through_torch_cuda():
    import torch

    def step(env):
        a, b = env.stream("a"), env.stream("b")
        x = torch.ones(4, device="cuda")
        a.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(a):  # torch's own API: no env wrapper
            x.add_(1)
        b.wait_stream(a)
        with torch.cuda.stream(b):
            assert x.sum().item() == 8.0

    trace = run_once(step, "cuda").program
    kinds = [type(op).__name__ for op in trace.ops]
    print(kinds)
    assert kinds.count("Record") == 2 and kinds.count("WaitEvent") == 2
    assert kinds.count("StreamSync") == 1
    assert trace_races(trace) == []


def test_every_event_method_and_host_sync_of_torch_cuda_is_recorded():
    """Each of torch.cuda's event and sync calls, and each op that makes the host wait, is one trace op."""
    import torch

    def step(env):
        a, b = env.stream("a"), env.stream("b")
        x = torch.arange(16, device="cuda")
        done = torch.cuda.Event()
        a.wait_stream(torch.cuda.current_stream())  # record + wait
        with torch.cuda.stream(a):
            x.add_(1)
            done.record()  # on the current stream a
        b.wait_event(done)  # through Event.wait
        done.synchronize()
        while not done.query():  # True: an event sync
            pass
        a.synchronize()
        with torch.cuda.stream(b):
            x.nonzero()  # stream syncs of b before the launch: a count read back,
            x[x > 3]  # a read through a boolean mask;
            x.cpu()  # after it: a blocking copy to the host;
            x.to("cpu", non_blocking=True)  # none: a non-blocking copy (torch pins its destination),
            x[:0].cpu()  # an empty copy,
            x[x > 100] = 0  # an assignment through a mask (masked_fill_),
            x[torch.arange(1, 3, device="cuda")]  # an integer index
        torch.cuda.synchronize()

    trace = run_once(step, "cuda").program
    kinds = [type(op).__name__ for op in trace.ops if type(op).__name__ != "Launch"]
    print(kinds)
    assert kinds == [
        "Record",
        "WaitEvent",
        "Record",
        "WaitEvent",
        "EventSync",
        "EventSync",
        *["StreamSync"] * 4,
        "DeviceSync",
    ]
    ops = trace.ops
    synced = [(op.stream.name, ops[op.index - 1], ops[op.index + 1]) for op in ops if type(op).__name__ == "StreamSync"]
    print(synced)
    assert [stream for stream, _, _ in synced] == ["a", "b", "b", "b"]
    assert [after.kernel for _, _, after in synced[1:3]] == ["aten.nonzero.default", "aten.index.Tensor"]
    assert synced[3][1].kernel == "aten._to_copy.default"


def test_copies_to_the_gpu_are_launches_writing_a_new_storage_and_torch_tensor_syncs_its_stream():
    """`torch.tensor(data, device="cuda")` copies behind the mode's back: a launch writing a new storage, then
    the host's sync of the stream (a blocking copy from pageable memory); `x.to("cuda")` of a host tensor
    is a launch writing its output, a blocking one followed by a sync, a non-blocking one from pinned
    memory reading the pinned buffer on the stream; the copies' outputs are freed on their stream."""
    import torch

    from racefuzz.trace.capture import TORCH_TENSOR_COPY

    def step(env):
        side = env.stream("side")
        side.wait_stream(torch.cuda.current_stream())
        pinned = torch.arange(4, dtype=torch.float32).pin_memory()
        with torch.cuda.stream(side):
            made = torch.tensor([1.0, 2.0, 3.0], device="cuda")
            copied = torch.arange(4, dtype=torch.float32).to("cuda")
            streamed = pinned.to("cuda", non_blocking=True)
            total = made.sum() + copied.sum() + streamed.sum()
            del made, copied, streamed
        torch.cuda.current_stream().wait_stream(side)
        return {"total": total}

    record = run_once(step, "cuda", watch_frees=True)
    ops = [op for op in record.program.ops if getattr(getattr(op, "stream", None), "name", None) == "side"]
    described = [getattr(op, "kernel", type(op).__name__) for op in ops]
    print(*described, sep="\n")
    copies = [op for op in ops if getattr(op, "kernel", "") in (TORCH_TENSOR_COPY, "aten._to_copy.default")]
    assert [op.kernel for op in copies] == [TORCH_TENSOR_COPY, "aten._to_copy.default", "aten._to_copy.default"]
    made, copied, streamed = copies
    assert type(record.program.ops[made.index + 1]).__name__ == "StreamSync"  # torch.tensor's blocking copy
    assert type(record.program.ops[copied.index + 1]).__name__ == "StreamSync"  # a blocking `.to("cuda")`
    assert type(record.program.ops[streamed.index + 1]).__name__ != "StreamSync"
    assert not made.reads and not copied.reads and len(streamed.reads) == 1  # the pinned buffer, on the stream
    written = {copy.writes[0].buffer.id for copy in copies}
    freed = {op.writes[0].buffer.id for op in ops if getattr(op, "info", {}).get("kind", "") == "free"}
    assert len(written) == 3 and written <= freed
    assert trace_races(record.program) == []


def test_a_host_write_to_a_pinned_buffer_a_non_blocking_copy_may_still_read_is_a_race():
    import torch

    def step(env, synced):
        side = env.stream("side")
        side.wait_stream(torch.cuda.current_stream())
        pinned = torch.zeros(1 << 16).pin_memory()
        with torch.cuda.stream(side):
            out = pinned.to("cuda", non_blocking=True)  # the copy engine reads `pinned` later, on `side`
        if synced:
            side.synchronize()
        pinned.fill_(1.0)  # the host overwrites it
        torch.cuda.current_stream().wait_stream(side)
        return {"out": out}

    found = races(lambda env: step(env, synced=False))
    print(*found, sep="\n")
    assert len(found) == 1 and {found[0].first.stream.name, found[0].second.stream.name} == {"side", "host"}
    assert races(lambda env: step(env, synced=True)) == []


def test_a_pinned_buffers_free_is_not_a_write_on_a_stream():
    """torch's host allocator hands a pinned block out again only after every copy that used it finished (an
    event per non-blocking copy): freeing a pinned buffer a copy on another stream reads is no race. A copy
    to the GPU from a host tensor's shape (`zeros_like`) reads nothing."""
    import torch

    def step(env):
        side = env.stream("side")
        source = torch.ones(1 << 16, device="cuda")
        staging = source.to("cpu", non_blocking=True)  # pinned, allocated while recording
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            back = staging.to("cuda", non_blocking=True)
            shaped = torch.zeros_like(staging, device="cuda")
        del staging
        torch.cuda.current_stream().wait_stream(side)
        return {"back": back, "shaped": shaped}

    record = run_once(step, "cuda", watch_frees=True)
    launches = [op for op in record.program.ops if type(op).__name__ == "Launch"]
    print(*launches, sep="\n")
    assert trace_races(record.program) == []
    (zeros,) = [op for op in launches if op.kernel == "aten.zeros_like.default"]
    assert zeros.reads == ()


def test_a_block_the_caching_allocator_hands_out_again_is_a_new_storage():
    import torch

    def step(env):
        first = torch.ones(1 << 20, device="cuda")
        ptr = first.data_ptr()
        del first  # freed on the default stream: its next allocation of that size gets the block
        second = torch.zeros(1 << 20, device="cuda")
        assert second.data_ptr() == ptr
        second.add_(1)

    trace = run_once(step, "cuda").program
    launches = [op for op in trace.ops if type(op).__name__ == "Launch"]
    print(*launches, sep="\n")
    assert [op.info["kind"] for op in launches] == ["torch", "free", "torch", "torch", "free"]  # `second` dies last
    ones, free, zeros, add, _ = launches
    assert ones.writes[0].buffer.id == free.writes[0].buffer.id != zeros.writes[0].buffer.id == add.writes[0].buffer.id
    assert trace_races(trace) == []


def test_wait_stream_while_recording_orders_the_device_with_one_reused_event():
    """The recorder's `wait_stream` (one event per recorder, not a new one per call) still orders the
    device: a read on b after `b.wait_stream(a)` sees a's write even when a's write is held back 50 ms,
    and even when the same event is re-recorded on an idle stream right after the wait."""
    import threading

    import torch

    from racefuzz.program import WaitEvent
    from racefuzz.trace.capture import recording
    from racefuzz.trace.env import TraceEnv
    from racefuzz.trace.recorder import Recorder

    spin = 50 * 1980 * 1000  # about 50 ms of SM clock cycles

    def step(env):
        a, b, idle = env.stream("a"), env.stream("b"), env.stream("idle")
        x = torch.zeros(4, device="cuda")
        a.wait_stream(torch.cuda.current_stream())
        b.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(a):
            torch.cuda._sleep(spin)
            x.fill_(1)
        b.wait_stream(a)
        idle.wait_stream(torch.cuda.current_stream())  # re-records the same event on work already done
        with torch.cuda.stream(b):
            seen = x.clone()
        torch.cuda.synchronize()
        return {"seen": seen}

    recorder = Recorder("cuda", snapshot_plan={})
    with recording(recorder):
        returned = step(TraceEnv(recorder, "cuda"))
        # Another thread's wait_stream takes torch's own path (the recorder's event is this thread's).
        other = threading.Thread(target=lambda: torch.cuda.Stream().wait_stream(torch.cuda.Stream()))
        other.start()
        other.join()
    record = recorder.finish(returned)
    assert recorder.wait_stream_event is not None  # the pooled path ran
    assert record.outputs["seen"].tolist() == [1.0, 1.0, 1.0, 1.0]
    assert len({op.event.name for op in record.program.ops if isinstance(op, WaitEvent)}) >= 1
    assert trace_races(record.program) == []
    # Outside recording, torch's own wait_stream runs (a new event per call) and orders the device too.
    a, b = torch.cuda.Stream(), torch.cuda.Stream()
    x = torch.zeros(4, device="cuda")
    with torch.cuda.stream(a):
        torch.cuda._sleep(spin)
        x.fill_(2)
    b.wait_stream(a)
    with torch.cuda.stream(b):
        seen = x.clone()
    torch.cuda.synchronize()
    assert seen.tolist() == [2.0, 2.0, 2.0, 2.0]


def test_triton_launches_are_recorded_with_annotations_or_the_default():
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def fill_row(table, row, stride, BLOCK: tl.constexpr):
        offsets = tl.arange(0, BLOCK)
        tl.store(table + row * stride + offsets, -1)

    def step(env):
        table = env.name(torch.zeros(4, 64, dtype=torch.int32, device="cuda"), "req_to_token")
        forward, schedule = env.stream("forward"), env.stream("schedule")
        for stream in (forward, schedule):
            stream.wait_stream(torch.cuda.current_stream())
        with env.use(forward):
            gathered = table[1].clone()
        with env.use(schedule):
            fill_row[(1,)](table, 3, table.stride(0), BLOCK=64)  # row 3: the forward reads row 1 only
        env.synchronize()
        return {"gathered": gathered}

    reference = run_once(step, "cuda", serialize=True)
    assert reference.assumed_kernels == ["fill_row"]
    assert trace_races(reference.program) != []  # assumed to touch all of req_to_token
    annotate("fill_row", reads={}, writes={"table": lambda args: [args["table"][args["row"]]]})
    try:
        annotated = run_once(step, "cuda", serialize=True)
        assert annotated.assumed_kernels == [] and trace_races(annotated.program) == []
    finally:
        _REGISTRY.pop("fill_row", None)


def test_cupy_kernels_are_recorded_on_torchs_current_stream():
    cupy = pytest.importorskip("cupy")
    import torch

    kernel = cupy.RawKernel(
        r'extern "C" __global__ void poison(int* row, int n) { int i = threadIdx.x; if (i < n) row[i] = -1; }',
        "poison",
    )
    poison = cupy_kernel(kernel, ["row", "n"])
    annotate("poison", reads={}, writes={"row": WHOLE})

    def step(env):
        table = env.name(torch.zeros(4, 64, dtype=torch.int32, device="cuda"), "req_to_token")
        forward, schedule = env.stream("forward"), env.stream("schedule")
        for stream in (forward, schedule):
            stream.wait_stream(torch.cuda.current_stream())
        with env.use(forward):
            total = table[1].sum()
        with env.use(schedule):
            poison((1,), (64,), (table[1, 8:16], 8))
        env.synchronize()
        assert int((table[1, 8:16] == -1).sum()) == 8
        return {"total": total}

    try:
        found = races(step)
    finally:
        _REGISTRY.pop("poison", None)
    print(*found, sep="\n")
    assert [(r.second.info["kind"], r.where) for r in found] == [("cupy", ("req_to_token[1, 8:16]",))]


def test_a_block_freed_while_another_stream_uses_it_is_a_race():
    import torch

    def step(env, record: bool):
        side = env.stream("side")
        scratch = torch.ones(1 << 20, device="cuda")  # allocated on the default stream
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            total = scratch.sum()
        if record:
            scratch.record_stream(side)
        del scratch  # the caching allocator may hand the block out again on the default stream
        reused = torch.zeros(1 << 20, device="cuda")  # and does, to this allocation (same size, same stream)
        env.synchronize()
        return {"total": total, "reused": reused}

    found = races(lambda env: step(env, record=False))
    print(*found, sep="\n")
    assert [r.second.info["kind"] for r in found] == ["free"]
    assert races(lambda env: step(env, record=True)) == []


def test_the_delay_search_manifests_the_race_and_not_the_synced_step():
    racy = fuzz(racy_step, device="cuda", examples=200, seed=0, confirm=3)
    print(racy.divergence, racy.delays, racy.confirmed, racy.examples)
    assert racy.divergence is not None and len(racy.delays) <= 2 and racy.confirmed == 3
    clean = fuzz(synced_step, device="cuda", examples=200, seed=0)
    assert clean.divergence is None and clean.races == [] and clean.examples > 0
