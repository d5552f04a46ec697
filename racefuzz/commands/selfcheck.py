"""`racefuzz selfcheck`: what the CUDA backend measures on this machine (`racefuzz.selfcheck`, imported only
when the command runs: it imports the CUDA backend's modules and the litmus programs, which no other
command's parser needs)."""

from __future__ import annotations

import argparse

from racefuzz.commands import ParserFactory


def add_parser(command: ParserFactory) -> None:
    """Add the `selfcheck` subcommand (it takes no options) through the CLI's subcommand factory."""
    command("selfcheck", "what the CUDA backend measures on this machine (spin accuracy, the cost of one example)")


def selfcheck_command(args: argparse.Namespace) -> int:
    from racefuzz.selfcheck import main

    return main()
