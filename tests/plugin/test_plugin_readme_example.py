"""The README's pytest example, verbatim: `mypkg/sync.py` and `tests/test_sync_refactor.py` as the README
shows them, run with the README's pytest command from the directory that holds `mypkg/`."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

import racefuzz

README = (Path(racefuzz.__file__).resolve().parent.parent / "README.md").read_text()
PLUGIN = ("-p", "racefuzz.pytest_plugin")  # as in test_plugin.py: loads it where racefuzz is not installed

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def readme_block(first_line: str) -> str:
    match = re.search(r"```(?:python|bash)\n(" + re.escape(first_line) + r"[^\n]*\n.*?)```", README, re.S)
    assert match, f"the README has no code block starting {first_line!r}"
    return match.group(1)


def test_the_readme_pytest_example_passes_verbatim(pytester: pytest.Pytester) -> None:
    (pytester.path / "mypkg").mkdir()
    (pytester.path / "mypkg" / "__init__.py").write_text("")
    (pytester.path / "mypkg" / "sync.py").write_text(readme_block("# mypkg/sync.py"))
    (pytester.path / "tests").mkdir()
    (pytester.path / "tests" / "test_sync_refactor.py").write_text(readme_block("# tests/test_sync_refactor.py"))
    command = shlex.split(readme_block("pytest -n auto").splitlines()[0].split("#", 1)[0])
    assert command[0] == "pytest"
    result = pytester.runpytest_subprocess(*PLUGIN, *command[1:])
    result.assert_outcomes(passed=2)


def test_the_readme_trace_fixture_example_passes_verbatim(pytester: pytest.Pytester) -> None:
    pytest.importorskip("torch")
    (pytester.path / "tests").mkdir()
    (pytester.path / "tests" / "test_overlap_step.py").write_text(readme_block("# tests/test_overlap_step.py"))
    result = pytester.runpytest_subprocess(*PLUGIN, "--racefuzz-backend", "sim")
    result.assert_outcomes(passed=1)
