"""CUDA graphs in `racefuzz trace`, on the CPU: `torch.cuda.graph` / `torch.cuda.CUDAGraph` in a CPU
recording capture launches without running them, and each `replay()` records (and runs) them on the replay
stream between two boundary launches, the replay's only delay points (`racefuzz/trace/graphs.py`). Each
verdict beside its negative control; tests/cuda/test_trace_graphs_gpu.py runs the same steps on a GPU."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from racefuzz.errors import UserCodeError  # noqa: E402
from racefuzz.program import Launch, Record  # noqa: E402
from racefuzz.trace.graphs import GRAPH_NODE, REPLAY  # noqa: E402
from racefuzz.trace.judge import trace_races  # noqa: E402
from racefuzz.trace.search import launch_points, run_once  # noqa: E402


def reference(step):
    return run_once(step, "cpu", serialize=True)


def races_of(step):
    return trace_races(reference(step).program)


def streams_set_up(env):
    """A 4 x 8 table (row r holds r + 1) and an output, on the default stream; `schedule` and `forward`
    ordered after them."""
    table = env.name(torch.arange(1, 5, dtype=torch.float32, device=env.device).view(4, 1).repeat(1, 8), "table")
    out = env.name(torch.zeros(8, device=env.device), "out")
    schedule, forward = env.stream("schedule"), env.stream("forward")
    for stream in (schedule, forward):
        stream.wait_stream(env.current_stream())
    return table, out, schedule, forward


def replayed_read_step(read_done_after_replay: bool):
    """The forward replays a graph that reads `table[1]`; the schedule stream then rewrites that row, after
    the forward's `read_done` event or (the race) without waiting for anything."""

    def step(env):
        table, out, schedule, forward = streams_set_up(env)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out.copy_(table[1] * 10)
        with env.use(forward):
            graph.replay()
            read_done = env.event("read_done")
            if read_done_after_replay:
                read_done.record()
        with env.use(schedule):
            if read_done_after_replay:
                read_done.wait()
            table[1].fill_(7)
        env.synchronize()
        return {"out": out}

    return step


def test_a_replayed_read_racing_a_schedule_stream_write_is_a_race_and_clean_after_the_read_done_event():
    found = races_of(replayed_read_step(read_done_after_replay=False))
    assert [(r.race.kind.value, r.where) for r in found] == [("WAR", ("table[1, 0:8]",))]
    read, write = found[0].first, found[0].second
    assert (read.info["kind"], read.stream.name, read.kernel) == (GRAPH_NODE, "forward", "aten.mul.Tensor")
    assert "in graph#1 replay 1 at" in read.info["at"] and "test_trace_graphs.py" in read.info["at"]
    assert (write.stream.name, write.kernel) == ("schedule", "aten.fill_.Scalar")
    assert races_of(replayed_read_step(read_done_after_replay=True)) == []


def test_a_capture_runs_nothing_and_each_replay_runs_the_captured_ops_on_the_replay_stream():
    seen = {}

    def step(env):
        table, out, _, forward = streams_set_up(env)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            assert torch.cuda.is_current_stream_capturing()
            out.copy_(table[1] * 10)
            out.add_(1)
        assert not torch.cuda.is_current_stream_capturing()
        seen["after capture"] = out.clone()
        with env.use(forward):
            graph.replay()
        seen["after replay 1"] = out.clone()
        table[1].fill_(5)
        with env.use(forward):
            graph.replay()
        env.synchronize()
        return {"out": out}

    run = reference(step)
    assert seen["after capture"].tolist() == [0.0] * 8  # CUDA runs no captured kernel at the capture
    assert seen["after replay 1"].tolist() == [21.0] * 8
    assert run.outputs["out"].tolist() == [51.0] * 8  # replay 2 read the row the default stream rewrote
    ops = run.program.ops
    nodes = [op for op in ops if isinstance(op, Launch) and op.info["kind"] == GRAPH_NODE]
    assert [(op.kernel, op.stream.name) for op in nodes] == [
        ("aten.mul.Tensor", "forward"),
        ("aten.copy_.default", "forward"),
        ("aten.add_.Tensor", "forward"),
    ] * 2
    boundaries = [op.kernel for op in ops if isinstance(op, Launch) and op.info["kind"] == REPLAY]
    assert boundaries == ["graph#1.replay()", "graph#1.replay() done"] * 2
    # The capture's launches are not in the trace where the capture happened.
    first_replay = next(i for i, op in enumerate(ops) if isinstance(op, Launch) and op.info["kind"] == REPLAY)
    before = [op.kernel for op in ops[:first_replay] if isinstance(op, Launch)]
    assert "aten.mul.Tensor" not in before and "aten.add_.Tensor" not in before
    assert before[-1] == "aten.clone.default"  # the step's own `out.clone()` after the capture
    # The product `table[1] * 10` was allocated inside the capture: the graph's pool, no free on a stream
    # (a free at the end of the step would race with nothing here, but after a replay on another stream it
    # would: the graph still writes the block).
    product = nodes[0].writes[0].buffer.id
    frees = [op for op in ops if isinstance(op, Launch) and op.info["kind"] == "free"]
    assert frees and product not in {cells.buffer.id for op in frees for cells in op.writes}


def test_the_delay_points_of_a_replay_are_its_boundaries_not_its_nodes():
    run = reference(replayed_read_step(read_done_after_replay=False))
    points = launch_points(run)
    forward = [n for stream, n in points if stream == "forward"]
    assert forward == [0, 1]  # before the replay and after it: the two boundary launches
    on_forward = [op for op in run.program.ops if isinstance(op, Launch) and op.stream.name == "forward"]
    assert [op.info["kind"] for op in on_forward] == [REPLAY, GRAPH_NODE, GRAPH_NODE, REPLAY]


def event_in_capture_step(record_after_read: bool):
    """`read_done` is recorded inside the capture, after the graph's read of `table[1]` or before it; the
    schedule waits on it after the replay, then rewrites the row."""

    def step(env):
        table, out, schedule, forward = streams_set_up(env)
        read_done = torch.cuda.Event(external=True)  # CUDA's event whose record inside a capture is a node
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            if not record_after_read:
                read_done.record()
            out.copy_(table[1])
            if record_after_read:
                read_done.record()
        with env.use(forward):
            graph.replay()
        with env.use(schedule):
            read_done.wait()
            table[1].fill_(7)
        env.synchronize()
        return {"out": out}

    return step


def test_an_event_recorded_inside_the_capture_is_recorded_by_each_replay_where_the_capture_put_it():
    run = reference(event_in_capture_step(record_after_read=True))
    assert trace_races(run.program) == []
    records = [op for op in run.program.ops if isinstance(op, Record) and op.stream.name == "forward"]
    assert len(records) == 1  # the replay's, on the replay stream; none at the capture
    found = races_of(event_in_capture_step(record_after_read=False))
    assert [(r.race.kind.value, r.where) for r in found] == [("WAR", ("table[1, 0:8]",))]


def two_replays_step(forward_waits_before_replay_2: bool):
    """Replay 1 is ordered before the schedule's write by `read_done`; replay 2 reads the row again after the
    write on the schedule stream, ordered after it by `written` or not at all."""

    def step(env):
        table, out, schedule, forward = streams_set_up(env)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out.copy_(table[1])
        read_done, written = env.event("read_done"), env.event("written")
        with env.use(forward):
            graph.replay()
            read_done.record()
        with env.use(schedule):
            read_done.wait()
            table[1].fill_(7)
            written.record()
        with env.use(forward):
            if forward_waits_before_replay_2:
                written.wait()
            graph.replay()
        env.synchronize()
        return {"out": out}

    return step


def test_two_replays_each_race_or_not_by_their_own_ordering():
    found = races_of(two_replays_step(forward_waits_before_replay_2=False))
    assert [(r.race.kind.value, r.where) for r in found] == [("RAW", ("table[1, 0:8]",))]
    assert "in graph#1 replay 2 at" in found[0].second.info["at"]  # not replay 1: that one is ordered
    assert races_of(two_replays_step(forward_waits_before_replay_2=True)) == []


def forked_capture_step(schedule_waits: bool):
    """Inside the capture the graph forks onto `side` (which reads `table[2]`) and joins back; before the
    replay the forward rewrites `table[2]` itself; after it the schedule rewrites `table[2]`, after the
    forward's `replayed` event or without waiting."""

    def step(env):
        table, out, schedule, forward = streams_set_up(env)
        side = torch.cuda.Stream()
        side_out = env.name(torch.zeros(8, device=env.device), "side_out")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                side_out.copy_(table[2])
            out.copy_(table[1])
            torch.cuda.current_stream().wait_stream(side)
        replayed = env.event("replayed")
        with env.use(forward):
            table[2].fill_(3)  # before the replay on its stream: the fork orders the side branch after it
            graph.replay()
            replayed.record()  # after the join: the side branch's read too
        with env.use(schedule):
            if schedule_waits:
                replayed.wait()
            table[2].fill_(9)
        env.synchronize()
        return {"out": out, "side_out": side_out}

    return step


def test_a_stream_that_joins_the_capture_is_a_branch_of_each_replay_ordered_by_the_fork_and_the_join():
    run = reference(forked_capture_step(schedule_waits=True))
    assert trace_races(run.program) == []
    assert run.outputs["side_out"].tolist() == [3.0] * 8
    branch = [op for op in run.program.ops if isinstance(op, Launch) and op.info["kind"] == GRAPH_NODE]
    (side,) = {op.stream.name for op in branch} - {"forward"}  # `side`, as a branch of this replay
    assert side.startswith("graph#1/stream#") and side.endswith(" replay 1")
    # Without the wait, the schedule's write races with the side branch's read and with the forward's write.
    found = races_of(forked_capture_step(schedule_waits=False))
    assert sorted((r.race.kind.value, r.where, r.first.stream.name) for r in found) == [
        ("WAR", ("table[2, 0:8]",), side),
        ("WAW", ("table[2, 0:8]",), "forward"),
    ]


def test_a_branch_not_joined_back_before_capture_end_is_refused_as_cuda_refuses_it():
    def unjoined(env):
        table, out, _, _ = streams_set_up(env)
        side = torch.cuda.Stream()
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                out.copy_(table[2])

    with pytest.raises(UserCodeError, match=r"stream stream#\d+ joined the capture of CUDA graph graph#1"):
        reference(unjoined)
    assert reference(forked_capture_step(schedule_waits=True)).program.ops  # the control: joined, recorded


def waiting_capture_step(wait_inside_capture: bool):
    """The plan stream writes `table[3]` and records `planned` before the replay; the graph reads the row,
    after waiting on `planned` inside the capture or not."""

    def step(env):
        table, out, _, forward = streams_set_up(env)
        plan = env.stream("plan")
        plan.wait_stream(env.current_stream())
        planned = torch.cuda.Event(external=True)  # a wait inside a capture on an outside record: CUDA's external event
        with env.use(plan):
            planned.record()  # torch makes the CUDA event at its first record: a wait before it waits for nothing
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            if wait_inside_capture:
                torch.cuda.current_stream().wait_event(planned)
            out.copy_(table[3])
        with env.use(plan):
            table[3].fill_(8)
            planned.record()
        with env.use(forward):
            graph.replay()
        env.synchronize()
        return {"out": out}

    return step


def test_a_wait_inside_the_capture_orders_the_graphs_later_nodes_at_each_replay():
    assert races_of(waiting_capture_step(wait_inside_capture=True)) == []
    found = races_of(waiting_capture_step(wait_inside_capture=False))
    assert [(r.race.kind.value, r.where) for r in found] == [("RAW", ("table[3, 0:8]",))]


def test_a_host_sync_inside_a_capture_is_refused_as_cuda_refuses_it():
    def item_inside(env):
        table, out, _, _ = streams_set_up(env)
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            out.fill_(table[0, 0].item())

    def synchronize_inside(env):
        _, out, _, _ = streams_set_up(env)
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            out.add_(1)
            torch.cuda.synchronize()

    for step in (item_inside, synchronize_inside):
        with pytest.raises(UserCodeError, match="inside the capture of CUDA graph graph#1"):
            reference(step)

    # The control: the same ops outside the capture are recorded.
    def outside(env):
        table, out, _, _ = streams_set_up(env)
        out.fill_(table[0, 0].item())
        torch.cuda.synchronize()

    assert reference(outside).program.ops


def test_a_graph_captured_in_another_run_is_refused_at_its_replay():
    kept = []

    def capture(env):
        _, out, _, _ = streams_set_up(env)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out.add_(1)
        kept.append(graph)
        graph.replay()  # the control: in its own run

    def replay_later(env):
        kept[0].replay()

    assert [op.kernel for op in reference(capture).program.ops if getattr(op, "info", {}).get("kind", "") == REPLAY]
    with pytest.raises(UserCodeError, match="captured outside this run"):
        reference(replay_later)


def test_graph_steps_record_the_same_trace_with_and_without_the_fast_path(monkeypatch):
    from racefuzz.trace import fastpath

    if fastpath.load() is None:
        pytest.skip("the C++ fast path is not available here")
    step = forked_capture_step(schedule_waits=False)
    fast = reference(step).program
    monkeypatch.setattr(fastpath, "_loaded", [None])
    python = reference(step).program
    assert fast.ops == python.ops


def test_the_docs_cuda_graphs_example_runs_verbatim_and_races_where_the_docs_say():
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[2] / "docs" / "trace.md").read_text()
    section = docs[docs.index("## CUDA graphs") :]
    code = section[section.index("```python\n") + len("```python\n") : section.index("```\n", 10)]
    namespace: dict = {}
    exec(compile(code, "docs/trace.md", "exec"), namespace)
    found = races_of(namespace["step"])
    assert [(r.race.kind.value, r.first.info["kind"], r.first.kernel, r.second.kernel, r.where) for r in found] == [
        ("WAR", GRAPH_NODE, "aten.mul.Tensor", "aten.fill_.Scalar", ("table[1, 0:8]",))
    ]
    assert "in graph#1 replay 1 at" in found[0].first.info["at"]


def test_a_kernel_launched_inside_a_capture_runs_at_each_replay_over_its_whole_annotated_views(monkeypatch):
    from racefuzz.trace import annotations, launch_kernel, rows

    monkeypatch.setattr(annotations, "_REGISTRY", {})
    annotations.annotate(
        "row_gather", reads={"table": rows("table", "index"), "index": "whole"}, writes={"out": "whole"}
    )
    ran = []

    def row_gather(table, index, out):
        ran.append(int(index[0]))
        out.copy_(table[int(index[0])])

    def step(env):
        table, out, schedule, forward = streams_set_up(env)
        index = torch.tensor([0], device=env.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            launch_kernel("row_gather", row_gather, table=table, index=index, out=out)
        assert ran == []  # not at the capture
        with env.use(forward):
            index.fill_(2)  # the graph's input, refilled before the replay on its stream
            graph.replay()
        with env.use(schedule):
            table[0].fill_(9)  # a row the capture's index named, the replay's does not: the whole view races
        env.synchronize()
        return {"out": out}

    run = reference(step)
    assert ran == [2] and run.outputs["out"].tolist() == [3.0] * 8
    assert run.whole_view_indexing == ["row_gather"]
    assert [r.where for r in trace_races(run.program)] == [("table[0, 0:8]",)]


def freed_before_capture_step(env):
    """A block allocated on the capture stream is freed while the schedule stream may still read it; then the
    capture allocates on that stream. The capture's allocation is the graph pool's, never that block: the
    free is a latent hazard, not a race with the replay that first touches the graph's block."""
    table, out, schedule, forward = streams_set_up(env)
    capture_stream = torch.cuda.Stream()
    capture_stream.wait_stream(env.current_stream())
    with torch.cuda.stream(capture_stream):
        doubled = table * 2  # allocated on the capture stream
    schedule.wait_stream(capture_stream)
    with env.use(schedule):
        shifted = doubled + 1  # pending on the schedule stream when `doubled` is freed
    del doubled
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=capture_stream):
        out.copy_(table[1] * 10)  # the product: a graph-pool block allocated on the capture stream
    with env.use(forward):
        graph.replay()
    env.synchronize()
    return {"out": out, "shifted": shifted}


def test_a_captures_allocation_is_no_reuse_of_a_block_freed_on_the_capture_stream():
    from racefuzz.trace.judge import judge

    judged = judge(reference(freed_before_capture_step).program)
    assert judged.races == []
    assert [(r.first.stream.name, r.second.info["kind"]) for r in judged.latent] == [("schedule", "free")]
