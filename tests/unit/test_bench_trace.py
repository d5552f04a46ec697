"""`python -m ci.bench trace`: the recording cost of the trace workloads (in-place micro, out-of-place), and of
sglang's real step per launch beside CSAN's, from fresh processes."""

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


COST = (
    "COST design={design} step_median_us=976.7 step_installed_median_us=905.9 recorded_step_median_us=2583.0 "
    "launches=31 installed_us_per_step=-74.2 recording_us_per_launch={recording} recorded_events=69 "
    "recording_us_per_event=23.1 empty_mode_us_per_launch=11.0 device={device}\n"
)
CSAN_STEP = (
    "CSAN {design}: no error reported\nCSAN micro {design}: plain 20.0 us/op, CSAN 110.0 us/op\n"
    "CSAN STEP design={design} plain_step_median_us=980.0 csan_step_median_us=4080.0 launches=31 "
    "csan_us_per_launch=100.0\n"
)


def fake_proof(recording, csan_stdout=CSAN_STEP):
    """A `python -m ci.bench.proof` that prints `COST` (`recording[fast path flag]` per launch) or `csan`'s lines."""
    calls = []

    def run(command, **kwargs):
        arguments = command[command.index("ci.bench.proof") + 1 :]
        flag = kwargs["env"]["RACEFUZZ_TRACE_FASTPATH"]
        calls.append((arguments[0], arguments[2], flag))
        design = arguments[2]
        if arguments[0] == "csan":
            out = csan_stdout.format(design=design)
        else:
            device = arguments[arguments.index("--device") + 1]
            out = COST.format(design=design, recording=recording[flag], device=device)
        return subprocess.CompletedProcess(command, 0, stdout=out, stderr="")

    return run, calls


def test_the_sglang_step_is_measured_per_launch_beside_csan_on_the_gpu(monkeypatch):
    run, calls = fake_proof({"1": 15.5, "0": 60.25})
    monkeypatch.setattr(bench_trace.subprocess, "run", run)
    monkeypatch.setattr(bench_trace, "_sglang_missing", lambda: None)
    row = bench_trace._sglang_row("cuda", "none", rounds=7)
    assert calls == [("cost", "none", "1"), ("cost", "none", "0"), ("csan", "none", "1")]
    assert row["fast"]["recording_us_per_launch"] == 15.5 and row["python"]["recording_us_per_launch"] == 60.25
    assert row["csan"]["csan_us_per_launch"] == 100.0
    results = {"device": "cuda", "runs": 3, "goal_us_per_op": 20.0, "rows": [], "step_rounds": 7}
    slow = dict(row, workload="sglang-step slow", fast={**row["fast"], "recording_us_per_launch": 20.5})
    table = bench_trace.render({**results, "sglang_rows": [row, slow]}).splitlines()
    assert "7 paired rounds" in table[-4]
    # workload, launches, plain (976.7 us / 31 launches), racefuzz fast, racefuzz python, CSAN, verdict
    assert table[-2].split() == ["sglang-step", "none", "31", "31.5", "15.5", "60.2", "100.0", "meets"]
    assert table[-1].split()[4] == "20.5" and table[-1].endswith("MISSES")


def test_the_sglang_step_on_the_cpu_says_csan_needs_cuda_and_runs_no_csan(monkeypatch):
    run, calls = fake_proof({"1": 40.0, "0": 90.0})
    monkeypatch.setattr(bench_trace.subprocess, "run", run)
    monkeypatch.setattr(bench_trace, "_sglang_missing", lambda: None)
    row = bench_trace._sglang_row("cpu", "self-event", rounds=3)
    assert [call[0] for call in calls] == ["cost", "cost"]
    results = {"device": "cpu", "runs": 3, "goal_us_per_op": 20.0, "rows": [], "step_rounds": 3, "sglang_rows": [row]}
    line = bench_trace.render(results).splitlines()[-1]
    assert "40.0" in line and "90.0" in line and "n/a (needs CUDA)" in line and "none on the CPU" in line


def test_csan_stopping_the_step_with_a_report_is_said_instead_of_a_figure(monkeypatch):
    run, _ = fake_proof({"1": 15.0, "0": 60.0}, csan_stdout="CSAN {design}: CUDASanitizerErrors: ...\n")
    monkeypatch.setattr(bench_trace.subprocess, "run", run)
    monkeypatch.setattr(bench_trace, "_sglang_missing", lambda: None)
    row = bench_trace._sglang_row("cuda", "none", rounds=3)
    results = {"device": "cuda", "runs": 3, "goal_us_per_op": 20.0, "rows": [], "step_rounds": 3, "sglang_rows": [row]}
    assert "CSAN reported an error" in bench_trace.render(results).splitlines()[-1]


def test_without_sglang_or_triton_the_sglang_rows_say_what_is_missing_and_run_nothing(monkeypatch):
    monkeypatch.setattr(bench_trace.importlib.util, "find_spec", lambda name: None if name == "triton" else object())
    monkeypatch.setattr(bench_trace.subprocess, "run", lambda *a, **k: pytest.fail("no process without Triton"))
    row = bench_trace._sglang_row("cpu", "none")
    assert row["unavailable"].startswith("needs triton importable")
    results = {"device": "cpu", "runs": 3, "goal_us_per_op": 20.0, "rows": [], "step_rounds": 3, "sglang_rows": [row]}
    assert bench_trace.render(results).splitlines()[-1].startswith("sglang-step none")


def test_a_real_run_on_the_cpu_measures_both_paths_of_both_workloads():
    results = bench_trace.run(runs=1, step_rounds=2)
    assert results["device"] in ("cpu", "cuda")
    measured = {(row["workload"], row["path"]) for row in results["rows"]}
    assert measured == {(w, p) for w in bench_trace.WORKLOADS for p in bench_trace.PATHS}
    for row in results["rows"]:
        assert row["trace_us_per_op"] > 0 and row["plain_us_per_op"] > 0
    assert [row["design"] for row in results["sglang_rows"]] == list(bench_trace.DESIGNS)
    for row in results["sglang_rows"]:  # measured where sglang and Triton are importable, else said
        assert "unavailable" in row or row["fast"]["launches"] > 0
