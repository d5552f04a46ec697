"""On the GPU: for each racy (design, hazard) cell of docs/designs.md, `racefuzz run --backend cuda`
fails and writes the replay file, and `racefuzz replay --backend cuda --repeat 5` of it reproduces 5/5
and prints the same report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from racefuzz.cli import main
from racefuzz.exitcodes import ExitCode

ROOT = Path(__file__).resolve().parents[2]
RACY = [
    (c["design"], c["hazard"])
    for c in json.loads((ROOT / "docs/results/design-matrix.json").read_text())["cells"]
    if c.get("replay_file")
]


@pytest.mark.parametrize(("design", "hazard"), RACY, ids=[f"{d}-{h}" for d, h in RACY])
def test_gpu_fail_write_replay_same_report(design: str, hazard: str, tmp_path: Path, capsys) -> None:
    argv = [
        "run",
        "--backend",
        "cuda",
        "--design",
        design,
        "--hazards",
        hazard,
        "--examples",
        "500",
        "--quiet",
        "--no-control",
        "--report-dir",
        str(tmp_path),
    ]
    assert main(argv) == ExitCode.RACE
    run_out = capsys.readouterr().out
    (replay_file,) = (p for p in tmp_path.glob("*.json") if not p.name.endswith(".trace.json"))
    report = replay_file.with_suffix(".txt").read_text()
    assert "backend cuda" in report and report.rstrip("\n") in run_out
    assert (tmp_path / f"{replay_file.stem}.png").exists() or (tmp_path / f"{replay_file.stem}.trace.json").exists()
    assert main(["replay", str(replay_file), "--repeat", "5"]) == ExitCode.RACE
    replay_out = capsys.readouterr().out
    assert "reproduced the manifested corruption in 5/5 run(s) on cuda" in replay_out
    assert replay_out.startswith(report)
