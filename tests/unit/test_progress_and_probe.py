"""Progress lines off a terminal, the torch-free GPU probe, and a search's partial result on Ctrl-C."""

from __future__ import annotations

import subprocess
import sys

import pytest

import racefuzz.progress as progress_module
from racefuzz.backends import executor
from racefuzz.designs import load_design
from racefuzz.search import search
from racefuzz.watchdog import StopRequested, WatchedExecutor, request_stop, stoppable


def test_off_a_terminal_progress_prints_plain_lines(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(progress_module, "LINE_EVERY_S", 0.0)  # a line at every call
    with progress_module.progress(10, "global-war") as advance:
        assert advance is not None
        advance(3)
        advance(10)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("racefuzz: global-war: 3/10 (30%), ") and lines[1].startswith(
        "racefuzz: global-war: 10/10"
    )
    with progress_module.progress(10, "quiet", quiet=True) as advance:
        assert advance is None


def test_the_gpu_probe_asks_the_driver_before_importing_torch() -> None:
    code = (
        "import sys\n"
        "from racefuzz.backends import resolve_backend\n"
        "from racefuzz.backends.cuda.availability import driver_device_count\n"
        "count, why = driver_device_count()\n"
        "backend = resolve_backend('auto')\n"
        "print(count, backend, 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    count, backend, torch_imported = out.stdout.split()
    if count == "0":  # no driver or no GPU: decided without torch
        assert (backend, torch_imported) == ("sim", "False")
    else:
        pytest.skip(f"the CUDA driver reports {count} GPU(s) here: torch is then needed to run")


def test_a_stop_during_the_search_carries_its_counterexample() -> None:
    design = load_design("none")  # caught within a few examples; shrinking then runs many more
    run = WatchedExecutor(executor("sim"), "sim")
    runs = 0

    def stop_after_thirty_runs(program, schedule):
        nonlocal runs
        runs += 1
        if runs == 30:  # as Ctrl-C does: the next checkpoint raises
            request_stop()
        return run(program, schedule)

    with stoppable(None), pytest.raises(StopRequested) as raised:
        search(design, stop_after_thirty_runs, examples=10_000, shrink=True)
    partial = raised.value.partial
    assert partial is not None and partial.found and partial.design is design
    assert partial.counterexample.oracle is not None
