"""On the GPU: for each racy (design, hazard) cell of docs/designs.md, `racefuzz run --backend cuda
--strategy orders` fails and writes the replay file, and `racefuzz replay --backend cuda --repeat 5` of it
prints the same report; where the cell's race manifests (a corrupted load), the replay reproduces it 5/5.
A cell racy on masked columns only (none and self-event on plan-stream: loaded, not used) can never
manifest, so its run reports the happens-before verdict, and so does its replay.

Forced orders (gates), not spins: a gate holds its order exactly, so "5/5" is a property of the
counterexample. A spin counterexample shrunk to the 300 us floor does not always reproduce 5/5 (on an
H200, read-done-post-launch-rewrite's replayed 3/5 once, after 5/5 in its search); spins stay covered,
with k-of-k, by tests/cuda/test_backend_async_gpu.py and the properties on cuda."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from racefuzz.cli import main
from racefuzz.exitcodes import ExitCode

ROOT = Path(__file__).resolve().parents[2]
CELLS = [
    c
    for c in json.loads((ROOT / "docs/results/design-matrix/design-matrix.json").read_text())["cells"]
    if c.get("replay_file")
]
RACY = [(c["design"], c["hazard"], c["manifested"]) for c in CELLS]
EXAMPLES = 3000
"""The search stops at its first manifested corruption; the simulator's matrix needed up to 1,356 examples
for a cell (self-event on recycled-row-prefill), and seed 0 of none on it needs more than 500."""


@pytest.mark.parametrize(("design", "hazard", "manifests"), RACY, ids=[f"{d}-{h}" for d, h, _ in RACY])
def test_gpu_fail_write_replay_same_report(design: str, hazard: str, manifests: bool, tmp_path: Path, capsys) -> None:
    argv = [
        "run",
        "--backend",
        "cuda",
        "--design",
        design,
        "--hazards",
        hazard,
        "--examples",
        str(EXAMPLES),
        "--strategy",
        "orders",
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
    if manifests:
        assert "verdict: manifested corruption" in report
        assert "reproduced the manifested corruption in 5/5 run(s) on cuda" in replay_out
    else:
        assert "not manifested under this schedule" in report and "masked column" in report
    assert replay_out.startswith(report)
