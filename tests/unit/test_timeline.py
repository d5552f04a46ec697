"""Timelines: the Chrome trace flags the two conflicting accesses, and the PNG is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from racefuzz.backends import executor
from racefuzz.designs import load_design
from racefuzz.report import primary_race
from racefuzz.scenarios.sglang import RequestSpec, Workload, build_program
from racefuzz.schedule import Schedule
from racefuzz.search import explain, judge
from racefuzz.timeline import chrome_trace, write_timeline

WORKLOAD = Workload(requests=(RequestSpec(0, 4, 64, (1, 1, 1), rewrite_at=(0,)),), iterations=4)


@pytest.fixture
def outcome():
    design = load_design("global-war")
    program = build_program(WORKLOAD, design.hooks)
    reader = next(op for op in program.launches if op.kernel == "verify_page_table" and op.info["iteration"] == 1)
    return explain(judge(WORKLOAD, design, Schedule(read_spins={reader.index: 500.0}), executor("sim")), "sim")


def test_trace_has_a_track_per_stream_and_flags_the_race(outcome) -> None:
    race = primary_race(outcome)
    assert race is not None and outcome.corruptions
    trace = chrome_trace(outcome.execution, race, "t")
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert names == {"host", "schedule_stream", "forward_stream", "copy_stream"}
    flagged = {e["args"]["op"]: e["args"]["conflict"] for e in trace["traceEvents"] if "conflict" in e.get("args", {})}
    assert flagged == {race.first.index: "first (issued earlier)", race.second.index: "second (issued later)"}
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == len(outcome.execution.timeline)
    reader = next(e for e in spans if e["args"]["op"] == race.first.index)
    assert reader["dur"] >= 500.0, "the read spin is part of the reader's span"


def test_write_timeline_writes_trace_and_png(outcome, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    written = write_timeline(outcome, "sim", primary_race(outcome), tmp_path / "case", "title")
    assert [p.name for p in written] == ["case.trace.json", "case.png"]
    assert (tmp_path / "case.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_happens_before_only_counterexample_gets_an_unperturbed_timeline(tmp_path: Path) -> None:
    design = load_design("global-war")
    unordered = judge(WORKLOAD, design, None, None)
    assert unordered.execution is None and unordered.races
    written = write_timeline(unordered, "sim", unordered.races[0], tmp_path / "hb", "hb only")
    assert written[0].exists()


def test_timeline_names_keep_dotted_stems(outcome, tmp_path: Path) -> None:
    written = write_timeline(outcome, "sim", primary_race(outcome), tmp_path / "mypkg.sync-1a2b", "t")
    assert written[0].name == "mypkg.sync-1a2b.trace.json"
