"""`python -m ci.bench trace`: what recording costs per op in `racefuzz trace`, on two workloads of
`python -m ci.bench proof micro --workload`: `micro`, small in-place torch ops alternating between two streams
with a `wait_stream` each, and `out-of-place`, `c = a + b` on one stream (a fresh tensor and a free each
op: the workload of CSAN's ~110 us/op figure).

On the GPU if there is one (the goal, 20 us/op, is the H200's), else on the CPU (CPU tensors through the same
dispatch mode, virtual streams: no verdict). Each figure comes from `python -m ci.bench.proof micro` in
a fresh process (nothing cached by an earlier figure), whose rounds time the unrecorded baseline, with torch's
own `torch.cuda` methods, back to back with the recorded runs. Each workload twice: with the C++ fast path and
with the Python path alone (`RACEFUZZ_TRACE_FASTPATH=0`), so the table says what the fast path is worth on
this machine. Raw output: docs/results/trace-cost-h200/ and docs/results/trace-cost-cpu/.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from racefuzz.errors import BackendUnavailable

GOAL_US_PER_OP = 20.0
RUNS = 21
"""Rounds per figure (each, back to back: unrecorded with torch's own `torch.cuda` methods, unrecorded with
racefuzz's patches, recorded, recorded with snapshots)."""
PATHS = {"fast": "1", "python": "0"}
"""Recorder path -> `RACEFUZZ_TRACE_FASTPATH`."""
WORKLOADS = ("micro", "out-of-place")
"""`ci.bench.proof micro --workload` values (its `WORKLOADS`), in the table's order."""
TIMEOUT_S = 900


def run(runs: int = RUNS) -> dict[str, Any]:
    try:
        import torch
    except ImportError as error:
        raise BackendUnavailable(f"the trace benchmark needs torch ({error})") from None
    device = "cuda" if torch.cuda.is_available() else "cpu"
    results: dict[str, Any] = {"device": device, "runs": runs, "goal_us_per_op": GOAL_US_PER_OP, "rows": []}
    for workload in WORKLOADS:
        for path, flag in PATHS.items():
            print(
                f"ci.bench trace: {workload}, the {path} path on {device}, {runs} rounds (a fresh process)",
                file=sys.stderr,
            )
            results["rows"].append({"workload": workload, "path": path, **_micro(device, runs, flag, workload)})
    return results


def _micro(device: str, runs: int, flag: str, workload: str = "micro") -> dict[str, Any]:
    """The `RECORDING` and `RECORDING-OVERHEAD` figures (medians over the rounds) of one fresh process."""
    command = [sys.executable, "-m", "ci.bench.proof", "micro", "--device", device, "--runs", str(runs)]
    command += ["--workload", workload]
    try:
        out = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            env={**os.environ, "RACEFUZZ_TRACE_FASTPATH": flag},
            cwd=Path(__file__).resolve().parents[2],  # the repository root, where `ci` is importable
        )
    except subprocess.TimeoutExpired:
        raise BackendUnavailable(f"`{' '.join(command)}` ran past {TIMEOUT_S} s") from None
    if out.returncode:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise BackendUnavailable(f"the {workload} workload failed on {device}: {last}")
    figures: dict[str, Any] = {"fast_path_unavailable": "fast path is unavailable" in out.stderr}
    for line in out.stdout.splitlines():
        label, _, rest = line.partition(" ")
        if label in ("RECORDING", "RECORDING-OVERHEAD"):
            for field in rest.split():
                key, sep, value = field.partition("=")
                if sep and key.endswith("_us_per_op"):
                    figures[key] = float(value)
    if "recording_overhead_us_per_op" not in figures:
        raise BackendUnavailable(f"no RECORDING-OVERHEAD line from `{' '.join(command)}`")
    return figures


def render(results: dict[str, Any]) -> str:
    device, goal = results["device"], results["goal_us_per_op"]
    lines = [
        f"racefuzz trace recording cost, {results['runs']} paired rounds on {device} (us/op, medians)",
        f"{'workload':<13} {'path':<7} {'unrecorded':>11} {'recorded':>9} {'overhead':>9}  "
        f"verdict (goal {goal:g} us/op)",
    ]
    for row in results["rows"]:
        if device != "cuda":
            verdict = "none on the CPU (the goal is the H200's)"
        elif row["path"] == "python":
            verdict = "none (the Python path alone, for comparison)"
        else:
            verdict = "meets" if row["recording_overhead_us_per_op"] <= goal else "MISSES"
        if row["fast_path_unavailable"] and row["path"] == "fast":
            verdict += "; the fast path could not be built here: this row is the Python path too"
        lines.append(
            f"{row['workload']:<13} {row['path']:<7} {row['plain_us_per_op']:>11.2f} {row['trace_us_per_op']:>9.2f} "
            f"{row['recording_overhead_us_per_op']:>9.2f}  {verdict}"
        )
    return "\n".join(lines)
