"""The CLI's subcommands, one module each, and `SUBCOMMANDS`, the one table of them that `racefuzz.cli` builds
its parser from and dispatches through.

Each module has `add_parser(command)`, which adds its subparser through the CLI's factory
(`command(name, help)` returns an `argparse.ArgumentParser` that already has `-v` and the exit-code table),
and an entry function that takes the parsed arguments and returns the exit code. The table names them as
strings: a module is imported when the parser is built, so its top level must stay light (no torch, CuPy,
numpy or Hypothesis: `racefuzz run` checks its arguments and its design before anything heavy is imported),
and its entry function imports what the command needs. Adding a subcommand is one entry here.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ParserFactory = Callable[[str, str], argparse.ArgumentParser]
"""The CLI's `command(name, help)`: a new subparser named `name`, listed in `racefuzz --help` with `help`."""


@dataclass(frozen=True)
class Subcommand:
    """One subcommand: the module that holds it and the names of its two functions there."""

    module: str
    """The module's dotted name, imported only when the parser is built."""
    entry: str
    """Its entry function: `entry(args: argparse.Namespace) -> int`, the exit code."""
    add_parser: str = "add_parser"
    """Its `add_parser(command: ParserFactory) -> None`, which adds the subparser of this entry's name."""
    holds_signals: bool = False
    """Whether it runs with signals held (`racefuzz.watchdog.hold`) outside its search: its search stops at a
    checkpoint, and what it found is written and printed before the exit. A command without checkpoints
    leaves this False and is interrupted where it is."""

    def add_to(self, command: ParserFactory) -> None:
        """Add this subcommand's parser through `command` (imports its module)."""
        self._function(self.add_parser)(command)

    def run(self, args: argparse.Namespace) -> int:
        """Run the command on its parsed arguments; its exit code."""
        return self._function(self.entry)(args)

    def _function(self, name: str) -> Callable[..., Any]:
        # `__import__`, not `importlib.import_module`: the latter's own import of the module escapes
        # `python -X importtime`, by which the CLI's start-up is measured.
        return getattr(__import__(self.module, fromlist=[name]), name)


SUBCOMMANDS: dict[str, Subcommand] = {
    "run": Subcommand("racefuzz.commands.run", "run_command", holds_signals=True),
    "compare": Subcommand("racefuzz.commands.compare", "compare_command"),
    "designs": Subcommand("racefuzz.commands.designs", "designs_command"),
    "replay": Subcommand("racefuzz.commands.replay", "replay_command", holds_signals=True),
    "selfcheck": Subcommand("racefuzz.commands.selfcheck", "selfcheck_command"),
    "trace": Subcommand("racefuzz.commands.trace", "trace_command"),
    "prove": Subcommand("racefuzz.commands.prove", "prove_command"),
    "sglang": Subcommand("racefuzz.commands.sglang", "sglang_command"),
    "vllm": Subcommand("racefuzz.commands.vllm", "vllm_command"),
}
"""Every subcommand by name, in the order `racefuzz --help` lists them. Each module's `add_parser` must add
the subparser of its key's name (tests/unit/test_cli_registry.py checks it)."""
