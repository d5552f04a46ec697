"""`python -m ci.bench gpu --processes N`, on the CPU: the option's validation, the aggregation arithmetic, the
error without a GPU, and the multi-process orchestration (spawn, barrier, failures) with a stand-in
measurement in place of the GPU search. The GPU measurement itself runs on the H200 only."""

from __future__ import annotations

import json
import os
import re
import statistics
import time
from typing import Any

import pytest

from ci.bench import gpu
from ci.bench.__main__ import MAX_PROCESSES as MAX_BENCH_PROCESSES
from ci.bench.__main__ import main
from ci.bench.gpu import PhaseClock, WorkerFailed, WorkerPool, aggregate
from racefuzz.errors import BackendUnavailable
from racefuzz.exitcodes import ExitCode


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# --- the option ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0", "argument --processes: expected a positive integer, got 0"),
        ("-3", "argument --processes: expected a positive integer, got -3"),
        ("65", "argument --processes: expected a positive integer up to 64, got 65"),
        ("four", "argument --processes: expected a positive integer, got 'four'"),
    ],
)
def test_processes_out_of_range_is_one_line_and_exit_2(capsys, value: str, message: str) -> None:
    with pytest.raises(SystemExit) as exc:  # argparse errors exit; ours return
        raise SystemExit(main(["gpu", "--processes", value]))
    assert exc.value.code == ExitCode.USAGE
    out, err = capsys.readouterr()
    assert out == "" and message in err and len(err.strip().splitlines()) == 1


def test_processes_applies_to_bench_gpu_only(capsys) -> None:
    with pytest.raises(SystemExit) as exc:  # each benchmark has its own options
        main(["engine", "--processes", "2"])
    assert exc.value.code == ExitCode.USAGE and "unrecognized arguments: --processes 2" in capsys.readouterr().err


def test_the_cli_bound_is_the_benchmark_bound() -> None:
    assert MAX_BENCH_PROCESSES == gpu.MAX_PROCESSES


def test_run_rejects_a_bad_count_of_processes_too(monkeypatch: pytest.MonkeyPatch) -> None:
    from racefuzz.errors import InvalidArgument

    monkeypatch.setattr(gpu.cuda, "cuda_unavailable_reason", lambda: None)  # as if a GPU were here
    for processes in (0, gpu.MAX_PROCESSES + 1):
        with pytest.raises(InvalidArgument, match="--processes: expected 1 to 64"):
            gpu.run(processes=processes)


def test_without_a_gpu_it_exits_2_before_spawning_anything(capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    if gpu.cuda.cuda_unavailable_reason() is None:
        pytest.skip("a GPU is usable here")

    def no_spawning(*args: object, **kwargs: object) -> None:
        raise AssertionError("a worker pool was started without a GPU")

    monkeypatch.setattr(gpu, "WorkerPool", no_spawning)
    code, out, err = run(capsys, "gpu", "--processes", "2")
    assert code == ExitCode.USAGE and out == ""
    assert err.startswith("python -m ci.bench gpu: error: the gpu benchmark needs a CUDA GPU:")
    assert len(err.strip().splitlines()) == 1


# --- the aggregation -----------------------------------------------------------------------------------------


def test_aggregate_counts_every_example_over_the_wall_time_from_first_start_to_last_end() -> None:
    # Two workers: 100 examples in [10.0, 10.5], 300 in [10.1, 11.0]; replays in [12.0, 12.2] and [12.0, 12.4].
    figures = aggregate([(100, (10.0, 10.5), (12.0, 12.2)), (300, (10.1, 11.0), (12.0, 12.4))])
    assert figures["processes"] == 2 and figures["examples"] == 400
    assert figures["search_wall_s"] == pytest.approx(1.0)
    assert figures["examples_per_s"] == pytest.approx(400.0)
    assert figures["replay_wall_s"] == pytest.approx(0.4)
    assert figures["replay_examples_per_s"] == pytest.approx(1000.0)
    assert figures["overhead_end_to_end"] == pytest.approx(2.5)  # replay examples/s over search examples/s
    assert figures["start_skew_s"] == pytest.approx(0.1)
    assert figures["end_spread_s"] == pytest.approx(0.5)


def test_aggregate_of_one_worker_is_that_worker() -> None:
    figures = aggregate([(50, (1.0, 1.25), (2.0, 2.2))])
    assert figures["examples_per_s"] == pytest.approx(200.0)
    assert figures["overhead_end_to_end"] == pytest.approx(1.25)
    assert figures["start_skew_s"] == 0 and figures["end_spread_s"] == 0


def test_aggregate_is_not_the_sum_of_the_workers_rates() -> None:
    # Two workers that did not overlap at all: the GPU served 200 examples in 2 s, not 2 x 100/s in 1 s each.
    figures = aggregate([(100, (0.0, 1.0), (5.0, 5.5)), (100, (1.0, 2.0), (5.5, 6.0))])
    assert figures["examples_per_s"] == pytest.approx(100.0)
    assert figures["overhead_end_to_end"] == pytest.approx(2.0)


@pytest.mark.parametrize(
    "workers",
    [[], [(10, (2.0, 1.0), (3.0, 4.0))], [(10, (1.0, 2.0), (4.0, 3.0))], [(-1, (1.0, 2.0), (3.0, 4.0))]],
)
def test_aggregate_rejects_nonsense(workers: list[Any]) -> None:
    with pytest.raises(ValueError):
        aggregate(workers)


def test_worker_seeds_are_distinct() -> None:
    seeds = {gpu.worker_seed(seed, worker) for seed in range(3) for worker in range(gpu.MAX_PROCESSES)}
    assert len(seeds) == 3 * gpu.MAX_PROCESSES


def test_phase_clock_without_a_barrier_only_stamps() -> None:
    clock = PhaseClock()
    clock.start("search")
    clock.end("search")
    start, end = clock.stamps["search"]
    assert start <= end


# --- the orchestration, with a stand-in measurement (top level: spawn pickles these by name) ---------------


def standin_setup(index: int) -> dict[str, Any]:
    return {"device": f"stand-in {index}"}


def failing_setup(index: int) -> dict[str, Any]:
    if index == 1:
        raise BackendUnavailable("no GPU in worker 1")
    return {}


def standin_measure(task: dict[str, Any], index: int, clock: PhaseClock) -> dict[str, Any]:
    if task.get("fail") == index:
        raise ValueError(f"stand-in failure in worker {index}")
    if task.get("die") == index:
        os._exit(3)  # as a crash in CUDA would: no exception, no reply
    if task.get("hang") == index:  # before the first barrier: its partners wait there for it, then report
        while True:
            time.sleep(1)
    time.sleep(task.get("late_s", 0.0) * index)  # a worker that reaches the start barrier later than the others
    arrived = time.monotonic()
    clock.start("search")
    clock.stamps["arrived"] = [arrived, arrived]
    time.sleep(task["search_s"] * (index + 1))
    clock.end("search")
    clock.start("replay")
    time.sleep(task["replay_s"])
    clock.end("replay")
    return {"worker": index, "examples": task["examples"]}


def _stamps(workers: list[tuple[dict[str, Any], dict[str, list[float]]]], phase: str) -> list[list[float]]:
    return [stamps[phase] for _, stamps in workers]


def test_the_pool_runs_the_workers_phases_together_and_aggregates() -> None:
    with WorkerPool(2, standin_setup, standin_measure, timeout_s=60) as pool:
        assert pool.setup_info == [{"device": "stand-in 0"}, {"device": "stand-in 1"}]
        assert len(pool.setup_s) == 2 and all(s >= 0 for s in pool.setup_s)
        for examples in (10, 20):  # two tasks on the same workers
            # Worker 1 reaches the start barrier 0.3 s after worker 0, and searches 0.4 s to worker 0's 0.2 s.
            measured = pool.run({"examples": examples, "search_s": 0.2, "replay_s": 0.1, "late_s": 0.3})
            assert [figures for figures, _ in measured] == [
                {"worker": 0, "examples": examples},
                {"worker": 1, "examples": examples},
            ]
            arrived, search = _stamps(measured, "arrived"), _stamps(measured, "search")
            replay = _stamps(measured, "replay")
            # Orderings the barrier guarantees, whatever the machine's load: no search starts before every
            # worker is ready (worker 0 waited for the late worker 1), no replay beside a search.
            assert min(s for s, _ in search) >= max(a for a, _ in arrived)
            assert min(s for s, _ in replay) >= max(e for _, e in search)
            figures = aggregate([(f["examples"], st["search"], st["replay"]) for f, st in measured])
            assert figures["examples"] == 2 * examples
            # From the first start to the last end: at least worker 1's 0.4 s of search.
            assert figures["search_wall_s"] >= 0.4
            assert figures["search_wall_s"] == round(max(e for _, e in search) - min(s for s, _ in search), 4)
    assert all(not worker.is_alive() for worker in pool.workers)


def test_a_worker_that_raises_is_named_and_nothing_hangs() -> None:
    with WorkerPool(2, standin_setup, standin_measure, timeout_s=600) as pool, pytest.raises(WorkerFailed) as failed:
        start = time.monotonic()
        pool.run({"examples": 1, "search_s": 0.05, "replay_s": 0.05, "fail": 1}, "in the stand-in row")
    message = str(failed.value)
    assert message.startswith("worker 1 of 2 failed in the stand-in row: ValueError: stand-in failure in worker 1")
    assert "test_bench_gpu_processes.py" in message  # where it was raised
    assert failed.value.exit_code == ExitCode.INTERNAL
    assert all(not worker.is_alive() for worker in pool.workers)
    # Worker 0, waiting at the barrier, was released, not timed out (600 s; this bound only catches a hang).
    assert time.monotonic() - start < 120


def test_a_worker_that_dies_is_named_with_its_exit_status() -> None:
    with WorkerPool(2, standin_setup, standin_measure, timeout_s=60) as pool, pytest.raises(WorkerFailed) as failed:
        pool.run({"examples": 1, "search_s": 0.05, "replay_s": 0.05, "die": 1}, "in the stand-in row")
    assert str(failed.value).startswith("worker 1 of 2 failed in the stand-in row: exited with code 3 without a result")
    assert all(not worker.is_alive() for worker in pool.workers)


def test_a_worker_that_fails_to_set_up_is_named_with_its_exit_code() -> None:
    with pytest.raises(WorkerFailed) as failed, WorkerPool(2, failing_setup, standin_measure, timeout_s=60):
        pass
    assert str(failed.value).startswith(
        "worker 1 of 2 failed while setting up (imports, CUDA context, warm-up): BackendUnavailable: no GPU in worker 1"
    )
    assert failed.value.exit_code == ExitCode.USAGE  # the worker's own error's code


def test_a_worker_that_hangs_is_stopped_after_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    # Worker 1 never reaches the barrier; worker 0 times out there after 2 s and reports, and then the
    # parent waits GRACE_S for worker 1, which never reports: named as the one that gave no result. No step
    # races the clock: the parent's own deadline (2 s + RESULT_MARGIN_S, left at its default) is far later
    # than worker 0's report, however loaded the machine.
    monkeypatch.setattr(gpu, "CLOSE_GRACE_S", 0.5)
    monkeypatch.setattr(gpu, "GRACE_S", 1.0)
    with WorkerPool(2, standin_setup, standin_measure, timeout_s=2) as pool:
        start = time.monotonic()
        with pytest.raises(WorkerFailed, match=r"^worker 1 of 2 failed .*: gave no result within 2 s"):
            pool.run({"examples": 1, "search_s": 0.05, "replay_s": 0.05, "hang": 1})
        assert time.monotonic() - start < gpu.RESULT_MARGIN_S  # named after worker 0's report, not the deadline
    assert all(not worker.is_alive() for worker in pool.workers)


# --- the text ------------------------------------------------------------------------------------------------


def _fake_results(processes: int) -> dict[str, Any]:
    worker = {
        "batch": 32,
        "examples": 1000,
        "search_s": 2.0,
        "examples_per_s": 500.0,
        "backend_s": 1.0,
        "replay_s": 0.5,
        "overhead_end_to_end": 4.0,
        "overhead_backend": 2.0,
        "replay_corrupted_examples": 0,
        "found": False,
        "overlap": True,
        "mean_gates": 1.2,
    }
    workers = [{**worker, "worker": i, "seed": i} for i in range(processes)]
    windows = [(1000, (0.0, 2.0), (3.0, 3.5)) for _ in range(processes)]
    runs = [{"seed": 0, **aggregate(windows), "workers": workers}]
    rows = [
        {
            "iterations": label,
            "batch": 32,
            "strategy": strategy,
            "counts_toward_goals": goal is not None,
            "goals": goal,
            "processes": processes,
            "examples_per_s": runs[0]["examples_per_s"],
            "replay_examples_per_s": runs[0]["replay_examples_per_s"],
            "overhead_end_to_end": runs[0]["overhead_end_to_end"],
            "overhead_backend_median_worker": 2.0,
            "runs": runs,
        }
        for label, _, _, _, strategy, goal in gpu.ROWS
    ]
    return {
        "date": "2026-12-01T12:00:00+00:00",
        "device": "NVIDIA H200",
        "torch": "2.x",
        "cupy": "13.x",
        "python": "3.11",
        "design": gpu.DESIGN,
        "hazards": "all",
        "repeat_k": gpu.K,
        "processes": processes,
        "setup_s": 20.0,
        "worker_setup_s": [19.0] * processes,
        "rows": rows,
    }


def test_the_text_says_per_gpu_with_n_processes_in_every_verdict() -> None:
    text = gpu.render(_fake_results(4))
    assert "processes: 4" in text and "NOT one process's throughput" in text
    verdict_lines = [line for line in text.splitlines() if line.startswith("  iterations ")]
    assert len(verdict_lines) == len(gpu.ROWS)
    for line in verdict_lines:
        assert "examples/s per GPU with 4 processes" in line
        assert "meets x" not in line and "MISSES x" not in line  # no overhead verdict with N > 1
        if "ablation" in line:
            assert "processes ;" not in line and "(meets" not in line
        else:  # 4 x 1000 examples in 2 s: 2000/s per GPU, which meets either rate goal (100 or 1000)
            assert re.search(r"\(meets (100|1000)/s per GPU with 4 processes\)", line), line
    assert "2000.0 examples/s per GPU with 4 processes (meets 1000/s per GPU with 4 processes)" in text
    assert "no overhead verdict with 4 processes" in text
    assert "set-up per worker (imports, CUDA context, warm-up; untimed): 19.0, 19.0, 19.0, 19.0 s" in text


def standin_versions(index: int) -> dict[str, Any]:
    return {"python": "3", "torch": "stand-in", "cupy": "stand-in", "numpy": "stand-in", "device": "no GPU"}


def standin_one_run(task: tuple[Any, ...], index: int, clock: PhaseClock) -> dict[str, Any]:
    """`_gpu_measure`'s figures, made up: `examples` examples in 0.05 s, replayed in 0.02 s."""
    examples, seed, _fixed, batch, overlap, strategy = task
    clock.start("search")
    time.sleep(0.05)
    clock.end("search")
    clock.start("replay")
    time.sleep(0.02)
    clock.end("replay")
    figures = {"seed": gpu.worker_seed(seed, index), "strategy": strategy, "mean_gates": 1.0, "batch": batch}
    figures |= {"overlap": overlap, "examples": examples, "executes": examples, "found": False, "flaky": 0}
    figures |= {"search_s": 0.05, "examples_per_s": examples / 0.05, "backend_s": 0.03, "replay_s": 0.02}
    figures |= {"overhead_end_to_end": 2.5, "overhead_backend": 1.5, "replay_corrupted_examples": 0}
    return {"worker": index, **figures}


def test_run_processes_assembles_rows_from_the_workers_and_renders_them() -> None:
    results = gpu.run_processes(
        2, examples=7, rows=("8 gates",), seeds=(0, 1), setup=standin_versions, measure=standin_one_run
    )
    assert results["processes"] == 2 and results["device"] == "no GPU" and len(results["worker_setup_s"]) == 2
    (row,) = results["rows"]
    assert row["iterations"] == "8 gates" and row["processes"] == 2 and len(row["runs"]) == 2
    for seed, concurrent in zip((0, 1), row["runs"], strict=True):
        assert concurrent["seed"] == seed and concurrent["examples"] == 14
        assert [w["seed"] for w in concurrent["workers"]] == [seed * 1000, seed * 1000 + 1]
        assert concurrent["search_wall_s"] >= 0.05  # each worker's stand-in search sleeps 0.05 s
    assert row["examples_per_s"] == statistics.median(r["examples_per_s"] for r in row["runs"])
    text = gpu.render(results)
    assert "processes: 2" in text and "examples/s per GPU with 2 processes" in text
    json.dumps(results)  # JSON-able
