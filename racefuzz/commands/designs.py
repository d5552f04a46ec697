"""`racefuzz designs`: list a scenario's built-in designs (or its deliberately broken ones), one a line."""

from __future__ import annotations

import argparse

from racefuzz.commands import ParserFactory
from racefuzz.designs import describe
from racefuzz.exitcodes import ExitCode
from racefuzz.scenarios import get_scenario


def add_parser(command: ParserFactory) -> None:
    """Add the `designs` subcommand through the CLI's subcommand factory."""
    designs = command("designs", "list the built-in designs")
    designs.add_argument("--scenario", default=None, help="whose designs (default sglang-overlap)")
    designs.add_argument("--mutants", action="store_true", help="list the deliberately broken designs instead")


def designs_command(args: argparse.Namespace) -> ExitCode:
    scenario = get_scenario(args.scenario)
    listed = scenario.mutants() if args.mutants else scenario.designs()
    width = max(map(len, listed))
    for name, design in listed.items():
        print(f"{name:{width}}  {describe(design)}")
    return ExitCode.CLEAN
