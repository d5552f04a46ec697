"""The scenario seam: a second scenario (tests/scenarios/ring_scenario.py, a two-stream ring buffer) runs
through search, report, replay and the CLI without any generic module knowing it."""

from __future__ import annotations

import json

import pytest
from ring_scenario import SCENARIO

from racefuzz.backends import executor
from racefuzz.cli import main
from racefuzz.designs import load_design
from racefuzz.report import load_replay, render, save_counterexample
from racefuzz.search import search


def _design(name: str):
    return load_design(name, "ring_scenario:SCENARIO")


def test_builtins_of_the_scenario_load_by_name_and_user_designs_name_their_scenario() -> None:
    assert _design("ring-events").scenario is SCENARIO
    user = load_design("ring_scenario:raw_only")  # no scenario given: the design names its own
    assert user.name == "ring-raw-only" and user.scenario is SCENARIO
    with pytest.raises(Exception, match="unknown design 'global-war'"):
        _design("global-war")


def test_the_fenced_ring_is_clean_beside_its_control_caught_in_the_same_run() -> None:
    sim = executor("sim")
    control = search(_design("ring-none"), sim, examples=300, seed=0, shrink=False)
    clean = search(_design("ring-events"), sim, examples=300, seed=0)
    assert control.found and control.manifested_examples >= 1
    assert not clean.found and clean.examples == 300


def test_a_missing_war_fence_is_found_shrunk_reported_and_replayed(tmp_path, capsys) -> None:
    result = search(load_design("ring_scenario:raw_only"), executor("sim"), examples=500, seed=0)
    assert result.found
    counterexample = result.counterexample
    assert counterexample is not None and counterexample.oracle == "corruption"
    kinds = {race.kind.value for race in counterexample.races}
    assert kinds == {"WAR"}, kinds  # the RAW edge is fenced; only the slot reuse races
    # Shrunk to the smallest wraparound: two items through one slot.
    assert (counterexample.workload.items, counterexample.workload.slots) == (2, 1)

    path, text, _ = save_counterexample(result, 0, tmp_path)
    assert text.startswith("==== racefuzz: WAR race on ring (design ring_scenario:raw_only, backend sim) ====")
    assert "counterexample: 2 item(s) through 1 slot(s)" in text
    assert "op #" in text and "produce" in text and "consume" in text
    saved = json.loads(path.read_text())
    assert saved["scenario"] == "ring_scenario:SCENARIO"

    replay = load_replay(path)
    assert replay.scenario is SCENARIO and replay.workload == counterexample.workload
    assert render(counterexample, design=replay.design, backend="sim", replay_path=path, scenario=SCENARIO) == text

    capsys.readouterr()
    assert main(["replay", str(path)]) == 1
    out = capsys.readouterr().out
    assert "WAR race on ring" in out and "2 item(s) through 1 slot(s)" in out


def test_a_replay_file_naming_an_unknown_scenario_is_a_one_line_error(tmp_path, capsys) -> None:
    path = tmp_path / "x.json"
    path.write_text(
        json.dumps(
            {
                "format": "racefuzz-replay",
                "version": 1,
                "scenario": "no_such_module:SCENARIO",
                "design": "x",
                "backend": "sim",
                "seed": 0,
                "oracle": "corruption",
                "workload": {},
                "schedule": {},
            }
        )
    )
    assert main(["replay", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "cannot load scenario 'no_such_module:SCENARIO'" in err and "\n" not in err
