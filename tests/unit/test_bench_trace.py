"""`racefuzz bench trace`: the recording cost of the trace micro workload, from fresh processes."""

from __future__ import annotations

import subprocess

import pytest

from racefuzz.bench import trace as bench_trace
from racefuzz.errors import BackendUnavailable

pytest.importorskip("torch")

LINES = (
    "RECORDING micro device=cuda ops=2000 runs=3 plain_us_per_op=22.00 plain_installed_us_per_op=22.10 "
    "trace_us_per_op={trace} trace_with_snapshots_us_per_op=60.00\n"
    "RECORDING-OVERHEAD trace_minus_plain_us_per_op=12.00 snapshots_minus_plain_us_per_op=38.00 "
    "installed_minus_plain_us_per_op=0.10 recording_overhead_us_per_op={overhead}\n"
    "FASTEST micro device=cuda ops=2000 runs=3 plain_us_per_op=1.00 trace_us_per_op=2.00\n"
    "FASTEST-OVERHEAD recording_overhead_us_per_op=1.00\n"
)


def fake_run(overheads, stderr="", returncode=0):
    calls = []

    def run(command, **kwargs):
        calls.append((command, kwargs["env"]["RACEFUZZ_TRACE_FASTPATH"]))
        overhead = overheads[len(calls) - 1]
        out = LINES.format(trace=22.0 + overhead, overhead=overhead)
        return subprocess.CompletedProcess(command, returncode, stdout=out, stderr=stderr)

    return run, calls


def test_the_table_judges_the_fast_path_on_the_gpu_against_the_goal(monkeypatch):
    run, calls = fake_run([12.5, 21.6])
    monkeypatch.setattr(bench_trace.subprocess, "run", run)
    figures = {path: bench_trace._micro("cuda", 3, flag) for path, flag in bench_trace.PATHS.items()}
    assert [flag for _, flag in calls] == ["1", "0"]
    assert figures["fast"]["recording_overhead_us_per_op"] == 12.5  # the median line, not FASTEST's
    table = bench_trace.render({"device": "cuda", "runs": 3, "goal_us_per_op": 20.0, **figures})
    assert "meets" in table.splitlines()[2] and "for comparison" in table.splitlines()[3]
    run, _ = fake_run([20.5, 30.0])
    monkeypatch.setattr(bench_trace.subprocess, "run", run)
    figures = {path: bench_trace._micro("cuda", 3, flag) for path, flag in bench_trace.PATHS.items()}
    assert "MISSES" in bench_trace.render({"device": "cuda", "runs": 3, "goal_us_per_op": 20.0, **figures})


def test_a_fast_path_that_could_not_be_built_is_said_in_its_row(monkeypatch):
    run, _ = fake_run([30.0], stderr="racefuzz: the trace recorder's C++ fast path is unavailable (no ninja)")
    monkeypatch.setattr(bench_trace.subprocess, "run", run)
    figures = bench_trace._micro("cpu", 3, "1")
    table = bench_trace.render({"device": "cpu", "runs": 3, "goal_us_per_op": 20.0, "fast": figures, "python": figures})
    assert "could not be built" in table and "none on the CPU" in table


def test_a_failed_or_silent_workload_is_a_one_line_error(monkeypatch):
    run, _ = fake_run([1.0], stderr="Traceback ...\nRuntimeError: boom", returncode=1)
    monkeypatch.setattr(bench_trace.subprocess, "run", run)
    with pytest.raises(BackendUnavailable, match="failed on cpu: RuntimeError: boom"):
        bench_trace._micro("cpu", 3, "1")
    monkeypatch.setattr(
        bench_trace.subprocess, "run", lambda command, **kw: subprocess.CompletedProcess(command, 0, "", "")
    )
    with pytest.raises(BackendUnavailable, match="no RECORDING-OVERHEAD line"):
        bench_trace._micro("cpu", 3, "1")


def test_a_real_run_on_the_cpu_measures_both_paths():
    results = bench_trace.run(runs=1)
    assert results["device"] in ("cpu", "cuda")
    for path in bench_trace.PATHS:
        assert results[path]["trace_us_per_op"] > 0 and results[path]["plain_us_per_op"] > 0
