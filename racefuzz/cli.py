"""The `racefuzz` command: builds its parser from `racefuzz.commands.SUBCOMMANDS` (one entry a subcommand,
each with its own parser in its module), parses the arguments and dispatches through the same table.

Exit codes (`racefuzz.exitcodes.ExitCode`, listed by `racefuzz --help`): 0 no race found (and the negative
control was caught), 1 a race was found (the report is on disk before it is printed), 2 usage or
configuration error, 3 inconclusive (the negative control was not caught), 4 error in user code (a design
hook), 5 internal error, 6 an example timed out, 130 interrupted (Ctrl-C or SIGTERM). Errors are one line on
stderr; `-v` adds the traceback. Arguments and the design are checked before anything heavy is imported
(`racefuzz run` on a CPU machine imports neither torch nor CuPy).

Only the console entry point (`racefuzz.__main__`, which takes SIGINT and SIGTERM before it imports this
module) and `python -m racefuzz.cli` import this module; the subcommands take their exit codes from
`racefuzz.exitcodes`.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Sequence

from racefuzz import __version__
from racefuzz.commands import SUBCOMMANDS
from racefuzz.errors import RacefuzzError, UserCodeError
from racefuzz.exitcodes import MEANINGS, ExitCode


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own errors: one line, exit 2
        self.exit(ExitCode.USAGE, f"racefuzz: error: {message}\n")


def _exit_code_table() -> str:
    return "exit codes:\n" + "\n".join(f"  {int(code):>3}  {meaning}" for code, meaning in MEANINGS.items())


def build_parser() -> argparse.ArgumentParser:
    """The whole parser: each subcommand of `SUBCOMMANDS`, in its order, adds its own (importing its module)."""
    verbose = argparse.ArgumentParser(add_help=False)
    verbose.add_argument("-v", "--verbose", action="store_true", help="print the traceback of an error")
    parser = _Parser(
        prog="racefuzz",
        description="Fuzz CUDA stream-ordering races (WAR on req_to_token).",
        epilog=_exit_code_table(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[verbose],
    )
    parser.add_argument("--version", action="version", version=f"racefuzz {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return commands.add_parser(
            name,
            help=help,
            parents=[verbose],
            epilog=_exit_code_table(),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )

    for subcommand in SUBCOMMANDS.values():
        subcommand.add_to(command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The `racefuzz` command (see the module docstring); returns the exit code.

    SIGINT and SIGTERM go to `racefuzz.watchdog`'s handler for the whole call (the entry point,
    `racefuzz.__main__`, installs it earlier still): held during start-up, and a signal received at any point
    ends the command with 130 and one line, after a counterexample found was written and printed."""
    from racefuzz import watchdog

    with watchdog.handle_signals(), watchdog.hold():
        code = _main(argv)
        watchdog.pause_point("exiting")
        if watchdog.signal_received() and code != ExitCode.INTERRUPTED:
            print(watchdog.interrupted_line(), file=sys.stderr)  # the command finished before it saw the signal
            code = ExitCode.INTERRUPTED
        return code


def _main(argv: Sequence[str] | None) -> int:
    from racefuzz import watchdog

    try:
        args = build_parser().parse_args(argv)  # imports numpy and Hypothesis: a signal here is held
    except KeyboardInterrupt:  # the third, which is not held
        print(watchdog.interrupted_line(), file=sys.stderr)
        return ExitCode.INTERRUPTED
    except Exception as exc:  # a bug in racefuzz while building the parser: one line, as below
        print(f"racefuzz: internal error: {type(exc).__name__}: {exc}; a bug in racefuzz", file=sys.stderr)
        return ExitCode.INTERNAL
    if watchdog.signal_received():
        print(watchdog.interrupted_line(), file=sys.stderr)
        return ExitCode.INTERRUPTED
    try:
        subcommand = SUBCOMMANDS[args.command]
        if subcommand.holds_signals:  # its search stops at a checkpoint: held, as during start-up
            return subcommand.run(args)
        with watchdog.released():
            return subcommand.run(args)
    except RacefuzzError as exc:
        kind = "error in user code" if isinstance(exc, UserCodeError) else "error"
        details = exc.details if isinstance(exc, UserCodeError) else ""
        hint = " (-v prints the traceback)" if details and not args.verbose else ""
        print(f"racefuzz: {kind}: {exc}{hint}", file=sys.stderr)
        if details and args.verbose:
            print(details, file=sys.stderr, end="")
        return exc.exit_code
    except KeyboardInterrupt:
        print(watchdog.interrupted_line(), file=sys.stderr)
        return ExitCode.INTERRUPTED
    except Exception as exc:  # a bug in racefuzz: say so in one line, the traceback with -v
        message = " | ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        hint = "" if args.verbose else "; a bug in racefuzz, -v prints the traceback to report"
        print(f"racefuzz: internal error: {type(exc).__name__}: {message}{hint}", file=sys.stderr)
        if args.verbose:
            traceback.print_exc()
        return ExitCode.INTERNAL


if __name__ == "__main__":
    sys.exit(main())
