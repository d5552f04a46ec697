"""The `racefuzz` command: parses the arguments and dispatches to `racefuzz.commands.*`.

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
from pathlib import Path

from racefuzz import __version__
from racefuzz.commands import argtypes
from racefuzz.errors import RacefuzzError, UserCodeError
from racefuzz.exitcodes import MEANINGS, ExitCode
from racefuzz.outputs import DEFAULT_REPORT_DIR

DEFAULT_EXAMPLE_TIMEOUT_S = argtypes.DEFAULT_EXAMPLE_TIMEOUT_S


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own errors: one line, exit 2
        self.exit(ExitCode.USAGE, f"racefuzz: error: {message}\n")


_examples = argtypes.examples
_repeat = argtypes.repeat
_seed = argtypes.seed
_max_delays = argtypes.max_delays
_microseconds = argtypes.microseconds
_timeout = argtypes.timeout
MAX_EXAMPLES = argtypes.MAX_EXAMPLES


def _hazard_list(text: str) -> tuple[str, ...]:
    """Comma-separated hazard names; which exist is the scenario's, checked once the design is loaded
    (`racefuzz.scenarios.check_hazards`), since `--scenario` may come after `--hazards`."""
    names = tuple(h.strip() for h in text.split(",") if h.strip())
    if not names:
        raise argparse.ArgumentTypeError(f"unknown hazard(s) [{text!r}]: name at least one")
    return names


def _exit_code_table() -> str:
    return "exit codes:\n" + "\n".join(f"  {int(code):>3}  {meaning}" for code, meaning in MEANINGS.items())


def build_parser() -> argparse.ArgumentParser:
    from racefuzz.backends import BACKENDS
    from racefuzz.scenarios import get_scenario
    from racefuzz.schedulers import STRATEGIES

    scenario = get_scenario()
    hazards, opt_in = scenario.hazards, scenario.opt_in_hazards
    hazards_help = (
        f"comma-separated hazards of the scenario (default: all but the opt-in ones); for {scenario.name}: "
        f"{','.join(hazards)}; opt-in, only when named: {','.join(opt_in)}"
    )
    scenario_help = (
        "built-in scenario name (e.g. vllm-kv-reuse) or module:attr (default: the design's, else sglang-overlap)"
    )
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

    run = command("run", "search one design for races (with a negative control)")
    run.add_argument("--backend", choices=BACKENDS, default="auto", help="auto: cuda if a GPU is usable, else sim")
    run.add_argument("--scenario", default=None, help=scenario_help)
    run.add_argument(
        "--design",
        default=None,
        help="built-in name, package.module:attr or path/to/file.py:attr (default: the scenario's default design, "
        "global-war for sglang-overlap)",
    )
    plan = run.add_mutually_exclusive_group()
    plan.add_argument(
        "--plan-stream",
        dest="plan_stream",
        action="store_true",
        default=None,
        help="always run DFLASH decode prep on the plan stream",
    )
    plan.add_argument("--no-plan-stream", dest="plan_stream", action="store_false", help="never use the plan stream")
    run.add_argument("--hazards", type=_hazard_list, default=None, help=hazards_help)
    run.add_argument(
        "--examples", type=_examples, default=2000, help=f"examples to try, 1 to {MAX_EXAMPLES:,} (default 2000)"
    )
    run.add_argument("--seed", type=_seed, default=0, help="Hypothesis seed, 0 to 2**32-1 (default 0)")
    run.add_argument("--max-delays", type=_max_delays, default=4, help="delays per schedule, 0 to 64 (default 4)")
    run.add_argument(
        "--strategy",
        choices=STRATEGIES,
        default="random",
        help="schedule strategy: random (default), pct (PCT-style stream priorities), orders (forced orders of "
        "racing pairs, gates, no spin), interleave (forced orders of any unordered launches), none",
    )
    run.add_argument(
        "--repeat",
        type=_repeat,
        default=None,
        help="runs a manifested race must reproduce in, 1 to 1000 (k of k; default 5 on cuda, 1 on sim)",
    )
    run.add_argument("--json", type=argtypes.path, help="write a JSON summary here (checked before the search)")
    run.add_argument(
        "--report-dir",
        type=argtypes.path,
        default=Path(DEFAULT_REPORT_DIR),
        help=f"where replay files, reports and timelines go (default {DEFAULT_REPORT_DIR}/ in the current "
        "directory; checked before the search)",
    )
    run.add_argument(
        "--example-timeout",
        type=_timeout,
        default=DEFAULT_EXAMPLE_TIMEOUT_S,
        metavar="SECONDS",
        help=f"stop with exit code {int(ExitCode.TIMEOUT)} when one example (a design hook, a run) takes longer "
        f"(default {DEFAULT_EXAMPLE_TIMEOUT_S:g}); a hung hook or GPU kernel is abandoned",
    )
    run.add_argument("--strict", action="store_true", help="design lint findings are errors (exit 4), not warnings")
    run.add_argument(
        "--database",
        default=None,
        metavar="DIR|none|module:attr",
        help="where failures are saved and tried first on the next run: a directory, none, or a Hypothesis "
        "ExampleDatabase object (default $RACEFUZZ_DATABASE, else .hypothesis/examples)",
    )
    run.add_argument(
        "--no-control", action="store_true", help="skip the negative control (the result can then not prove 'no race')"
    )
    run.add_argument("--quiet", action="store_true", help="no progress bar")

    compare = command("compare", "correctness and cost of sync designs side by side")
    compare.add_argument("--scenario", default=None, help=scenario_help)
    compare.add_argument(
        "--designs",
        default=None,
        help="comma-separated designs, at least two (default self-event,global-war for sglang-overlap, every "
        "built-in design of another --scenario)",
    )
    compare.add_argument("--backend", choices=BACKENDS, default="auto", help="auto: cuda if a GPU is usable")
    cplan = compare.add_mutually_exclusive_group()
    cplan.add_argument("--plan-stream", dest="plan_stream", action="store_true", default=None)
    cplan.add_argument("--no-plan-stream", dest="plan_stream", action="store_false")
    compare.add_argument("--hazards", type=_hazard_list, default=None, help=hazards_help)
    compare.add_argument(
        "--workloads",
        type=argtypes.bounded_int(1, 100_000, "a positive integer"),
        default=100,
        help="drawn workloads, 1 to 100,000 (default 100)",
    )
    compare.add_argument("--seed", type=_seed, default=0)
    compare.add_argument(
        "--forward-us",
        type=_microseconds,
        default=3000.0,
        help="forward compute per iteration in us (default 3000, a decode step)",
    )
    compare.add_argument(
        "--host-us",
        type=_microseconds,
        default=600.0,
        help="host scheduling work per iteration before decode prep, in us (default 600)",
    )
    compare.add_argument(
        "--prep-us",
        type=_microseconds,
        default=300.0,
        help="host work between decode prep and the forward launch, in us (default 300)",
    )
    compare.add_argument("--json", type=argtypes.path, help="write the results here")
    compare.add_argument("--plot", type=argtypes.path, help="write a PNG: cost bars and one timeline per design")

    designs = command("designs", "list the built-in designs")
    designs.add_argument("--scenario", default=None, help="whose designs (default sglang-overlap)")
    designs.add_argument("--mutants", action="store_true", help="list the deliberately broken designs instead")

    replay = command("replay", "re-run a replay file and print its report")
    replay.add_argument("file", type=argtypes.path)
    replay.add_argument("--backend", choices=("sim", "cuda"), help="default: the backend recorded in the file")
    replay.add_argument("--repeat", type=_repeat, default=1, help="runs, 1 to 1000 (default 1; 5 is sensible on GPU)")
    replay.add_argument(
        "--example-timeout",
        type=_timeout,
        default=DEFAULT_EXAMPLE_TIMEOUT_S,
        metavar="SECONDS",
        help=f"as for run (default {DEFAULT_EXAMPLE_TIMEOUT_S:g})",
    )

    command("selfcheck", "what the CUDA backend measures on this machine (spin accuracy, the cost of one example)")
    from racefuzz.commands.trace import add_parser as add_trace_parser

    add_trace_parser(command)
    from racefuzz.commands.prove import add_parser as add_prove_parser

    add_prove_parser(command)
    from racefuzz.commands.sglang import add_parser as add_sglang_parser

    add_sglang_parser(command)
    from racefuzz.commands.vllm import add_parser as add_vllm_parser

    add_vllm_parser(command)
    return parser


HOLDING_COMMANDS = ("run", "replay")
"""Commands that run with signals held (`racefuzz.watchdog.hold`) outside their search: their search stops at
a checkpoint, and what it found is written and printed before the exit. The others, which have no
checkpoints, are interrupted where they are."""


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
        if args.command in HOLDING_COMMANDS:
            return _dispatch(args)
        with watchdog.released():
            return _dispatch(args)
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


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "run":
        from racefuzz.commands.run import run_command

        return run_command(args)
    if args.command == "compare":
        from racefuzz.commands.compare import compare_command

        return compare_command(args)
    if args.command == "designs":
        from racefuzz.designs import describe
        from racefuzz.scenarios import get_scenario

        scenario = get_scenario(args.scenario)
        listed = scenario.mutants() if args.mutants else scenario.designs()
        width = max(map(len, listed))
        for name, design in listed.items():
            print(f"{name:{width}}  {describe(design)}")
        return ExitCode.CLEAN
    if args.command == "replay":
        from racefuzz.commands.replay import replay_command

        return replay_command(args)
    if args.command == "trace":
        from racefuzz.commands.trace import trace_command

        return trace_command(args)
    if args.command == "prove":
        from racefuzz.commands.prove import prove_command

        return prove_command(args)
    if args.command == "sglang":
        from racefuzz.commands.sglang import sglang_command

        return sglang_command(args)
    if args.command == "vllm":
        from racefuzz.commands.vllm import vllm_command

        return vllm_command(args)
    if args.command == "selfcheck":
        from racefuzz.selfcheck import main as selfcheck

        return selfcheck()
    raise AssertionError(f"unhandled command {args.command}")


if __name__ == "__main__":
    sys.exit(main())
