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
