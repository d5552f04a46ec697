"""racefuzz's pytest plugin, driven end to end with pytester.

Runs go through subprocesses: an in-process pytester run unloads and re-imports modules, which numpy
does not survive.
"""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import settings

import racefuzz.pytest_plugin as plugin
from racefuzz.backends import BACKENDS  # imported here, not in a pytester test: its teardown unloads numpy

PLUGIN = ("-p", "racefuzz.pytest_plugin")
"""Loads the plugin in a pytester run even where racefuzz is on the path but not installed (no entry point);
a no-op where the entry point already loaded it under that name."""

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
    # With a single example the control is not caught (the first example is all zeros: no delay, one
    # request), so the "no race" of that same search must not pass.
    _write(
        pytester,
        """
        from racefuzz.testing import assert_race_free

        def test_plan_only(racefuzz_config):
            assert_race_free("global-war", racefuzz_config, hazards=["plan-stream"], plan_stream=True)
        """,
    )
    result = pytester.runpytest_subprocess("--racefuzz-backend", "sim", "--racefuzz-examples", "1")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*racefuzz: inconclusive: the negative control `none` was not caught in 1 examples*"])


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


@pytest.fixture(scope="module")
def cuda_reason() -> str | None:
    """Why the CUDA backend cannot run here. Module-scoped, so that torch is imported before the pytester
    fixture snapshots sys.modules: torch imported inside a pytester test is unloaded at its teardown, and a
    later import of it in the same process (any `--backend auto` run) crashes the interpreter."""
    from racefuzz.backends import cuda_unavailable_reason

    return cuda_unavailable_reason()


def test_cuda_marked_test_skips_with_a_reason_without_a_gpu(pytester: pytest.Pytester, cuda_reason: str | None) -> None:
    if cuda_reason is None:
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


# -- a polite plugin: a session that does not use racefuzz sees nothing of it ---------------------------------

FAKE_NVIDIA_SMI = """#!/bin/sh
echo called >> "{calls}"
echo "GPU 0: Fake GPU (UUID: GPU-0)"
echo "GPU 1: Fake GPU (UUID: GPU-1)"
"""


@pytest.fixture
def two_fake_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An `nvidia-smi` that lists two GPUs and logs its calls (the returned file), and an xdist worker gw1
    without CUDA_VISIBLE_DEVICES: a session that pins would set CUDA_VISIBLE_DEVICES=1."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    calls = tmp_path / "nvidia-smi-calls"
    smi = bin_dir / "nvidia-smi"
    smi.write_text(FAKE_NVIDIA_SMI.format(calls=calls))
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("RACEFUZZ_WORKER_LOG", raising=False)
    return calls


def test_a_session_not_using_racefuzz_sees_nothing_of_it(pytester: pytest.Pytester, two_fake_gpus: Path) -> None:
    # A `cuda` marker would count as using racefuzz; an unrelated marker and Hypothesis-free tests do not.
    _write(
        pytester,
        """
        import os
        import sys

        import pytest

        def test_plain(pytestconfig):
            assert pytestconfig.pluginmanager.has_plugin("racefuzz.pytest_plugin")
            leaked = sorted(m for m in ("hypothesis", "numpy", "torch", "racefuzz.backends") if m in sys.modules)
            assert not leaked, f"imported by the plugin: {leaked}"
            assert "CUDA_VISIBLE_DEVICES" not in os.environ

        @pytest.mark.slow
        def test_marked(pytestconfig):
            assert "hypothesis" not in sys.modules and "CUDA_VISIBLE_DEVICES" not in os.environ
        """,
    )
    pytester.makeini("[pytest]\nmarkers =\n    slow: an unrelated marker\n")
    result = pytester.runpytest_subprocess(*PLUGIN, "-p", "no:xdist")
    result.assert_outcomes(passed=2)
    assert not two_fake_gpus.exists(), "nvidia-smi was called"
    assert not any(line.startswith("racefuzz:") for line in result.outlines), "no racefuzz report header"


@pytest.mark.parametrize(
    ("args", "body"),
    [
        pytest.param((), "def test_it(racefuzz_config):\n    pass\n", id="fixture"),
        pytest.param(
            (),
            "import pytest\n\n@pytest.fixture\ndef mine(racefuzz_backend):\n    return racefuzz_backend\n\n"
            "def test_it(mine):\n    pass\n",
            id="fixture-through-another",
        ),
        pytest.param(("--racefuzz-backend", "sim"), "def test_it():\n    pass\n", id="option"),
        pytest.param(("--hypothesis-profile", "racefuzz-dev"), "def test_it():\n    pass\n", id="profile"),
    ],
)
def test_a_session_that_uses_racefuzz_is_pinned_before_its_tests_run(
    pytester: pytest.Pytester, two_fake_gpus: Path, args: tuple[str, ...], body: str
) -> None:
    # The check runs in a conftest fixture that every test uses, so it sees the environment before the test.
    pytester.makeconftest(
        """
        import os
        import sys

        import pytest

        @pytest.fixture(autouse=True)
        def _pinned():
            assert os.environ.get("CUDA_VISIBLE_DEVICES") == "1"
            assert "hypothesis" in sys.modules, "racefuzz's profiles are registered"
        """
    )
    pytester.makepyfile(test_user=body)
    result = pytester.runpytest_subprocess(*PLUGIN, "-p", "no:xdist", *args)
    result.assert_outcomes(passed=1)
    assert two_fake_gpus.read_text().splitlines() == ["called"]


def test_the_worker_log_never_imports_torch(
    pytester: pytest.Pytester, two_fake_gpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "workers.log"
    _write(pytester, "def test_nothing():\n    pass\n")
    monkeypatch.setenv("RACEFUZZ_WORKER_LOG", str(log))
    pytester.runpytest_subprocess(*PLUGIN, "-p", "no:xdist").assert_outcomes(passed=1)
    assert log.read_text() == (
        "worker gw1: CUDA_VISIBLE_DEVICES=None, device 0 is unknown (torch not used in this process)\n"
    )


def test_the_racefuzz_ci_profile_is_derandomized(pytester: pytest.Pytester) -> None:
    _write(
        pytester,
        """
        from hypothesis import given, settings, strategies as st

        def test_profile():
            s = settings()
            assert (s.max_examples, s.derandomize, s.deadline) == (1000, True, None)

        @given(st.integers())
        def test_draws(x):
            with open("draws.txt", "a") as f:
                f.write(f"{x}\\n")
        """,
    )
    runs = []
    for _ in range(2):
        (pytester.path / "draws.txt").unlink(missing_ok=True)
        pytester.runpytest_subprocess(*PLUGIN, "--hypothesis-profile", "racefuzz-ci").assert_outcomes(passed=2)
        runs.append((pytester.path / "draws.txt").read_text())
    assert runs[0] == runs[1], "a derandomized profile draws the same examples on every run"
    plugin._register_hypothesis_profiles()
    assert {name: settings.get_profile(name).derandomize for name in plugin.PROFILES} == {
        "racefuzz-dev": False,
        "racefuzz-ci": True,
        "racefuzz-thorough": False,
    }


def test_the_backend_option_takes_its_names_from_racefuzz_backends(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess(*PLUGIN, "--help")
    start = next(i for i, line in enumerate(result.outlines) if line.strip().startswith("--racefuzz-backend"))
    help_text = " ".join(result.outlines[start : start + 3])
    assert all(name in help_text for name in BACKENDS), help_text
    assert plugin.parse_backend("sim") == "sim"
    with pytest.raises(pytest.UsageError, match=", ".join(BACKENDS)):
        plugin.parse_backend("tpu")


def test_loading_the_plugin_imports_nothing_heavy() -> None:
    import subprocess

    code = (
        "import sys, racefuzz.pytest_plugin\n"
        "leaked = sorted(m for m in ('hypothesis', 'numpy', 'torch', 'racefuzz.backends') if m in sys.modules)\n"
        "assert not leaked, leaked\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
