"""The README's examples, verbatim, from a temporary directory, as the console script runs them (the working
directory is not on the import path): "guard your sync refactor" (its design file, its `racefuzz run`
commands, the racy variant it describes with its replay, and the figure it quotes), and the commands of
"run a design" and "fuzz your own code", each exiting as its comment says. The pytest halves are in
tests/plugin/test_plugin_readme_example.py."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import racefuzz
from racefuzz.exitcodes import ExitCode

REPO = Path(racefuzz.__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()

ENTRY_POINT = "import sys\nfrom racefuzz.cli import main\nsys.exit(main())\n"
"""What the `racefuzz` console script runs; from its own directory, so the user's is not on sys.path."""


def readme_block(first_line: str) -> str:
    """The README code block whose first line starts with `first_line`."""
    match = re.search(r"```(?:python|bash)\n(" + re.escape(first_line) + r"[^\n]*\n.*?)```", README, re.S)
    assert match, f"the README has no code block starting {first_line!r}"
    return match.group(1)


def readme_commands(first_line: str) -> list[list[str]]:
    """The commands of the bash block whose first line starts with `first_line`, comments stripped."""
    return [shlex.split(line.split("#", 1)[0]) for line in readme_block(first_line).splitlines()]


def racefuzz_cli(argv: list[str], cwd: Path, entry: Path) -> subprocess.CompletedProcess[str]:
    assert argv[0] == "racefuzz"
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # racefuzz importable, as `pip install -e .` makes it
    return subprocess.run(
        [sys.executable, str(entry), *argv[1:]], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_the_readme_design_example_works_verbatim(tmp_path: Path) -> None:
    entry = tmp_path / "bin" / "racefuzz"
    entry.parent.mkdir()
    entry.write_text(ENTRY_POINT)
    project = tmp_path / "project"
    (project / "mypkg").mkdir(parents=True)
    (project / "mypkg" / "__init__.py").write_text("")
    design = readme_block("# mypkg/sync.py")
    (project / "mypkg" / "sync.py").write_text(design)

    commands = readme_commands("racefuzz run --design mypkg.sync:design")
    assert [c[:3] for c in commands] == [["racefuzz", "run", "--design"]] * 2
    for command in commands:  # by module and by file path
        done = racefuzz_cli(command, project, entry)
        assert done.returncode == ExitCode.CLEAN, done.stdout + done.stderr
        spec = command[3]  # messages name the design as the user named it
        assert "negative control `none`: caught" in done.stdout and f"no race found in design {spec}" in done.stdout

    # The variant the README describes: the barrier at loop_top races, after the number of examples it says.
    assert "def after_launch(self, ctx):" in design
    (project / "mypkg" / "sync.py").write_text(
        design.replace("def after_launch(self, ctx):", "def loop_top(self, ctx):")
    )
    racy = racefuzz_cli(commands[0], project, entry)
    assert racy.returncode == ExitCode.RACE, racy.stdout + racy.stderr
    claimed = re.search(r"`racefuzz run` exits 1 after (\d+) examples", README)
    assert claimed, "the README quotes how many examples the racy variant takes"
    assert f"RACE FOUND in design {commands[0][3]} after {claimed.group(1)} example(s)" in racy.stdout
    assert "post_launch_rewrite" in racy.stdout
    replay_file = re.search(r"replay: racefuzz replay (\S+)", racy.stdout).group(1)  # type: ignore[union-attr]
    assert re.fullmatch(r"\.racefuzz/mypkg\.sync\.design-[0-9a-f]{10}\.json", replay_file)
    replayed = racefuzz_cli(["racefuzz", "replay", replay_file], project, entry)
    assert replayed.returncode == ExitCode.RACE, replayed.stdout + replayed.stderr
    assert "post_launch_rewrite" in replayed.stdout


def expected_exit(line: str) -> int | None:
    """The exit code a README command's comment promises (`# exit N: ...`), if it says one."""
    match = re.search(r"#\s*exit (\d+)", line)
    return int(match.group(1)) if match else None


def run_block_as_commented(first_line: str, tmp_path: Path) -> None:
    """Run every command of a README bash block from an empty directory; each exits as its comment says."""
    entry = tmp_path / "bin" / "racefuzz"
    entry.parent.mkdir()
    entry.write_text(ENTRY_POINT)
    work = tmp_path / "work"
    work.mkdir()
    lines = readme_block(first_line).splitlines()
    promised = [expected_exit(line) for line in lines]
    assert any(code is not None for code in promised), f"the block {first_line!r} promises no exit code"
    for command, code in zip(readme_commands(first_line), promised, strict=True):
        done = racefuzz_cli(command, work, entry)
        assert done.returncode == (ExitCode.CLEAN if code is None else code), (command, done.stdout + done.stderr)


def test_the_readme_run_example_exits_as_it_says(tmp_path: Path) -> None:
    run_block_as_commented("racefuzz run --design global-war", tmp_path)
    block = readme_block("racefuzz run --design global-war")
    assert "racefuzz designs" in block


def test_the_readme_trace_example_exits_as_it_says(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    run_block_as_commented("racefuzz trace racefuzz.trace.example:racy_step", tmp_path)
