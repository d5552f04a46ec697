"""Required round trip: for each racy (design, hazard) cell of docs/designs.md, `racefuzz run` fails and
writes the replay file, and `racefuzz replay` of that file prints the same report. Also the committed
counterexamples still replay to their committed reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from racefuzz.cli import main
from racefuzz.exitcodes import ExitCode

ROOT = Path(__file__).resolve().parents[2]
RACY = [
    (c["design"], c["hazard"])
    for c in json.loads((ROOT / "docs/results/design-matrix/design-matrix.json").read_text())["cells"]
    if c.get("replay_file")
]


def test_the_matrix_has_racy_cells_for_every_racy_design() -> None:
    assert {design for design, _ in RACY} == {"none", "self-event", "global-war", "read-done"}


@pytest.mark.parametrize(("design", "hazard"), RACY, ids=[f"{d}-{h}" for d, h in RACY])
def test_fail_write_replay_same_report(design: str, hazard: str, tmp_path: Path, capsys) -> None:
    argv = [
        "run",
        "--backend",
        "sim",
        "--design",
        design,
        "--hazards",
        hazard,
        "--examples",
        "2000",
        "--quiet",
        "--no-control",
        "--report-dir",
        str(tmp_path),
    ]
    if hazard == "plan-stream":
        argv.append("--plan-stream")
    assert main(argv) == ExitCode.RACE
    capsys.readouterr()
    (replay_file,) = (p for p in tmp_path.glob("*.json") if not p.name.endswith(".trace.json"))
    report = replay_file.with_suffix(".txt").read_text()
    assert replay_file.with_suffix(".trace.json").exists()
    assert main(["replay", str(replay_file)]) == ExitCode.RACE
    assert capsys.readouterr().out.startswith(report)


@pytest.mark.parametrize(
    "replay_file",
    sorted((ROOT / "docs/results/design-matrix/counterexamples").glob("*/*.json")),
    ids=lambda p: p.parent.name,
)
def test_committed_counterexamples_replay_to_their_reports(replay_file: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)  # the reports name the replay file relative to the repository
    relative = replay_file.relative_to(ROOT)
    assert main(["replay", str(relative)]) == ExitCode.RACE
    assert capsys.readouterr().out.startswith(replay_file.with_suffix(".txt").read_text())


# -- one format, two kinds: a model's counterexample and real code's (racefuzz trace) -------------------


def test_a_model_and_a_trace_counterexample_share_one_format_and_replay_through_one_command(
    tmp_path: Path, capsys
) -> None:
    pytest.importorskip("torch")
    model_dir, trace_dir = tmp_path / "model", tmp_path / "trace"
    run = ["run", "--backend", "sim", "--design", "none", "--examples", "200", "--quiet", "--no-control"]
    assert main([*run, "--report-dir", str(model_dir), "--database", "none"]) == ExitCode.RACE
    step = "racefuzz.trace.example:racy_step"
    assert main(["trace", step, "--device", "cpu", "--report-dir", str(trace_dir)]) == ExitCode.RACE
    capsys.readouterr()
    (model_file,) = (p for p in model_dir.glob("*.json") if not p.name.endswith(".trace.json"))
    (trace_file,) = (p for p in trace_dir.glob("*.json") if not p.name.endswith(".trace.json"))
    model, trace = json.loads(model_file.read_text()), json.loads(trace_file.read_text())
    assert (model["format"], model["version"], model["kind"]) == ("racefuzz-replay", 1, "model")
    assert (trace["format"], trace["version"], trace["kind"]) == ("racefuzz-replay", 1, "trace")
    assert trace["step"] == step and trace["racefuzz"] == model["racefuzz"]
    assert main(["replay", str(model_file)]) == ExitCode.RACE
    assert capsys.readouterr().out.startswith(model_file.with_suffix(".txt").read_text())
    assert main(["replay", str(trace_file)]) == ExitCode.RACE
    assert "reproduced as 1 happens-before race(s)" in capsys.readouterr().out
    # racefuzz trace --replay takes only the trace's kind, and says where the other goes.
    assert main(["trace", "--replay", str(model_file)]) == ExitCode.USAGE
    assert f"of kind 'model', not 'trace'): replay it with racefuzz replay {model_file}" in capsys.readouterr().err


def test_a_legacy_trace_replay_file_and_a_model_file_without_kind_still_replay(tmp_path: Path, capsys) -> None:
    pytest.importorskip("torch")
    legacy = tmp_path / "legacy.json"
    legacy.write_text(
        json.dumps(
            {
                "format": "racefuzz-trace-replay",
                "version": 1,
                "step": "racefuzz.trace.example:racy_step",
                "device": "cpu",
                "watch": [],
                "delays": [{"stream": "forward", "launch": 0, "us": 5000.0}],
            }
        )
    )
    assert main(["replay", str(legacy)]) == ExitCode.RACE
    assert "reproduced as 1 happens-before race(s)" in capsys.readouterr().out
    committed = sorted((ROOT / "docs/results/design-matrix/counterexamples").glob("*/*.json"))[0]
    assert "kind" not in json.loads(committed.read_text())  # written before the field: a model's
    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps({**json.loads(committed.read_text()), "kind": "tensorrt"}))
    assert main(["replay", str(unknown)]) == ExitCode.USAGE
    assert "\"kind\" must be one of model, trace, sglang, vllm, got 'tensorrt'" in capsys.readouterr().err
