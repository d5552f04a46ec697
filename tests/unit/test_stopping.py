"""Ctrl-C, SIGTERM and the per-example watchdog, on real `racefuzz` processes (`racefuzz.watchdog`).

No test here guesses when the process has reached a moment: the process reports its moments on a file
(`RACEFUZZ_TEST_EVENTS`: "handlers" once racefuzz's signal handler is installed, "search" at each search,
"pause writing" when it waits, under `RACEFUZZ_TEST_PAUSE`, for a signal before writing a race it found;
"pause exiting" before it exits), and the test waits for the line, then signals at a random moment after
it. Timeouts only bound a hang.
A signal before "handlers" -- while the interpreter itself starts (site-packages, its .pth files) -- is
Python's and is not tested: no racefuzz code has run yet.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

import racefuzz
from racefuzz import watchdog
from racefuzz.exitcodes import ExitCode

REPO = Path(racefuzz.__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

ENTRY_POINT = "import sys\nfrom racefuzz.__main__ import main\nsys.exit(main())\n"
"""What the `racefuzz` console script runs (pip writes the same lines into bin/racefuzz)."""

HANG_S = 120.0
"""How long a test waits for a moment or an exit before it calls the process hung (it only bounds a hang)."""

LONG_SEARCH = ["--backend", "sim", "--design", "war-after-launch", "--examples", str(10**8), "--database", "none"]
"""A search far longer than any test: it only ends by a signal."""
RACY_SEARCH = ["--backend", "sim", "--design", "none", "--no-control", "--examples", "2000", "--database", "none"]
RACY_SEARCH += ["--seed", "1"]
"""A search that finds, shrinks and writes a race within seconds (seed 1: among the cheapest to shrink)."""


def _hide_matplotlib(root: Path) -> Path:
    """A folder to put first on PYTHONPATH, where `import matplotlib` fails as if it were not installed."""
    stub = root / "no-matplotlib"
    (stub / "matplotlib").mkdir(parents=True, exist_ok=True)
    (stub / "matplotlib" / "__init__.py").write_text('raise ImportError("hidden by the test")\n')
    return stub


def _start(args: list[str], cwd: Path, events: Path, **env: str) -> subprocess.Popen[str]:
    entry = cwd / "bin" / "racefuzz"
    entry.parent.mkdir(exist_ok=True)
    entry.write_text(ENTRY_POINT)
    first = [env.pop("PYTHONPATH")] if "PYTHONPATH" in env else []
    pythonpath = os.pathsep.join(filter(None, [*first, str(REPO), os.environ.get("PYTHONPATH")]))
    environment = {**os.environ, "PYTHONPATH": pythonpath, "RACEFUZZ_TEST_EVENTS": str(events)}
    environment.pop("RACEFUZZ_TEST_PAUSE", None)
    environment.update(env)
    return subprocess.Popen(
        [sys.executable, str(entry), *args],
        cwd=cwd,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(events: Path, line: str, process: subprocess.Popen[str]) -> None:
    """Until `line` is in the events file; fails if the process exits first or nothing comes for HANG_S."""
    deadline = time.monotonic() + HANG_S
    while time.monotonic() < deadline:
        if events.exists() and line in events.read_text().splitlines():
            return
        if process.poll() is not None:
            out, err = process.communicate()
            pytest.fail(f"exited {process.returncode} before {line!r}\n{out}\n{err}")
        time.sleep(0.002)
    process.kill()
    pytest.fail(f"no {line!r} within {HANG_S} s")


def _finish(process: subprocess.Popen[str]) -> tuple[str, str]:
    try:
        return process.communicate(timeout=HANG_S)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        pytest.fail(f"still running {HANG_S} s after the signal\n{out}\n{err}")


@dataclass(frozen=True)
class Trial:
    moment: str  # "start-up", "search" or "writing"
    args: tuple[str, ...]
    delay_s: float  # after the moment's line
    pause: str | None = None  # RACEFUZZ_TEST_PAUSE
    png: bool = False  # matplotlib importable (else hidden: the timeline is written without its PNG)


def _replay_files_named(out: str) -> list[Path]:
    return [Path(p) for p in re.findall(r"racefuzz replay (\S+\.json)", out)]


def _check_stopped_run(trial: Trial, out: str, err: str, code: int, reports: Path, sig: str = "SIGINT") -> None:
    """Exit 130 with one line saying so; any race found printed, its replay file named and on disk."""
    context = f"{trial}\n--- stdout\n{out}\n--- stderr\n{err}"
    assert code == ExitCode.INTERRUPTED, context
    assert "Traceback" not in err and "Exception ignored" not in err, context
    expected = "racefuzz: interrupted" + (" (SIGTERM)" if sig == "SIGTERM" else "")
    assert err.strip().splitlines()[-1] == expected, context
    named = _replay_files_named(out)
    on_disk = sorted(p for p in reports.glob("*.json") if not p.name.endswith(".trace.json"))
    assert ("RACE FOUND" in out) == bool(named), context  # a race printed names its replay file
    assert sorted(p.resolve() for p in named) == [p.resolve() for p in on_disk], context  # and only those exist
    for path in named:
        assert path.with_suffix(".txt").exists(), context
    for path in named:  # the timeline: its PNG written, or said to be skipped
        png = path.parent / f"{path.stem}.png"
        assert f"timeline: {png}" in out if trial.png else "timeline: no PNG (matplotlib is not installed" in out
        assert png.exists() == trial.png, context
    if trial.moment == "writing":  # the run found a race before the signal: it must be there
        assert len(named) == 1 and "RACE FOUND in design none after" in out, context


def _run_trial(index: int, trial: Trial, root: Path, sig: signal.Signals = signal.SIGINT) -> float:
    """One signalled run; the seconds from the signal to the exit."""
    cwd = root / f"trial-{index}"
    cwd.mkdir()
    events, reports = cwd / "events", cwd / "reports"
    env = {"RACEFUZZ_TEST_PAUSE": trial.pause} if trial.pause else {}
    if not trial.png:
        env["PYTHONPATH"] = str(_hide_matplotlib(root))
    process = _start(["run", *trial.args, "--report-dir", str(reports)], cwd, events, **env)
    line = {"start-up": "handlers", "search": "search", "writing": f"pause {trial.pause}"}[trial.moment]
    _wait_for(events, line, process)
    time.sleep(trial.delay_s)
    process.send_signal(sig)
    sent = time.monotonic()
    out, err = _finish(process)
    _check_stopped_run(trial, out, err, process.returncode, reports, sig.name)
    return time.monotonic() - sent


def _trials(rng: random.Random) -> list[Trial]:
    trials = [Trial("start-up", tuple(LONG_SEARCH), rng.uniform(0.0, 0.4)) for _ in range(15)]
    # In the negative control's search or the design's, race-free.
    trials += [Trial("search", tuple(LONG_SEARCH), rng.uniform(0.0, 0.6)) for _ in range(20)]
    # Searching, shrinking, writing or reporting a race, or done: the run waits before exiting until the signal
    # has come, so that a late one still lands in it.
    trials += [Trial("search", tuple(RACY_SEARCH), rng.uniform(0.0, 1.5), "exiting") for _ in range(5)]
    # While a race found is being written: the run waits before writing (or after, before printing). Most
    # without matplotlib (a PNG costs a second of CPU), three with it.
    pauses = ["writing", "written"] * 5
    trials += [Trial("writing", tuple(RACY_SEARCH), rng.uniform(0.0, 0.01), p, png=i < 3) for i, p in enumerate(pauses)]
    rng.shuffle(trials)
    return trials


def test_ctrl_c_at_fifty_moments_from_start_up_to_writing_a_race_always_exits_130_with_the_race_kept(
    tmp_path: Path,
) -> None:
    trials = _trials(random.Random(15))
    assert len(trials) == 50 and {t.moment for t in trials} == {"start-up", "search", "writing"}
    # Two at a time: each run is mostly a Python start-up, and the suite must hold on two busy cores.
    with ThreadPoolExecutor(max_workers=2) as pool:
        stops = list(pool.map(lambda it: _run_trial(it[0], it[1], tmp_path), enumerate(trials)))
    assert max(stops) < HANG_S  # stops at the next example; how soon depends on the machine's load


def test_sigterm_behaves_like_ctrl_c(tmp_path: Path) -> None:
    trials = [
        Trial("start-up", tuple(LONG_SEARCH), 0.0),
        Trial("search", tuple(LONG_SEARCH), 0.3),
        Trial("writing", tuple(RACY_SEARCH), 0.0, "writing", png=True),
    ]
    for index, trial in enumerate(trials):
        _run_trial(index, trial, tmp_path, signal.SIGTERM)


# --- the handler's rules, in this process ---------------------------------------------------------------------


def test_in_a_hold_region_signals_are_noted_until_the_third() -> None:
    with watchdog.handle_signals(), watchdog.hold():
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGTERM)
        assert watchdog.signal_received() == "SIGINT"
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is not watchdog._on_signal  # the caller's handler is back
    assert watchdog.signal_received() is None  # and a later command in this process starts afresh


def test_in_a_search_the_first_signal_stops_at_the_next_checkpoint_and_the_second_at_once() -> None:
    with watchdog.handle_signals(), watchdog.hold(), watchdog.stoppable(None):
        signal.raise_signal(signal.SIGTERM)  # noted
        with pytest.raises(watchdog.StopRequested):
            watchdog.checkpoint("the next example")
    with watchdog.handle_signals(), watchdog.stoppable(None):
        signal.raise_signal(signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)


class _InterruptedFinalizer:
    """A `__del__` interrupted by Ctrl-C, as Hypothesis's garbage-collection callback was: Python reports an
    exception there as unraisable ("Exception ignored") and drops it."""

    def __del__(self) -> None:
        signal.raise_signal(signal.SIGINT)


def test_an_interrupt_swallowed_inside_a_finalizer_is_delivered_again(capsys: pytest.CaptureFixture[str]) -> None:
    with watchdog.handle_signals(), pytest.raises(KeyboardInterrupt):
        finalized = _InterruptedFinalizer()
        del finalized  # the interrupt is raised inside __del__, where Python cannot propagate it
        deadline = time.monotonic() + HANG_S
        while time.monotonic() < deadline:  # ordinary code, where it lands instead
            time.sleep(0.001)
    assert "Exception ignored" not in capsys.readouterr().err


def test_main_gives_the_callers_handlers_back(capsys: pytest.CaptureFixture[str]) -> None:
    from racefuzz.cli import main

    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    assert main(["designs"]) == ExitCode.CLEAN
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


HUNG_DESIGN = """
import time


class Hangs:
    name = "hangs"

    def after_reads(self, ctx):
        while True:
            time.sleep(0.1)


design = Hangs()
"""


def test_a_hook_that_never_returns_is_abandoned_with_exit_6(tmp_path: Path) -> None:
    (tmp_path / "hung.py").write_text(HUNG_DESIGN)
    process = _start(["run", "--design", "hung.py:design", "--example-timeout", "0.5"], tmp_path, tmp_path / "events")
    try:
        out, err = process.communicate(timeout=HANG_S)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail("the watchdog did not end the run")
    assert process.returncode == ExitCode.TIMEOUT, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err
    assert "hook after_reads of design hung.py:design took more than 0.5 s (--example-timeout)" in lines[0]
    assert "abandoned" in lines[0]
