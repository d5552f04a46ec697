"""The `racefuzz_trace` fixture, driven end to end with pytester (in subprocesses, as tests/plugin/test_plugin.py)."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ("-p", "racefuzz.pytest_plugin")

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def test_the_fixture_fails_a_racy_step_and_passes_a_synced_one_beside_its_control(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    pytester.makepyfile(
        test_user=textwrap.dedent(
            """
            from racefuzz.trace.example import racy_step, synced_step

            def test_racy(racefuzz_trace):
                racefuzz_trace.fuzz(racy_step, watch=["req_to_token"])

            def test_synced(racefuzz_trace):
                result = racefuzz_trace.fuzz(synced_step, control=racy_step)
                assert result.races == []
            """
        )
    )
    result = pytester.runpytest_subprocess(*PLUGIN, "--racefuzz-backend", "sim")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(
        [
            "*racefuzz: race found: ==== racefuzz trace: RACE in racefuzz.trace.example:racy_step (cpu) ====*",
            "*req_to_token[[]1, 0:8[]]*",
        ]
    )


def test_the_fixture_writes_the_timeline_and_shows_an_uncaught_control_as_inconclusive(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    pytester.makepyfile(
        test_user=textwrap.dedent(
            """
            from racefuzz.trace.example import racy_step, synced_step

            def test_racy(racefuzz_trace):
                racefuzz_trace.fuzz(racy_step)

            def test_uncaught_control(racefuzz_trace):
                racefuzz_trace.fuzz(synced_step, control=synced_step)
            """
        )
    )
    reports = pytester.path / "reports"
    result = pytester.runpytest_subprocess(*PLUGIN, "--racefuzz-backend", "sim", "--racefuzz-report-dir", str(reports))
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*racefuzz: inconclusive: the negative control *synced_step did not race*"])
    assert (reports / "trace-racefuzz.trace.example.racy_step.trace.json").exists()
