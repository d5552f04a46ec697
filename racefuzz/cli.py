"""The `racefuzz` command: parses the arguments and dispatches to `racefuzz.commands.*`.

Exit codes (`racefuzz.exitcodes.ExitCode`): 0 no race found (and the negative control was caught), 1 a race
was found (the report is on disk before it is printed), 2 usage or configuration error (one line on
stderr), 3 inconclusive: the negative control was not caught, so "no race" would mean nothing.

Only the console entry point (`racefuzz = "racefuzz.cli:main"`) and `python -m racefuzz.cli` import this
module; the subcommands take their exit codes from `racefuzz.exitcodes`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from racefuzz import __version__
from racefuzz.errors import InvalidArgument, RacefuzzError
from racefuzz.exitcodes import ExitCode

# Aliases for callers that still import them from here (some tests); new code uses `ExitCode`.
BENCHMARKS = ("mutants", "engine", "scenario", "matrix", "gpu")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own errors: one line, exit 2
        self.exit(ExitCode.USAGE, f"racefuzz: error: {message}\n")


def _int_at_least(minimum: int, what: str):
    """An argparse type: an integer >= `minimum`, else a one-line error naming `what` was expected."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
        return value

    return parse


_positive_int = _int_at_least(1, "a positive integer")
_non_negative_int = _int_at_least(0, "a non-negative integer")


def _hazard_list(text: str) -> tuple[str, ...]:
    from racefuzz.scenarios import get_scenario

    scenario = get_scenario()  # the default scenario, sglang's overlap loop
    all_hazards = (*scenario.hazards, *scenario.opt_in_hazards)
    names = tuple(h.strip() for h in text.split(",") if h.strip())
    unknown = [h for h in names if h not in all_hazards]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown hazard(s) {unknown or [text]}; choose from {', '.join(all_hazards)}")
    return names


def build_parser() -> argparse.ArgumentParser:
    from racefuzz.backends import BACKENDS
    from racefuzz.report import DEFAULT_REPORT_DIR
    from racefuzz.scenarios import get_scenario
    from racefuzz.schedulers import STRATEGIES

    hazards = get_scenario().hazards
    parser = _Parser(prog="racefuzz", description="Fuzz CUDA stream-ordering races (WAR on req_to_token).")
    parser.add_argument("--version", action="version", version=f"racefuzz {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = commands.add_parser("run", help="search one design for races (with a negative control)")
    run.add_argument("--backend", choices=BACKENDS, default="auto", help="auto: cuda if a GPU is usable, else sim")
    run.add_argument("--design", default="global-war", help="built-in name or module:attr (default: global-war)")
    plan = run.add_mutually_exclusive_group()
    plan.add_argument(
        "--plan-stream",
        dest="plan_stream",
        action="store_true",
        default=None,
        help="always run DFLASH decode prep on the plan stream",
    )
    plan.add_argument("--no-plan-stream", dest="plan_stream", action="store_false", help="never use the plan stream")
    run.add_argument(
        "--hazards",
        type=_hazard_list,
        default=hazards,
        help=f"comma-separated subset of {','.join(hazards)} (default: all)",
    )
    run.add_argument("--examples", type=_positive_int, default=2000, help="examples to try (default 2000)")
    run.add_argument("--seed", type=_non_negative_int, default=0, help="Hypothesis seed (default 0)")
    run.add_argument("--max-delays", type=_non_negative_int, default=4, help="delays per schedule (default 4)")
    run.add_argument(
        "--strategy",
        choices=STRATEGIES,
        default="random",
        help="delay strategy: random (default), pct (PCT-style stream priorities), none",
    )
    run.add_argument(
        "--repeat",
        type=_positive_int,
        default=None,
        help="runs a manifested race must reproduce in (k of k; default 5 on cuda, 1 on sim)",
    )
    run.add_argument("--json", type=Path, help="write a JSON summary here")
    run.add_argument(
        "--report-dir",
        type=Path,
        default=Path(DEFAULT_REPORT_DIR),
        help=f"where replay files and reports go (default {DEFAULT_REPORT_DIR}/)",
    )
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

    compare = commands.add_parser("compare", help="correctness and cost of sync designs side by side")
    compare.add_argument(
        "--designs",
        default="self-event,global-war",
        help="comma-separated designs, at least two (default self-event,global-war)",
    )
    compare.add_argument("--backend", choices=BACKENDS, default="auto", help="auto: cuda if a GPU is usable")
    cplan = compare.add_mutually_exclusive_group()
    cplan.add_argument("--plan-stream", dest="plan_stream", action="store_true", default=None)
    cplan.add_argument("--no-plan-stream", dest="plan_stream", action="store_false")
    compare.add_argument("--hazards", type=_hazard_list, default=hazards)
    compare.add_argument("--workloads", type=_positive_int, default=100, help="drawn workloads (default 100)")
    compare.add_argument("--seed", type=_non_negative_int, default=0)
    compare.add_argument(
        "--forward-us",
        type=float,
        default=3000.0,
        help="forward compute per iteration in us (default 3000, a decode step)",
    )
    compare.add_argument(
        "--host-us",
        type=float,
        default=600.0,
        help="host scheduling work per iteration before decode prep, in us (default 600)",
    )
    compare.add_argument(
        "--prep-us",
        type=float,
        default=300.0,
        help="host work between decode prep and the forward launch, in us (default 300)",
    )
    compare.add_argument("--json", type=Path, help="write the results here")
    compare.add_argument("--plot", type=Path, help="write a PNG: cost bars and one timeline per design")

    designs = commands.add_parser("designs", help="list the built-in designs")
    designs.add_argument("--mutants", action="store_true", help="list the deliberately broken designs instead")

    replay = commands.add_parser("replay", help="re-run a replay file and print its report")
    replay.add_argument("file", type=Path)
    replay.add_argument("--backend", choices=("sim", "cuda"), help="default: the backend recorded in the file")
    replay.add_argument("--repeat", type=_positive_int, default=1, help="runs (default 1; 5 is sensible on GPU)")
    replay.add_argument("--report-dir", type=Path, default=Path(DEFAULT_REPORT_DIR))

    bench = commands.add_parser("bench", help="benchmarks: print a table; --json (and for matrix --out) write files")
    bench.add_argument(
        "which",
        nargs="?",
        default="mutants",
        choices=BENCHMARKS,
        help="mutants (default): kill rate and baselines; engine, scenario, matrix: simulator; gpu: the CUDA backend",
    )
    bench.add_argument("--backend", choices=("sim", "cuda"), default="sim", help="for `mutants` (default sim)")
    bench.add_argument("--json", type=Path, help="write the raw figures here")
    bench.add_argument(
        "--out",
        type=Path,
        help="for `matrix`: write each racy cell's replay file and report under DIR/counterexamples/ "
        "(default: write none; the committed ones are regenerated with --out docs/results)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "run":
            from racefuzz.commands.run import run_command

            return run_command(args)
        if args.command == "compare":
            from racefuzz.commands.compare import compare_command

            return compare_command(args)
        if args.command == "designs":
            from racefuzz.designs import describe
            from racefuzz.scenarios import get_scenario

            scenario = get_scenario()
            listed = scenario.mutants() if args.mutants else scenario.designs()
            width = max(map(len, listed))
            for name, design in listed.items():
                print(f"{name:{width}}  {describe(design)}")
            return ExitCode.CLEAN
        if args.command == "replay":
            from racefuzz.commands.replay import replay_command

            return replay_command(args)
        if args.command == "bench":
            return _bench(args)
    except RacefuzzError as exc:
        print(f"racefuzz: error: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    except KeyboardInterrupt:
        print("racefuzz: interrupted", file=sys.stderr)
        return 130
    raise AssertionError(f"unhandled command {args.command}")


def _bench(args: argparse.Namespace) -> int:
    import importlib

    from racefuzz.backends import resolve_backend

    if args.backend != "sim" and args.which != "mutants":
        raise InvalidArgument(f"--backend applies to `racefuzz bench mutants` only, not to {args.which}")
    if args.out is not None and args.which != "matrix":
        raise InvalidArgument(f"--out applies to `racefuzz bench matrix` only, not to {args.which}")
    bench = importlib.import_module(f"racefuzz.bench.{args.which}")
    if args.which == "mutants":
        results = bench.run(backend=resolve_backend(args.backend))
    elif args.which == "matrix":
        results = bench.run(out=args.out)
    else:
        results = bench.run()
    print(bench.render(results))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return ExitCode.CLEAN


if __name__ == "__main__":
    sys.exit(main())
