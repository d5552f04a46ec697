"""`python -m ci.bench trace`: the recording cost of the trace workloads (in-place micro, out-of-place), from
fresh processes."""

from __future__ import annotations

import subprocess

import pytest

from ci.bench import trace as bench_trace
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
        calls.append((command, kwargs["env"]["RACEFUZZ_TRACE_FASTPATH"], command[command.index("--workload") + 1]))
        overhead = overheads[len(calls) - 1]
        out = LINES.format(trace=22.0 + overhead, overhead=overhead)
        return subprocess.CompletedProcess(command, returncode, stdout=out, stderr=stderr)

    return run, calls


def rows(device, runs=3):
    return [
        {"workload": workload, "path": path, **bench_trace._micro(device, runs, flag, workload)}
        for workload in bench_trace.WORKLOADS
        for path, flag in bench_trace.PATHS.items()
    ]


def test_the_table_judges_the_fast_path_of_each_workload_on_the_gpu_against_the_goal(monkeypatch):
    run, calls = fake_run([12.5, 21.6, 35.7, 34.1])
    monkeypatch.setattr(bench_trace.subprocess, "run", run)
    results = {"device": "cuda", "runs": 3, "goal_us_per_op": 20.0, "rows": rows("cuda")}
    assert [(flag, workload) for _, flag, workload in calls] == [
        ("1", "micro"),
        ("0", "micro"),
        ("1", "out-of-place"),
        ("0", "out-of-place"),
    ]
    assert results["rows"][0]["recording_overhead_us_per_op"] == 12.5  # the median line, not FASTEST's
    table = bench_trace.render(results).splitlines()
    assert table[2].startswith("micro") and "meets" in table[2] and "for comparison" in table[3]
    assert table[4].startswith("out-of-place") and "MISSES" in table[4] and "for comparison" in table[5]


def test_a_fast_path_that_could_not_be_built_is_said_in_its_rows(monkeypatch):
    stderr = "racefuzz: the trace recorder's C++ fast path is unavailable (no ninja)"
    run, _ = fake_run([30.0] * 4, stderr=stderr)
    monkeypatch.setattr(bench_trace.subprocess, "run", run)
    table = bench_trace.render({"device": "cpu", "runs": 3, "goal_us_per_op": 20.0, "rows": rows("cpu")})
    assert table.count("could not be built") == 2 and table.count("none on the CPU") == 4


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


def test_a_real_run_on_the_cpu_measures_both_paths_of_both_workloads():
    results = bench_trace.run(runs=1)
    assert results["device"] in ("cpu", "cuda")
    measured = {(row["workload"], row["path"]) for row in results["rows"]}
    assert measured == {(w, p) for w in bench_trace.WORKLOADS for p in bench_trace.PATHS}
    for row in results["rows"]:
        assert row["trace_us_per_op"] > 0 and row["plain_us_per_op"] > 0
