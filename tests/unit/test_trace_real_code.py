"""racefuzz.trace on code as engines write it, on the CPU: index ops with the byte sets their index values
select, the host's reads that dispatch no op (`.tolist()`, `.numpy()`), torch's own stream API
(`torch.cuda.Stream`, `current_stream`, `get_device_module`) resolving to the run's virtual streams, and
frees and `record_stream` modelled as on a GPU. Each case beside its negative control."""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")

from racefuzz.program import EventSync, Launch, Record, StreamSync  # noqa: E402
from racefuzz.trace import TraceEnv, VirtualEvent, VirtualStream, fuzz  # noqa: E402
from racefuzz.trace import fastpath as fastpath_module  # noqa: E402
from racefuzz.trace.capture import recording  # noqa: E402
from racefuzz.trace.judge import trace_races  # noqa: E402
from racefuzz.trace.recorder import Recorder  # noqa: E402
from racefuzz.trace.report import render  # noqa: E402
from racefuzz.trace.search import run_once  # noqa: E402


def races_of(step, **options):
    return trace_races(run_once(step, "cpu", serialize=True, **options).program)


def where(step, **options):
    return [(r.race.kind.value, r.where) for r in races_of(step, **options)]


# --- (2) index ops: the bytes their index values select ----------------------------------------------------

ROWS = torch.tensor([1, 3])
"""The rows every gather below reads (of an 8 x 8 table)."""

GATHERS = {
    "index_select": lambda table, rows: table.index_select(0, rows),
    "R[idx]": lambda table, rows: table[rows],
    "R[idx, :k]": lambda table, rows: table[rows, :4],
    "gather": lambda table, rows: table.gather(0, rows.view(2, 1).expand(2, 8)),
    "take": lambda table, rows: table.take(torch.cat([rows * 8, rows * 8 + 1])),  # columns 0 and 1 of each row
    "R[mask]": lambda table, rows: table[torch.isin(torch.arange(8), rows)],
    "masked_select": lambda table, rows: table.masked_select(torch.isin(torch.arange(8), rows).view(8, 1)),
    "embedding": lambda table, rows: torch.nn.functional.embedding(rows, table),
}


def gather_step(gather, written_row: int):
    """The forward gathers rows 1 and 3 of the table; the schedule stream rewrites `table[written_row, 0:2]`
    with no edge from the forward."""

    def step(env):
        table = env.name(torch.arange(64, dtype=torch.float32).reshape(8, 8), "req_to_token")
        forward, schedule = env.stream("forward"), env.stream("schedule")
        for stream in (forward, schedule):
            stream.wait_stream(env.current_stream())  # after the table's and the index's allocation
        with env.use(forward):
            out = gather(table, ROWS)
        with env.use(schedule):
            table[written_row, 0:2] = -1
        env.synchronize()
        return {"out": out}

    return step


@pytest.mark.parametrize("name", list(GATHERS))
def test_a_gather_of_rows_a_writer_does_not_touch_is_clean_and_of_one_it_does_a_race(name):
    gather = GATHERS[name]
    assert where(gather_step(gather, written_row=2)) == []  # a row the gather does not read
    assert where(gather_step(gather, written_row=3)) == [("WAR", ("req_to_token[3, 0:2]",))]
    assert where(gather_step(gather, written_row=1)) == [("WAR", ("req_to_token[1, 0:2]",))]


def test_a_gather_reads_only_the_columns_of_its_slice():
    """`R[idx, :k]` is `aten.index` of the view `R[:, :k]`: the columns past k are never read."""

    def step(env):
        table = env.name(torch.arange(64, dtype=torch.int32).reshape(8, 8), "req_to_token")
        forward, schedule = env.stream("forward"), env.stream("schedule")
        for stream in (forward, schedule):
            stream.wait_stream(env.current_stream())
        with env.use(forward):
            out = table[ROWS, :4]
        with env.use(schedule):
            table[1, 4:8] = -1  # row 1, outside the columns read
            table[3, 3:5] = -1  # row 3, one column inside
        env.synchronize()
        return {"out": out}

    assert where(step) == [("WAR", ("req_to_token[3, 3:4]",))]


SCATTERS = {
    "R[idx] = v": lambda table, rows, src: table.__setitem__(rows, 5.0),
    "R[idx, :k] = v": lambda table, rows, src: table.__setitem__((rows, slice(0, 2)), src[:, :2]),
    "R[mask] = v": lambda table, rows, src: table.__setitem__(torch.isin(torch.arange(8), rows), 0.0),
    "index_put_ accumulate": lambda table, rows, src: table.index_put_((rows,), src, accumulate=True),
    "index_copy_": lambda table, rows, src: table.index_copy_(0, rows, src),
    "index_fill_": lambda table, rows, src: table.index_fill_(0, rows, 7.0),
    "index_add_": lambda table, rows, src: table.index_add_(0, rows, src),
    "scatter_": lambda table, rows, src: table.scatter_(0, rows.view(2, 1).expand(2, 8), src),
    "scatter_add_": lambda table, rows, src: table.scatter_add_(0, rows.view(2, 1).expand(2, 8), src),
    "scatter_ value": lambda table, rows, src: table.scatter_(0, rows.view(2, 1).expand(2, 8), 1.0),
    "masked_fill_": lambda table, rows, src: table.masked_fill_(torch.isin(torch.arange(8), rows).view(8, 1), 0),
    "masked_scatter_": lambda table, rows, src: table.masked_scatter_(
        torch.isin(torch.arange(8), rows).view(8, 1), src
    ),
}


def scatter_step(scatter, read_row: int):
    """The forward reads `table[read_row]`; the schedule stream writes rows 1 and 3 with `scatter`."""

    def step(env):
        table = env.name(torch.arange(64, dtype=torch.float32).reshape(8, 8), "req_to_token")
        src = torch.ones(2, 8)
        forward, schedule = env.stream("forward"), env.stream("schedule")
        for stream in (forward, schedule):
            stream.wait_stream(env.current_stream())
        with env.use(forward):
            total = table[read_row].sum()
        with env.use(schedule):
            scatter(table, ROWS, src)
        env.synchronize()
        return {"total": total}

    return step


@pytest.mark.parametrize("name", list(SCATTERS))
def test_an_index_write_races_only_with_a_read_of_a_row_it_writes(name):
    scatter = SCATTERS[name]
    assert where(scatter_step(scatter, read_row=2)) == []
    ((kind, cells),) = where(scatter_step(scatter, read_row=3))
    assert kind == "WAR" and all(cell.startswith("req_to_token[3, ") for cell in cells)


def test_an_index_op_whose_values_cannot_be_read_keeps_its_whole_view_and_the_report_says_so():
    """What a GPU run that is not serialized does (the index values there may not be the op's yet)."""
    step = gather_step(GATHERS["index_select"], written_row=2)
    recorder = Recorder("cpu", serialize=True)
    recorder.exact_indexing = False
    with recording(recorder):
        step(TraceEnv(recorder, "cpu"))
    assert recorder.record.whole_view_indexing == ["aten.index_select.default"]
    assert [r.where for r in trace_races(recorder.record.program)] == [
        ("req_to_token[2, 0:2]",)
    ]  # the whole table was read

    result = fuzz(gather_step(GATHERS["index_select"], written_row=2), device="cpu")
    assert result.reference.whole_view_indexing == [] and not result.racy
    result.reference = recorder.finish({})
    assert "index ops recorded over their whole views" in render(result)
    assert "aten.index_select.default" in render(result)


def test_index_ops_go_to_the_python_path_under_the_fast_path(monkeypatch):
    """The fast path records the schema's whole views: index ops must reach the mode, with it on or off."""
    if fastpath_module.load() is None:
        pytest.skip("the C++ fast path cannot be built here")
    step = gather_step(GATHERS["index_select"], written_row=2)
    fast = run_once(step, "cpu", serialize=True)
    with monkeypatch.context() as patch:
        patch.setattr(fastpath_module, "load", lambda: None)
        slow = run_once(step, "cpu", serialize=True)

    def without_sources(ops):
        return [(*op[:7], op.info["kind"]) if type(op) is Launch else op for op in ops]

    assert without_sources(fast.program.ops) == without_sources(slow.program.ops)  # not the source lines
    assert trace_races(fast.program) == []


def test_a_huge_index_is_coarsened_to_its_bounding_interval_never_dropped():
    def step(env):
        table = env.name(torch.zeros(10_000, 2), "big")
        forward, schedule = env.stream("forward"), env.stream("schedule")
        rows = torch.arange(0, 10_000, 2)  # 5000 rows, more runs than MAX_RUNS
        for stream in (forward, schedule):
            stream.wait_stream(env.current_stream())
        with env.use(forward):
            out = table[rows]
        with env.use(schedule):
            table[1] = 1.0  # between two rows read: inside the bounding interval
        env.synchronize()
        return {"out": out}

    assert len(where(step)) == 1


# --- (3) the host's reads -------------------------------------------------------------------------------


def host_read_step(read, synced: bool):
    """A non-blocking copy of the sampler's output on a copy stream, `copy_done` recorded after it; the
    host then reads the copy (`read(host)`), with or without `copy_done.synchronize()` first."""

    def step(env):
        tokens = torch.arange(4, dtype=torch.int64)
        host = torch.empty(4, dtype=torch.int64)
        copy = env.stream("copy")
        copy.wait_stream(env.current_stream())
        with env.use(copy):
            host.copy_(tokens, non_blocking=True)
            copy_done = env.event("copy_done")
            copy_done.record()
        if synced:
            copy_done.synchronize()
        values = read(host)
        env.synchronize()
        return {"values": torch.tensor(values)}

    return step


HOST_READS = {
    "tolist": lambda t: t.tolist(),
    "numpy": lambda t: t.numpy().tolist(),
    "int": lambda t: [int(t[0])],
    "float": lambda t: [float(t[1])],
    "bool": lambda t: [bool(t[2])],
    "item": lambda t: [t[3].item()],
    "iteration": lambda t: [int(x) for x in t],
}


@pytest.mark.parametrize("name", list(HOST_READS))
def test_a_host_read_before_the_copys_sync_is_a_race_and_after_it_clean(name):
    read = HOST_READS[name]
    found = races_of(host_read_step(read, synced=False))
    assert [(r.race.kind.value, r.first.stream.name, r.first.kernel) for r in found][:1] == [
        ("RAW", "copy", "aten.copy_.default")
    ]
    assert races_of(host_read_step(read, synced=True)) == []


def test_tolist_is_a_copy_on_the_current_stream_then_the_hosts_sync_as_item_is():
    def step(env):
        values = torch.arange(3)
        forward = env.stream("forward")
        with env.use(forward):
            values.add_(1)
            values.tolist()

    ops = run_once(step, "cpu").program.ops
    read = next(i for i, op in enumerate(ops) if getattr(op, "kernel", "") == "Tensor.tolist (device-to-host copy)")
    assert ops[read].stream.name == "forward" and ops[read + 1] == StreamSync(read + 1, ops[read].stream)


def test_host_reads_outside_a_recording_are_torchs_own():
    recorder = Recorder("cpu")
    with recording(recorder):
        pass
    assert torch.Tensor.tolist is torch._C.TensorBase.tolist and "tolist" not in vars(torch.Tensor)
    assert torch.arange(3).tolist() == [0, 1, 2]


# --- (5) torch's own stream API resolves to the run's virtual streams ----------------------------------


def engine_step(barrier: bool, module_of=lambda env: torch.get_device_module(env.device)):
    """Code as an engine writes it: streams and events from `torch.get_device_module(device)` and
    `torch.cuda`, `torch.cuda.current_stream()`, `with torch.cuda.stream(...)`, no TraceEnv API but `name`."""

    def step(env):
        device_module = module_of(env)
        table = env.name(torch.arange(64, dtype=torch.int32).reshape(8, 8), "req_to_token")
        forward = device_module.Stream()
        schedule = torch.cuda.Stream(priority=-1)
        current = torch.cuda.current_stream()
        forward.wait_stream(current)
        schedule.wait_stream(current)
        with torch.cuda.stream(forward):
            out = table[ROWS, :4]
            read_done = device_module.Event()
            read_done.record()
        if barrier:
            schedule.wait_event(read_done)
        with device_module.stream(schedule):
            table[1, 0:2] = -1
        torch.cuda.synchronize()
        return {"out": out}

    return step


@pytest.mark.parametrize(
    "module_of",
    [
        lambda env: torch.get_device_module(env.device),
        lambda env: torch.get_device_module("cuda"),
        lambda env: torch.cuda,
    ],
    ids=["get_device_module(env.device)", "get_device_module('cuda')", "torch.cuda"],
)
def test_an_engines_own_stream_api_resolves_to_the_runs_virtual_streams(module_of):
    found = races_of(engine_step(barrier=False, module_of=module_of))
    assert [(r.first.stream.name, r.second.stream.name, r.where) for r in found] == [
        ("stream#1", "stream#2", ("req_to_token[1, 0:2]",))
    ]
    assert races_of(engine_step(barrier=True, module_of=module_of)) == []


def test_torch_made_streams_and_events_are_virtual_and_current_stream_follows_the_step():
    seen = {}

    def step(env):
        stream = torch.get_device_module("cpu").Stream()
        seen["stream"], seen["event"] = stream, torch.cuda.Event(enable_timing=True)
        seen["current"] = torch.cuda.current_stream()
        seen["default"] = torch.cuda.default_stream()
        with torch.cuda.stream(stream):
            seen["inside"] = (torch.cuda.current_stream(), torch.cpu.current_stream(), env.current_stream())
        torch.cuda.set_stream(stream)
        seen["set"] = env.current_stream()
        torch.cuda.set_stream(seen["default"])
        seen["query"] = (stream.query(), seen["event"].query())

    trace = run_once(step, "cpu").program
    assert isinstance(seen["stream"], VirtualStream)
    assert isinstance(seen["event"], VirtualEvent)
    assert seen["current"] is seen["default"] and seen["current"].name == "default"
    assert seen["inside"] == (seen["stream"],) * 3 and seen["set"] is seen["stream"]
    assert seen["query"] == (True, True)  # a query that answers True is a sync, as on a GPU
    syncs = [op for op in trace.ops if isinstance(op, (StreamSync, EventSync))]
    named = [(type(op).__name__, op.stream.name if type(op) is StreamSync else op.event.name) for op in syncs]
    assert named == [("StreamSync", "stream#1"), ("EventSync", "event#1")]
    # Recorded or not, torch's own again after the recording.
    assert torch.cuda.Stream.__module__ == "torch.cuda.streams" and torch.cpu.Stream.__module__ == "torch.cpu"
    assert isinstance(torch.cpu.current_stream(), torch.cpu.Stream)


def test_another_thread_during_a_cpu_recording_gets_torchs_own_streams():
    got = []

    def step(env):
        thread = threading.Thread(target=lambda: got.append(torch.cpu.current_stream()))
        thread.start()
        thread.join()

    run_once(step, "cpu")
    assert type(got[0]).__module__ == "torch.cpu"


def free_step(record_stream: bool, synced: bool = False):
    """A buffer allocated on the default stream, used on the forward stream, freed by the host at once."""

    def step(env):
        forward = env.stream("forward")
        buffer = torch.ones(1 << 10)
        forward.wait_stream(env.current_stream())
        with env.use(forward):
            buffer.mul_(2)
        if record_stream:
            buffer.record_stream(forward)  # torch's own call, with a virtual stream
        if synced:
            env.current_stream().wait_stream(forward)
        del buffer  # the caching allocator may hand the block to the default stream's next allocation
        return {"reused": torch.zeros(1 << 10)}  # that allocation

    return step


def test_a_free_while_in_use_is_a_race_on_the_cpu_as_on_a_gpu():
    result = fuzz(free_step(record_stream=False), device="cpu")
    assert [(r.first.stream.name, r.second.info["kind"]) for r in result.races] == [("forward", "free")]
    assert fuzz(free_step(record_stream=False, synced=True), device="cpu").races == []


def test_record_stream_takes_a_virtual_stream_and_drops_the_free_as_on_a_gpu():
    assert fuzz(free_step(record_stream=True), device="cpu").races == []


def test_record_stream_of_a_torch_made_stream():
    def step(env):
        side = torch.cuda.Stream()
        buffer = torch.ones(8)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            buffer.add_(1)
        buffer.record_stream(side)
        del buffer

    assert races_of(step) == []


# --- what a newcomer meets first ------------------------------------------------------------------------


def test_trace_env_and_the_virtual_streams_are_importable_from_racefuzz_trace():
    import racefuzz.trace
    from racefuzz.trace.env import TraceEnv as Defined

    assert racefuzz.trace.TraceEnv is Defined and "TraceEnv" in racefuzz.trace.__all__


def test_env_event_takes_a_name_which_the_trace_and_reports_use():
    def step(env):
        first, second, anonymous = env.event("copy_done"), env.event("copy_done"), env.event()
        for event in (first, second, anonymous):
            event.record()

    records = [op.event.name for op in run_once(step, "cpu").program.ops if isinstance(op, Record)]
    assert records == ["copy_done", "copy_done#2", "event#1"]


def first_docs_example(env):
    """The first example of docs/trace.md, whole: the named streams are ordered after the stream the table
    was allocated on, so its one race is the forward's read against the schedule's write."""
    table = env.name(torch.zeros(8, 64, dtype=torch.int32, device=env.device), "req_to_token")
    schedule, forward = env.stream("schedule"), env.stream("forward")
    schedule.wait_stream(env.current_stream())  # after the table's allocation and zeroing
    forward.wait_stream(env.current_stream())
    with env.use(forward):
        rows = torch.tensor([1, 2], device=env.device)  # made on the stream that reads it
        kv_indices = table[rows, :32].flatten()
    with env.use(schedule):
        table[1, 0:8] = -1  # no barrier: a WAR with the forward's read
    env.synchronize()
    return {"kv_indices": kv_indices}


def test_the_first_docs_example_reports_only_the_pair_it_is_about():
    found = races_of(first_docs_example)
    assert [(r.first.stream.name, r.second.stream.name, r.where) for r in found] == [
        ("forward", "schedule", ("req_to_token[1, 0:8]",))
    ]


def test_a_kept_stream_context_is_re_entered_each_step_as_sglangs_forward_stream_ctx():
    """sglang keeps `device_module.StreamContext(forward_stream)` and enters it every iteration."""

    def step(env):
        device_module = torch.get_device_module(env.device)
        forward = device_module.Stream()
        context = device_module.StreamContext(forward)
        streams = []
        for _ in range(2):
            with context:
                streams.append(torch.cuda.current_stream())
                with context:  # nested: the outer one is current again after
                    pass
                streams.append(torch.cuda.current_stream())
            streams.append(torch.cuda.current_stream())
        assert streams == [forward, forward, env.current_stream()] * 2
        with device_module.StreamContext(None):  # None: no change, as torch's
            assert torch.cuda.current_stream() is env.current_stream()

    run_once(step, "cpu")


def test_negative_indices_and_broadcast_masks_select_the_elements_torch_does():
    def step(env, written_row: int, read):
        table = env.name(torch.arange(64, dtype=torch.float32).reshape(8, 8), "req_to_token")
        forward, schedule = env.stream("forward"), env.stream("schedule")
        for stream in (forward, schedule):
            stream.wait_stream(env.current_stream())
        with env.use(forward):
            out = read(table)
        with env.use(schedule):
            table[written_row, 0:2] = -1
        env.synchronize()
        return {"out": out}

    last_row = lambda table: table[torch.tensor([-1])]  # noqa: E731 - row 7
    assert where(lambda env: step(env, 6, last_row)) == []
    assert where(lambda env: step(env, 7, last_row)) == [("WAR", ("req_to_token[7, 0:2]",))]
    row_mask = torch.zeros(8, 1, dtype=torch.bool)
    row_mask[5] = True
    rows_selected = lambda table: table.masked_select(row_mask)  # noqa: E731 - broadcast over the columns
    assert where(lambda env: step(env, 4, rows_selected)) == []
    assert where(lambda env: step(env, 5, rows_selected)) == [("WAR", ("req_to_token[5, 0:2]",))]
    column_of = lambda table: table[:, 1:2].expand(8, 4).masked_select(row_mask)  # noqa: E731 - a broadcast input
    assert where(lambda env: step(env, 5, column_of)) == [("WAR", ("req_to_token[5, 1:2]",))]


@pytest.mark.parametrize(
    "use",
    [
        lambda stream: torch.cpu.stream(stream).__enter__(),
        lambda stream: torch.cuda.StreamContext(stream),
        lambda stream: torch.cuda.set_stream(stream),
        lambda stream: torch.ones(2).record_stream(stream),
    ],
    ids=["stream", "StreamContext", "set_stream", "record_stream"],
)
def test_a_stream_from_outside_the_cpu_run_is_refused_saying_why(use):
    from racefuzz.errors import UserCodeError

    outside = torch.cpu.Stream()  # torch's own, made before the run

    def step(env):
        use(outside)

    with pytest.raises(UserCodeError, match="only this run's streams can be made current"):
        run_once(step, "cpu")


def tensor_from_data_step(device_named: bool, freed_in_use: bool):
    """The schedule stream rewrites row 1, then makes the forward's index with `torch.tensor(data,
    device=env.device)`: on a GPU a blocking copy on the schedule stream (the host waits for it, and so for
    the rewrite) into a block allocated there. The forward reads row 1 through the index with no wait on the
    schedule stream; the index is then freed while the forward may still read it, or after a sync."""

    def step(env):
        table = env.name(torch.arange(64, dtype=torch.int32).reshape(8, 8), "req_to_token")
        schedule, forward = env.stream("schedule"), env.stream("forward")
        for stream in (schedule, forward):
            stream.wait_stream(env.current_stream())
        with env.use(schedule):
            table[1, 0:2] = -1
            rows = torch.tensor([1, 3], device=env.device) if device_named else torch.tensor([1, 3])
        with env.use(forward):
            out = table[rows]
        if not freed_in_use:
            env.synchronize()
        del rows
        with env.use(schedule):
            reused = torch.zeros(2, dtype=torch.int64)  # the schedule stream's next allocation: the block's reuse
        env.synchronize()
        return {"out": out, "reused": reused}

    return step


def test_a_tensor_made_from_data_for_the_device_is_a_blocking_copy_into_a_block_of_the_stream():
    # The copy's sync orders the rewrite before the forward's read; the index's free races with that read.
    found = races_of(tensor_from_data_step(device_named=True, freed_in_use=True))
    assert [(r.race.kind.value, r.first.stream.name, r.second.info["kind"]) for r in found] == [
        ("WAR", "forward", "free")
    ]
    assert races_of(tensor_from_data_step(device_named=True, freed_in_use=False)) == []
    # Without a device it is a host tensor, as in a GPU run: no copy, no sync, no block of a stream.
    found = races_of(tensor_from_data_step(device_named=False, freed_in_use=True))
    assert [(r.race.kind.value, r.first.stream.name, r.second.stream.name) for r in found] == [
        ("RAW", "schedule", "forward")
    ]
    for name, make in (
        ("as_tensor", lambda env: {"t": torch.as_tensor([1], dtype=torch.int64, device=env.device)}),
        ("asarray", lambda env: {"t": torch.asarray([1], device=env.device)}),
    ):
        kernels = [getattr(op, "kernel", "") for op in run_once(make, "cpu").program.ops]
        assert "torch.tensor (host-to-device copy)" in kernels, name


def test_the_whole_view_note_is_the_run_records():
    recorder = Recorder("cpu")
    recorder.exact_indexing = False
    with recording(recorder):
        gather_step(GATHERS["R[idx]"], written_row=2)(TraceEnv(recorder, "cpu"))
    assert recorder.record.whole_view_indexing == ["aten.index.Tensor"]
