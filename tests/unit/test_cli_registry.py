"""The CLI is built from one table, `racefuzz.commands.SUBCOMMANDS`: each entry's module adds its own parser,
the table's order is `racefuzz --help`'s, a new subcommand is one entry, and whether a command runs with
signals held is the entry's."""

from __future__ import annotations

import argparse
import importlib
import signal
import subprocess
import sys
import types

import pytest

from racefuzz.cli import build_parser, main
from racefuzz.commands import SUBCOMMANDS, Subcommand
from racefuzz.exitcodes import ExitCode


def _subcommands(parser: argparse.ArgumentParser) -> list[str]:
    (action,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return list(action.choices)


def test_the_parser_has_the_tables_subcommands_in_its_order() -> None:
    assert _subcommands(build_parser()) == list(SUBCOMMANDS)


@pytest.mark.parametrize("name", list(SUBCOMMANDS))
def test_each_entry_adds_the_subparser_of_its_name_and_names_its_entry_function(name: str) -> None:
    added: list[str] = []

    def command(subcommand: str, help: str) -> argparse.ArgumentParser:
        added.append(subcommand)
        return argparse.ArgumentParser(prog=subcommand)

    SUBCOMMANDS[name].add_to(command)
    assert added == [name]
    assert callable(getattr(importlib.import_module(SUBCOMMANDS[name].module), SUBCOMMANDS[name].entry))


def test_only_the_commands_whose_search_stops_at_a_checkpoint_hold_signals() -> None:
    assert [name for name, entry in SUBCOMMANDS.items() if entry.holds_signals] == ["run", "replay"]


def test_building_every_parser_imports_neither_torch_nor_cupy_nor_hypothesis() -> None:
    """Each command module is imported to build the parser: one with a heavy import at its top level would
    slow every `racefuzz` call, `--help` and a typo included."""
    probe = (
        "import sys\n"
        "from racefuzz.cli import build_parser\n"
        "build_parser()\n"
        "print(sorted(m for m in ('torch', 'cupy', 'hypothesis') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _fake_command(monkeypatch: pytest.MonkeyPatch, *, holds_signals: bool, interrupt: bool) -> list[str]:
    """Register a subcommand `fake` by one table entry (its module put in sys.modules); what it did is
    appended to the returned list: "start", then "end" if it ran to its end."""
    did: list[str] = []
    module = types.ModuleType("racefuzz_fake_command")

    def add_parser(command) -> None:
        command("fake", "a subcommand added by one table entry").add_argument("--code", type=int, default=0)

    def fake_command(args: argparse.Namespace) -> int:
        did.append("start")
        if interrupt:
            signal.raise_signal(signal.SIGINT)
        did.append("end")
        return args.code

    module.add_parser, module.fake_command = add_parser, fake_command
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(SUBCOMMANDS, "fake", Subcommand(module.__name__, "fake_command", holds_signals=holds_signals))
    return did


def test_a_subcommand_is_one_table_entry(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    did = _fake_command(monkeypatch, holds_signals=False, interrupt=False)
    assert main(["fake", "--code", "3"]) == 3
    assert did == ["start", "end"]
    with pytest.raises(SystemExit) as usage:  # argparse's own error, through the CLI's parser class
        main(["fake", "--code", "x"])
    assert usage.value.code == ExitCode.USAGE
    assert capsys.readouterr().err == "racefuzz: error: argument --code: invalid int value: 'x'\n"
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "a subcommand added by one table entry" in capsys.readouterr().out


@pytest.mark.parametrize("holds_signals", [True, False])
def test_a_command_that_holds_signals_runs_to_its_end_and_one_that_does_not_stops_at_once(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], holds_signals: bool
) -> None:
    did = _fake_command(monkeypatch, holds_signals=holds_signals, interrupt=True)
    assert main(["fake"]) == ExitCode.INTERRUPTED
    assert did == (["start", "end"] if holds_signals else ["start"])
    assert capsys.readouterr().err.strip() == "racefuzz: interrupted"
