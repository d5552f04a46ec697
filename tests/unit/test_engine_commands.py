"""`racefuzz.commands.engine`: what `racefuzz sglang` and `racefuzz vllm` share, without either engine."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from racefuzz.commands import engine
from racefuzz.errors import Inconclusive, RaceFound
from racefuzz.exitcodes import ExitCode


def _result(checked_races: int, control_races: int) -> dict:
    race = {"kind": "WAR"}
    return {
        "status": "ok",
        "runs": [
            {"control": False, "races": [race] * checked_races},
            {"control": True, "races": [race] * control_races},
        ],
    }


def _is_control(run: dict) -> bool:
    return run["control"]


@pytest.mark.parametrize(
    ("result", "control", "expected"),
    [
        (_result(1, 1), True, ExitCode.RACE),
        (_result(0, 1), True, ExitCode.CLEAN),
        (_result(0, 0), True, ExitCode.INCONCLUSIVE),
        (_result(0, 0), False, ExitCode.CLEAN),
        ({"status": "unsupported"}, True, ExitCode.USAGE),
        ({"status": "error"}, True, ExitCode.INTERNAL),
    ],
)
def test_a_versions_verdict(result: dict, control: bool, expected: ExitCode) -> None:
    assert engine.version_verdict(result, control, _is_control) == expected


def test_a_confirmed_wrong_read_is_a_race_without_a_happens_before_race() -> None:
    assert engine.version_verdict(_result(0, 1), True, _is_control, manifested=True) == ExitCode.RACE


def test_the_runs_exit_code_is_the_first_of_the_precedence_any_version_has() -> None:
    assert engine.overall_exit([ExitCode.CLEAN, ExitCode.INCONCLUSIVE, ExitCode.RACE]) == ExitCode.RACE
    assert engine.overall_exit([ExitCode.RACE, ExitCode.INTERNAL]) == ExitCode.INTERNAL
    assert engine.overall_exit([ExitCode.INTERNAL, ExitCode.USAGE]) == ExitCode.USAGE
    assert engine.overall_exit([ExitCode.CLEAN, ExitCode.CLEAN]) == ExitCode.CLEAN
    assert engine.overall_exit([]) == ExitCode.CLEAN


@pytest.mark.parametrize(
    ("verdict", "raised"),
    [(ExitCode.RACE, RaceFound), (ExitCode.INCONCLUSIVE, Inconclusive), (ExitCode.INTERNAL, RuntimeError)],
)
def test_an_assertion_raises_what_the_command_would_exit(verdict: ExitCode, raised: type) -> None:
    with pytest.raises(raised, match="the report"):
        engine.raise_for_verdict(verdict, "the report")


def test_a_clean_verdict_raises_nothing() -> None:
    assert engine.raise_for_verdict(ExitCode.CLEAN, "the report") is None


def test_the_targets_are_the_checkout_then_each_version() -> None:
    args = argparse.Namespace(source=Path("tree"), versions=["1.0.0", "1.0.1"])

    def locate(version: str | None = None, source: Path | None = None) -> Path:
        return Path(f"/located/{source or version}")

    assert engine.targets(args, locate, "0.9.0") == [
        ("source tree", Path("/located/tree"), "0.9.0"),
        ("1.0.0", Path("/located/1.0.0"), "1.0.0"),
        ("1.0.1", Path("/located/1.0.1"), "1.0.1"),
    ]


def test_a_replay_file_wraps_the_workload_in_the_replay_format(tmp_path: Path) -> None:
    from racefuzz.report import FORMAT, FORMAT_VERSION

    data = engine.replay_document("vllm", {"vllm_version": "0.33.0"}, {"requests": [1]}, {"race": {"kind": "WAR"}})
    path = engine.write_replay(tmp_path / "made", "r.json", data)
    written = json.loads(path.read_text())
    assert list(written) == ["format", "version", "kind", "vllm_version", "requests", "race"]
    assert written["format"] == FORMAT and written["version"] == FORMAT_VERSION and written["kind"] == "vllm"


def test_the_control_line_says_whether_the_control_was_caught() -> None:
    caught = engine.control_line("X off", _result(0, 2)["runs"][1:])
    assert caught == "  control (X off): caught: 2 race(s) in 1 of 1 workload(s)"
    missed = engine.control_line("X off", _result(0, 0)["runs"][1:])
    assert missed == "  control (X off): NOT caught (inconclusive): 0 race(s) in 0 of 1 workload(s)"
