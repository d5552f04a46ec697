"""racefuzz's pytest plugin, driven end to end with pytester.

Runs go through subprocesses: an in-process pytester run unloads and re-imports modules, which numpy
does not survive.
"""

from __future__ import annotations

import textwrap

import pytest

import racefuzz.pytest_plugin as plugin

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def _write(pytester: pytest.Pytester, body: str) -> None:
    pytester.makepyfile(test_user=textwrap.dedent(body))


def test_failing_property_leaves_report_replay_file_and_timeline(pytester: pytest.Pytester) -> None:
    _write(
        pytester,
        """
        from racefuzz.testing import assert_race_free

        def test_unfenced_loop(racefuzz_config):
            assert_race_free("none", racefuzz_config, control=None)
        """,
    )
    result = pytester.runpytest_subprocess(
        "--racefuzz-backend", "sim", "--racefuzz-examples", "300", "--racefuzz-report-dir", "rf"
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*racefuzz found a race in design none (replay file rf/none-*.json)*",
            "*==== racefuzz: WAR race on req_to_token (design none, backend sim) ====*",
        ]
    )
    report_dir = pytester.path / "rf"
    replays = [p for p in report_dir.glob("none-*.json") if not p.name.endswith(".trace.json")]
    assert len(replays) == 1
    assert replays[0].with_suffix(".txt").exists()
    assert (report_dir / f"{replays[0].stem}.trace.json").exists()


def test_clean_design_passes_beside_its_control(pytester: pytest.Pytester) -> None:
    _write(
        pytester,
        """
        from racefuzz.testing import assert_race_free

        def test_barrier_after_launch(racefuzz_config):
            result = assert_race_free("war-after-launch", racefuzz_config)
            assert result.examples == racefuzz_config.examples == 150
        """,
    )
    result = pytester.runpytest_subprocess("--racefuzz-backend", "sim", "--racefuzz-examples", "150")
    result.assert_outcomes(passed=1)


def test_uncaught_control_is_inconclusive_not_green(pytester: pytest.Pytester) -> None:
    # Over the plan-stream hazard alone even `none` is race-free (column-disjoint over-allocation), so
    # the control cannot be caught there and a "no race" must not pass.
    _write(
        pytester,
        """
        from racefuzz.testing import assert_race_free

        def test_plan_only(racefuzz_config):
            assert_race_free("global-war", racefuzz_config, hazards=["plan-stream"], plan_stream=True)
        """,
    )
    result = pytester.runpytest_subprocess("--racefuzz-backend", "sim", "--racefuzz-examples", "100")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*INCONCLUSIVE: the negative control `none` was not caught in 100 examples*"])


def test_no_new_race_compares_designs(pytester: pytest.Pytester) -> None:
    _write(
        pytester,
        """
        from racefuzz.testing import assert_no_new_race

        def test_global_war_over_self_event(racefuzz_config):
            assert_no_new_race("global-war", "self-event", racefuzz_config)

        def test_self_event_over_global_war(racefuzz_config):
            assert_no_new_race("self-event", "global-war", racefuzz_config)
        """,
    )
    result = pytester.runpytest_subprocess("--racefuzz-examples", "200", "-v")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*test_self_event_over_global_war FAILED*"])
    result.stdout.fnmatch_lines(["*design self-event has races that global-war does not*"])


def test_same_seed_same_failure(pytester: pytest.Pytester) -> None:
    _write(
        pytester,
        """
        from racefuzz.testing import assert_race_free

        def test_unfenced(racefuzz_config):
            assert_race_free("self-event", racefuzz_config, control=None)
        """,
    )
    first = pytester.runpytest_subprocess(
        "--racefuzz-seed", "7", "--racefuzz-examples", "300", "--racefuzz-backend", "sim"
    )
    second = pytester.runpytest_subprocess(
        "--racefuzz-seed", "7", "--racefuzz-examples", "300", "--racefuzz-backend", "sim"
    )
    lines = [[line for line in r.outlines if "counterexample:" in line] for r in (first, second)]
    assert lines[0] and lines[0] == lines[1]


def test_cuda_marked_test_skips_with_a_reason_without_a_gpu(pytester: pytest.Pytester) -> None:
    from racefuzz.backend import cuda_unavailable_reason

    if cuda_unavailable_reason() is None:
        pytest.skip("a GPU is usable here")
    _write(
        pytester,
        """
        import pytest

        @pytest.mark.cuda
        def test_on_the_gpu():
            raise AssertionError("must not run without a GPU")
        """,
    )
    result = pytester.runpytest_subprocess("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*needs a CUDA GPU: *"])


def test_options_reach_the_config_fixture_and_the_header(pytester: pytest.Pytester) -> None:
    _write(
        pytester,
        """
        from pathlib import Path

        def test_config(racefuzz_config, racefuzz_backend):
            assert (racefuzz_config.examples, racefuzz_config.seed) == (7, 3)
            assert racefuzz_config.report_dir == Path("out")
            assert racefuzz_backend == "sim"
        """,
    )
    result = pytester.runpytest_subprocess(
        "--racefuzz-examples", "7", "--racefuzz-seed", "3", "--racefuzz-report-dir", "out", "--racefuzz-backend", "sim"
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["racefuzz: backend sim, examples 7, seed 3, report dir out, *"])


def test_examples_default_to_the_hypothesis_profile(pytester: pytest.Pytester) -> None:
    _write(
        pytester,
        """
        def test_config(racefuzz_config):
            assert racefuzz_config.examples == 1000
        """,
    )
    pytester.runpytest_subprocess("--hypothesis-profile", "racefuzz-ci").assert_outcomes(passed=1)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--racefuzz-backend", "tpu"], "--racefuzz-backend: expected one of auto, sim, cuda, got 'tpu'"),
        (["--racefuzz-examples", "0"], "--racefuzz-examples: expected an integer >= 1, got 0"),
        (["--racefuzz-examples", "many"], "--racefuzz-examples: expected an integer >= 1, got 'many'"),
        (["--racefuzz-seed", "-1"], "--racefuzz-seed: expected an integer >= 0, got -1"),
    ],
)
def test_bad_option_values_are_one_usage_error(pytester: pytest.Pytester, args: list[str], message: str) -> None:
    _write(pytester, "def test_nothing():\n    pass\n")
    result = pytester.runpytest_subprocess(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}"])


def test_xdist_workers_are_pinned_round_robin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(plugin, "_gpu_count", lambda: 2)
    chosen = []
    for worker in ("gw0", "gw1", "gw2", "gw3"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        chosen.append(plugin._pin_xdist_worker_to_gpu())
    assert chosen == ["0", "1", "0", "1"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")
    assert plugin._pin_xdist_worker_to_gpu() == "5", "a user's own CUDA_VISIBLE_DEVICES wins"
    monkeypatch.setattr(plugin, "_gpu_count", lambda: None)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert plugin._pin_xdist_worker_to_gpu() is None
