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

Then sglang's real step (`racefuzz.scenarios.sglang.real_kernels`, each design), per launch, in a second
table: the plain run, racefuzz's recording with and without the fast path (`python -m ci.bench.proof cost
--design D`, a fresh process each: `COST`'s `recording_us_per_launch`), and PyTorch's CUDA sanitizer (CSAN)
on the same step (`python -m ci.bench.proof csan --design D`: `CSAN STEP`'s `csan_us_per_launch`). On the
CPU the step's Triton launches are recorded from their annotations, not run, and timed in CPU time (see
`ci.bench.proof.cost_main`); CSAN needs CUDA. The step needs sglang 0.5.23's sources and Triton importable
(`pip install --no-deps sglang==0.5.23 triton`); without them its rows say so. Raw output:
docs/results/trace-sglang-step-cost-h200/ and docs/results/trace-sglang-step-cost-cpu/.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from racefuzz.errors import BackendUnavailable
from racefuzz.scenarios.sglang.real_kernels import DESIGNS, SGLANG_VERSION

GOAL_US_PER_OP = 20.0
RUNS = 21
"""Rounds per figure (each, back to back: unrecorded with torch's own `torch.cuda` methods, unrecorded with
racefuzz's patches, recorded, recorded with snapshots)."""
PATHS = {"fast": "1", "python": "0"}
"""Recorder path -> `RACEFUZZ_TRACE_FASTPATH`."""
WORKLOADS = ("micro", "out-of-place")
"""`ci.bench.proof micro --workload` values (its `WORKLOADS`), in the table's order."""
TIMEOUT_S = 900
STEP_ROUNDS = 100
"""Paired rounds per sglang step figure (`python -m ci.bench.proof cost --rounds`)."""
CSAN_NEEDS_CUDA = "n/a (needs CUDA)"


def run(runs: int = RUNS, step_rounds: int = STEP_ROUNDS) -> dict[str, Any]:
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
    results["step_rounds"] = step_rounds
    results["sglang_rows"] = [_sglang_row(device, design, step_rounds) for design in DESIGNS]
    return results


def _sglang_missing() -> str | None:
    """Why the sglang step cannot run here (its sources or Triton not importable), or None."""
    missing = [name for name in ("sglang", "triton") if importlib.util.find_spec(name) is None]
    if not missing:
        return None
    return f"needs {' and '.join(missing)} importable (pip install --no-deps sglang=={SGLANG_VERSION} triton)"


def _sglang_row(device: str, design: str, rounds: int = STEP_ROUNDS) -> dict[str, Any]:
    """One design's figures: `COST` with each recorder path, and CSAN's `CSAN STEP` on the GPU."""
    row: dict[str, Any] = {"workload": f"sglang-step {design}", "design": design}
    missing = _sglang_missing()
    if missing is not None:
        row["unavailable"] = missing
        return row
    for path, flag in PATHS.items():
        print(
            f"ci.bench trace: the sglang step ({design}), the {path} path on {device} (a fresh process)",
            file=sys.stderr,
        )
        row[path] = _fresh_figures(
            ["cost", "--design", design, "--device", device, "--rounds", str(rounds)], "COST", flag
        )
    if device == "cuda":
        print(f"ci.bench trace: the sglang step ({design}) under CSAN (a fresh process)", file=sys.stderr)
        row["csan"] = _fresh_figures(["csan", "--design", design], "CSAN STEP", "1")
        if "csan_us_per_launch" not in row["csan"]:
            row["csan"]["unavailable"] = "n/a (CSAN reported an error: the step cannot be timed whole)"
    else:
        row["csan"] = {"unavailable": CSAN_NEEDS_CUDA}
    return row


def _fresh_figures(arguments: list[str], label: str, flag: str) -> dict[str, Any]:
    """The `key=value` figures of the `label` line of `python -m ci.bench.proof ARGUMENTS` (a fresh process,
    `RACEFUZZ_TRACE_FASTPATH=flag`), and whether the fast path was unavailable there; no figures if the
    process printed no such line (CSAN stopped the step with an error)."""
    command = [sys.executable, "-m", "ci.bench.proof", *arguments]
    try:
        out = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            env={**os.environ, "RACEFUZZ_TRACE_FASTPATH": flag},
            cwd=Path(__file__).resolve().parents[2],
        )
    except subprocess.TimeoutExpired:
        raise BackendUnavailable(f"`{' '.join(command)}` ran past {TIMEOUT_S} s") from None
    if out.returncode:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise BackendUnavailable(f"`{' '.join(command)}` failed: {last}")
    figures: dict[str, Any] = {"fast_path_unavailable": "fast path is unavailable" in out.stderr}
    for line in out.stdout.splitlines():
        if line.startswith(label + " "):
            for field in line[len(label) + 1 :].split():
                key, sep, value = field.partition("=")
                if sep:
                    try:
                        figures[key] = float(value)
                    except ValueError:
                        figures[key] = value
    return figures


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
    if "sglang_rows" in results:
        lines += ["", *_render_sglang(results)]
    return "\n".join(lines)


def _render_sglang(results: dict[str, Any]) -> list[str]:
    """The sglang step's table: µs per launch of the plain run, of racefuzz's recording (each path) and of CSAN."""
    device, goal = results["device"], results["goal_us_per_op"]
    lines = [
        f"the sglang step (racefuzz.scenarios.sglang.real_kernels) on {device}, us/launch (medians of "
        f"{results['step_rounds']} paired rounds; CSAN: its median against the plain median)",
        f"{'workload':<29} {'launches':>8} {'plain':>7} {'racefuzz fast':>13} {'racefuzz python':>15} "
        f"{'CSAN':>16}  verdict (goal {goal:g} us/launch)",
    ]
    for row in results["sglang_rows"]:
        if "unavailable" in row:
            lines.append(f"{row['workload']:<29} n/a ({row['unavailable']})")
            continue
        fast, python, csan = row["fast"], row["python"], row["csan"]
        launches = int(fast["launches"])
        plain = fast["step_median_us"] / launches
        shown_csan = csan.get("unavailable") or f"{csan['csan_us_per_launch']:.1f}"
        if device != "cuda":
            verdict = "none on the CPU (the goal is the H200's)"
        else:
            verdict = "meets" if fast["recording_us_per_launch"] <= goal else "MISSES"
        if fast["fast_path_unavailable"]:
            verdict += "; the fast path could not be built here: its column is the Python path too"
        lines.append(
            f"{row['workload']:<29} {launches:>8} {plain:>7.1f} {fast['recording_us_per_launch']:>13.1f} "
            f"{python['recording_us_per_launch']:>15.1f} {shown_csan:>16}  {verdict}"
        )
    return lines
