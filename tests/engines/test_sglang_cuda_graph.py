"""Decodes replayed from CUDA graphs in the sglang harness (`Workload.cuda_graph`, `racefuzz sglang --cuda-graph`).

The fake worker captures one graph per batch size at its init (racefuzz's CPU stand-ins for
`torch.cuda.graph`) and decodes through sglang's own `DecodeCudaGraphRunner.execute` on a stand-in runner
(`racefuzz/engines/sglang/graph_runner.py`). 0.5.23 reads `req_to_token` inside the graph, before sglang's
in-graph marker, and its barrier's fast path waits on that marker; 0.5.15 reads in `load_batch` and publishes
before the replay. The loop tests need 0.5.15's and 0.5.23's sources and skip without them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from engine_support import once_per_session, sources_or_skip

from racefuzz.engines.sglang import sources
from racefuzz.engines.sglang.workload import FIXED, Request, Workload, workloads
from racefuzz.exitcodes import ExitCode

GRAPH_FIXED = FIXED.with_cuda_graph(True)
EXECUTE = "sglang/srt/model_executor/runner/decode_cuda_graph_runner.py:execute"


def test_cuda_graph_round_trips_and_old_files_read_as_eager() -> None:
    assert Workload.from_json(json.loads(json.dumps(GRAPH_FIXED.to_json()))) == GRAPH_FIXED
    assert GRAPH_FIXED.to_json()["cuda_graph"] is True and "decode in CUDA graphs" in GRAPH_FIXED.describe()
    assert "cuda_graph" not in FIXED.to_json()
    assert not Workload.from_json({"requests": [["r0", 0, 12, 2]]}).cuda_graph
    with pytest.raises(ValueError, match="cuda_graph needs spec none"):
        Workload((Request("r0", 0, 3, 2),), cuda_graph=True, spec="dflash")


def test_cuda_graphs_are_drawn_and_the_default_draws_are_unchanged() -> None:
    from hypothesis import HealthCheck, given, settings

    from racefuzz.commands.sglang import draw_workloads

    assert draw_workloads(8, seed=3) == draw_workloads(8, seed=3, cuda_graphs=(False,))
    seen: list[Workload] = []

    @settings(max_examples=40, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(workloads(page_sizes=(1, 16), cuda_graphs=(False, True)))
    def drawn(workload: Workload) -> None:
        seen.append(workload)

    drawn()
    assert {w.cuda_graph for w in seen} == {False, True} and {w.page_size for w in seen} == {1, 16}
    assert all(w.cuda_graph for w in draw_workloads(4, seed=0, cuda_graphs=(True,)))


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--cuda-graph", "drawn"], "--cuda-graph drawn needs --workload drawn or search"),
        (["--cuda-graph", "on", "--spec", "dflash"], "--cuda-graph needs --spec none"),
        (["--cuda-graph", "on", "--read-done", "after"], "--cuda-graph needs --read-done none"),
        (["--cuda-graph", "maybe"], "argument --cuda-graph: invalid choice"),
    ],
)
def test_bad_cuda_graph_options_are_one_line_and_exit_2(args: list[str], says: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "racefuzz.cli", "sglang", "--version", "0.5.23", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == ExitCode.USAGE, done.stderr
    assert says in done.stderr.strip().splitlines()[-1], done.stderr


def _sources_or_skip(version: str) -> Path:
    return sources_or_skip(sources, "sglang", version)


def _graph_result(tmp_path_factory: pytest.TempPathFactory, version: str) -> dict:
    """`version` on the fixed workload with its decodes in graphs, barrier and control (once per session)."""
    from racefuzz.commands.sglang import run_harness

    path = _sources_or_skip(version)
    return once_per_session(
        tmp_path_factory,
        f"sglang-harness-{version}-cuda-graph",
        lambda: run_harness(path, [GRAPH_FIXED.to_json()], True, version, 600),
    )


def test_0_5_23_decodes_in_graphs_clean_through_the_in_graph_marker(tmp_path_factory: pytest.TempPathFactory) -> None:
    from racefuzz.commands.sglang import version_verdict

    result = _graph_result(tmp_path_factory, "0.5.23")
    assert result["status"] == "ok", result.get("error")
    barrier, control = result["runs"]
    functions = set(barrier["sglang_functions"])
    assert {EXECUTE, EXECUTE.replace(":execute", ":_publish_read_done")} <= functions
    assert barrier["races"] == []
    # The barrier took its fast path on the decodes (the marker sglang's execute handed out), its coarse
    # wait_stream on the eager prefills.
    syncs = barrier["syncs"]
    assert syncs.get("wait_event at sglang/srt/managers/scheduler.py:2021 (_apply_war_barrier)", 0) >= 2, syncs
    # The control: a read during a replay (a graph node on the forward stream) against a schedule-stream write.
    replayed = [race for race in control["races"] if " in graph#" in race["first"]["source"]]
    assert replayed, f"no race of a replayed read in the control: {control['races']}"
    streams = {(r["first"]["stream"], r["second"]["stream"]) for r in replayed}
    assert streams == {("forward_stream", "schedule_stream")}
    assert version_verdict(result, control=True) == ExitCode.CLEAN


def test_0_5_15_decodes_in_graphs_and_still_races(tmp_path_factory: pytest.TempPathFactory) -> None:
    from racefuzz.commands.sglang import version_verdict

    result = _graph_result(tmp_path_factory, "0.5.15")
    assert result["status"] == "ok", result.get("error")
    barrier = result["runs"][0]
    assert EXECUTE in set(barrier["sglang_functions"])
    assert barrier["syncs"].get("wait_event at sglang/srt/managers/scheduler.py:1527 (_apply_war_barrier)", 0) >= 2
    rewrites = [
        race
        for race in barrier["races"]
        if any("cache_unfinished_req" in chain for chain in race["second"].get("called_from", []))
    ]
    assert rewrites, f"#31687's pair was not found with the decodes in graphs: {barrier['races']}"
    assert version_verdict(result, control=True) == ExitCode.RACE


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "racefuzz.cli", "sglang", *args], capture_output=True, text=True, timeout=900
    )


def test_a_publish_moved_before_the_replay_is_caught_only_with_graphs(tmp_path: Path) -> None:
    """0.5.23's tree with `DecodeCudaGraphRunner.execute` publishing the IN_REPLAY read-done before the replay
    (the ordering #31686 and #37988 are about): the graph's in-graph read then follows the event the barrier
    trusts. With `--cuda-graph on` the loop races; eager decodes never run `execute` and stay clean."""
    original = _sources_or_skip("0.5.23")
    checkout = tmp_path / "sglang" / "python"
    checkout.parent.mkdir()
    subprocess.run(["cp", "-rs", str(original), str(checkout)], check=True)  # a tree of symlinks
    runner = checkout / "sglang" / "srt" / "model_executor" / "runner" / "decode_cuda_graph_runner.py"
    text = runner.read_text()
    before = "            if shared_read_ends is SharedReadEnds.PRE_REPLAY:\n"
    after = "            if shared_read_ends is SharedReadEnds.IN_REPLAY:\n"
    assert text.count(before) == 1 and text.count(after) == 1
    early = "            if shared_read_ends in (SharedReadEnds.PRE_REPLAY, SharedReadEnds.IN_REPLAY):\n"
    moved = text.replace(before, early)
    moved = moved.replace(after, "            if False:  # published before the replay above\n")
    runner.unlink()
    runner.write_text(moved)
    graphs = _cli("--source", str(checkout.parent), "--no-control", "--cuda-graph", "on")
    assert graphs.returncode == ExitCode.RACE, graphs.stdout[-3000:] + graphs.stderr[-2000:]
    assert " in graph#" in graphs.stdout and "(run_batch)" in graphs.stdout
    eager = _cli("--source", str(checkout.parent), "--no-control")
    assert eager.returncode == ExitCode.CLEAN, eager.stdout[-3000:] + eager.stderr[-2000:]
