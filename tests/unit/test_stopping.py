"""Ctrl-C and the per-example watchdog, on a real `racefuzz run` process (`racefuzz.watchdog`)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import racefuzz
from racefuzz.exitcodes import ExitCode

REPO = Path(racefuzz.__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


ENTRY_POINT = "import sys\nfrom racefuzz.cli import main\nsys.exit(main())\n"
"""What the `racefuzz` console script runs (pip writes the same three lines into bin/racefuzz)."""


def _start(args: list[str], cwd: Path) -> subprocess.Popen[str]:
    entry = cwd / "bin" / "racefuzz"
    entry.parent.mkdir(exist_ok=True)
    entry.write_text(ENTRY_POINT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen(
        [sys.executable, str(entry), *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_ctrl_c_at_twenty_random_moments_always_stops_within_two_seconds(tmp_path: Path) -> None:
    # A search far longer than the test (10**8 examples of a race-free design): it only ends by Ctrl-C.
    args = ["run", "--backend", "sim", "--design", "war-after-launch", "--examples", str(10**8)]
    args += ["--database", "none", "--report-dir", str(tmp_path / "reports")]
    rng = random.Random(15)
    stops = []
    for trial in range(20):
        process = _start(args, tmp_path)
        time.sleep(rng.uniform(0.3, 1.5))  # before, during and after the negative control
        process.send_signal(signal.SIGINT)
        sent = time.monotonic()
        try:
            out, err = process.communicate(timeout=2.0)
        except subprocess.TimeoutExpired:
            process.kill()
            out, err = process.communicate()
            pytest.fail(f"trial {trial}: still running 2 s after Ctrl-C\n{out}\n{err}")
        stops.append(time.monotonic() - sent)
        assert process.returncode == ExitCode.INTERRUPTED, (trial, out, err)
        assert "racefuzz: interrupted" in err and "Traceback" not in err and "Exception ignored" not in err
    assert max(stops) < 2.0


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
    process = _start(["run", "--design", "hung.py:design", "--example-timeout", "0.5"], tmp_path)
    try:
        out, err = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail("the watchdog did not end the run")
    assert process.returncode == ExitCode.TIMEOUT, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err
    assert "hook after_reads of design hung.py:design took more than 0.5 s (--example-timeout)" in lines[0]
    assert "abandoned" in lines[0]
