"""The pytest plugin and `racefuzz.testing` drive a second scenario (tests/scenarios/ring_scenario.py)
exactly as they drive sglang's: a clean design passes beside its scenario's control, a racy one fails
with the report and leaves its replay file."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

SCENARIOS = Path(__file__).parents[1] / "scenarios"

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def test_a_second_scenario_through_the_plugin(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(SCENARIOS), os.environ.get("PYTHONPATH")])))
    pytester.makepyfile(
        test_ring=textwrap.dedent(
            """
            from racefuzz.designs import load_design
            from racefuzz.testing import assert_race_free

            def test_fenced_ring(racefuzz_config):
                design = load_design("ring-events", "ring_scenario:SCENARIO")
                result = assert_race_free(design, racefuzz_config)  # beside the scenario's control, ring-none
                assert result.examples == 200

            def test_ring_without_war_fence(racefuzz_config):
                assert_race_free("ring_scenario:raw_only", racefuzz_config)
            """
        )
    )
    result = pytester.runpytest_subprocess(
        "-p", "racefuzz.pytest_plugin", "--racefuzz-backend", "sim", "--racefuzz-examples", "200",
        "--racefuzz-report-dir", "rf",
    )  # fmt: skip
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*racefuzz found a race in design ring-raw-only (replay file rf/ring_scenario.raw_only-*.json)*",
            "*==== racefuzz: WAR race on ring (design ring_scenario:raw_only, backend sim) ====*",
        ]
    )
    assert len([p for p in (pytester.path / "rf").glob("*.json") if not p.name.endswith(".trace.json")]) == 1
