"""CUDA graphs in `racefuzz trace` on a real GPU: the steps of tests/unit/test_trace_graphs.py under real
`torch.cuda.graph` capture and replay give the CPU's happens-before verdicts, and a delay before a replay
makes the replayed read see the schedule stream's write (the race manifests, k of k) while the step that
records its read-done event after the replay stays clean under the same delay.

Each test prints what it saw (run with `-s` for the record)."""

from __future__ import annotations

import pytest

from racefuzz.program import Launch
from racefuzz.trace import fuzz
from racefuzz.trace.graphs import GRAPH_NODE, REPLAY
from racefuzz.trace.judge import trace_races
from racefuzz.trace.search import launch_points, run_once, run_with_delays
from tests.unit.test_trace_graphs import (
    event_in_capture_step,
    forked_capture_step,
    freed_before_capture_step,
    replayed_read_step,
    two_replays_step,
    waiting_capture_step,
)

pytestmark = pytest.mark.cuda


@pytest.fixture(scope="module", autouse=True)
def _kernels_loaded():
    """The steps' kernels run once outside any capture first (CUDA loads a module's kernels lazily, and
    torch's docs warm a graph's work up before capturing it)."""
    import torch

    table = torch.ones(4, 8, device="cuda")
    out = torch.zeros(8, device="cuda")
    out.copy_(table[1] * 10)
    out.add_(1)
    table[1].fill_(7)
    torch.cuda.synchronize()


def verdict(step, device):
    """What happens-before says, without stream names (a GPU and a CPU run number streams they did not
    name alike)."""
    found = trace_races(run_once(step, device, serialize=True).program)
    return sorted((r.race.kind.value, r.where, r.first.info["kind"], r.second.info["kind"]) for r in found)


CASES = {
    "replayed read, no barrier": (replayed_read_step(read_done_after_replay=False), True),
    "replayed read, read_done after the replay": (replayed_read_step(read_done_after_replay=True), False),
    "event recorded in the capture after the read": (event_in_capture_step(record_after_read=True), False),
    "event recorded in the capture before the read": (event_in_capture_step(record_after_read=False), True),
    "second replay unordered": (two_replays_step(forward_waits_before_replay_2=False), True),
    "second replay ordered": (two_replays_step(forward_waits_before_replay_2=True), False),
    "forked capture, schedule waits": (forked_capture_step(schedule_waits=True), False),
    "forked capture, no wait": (forked_capture_step(schedule_waits=False), True),
    "wait inside the capture": (waiting_capture_step(wait_inside_capture=True), False),
    "no wait inside the capture": (waiting_capture_step(wait_inside_capture=False), True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_graph_step_gets_the_cpus_happens_before_verdict_on_the_gpu(case):
    step, racy = CASES[case]
    on_gpu = verdict(step, "cuda")
    print(case, on_gpu)
    assert bool(on_gpu) == racy
    assert on_gpu == verdict(step, "cpu")


def test_a_captures_allocation_is_no_reuse_on_the_gpu_either():
    from racefuzz.trace.judge import judge

    judged = {
        device: judge(run_once(freed_before_capture_step, device, serialize=True).program) for device in ("cuda", "cpu")
    }
    print(judged)
    for found in judged.values():
        assert found.races == []
    assert [(r.first.stream.name, r.second.info["kind"]) for r in judged["cpu"].latent] == [("schedule", "free")]
    # On the GPU `torch.cuda.graph` synchronizes the device on entry and then allocates its RNG state on the
    # capture stream (two `fill_`s): that allocation may get the freed block, but after the sync, so the free
    # is neither a race nor latent there (the CPU's stand-in capture allocates nothing). Seen on the H200.
    assert judged["cuda"].latent == []


def test_a_replay_is_recorded_as_its_nodes_on_the_replay_stream_between_its_two_delay_points():
    run = run_once(replayed_read_step(read_done_after_replay=False), "cuda", serialize=True)
    on_forward = [op for op in run.program.ops if isinstance(op, Launch) and op.stream.name == "forward"]
    print([(op.info["kind"], op.kernel) for op in on_forward])
    assert [op.info["kind"] for op in on_forward] == [REPLAY, GRAPH_NODE, GRAPH_NODE, REPLAY]
    assert [n for stream, n in launch_points(run) if stream == "forward"] == [0, 1]
    assert run.outputs["out"].tolist() == [20.0] * 8  # serialized: the replay read row 1 (2) before the write


def test_a_delay_before_the_replay_makes_the_replayed_read_see_the_new_value_and_the_synced_step_stays_clean():
    racy = replayed_read_step(read_done_after_replay=False)
    synced = replayed_read_step(read_done_after_replay=True)
    before_replay = [("forward", 0, 5000.0)]  # the replay's first boundary launch: a spin before the graph
    for step, expected in ((racy, 70.0), (synced, 20.0)):
        reference = run_once(step, "cuda", serialize=True)
        outs = []
        for _ in range(3):
            run = run_with_delays(step, "cuda", reference, before_replay)
            assert not isinstance(run, BaseException), run
            assert run.delays_applied == [("forward", 0, 5000.0)]
            outs.append(run.outputs["out"].tolist())
        print(expected, outs)
        assert outs == [[expected] * 8] * 3  # 3 of 3: the racy replay read the schedule's 7 (x 10)


def test_the_delay_search_manifests_the_replay_race_beside_a_clean_control():
    racy = fuzz(replayed_read_step(read_done_after_replay=False), device="cuda", examples=100, seed=0, confirm=3)
    print(racy.divergence, racy.delays, racy.confirmed, racy.examples)
    assert racy.races and racy.manifested
    # The one point that manifests it: before the replay (a delay inside a graph is not a point).
    assert [(stream, n) for stream, n, _ in racy.delays] == [("forward", 0)]
    clean = fuzz(replayed_read_step(read_done_after_replay=True), device="cuda", examples=100, seed=0)
    print(clean.races, clean.divergence, clean.examples)
    assert not clean.racy and clean.examples > 0


def triton_graph_step(read_done_after_replay: bool):
    """`replayed_read_step` with the graph's read made by a Triton kernel (annotated by the test)."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def graph_copy_row(src, dst, BLOCK: tl.constexpr):
        offsets = tl.arange(0, BLOCK)
        tl.store(dst + offsets, tl.load(src + offsets))

    def step(env):
        table = env.name(torch.arange(1, 5, dtype=torch.float32, device=env.device).view(4, 1).repeat(1, 8), "table")
        out = env.name(torch.zeros(8, device=env.device), "out")
        schedule, forward = env.stream("schedule"), env.stream("forward")
        for stream in (schedule, forward):
            stream.wait_stream(env.current_stream())
        graph_copy_row[(1,)](table[0], out, BLOCK=8)  # compiled outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            graph_copy_row[(1,)](table[1], out, BLOCK=8)
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


def test_a_triton_kernel_in_a_graph_is_a_node_of_each_replay_and_its_race_manifests_before_the_replay(monkeypatch):
    pytest.importorskip("triton")
    from racefuzz.trace import annotations

    monkeypatch.setattr(annotations, "_REGISTRY", {})
    annotations.annotate("graph_copy_row", reads={"src": "whole"}, writes={"dst": "whole"})
    racy, synced = triton_graph_step(False), triton_graph_step(True)
    found = trace_races(run_once(racy, "cuda", serialize=True).program)
    print(*found, sep="\n")
    assert [(r.race.kind.value, r.first.info["kind"], r.first.kernel, r.where) for r in found] == [
        ("WAR", GRAPH_NODE, "graph_copy_row", ("table[1, 0:8]",))
    ]
    assert trace_races(run_once(synced, "cuda", serialize=True).program) == []
    reference = run_once(racy, "cuda", serialize=True)
    # The forward's first boundary launch: the replay's (the eager warm-up launch is on the default stream).
    before_replay = [("forward", 0, 5000.0)]
    outs = [run_with_delays(racy, "cuda", reference, before_replay).outputs["out"].tolist() for _ in range(3)]
    print(reference.outputs["out"].tolist(), outs)
    assert reference.outputs["out"].tolist() == [2.0] * 8 and outs == [[7.0] * 8] * 3
