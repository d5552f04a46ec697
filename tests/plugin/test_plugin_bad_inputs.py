"""Bad inputs through the pytest plugin: a usage error is one `ERROR:` line before any test runs, and a test
failed by racefuzz shows one line naming the kind (`racefuzz: usage error: ...`, `racefuzz: error in user
code: ...`) -- the kinds of the CLI's exit codes. Files already in the report directory stay as they were."""

from __future__ import annotations

import textwrap

import pytest

PLUGIN = ("-p", "racefuzz.pytest_plugin")
EARLIER = "a report from an earlier run\n"

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

USES_RACEFUZZ = """
def test_uses_racefuzz(racefuzz_config):
    pass
"""


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    (pytester.path / ".racefuzz").mkdir()
    (pytester.path / ".racefuzz" / "earlier.txt").write_text(EARLIER)
    (pytester.path / "notes.txt").write_text("a file, not a directory\n")
    pytester.makepyfile(test_user=USES_RACEFUZZ)
    return pytester


def _unchanged(pytester: pytest.Pytester) -> None:
    assert [p.name for p in (pytester.path / ".racefuzz").iterdir()] == ["earlier.txt"]
    assert (pytester.path / ".racefuzz" / "earlier.txt").read_text() == EARLIER


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--racefuzz-report-dir", "notes.txt"], "--racefuzz-report-dir notes.txt: exists and is not a directory"),
        (["--racefuzz-report-dir", "notes.txt/out"], "cannot be created"),
        (["--racefuzz-backend", "tpu"], "--racefuzz-backend: expected one of auto, sim, cuda, got 'tpu'"),
        (["--racefuzz-examples", "0"], "--racefuzz-examples: expected an integer >= 1, got 0"),
        (["--racefuzz-examples", "many"], "--racefuzz-examples: expected an integer >= 1, got 'many'"),
        (["--racefuzz-seed", "-1"], "--racefuzz-seed: expected an integer >= 0, got -1"),
        # The CLI's ranges (racefuzz.commands.argtypes): a seed the CLI refuses would write a replay file
        # that `racefuzz replay` refuses.
        (["--racefuzz-seed", str(2**32)], "--racefuzz-seed: expected a non-negative integer up to 4294967295"),
        (["--racefuzz-examples", str(10**9)], "--racefuzz-examples: expected a positive integer up to 100000000"),
        (["--racefuzz-example-timeout", "0"], "--racefuzz-example-timeout: expected seconds in [0.1, 86400]"),
        (["--racefuzz-example-timeout", "inf"], "--racefuzz-example-timeout: expected seconds in [0.1, 86400]"),
    ],
    ids=[
        "report dir is a file",
        "report dir under a file",
        "backend",
        "examples 0",
        "examples text",
        "seed",
        "seed 2**32",
        "examples past the CLI's cap",
        "timeout 0",
        "timeout inf",
    ],
)
def test_a_bad_option_is_one_usage_error_line(project: pytest.Pytester, options: list[str], message: str) -> None:
    result = project.runpytest_subprocess(*PLUGIN, *options)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.errlines if line.strip()]
    assert errors == [f"ERROR: {message}"] or (len(errors) == 1 and message in errors[0]), result.errlines
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    _unchanged(project)


BAD_DESIGN = """
class Raises:
    name = "raises"

    def after_reads(self, ctx):
        table = {}
        return table["read_done"]


design = Raises()


class Exits:
    name = "exits"

    def after_reads(self, ctx):
        import sys

        sys.exit(0)


exits = Exits()
"""


@pytest.mark.parametrize(
    ("call", "line"),
    [
        ('assert_race_free("global-wra", racefuzz_config)', "racefuzz: usage error: unknown design 'global-wra'"),
        (
            'assert_race_free("bad_design:design", racefuzz_config)',
            "racefuzz: error in user code: design bad_design:design: hook after_reads raised KeyError",
        ),
        (
            'assert_no_new_race("bad_design:design", "self-event", racefuzz_config)',
            "racefuzz: error in user code: design bad_design:design: hook after_reads raised KeyError",
        ),
        (
            'assert_race_free("none", racefuzz_config, control=None)',
            "racefuzz: race found: racefuzz found a race in design none",
        ),
        (
            'assert_race_free("bad_design:exits", racefuzz_config)',
            "racefuzz: error in user code: design bad_design:exits: hook after_reads raised SystemExit",
        ),
        (
            'assert_no_new_race("bad_design:exits", "self-event", racefuzz_config)',
            "racefuzz: error in user code: design bad_design:exits: hook after_reads raised SystemExit",
        ),
    ],
    ids=["unknown design", "hook raises", "hook raises (no new race)", "race", "hook exits", "hook exits (no new)"],
)
def test_a_failure_shows_its_kind_in_one_line(project: pytest.Pytester, call: str, line: str) -> None:
    (project.path / "bad_design.py").write_text(BAD_DESIGN)
    project.makepyfile(
        test_user=textwrap.dedent(
            f"""
            from racefuzz.testing import assert_no_new_race, assert_race_free

            def test_design(racefuzz_config):
                {call}
            """
        )
    )
    report_dir = "reports" if "race found" in line else ".racefuzz"  # a race is written: elsewhere here
    result = project.runpytest_subprocess(
        *PLUGIN, "--racefuzz-backend", "sim", "--racefuzz-examples", "50", "--racefuzz-report-dir", report_dir
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"{line}*"])
    assert "Traceback" not in result.stdout.str()
    _unchanged(project)


def test_the_plugins_default_example_timeout_is_the_clis() -> None:
    from racefuzz.commands.argtypes import DEFAULT_EXAMPLE_TIMEOUT_S
    from racefuzz.pytest_plugin import DEFAULT_EXAMPLE_TIMEOUT_S as PLUGIN_DEFAULT

    assert PLUGIN_DEFAULT == DEFAULT_EXAMPLE_TIMEOUT_S


HANGS = """
class Hangs:
    name = "hangs"

    def after_reads(self, ctx):
        while True:
            pass


design = Hangs()
"""


def test_a_hook_that_never_returns_ends_the_session_with_exit_6_naming_it(project: pytest.Pytester) -> None:
    (project.path / "hanging_design.py").write_text(HANGS)
    project.makepyfile(
        test_user="""
        from racefuzz.testing import assert_race_free

        def test_design(racefuzz_config):
            assert_race_free("hanging_design:design", racefuzz_config, control=None)
        """
    )
    result = project.runpytest_subprocess(
        *PLUGIN, "--racefuzz-backend", "sim", "--racefuzz-examples", "5", "--racefuzz-example-timeout", "1"
    )
    assert result.ret == 6  # racefuzz's exit code for a timeout: the hook cannot be interrupted, only abandoned
    result.stdout.fnmatch_lines(
        ["racefuzz: error: hook after_reads of design hanging_design:design took more than 1 s (--example-timeout)*"]
    )


STEPS = """
import sys


def exits(env):
    sys.exit(0)


def hangs(env):
    while True:
        pass
"""


@pytest.mark.parametrize(
    ("step", "outcome"),
    [
        ("exits", "racefuzz: error in user code: the step steps:exits raised SystemExit: sys.exit(0) was called"),
        ("hangs", "took more than 1 s (--example-timeout)"),
    ],
    ids=["sys.exit", "never returns"],
)
def test_a_traced_step_that_exits_or_hangs_fails_naming_it(project: pytest.Pytester, step: str, outcome: str) -> None:
    import importlib.util

    if importlib.util.find_spec("torch") is None:  # not imported here: pytester restores sys.modules after
        pytest.skip("needs torch")
    (project.path / "steps.py").write_text(STEPS)
    project.makepyfile(
        test_user=f"""
        import steps

        def test_step(racefuzz_trace):
            racefuzz_trace.fuzz(steps.{step})
        """
    )
    result = project.runpytest_subprocess(
        *PLUGIN, "--racefuzz-backend", "sim", "--racefuzz-examples", "5", "--racefuzz-example-timeout", "1"
    )
    if step == "hangs":
        assert result.ret == 6
        result.stdout.fnmatch_lines([f"racefuzz: error: *the step steps:hangs {outcome}*"])
    else:
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines([f"{outcome}*"])
