"""racefuzz.trace on code as engines write it, on a real GPU, beside the CPU's verdict on the same steps:
index ops with the byte sets their index values select (read in the serialized reference run), the host's
`.tolist()` / `.numpy()` of a pinned tensor a non-blocking copy fills, torch's own stream API, frees and
`record_stream`. tests/unit/test_trace_real_code.py has the CPU side of each case.

Each test prints what it saw (run with `-s` for the record)."""

from __future__ import annotations

import re

import pytest

from racefuzz.program import Record, StreamSync
from racefuzz.trace import fuzz
from racefuzz.trace.builder import HOST
from racefuzz.trace.judge import trace_races
from racefuzz.trace.search import run_once

pytestmark = pytest.mark.cuda


def verdict(step, device: str, **options):
    found = trace_races(run_once(step, device, serialize=True, **options).program)
    print(device, *found, sep="\n  ")
    # An unnamed storage's number (tmp1, tmp2) counts the run's temporaries, and a CPU run makes more of them
    # (a scalar assignment's value is a tensor there): the verdict is the pair, not the numbering.
    return [
        (
            r.race.kind.value,
            r.first.stream.name,
            r.second.stream.name,
            tuple(re.sub(r"\btmp\d+", "tmp", w) for w in r.where),
        )
        for r in found
    ]


def gather_step(gather: str, written_row: int):
    import torch

    def step(env):
        table = env.name(torch.arange(64, dtype=torch.float32, device=env.device).reshape(8, 8), "req_to_token")
        forward, schedule = env.stream("forward"), env.stream("schedule")
        for stream in (forward, schedule):
            stream.wait_stream(env.current_stream())
        with env.use(forward):
            rows = torch.tensor([1, 3], device=env.device)
            if gather == "index_select":
                out = table.index_select(0, rows)
            elif gather == "R[idx, :k]":
                out = table[rows, :4]
            else:
                out = table.gather(0, rows.view(2, 1).expand(2, 8))
        with env.use(schedule):
            table[written_row, 0:2] = -1
        env.synchronize()
        return {"out": out}

    return step


@pytest.mark.parametrize("gather", ["index_select", "R[idx, :k]", "gather"])
def test_a_gather_reads_only_its_rows_on_the_gpu_as_on_the_cpu(gather):
    for row, expected in ((2, []), (3, [("WAR", "forward", "schedule", ("req_to_token[3, 0:2]",))])):
        step = gather_step(gather, row)
        assert verdict(step, "cuda") == expected
        assert verdict(step, "cpu") == expected


def test_a_gpu_run_that_is_not_serialized_keeps_the_whole_view_and_says_so():
    record = run_once(gather_step("index_select", 2), "cuda")
    assert record.whole_view_indexing == ["aten.index_select.default"]
    assert [r.where for r in trace_races(record.program)] == [("req_to_token[2, 0:2]",)]


def test_a_race_free_gather_beside_a_gather_of_the_written_row_on_the_gpu():
    """The delay search on a clean gather finds nothing; the control (the written row) is caught."""
    clean = fuzz(gather_step("R[idx, :k]", 2), device="cuda", examples=30, seed=0)
    control = fuzz(gather_step("R[idx, :k]", 3), device="cuda", examples=30, seed=0)
    print(clean.races, clean.divergence, control.races, control.divergence)
    assert not clean.racy and control.racy


def pinned_read_step(read: str, synced: bool):
    import torch

    def step(env):
        tokens = torch.arange(4, device="cuda")
        copy = env.stream("copy")
        copy.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(copy):
            host = tokens.to("cpu", non_blocking=True)  # a pinned tensor (torch pins a non-blocking D2H copy)
            copy_done = env.event("copy_done")
            copy_done.record()
        if synced:
            copy_done.synchronize()
        values = host.tolist() if read == "tolist" else host.numpy().tolist()
        torch.cuda.synchronize()
        return {"values": torch.tensor(values)}

    return step


@pytest.mark.parametrize("read", ["tolist", "numpy"])
def test_a_pinned_tensors_host_read_before_the_copys_sync_is_a_host_race_and_after_it_clean(read):
    found = verdict(pinned_read_step(read, synced=False), "cuda")
    assert [(kind, first, second) for kind, first, second, _ in found] == [("RAW", "copy", HOST)]
    assert verdict(pinned_read_step(read, synced=True), "cuda") == []
    record = run_once(pinned_read_step(read, synced=True), "cuda")
    assert "copy_done" in {op.event.name for op in record.program.ops if isinstance(op, Record)}


def engine_step(barrier: bool):
    """Streams and events from torch's own API only, as an engine's code makes them."""
    import torch

    def step(env):
        device_module = torch.get_device_module(env.device)
        table = env.name(torch.arange(64, dtype=torch.int32, device=env.device).reshape(8, 8), "req_to_token")
        forward, schedule = device_module.Stream(), torch.cuda.Stream()
        current = torch.cuda.current_stream()
        forward.wait_stream(current)
        schedule.wait_stream(current)
        with torch.cuda.stream(forward):
            rows = torch.tensor([1, 3], device=env.device)
            out = table[rows, :4]
            read_done = device_module.Event()
            read_done.record()
        if barrier:
            schedule.wait_event(read_done)
        with device_module.stream(schedule):
            table[1, 0:2] = -1
        torch.cuda.synchronize()
        return {"out": out}

    return step


def free_step(record_stream: bool):
    import torch

    def step(env):
        forward = env.stream("forward")
        buffer = torch.ones(1 << 10, device=env.device)
        forward.wait_stream(env.current_stream())
        with env.use(forward):
            buffer.mul_(2)
        if record_stream:
            buffer.record_stream(forward)
        del buffer
        return {"reused": torch.zeros(1 << 10, device=env.device)}  # the default stream's next allocation

    return step


def tensor_from_data_step(freed_in_use: bool):
    """`torch.tensor(data, device=env.device)` on the schedule stream: a blocking copy into a block of that
    stream (tests/unit/test_trace_real_code.py has the CPU side)."""
    import torch

    def step(env):
        table = env.name(torch.arange(64, dtype=torch.int32, device=env.device).reshape(8, 8), "req_to_token")
        schedule, forward = env.stream("schedule"), env.stream("forward")
        for stream in (schedule, forward):
            stream.wait_stream(env.current_stream())
        with env.use(schedule):
            table[1, 0:2] = -1
            rows = torch.tensor([1, 3], device=env.device)
        with env.use(forward):
            out = table[rows]
        if not freed_in_use:
            env.synchronize()
        del rows
        with env.use(schedule):
            reused = torch.zeros(2, dtype=torch.int64, device=env.device)  # the schedule stream's next allocation
        env.synchronize()
        return {"out": out, "reused": reused}

    return step


@pytest.mark.parametrize(
    "step",
    [
        engine_step(False),
        engine_step(True),
        free_step(False),
        free_step(True),
        tensor_from_data_step(True),
        tensor_from_data_step(False),
    ],
    ids=["engine-racy", "engine-barrier", "free-in-use", "record-stream", "tensor-freed-in-use", "tensor-synced"],
)
def test_the_cpus_verdict_is_the_gpus(step):
    gpu, cpu = verdict(step, "cuda"), verdict(step, "cpu")
    assert gpu == cpu


def test_a_stream_query_that_answers_true_is_a_sync():
    import torch

    def step(env):
        side = env.stream("side")
        with env.use(side):
            torch.ones(4, device="cuda").add_(1)
        side.synchronize()
        assert side.query()

    ops = run_once(step, "cuda").program.ops
    assert [op.stream.name for op in ops if isinstance(op, StreamSync)] == ["side", "side"]
