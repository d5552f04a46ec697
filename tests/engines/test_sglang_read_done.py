"""sglang 0.5.23's read-done publishers, driven (`racefuzz.engines.sglang.read_done`): sglang's own
`DecodeCudaGraphRunner.execute`, `maybe_publish_prefill_shared_read_done`,
`EAGLEDraftExtendCudaGraphRunner.execute` and the workers' `last_shared_read_runner`, around fake reads of
`req_to_token`, then sglang's `Scheduler._apply_war_barrier` and a schedule-stream row rewrite, judged by
happens-before on the CPU. Every clean case runs in the same subprocess as the controls of its publisher,
each of which must race. docs/sglang-read-done.md has the table; docs/results/sglang-read-done-cpu/ the output.

Needs 0.5.23's sources in the cache (`racefuzz sglang fetch --version 0.5.23`); without them it skips.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from racefuzz.engines.sglang import sources

pytest.importorskip("torch")

VERSION = "0.5.23"


@pytest.fixture(scope="module")
def cases() -> dict[str, dict]:
    """Every case of one `python -m racefuzz.engines.sglang.read_done` run on 0.5.23, by name."""
    try:
        path: Path = sources.locate(version=VERSION)
    except sources.SourcesUnavailable as exc:
        pytest.skip(f"sglang {VERSION}'s sources are not here: {exc}")
    done = subprocess.run(
        [sys.executable, "-m", "racefuzz.engines.sglang.read_done", "--python-dir", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["status"] == "ok", result.get("error")
    return {case["case"]: case for case in result["cases"]}


def _races_on_req_to_token_read_on_forward(case: dict) -> bool:
    """Every race of `case` is a WAR on `req_to_token` row 1 between a forward-stream read and the
    schedule stream's rewrite after sglang's barrier."""
    return bool(case["races"]) and all(
        race["kind"] == "WAR"
        and race["where"] == ["req_to_token[1, 0:8]"]
        and " on forward_stream " in race["first"]
        and " on schedule_stream " in race["second"]
        for race in case["races"]
    )


FAST = "fast path (wait_event on the published event)"
COARSE = "coarse (wait_stream)"


@pytest.mark.parametrize(
    ("clean", "barrier", "controls"),
    [
        # DecodeCudaGraphRunner.execute: each declaration publishes where its reads end
        ("decode_in_replay", FAST, ["control_decode_in_replay_reads_after_marker"]),
        ("decode_pre_replay", FAST, ["control_decode_pre_replay_reads_in_graph"]),
        ("decode_in_replay_no_marker", FAST, ["control_decode_in_replay_reads_after_marker"]),
        ("decode_post_replay", FAST, ["control_decode_pre_replay_reads_in_graph"]),
        ("decode_unknown", COARSE, ["control_decode_pre_replay_reads_in_graph"]),
        # maybe_publish_prefill_shared_read_done, gated by the speculative algorithm (#35947)
        ("prefill_none", FAST, ["control_prefill_lazy_first_layer"]),
        ("prefill_dspark", FAST, ["control_prefill_lazy_first_layer"]),
        ("prefill_eagle", COARSE, ["control_prefill_lazy_first_layer"]),
        # EAGLEDraftExtendCudaGraphRunner.execute (#37988's site)
        ("eagle_draft_extend_unknown", COARSE, ["control_eagle_draft_extend_pre_replay_reads_in_graph"]),
        ("eagle_draft_extend_in_replay", FAST, ["control_eagle_draft_extend_pre_replay_reads_in_graph"]),
        ("eagle_draft_extend_pre_replay", FAST, ["control_eagle_draft_extend_pre_replay_reads_in_graph"]),
        # the workers' last_shared_read_runner (#35057, #38169)
        ("eagle_step", COARSE, ["control_eagle_step_target_fence"]),
        ("multi_layer_staged", FAST, ["control_multi_layer_staged_reads_in_graph"]),
    ],
)
def test_each_publisher_is_clean_beside_its_caught_control(
    cases: dict[str, dict], clean: str, barrier: str, controls: list[str]
) -> None:
    assert cases[clean]["verdict"] == "clean", cases[clean]["races"]
    assert cases[clean]["barrier"] == barrier  # a fast-path clean is the published event's, not wait_stream's
    for control in controls:
        assert cases[control]["barrier"] == FAST  # the race is the trusted event's
        assert _races_on_req_to_token_read_on_forward(cases[control]), cases[control]["races"]


def test_the_read_a_control_misses_is_the_one_its_case_moves(cases: dict[str, dict]) -> None:
    """The controls' races name the fake read that the publish does not follow: inside the graph's
    replay for the graph runners, the eager layer for the prefill."""
    in_replay = [
        "control_decode_pre_replay_reads_in_graph",
        "control_decode_in_replay_reads_after_marker",
        "control_eagle_draft_extend_pre_replay_reads_in_graph",
        "control_multi_layer_staged_reads_in_graph",
    ]
    for name in in_replay:
        assert all("(graph)" in race["first"] and "replay" in race["first"] for race in cases[name]["races"]), name
    lazy = cases["control_prefill_lazy_first_layer"]["races"]
    assert all("(graph)" not in race["first"] and "layer_reads" in race["first"] for race in lazy)


def test_the_eagle_workers_hand_the_scheduler_the_runner_of_the_last_read(cases: dict[str, dict]) -> None:
    assert cases["eagle_step"]["worker"] == "EAGLEWorkerV2.last_shared_read_runner -> draft runner"
    assert cases["multi_layer_staged"]["worker"] == "MultiLayerEagleWorkerV2.last_shared_read_runner -> target runner"
    assert (
        cases["control_eagle_step_target_fence"]["worker"] == "BaseSpecWorker.last_shared_read_runner -> target runner"
    )


def test_every_case_is_as_expected(cases: dict[str, dict]) -> None:
    assert [name for name, case in cases.items() if not case["as_expected"]] == []


@pytest.mark.parametrize(
    ("case", "site"),
    [
        ("decode_in_replay", "decode_cuda_graph_runner.py:{} (_record_in_graph_metadata_prep_done)"),
        ("decode_pre_replay", "decode_cuda_graph_runner.py:{} (_publish_read_done)"),
        ("decode_post_replay", "decode_cuda_graph_runner.py:{} (_publish_read_done)"),
        ("decode_in_replay_no_marker", "decode_cuda_graph_runner.py:{} (_publish_read_done)"),
        ("prefill_dspark", "shared_read_event.py:{} (maybe_publish_prefill_shared_read_done)"),
        ("eagle_draft_extend_in_replay", "decode_cuda_graph_runner.py:{} (_publish_read_done)"),
    ],
)
def test_the_event_the_barrier_waits_on_is_recorded_by_sglangs_publisher(
    cases: dict[str, dict], case: str, site: str
) -> None:
    """The record is made by sglang's line (its file and function; the line number is the version's), and
    the barrier's wait is sglang's `_apply_war_barrier`'s `wait_event`."""
    calls = cases[case]["sglang_calls"]
    head, tail = site.split("{}")
    assert any(call.startswith("record at sglang/srt/") and head in call and call.endswith(tail) for call in calls)
    assert any(call.startswith("wait_event at sglang/srt/managers/scheduler.py:") for call in calls)
    assert not any(call.startswith("wait_stream at sglang/srt/managers/scheduler.py:") for call in calls)
