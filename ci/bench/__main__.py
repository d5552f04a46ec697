"""`python -m ci.bench NAME [options]`, from the repository root: run one benchmark, print its table.

Each benchmark is a module of this package with `run(...)` (the raw figures, JSON-able) and `render(figures)`
(the table); it writes a file only where asked (`--json PATH`; for `matrix`, `--out DIR` for its
counterexamples). `docs/results/README.md` names the folder each benchmark's committed raw output lives in
and the command that wrote it. Each benchmark has its own options; bad input is one line on stderr and
exit 2, as for `racefuzz`.

`proof` hands its arguments to `ci.bench.proof` (`racefuzz trace` on sglang's own kernels, recording costs);
`selfcheck` runs `racefuzz selfcheck` (the CUDA backend's figures on this machine).
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from racefuzz.commands import argtypes
from racefuzz.errors import InvalidArgument, RacefuzzError
from racefuzz.exitcodes import ExitCode

PROG = "python -m ci.bench"

MAX_PROCESSES = 64
"""`gpu --processes`' bound (`ci.bench.gpu.MAX_PROCESSES`, not imported here: that imports the search)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own errors: one line, exit 2
        self.exit(ExitCode.USAGE, f"{self.prog}: error: {message}\n")


def _json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=argtypes.path, help="write the raw figures here")


def _mutants(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], Any]:
    from racefuzz.schedulers import STRATEGIES

    parser.add_argument("--backend", choices=("sim", "cuda"), default="sim", help="default sim")
    _json_option(parser)
    parser.add_argument("--quick", action="store_true", help="fewer seeds and examples (a smoke run, ~1 minute)")
    parser.add_argument(
        "--strategy",
        choices=STRATEGIES,
        default="random",
        help="the main search's schedule strategy (default random; `orders`: forced orders alone)",
    )
    parser.add_argument(
        "--rates",
        nargs=3,
        metavar=("SEEDS", "BUDGET", "OUT"),
        help="instead: per-mutant detection rates over SEEDS seeds of BUDGET examples, written to OUT "
        "(the figures tests/quality reads)",
    )

    def run(args: argparse.Namespace) -> Any:
        from ci.bench import mutants

        if args.rates is not None:
            seeds, budget, out = _rates_arguments(args.rates)
            if args.json is not None or args.quick or args.backend != "sim" or args.strategy != "random":
                raise InvalidArgument("--rates takes no other option")
            rates = mutants.detection_rates(seeds, budget)
            _write(out, json.dumps(rates, indent=1) + "\n")
            return rates, lambda _: f"detection rates of {len(rates)} mutants written to {out}"
        from racefuzz.backends import resolve_backend

        figures = mutants.run(backend=resolve_backend(args.backend), quick=args.quick, strategy=args.strategy)
        return figures, mutants.render

    return run


def _rates_arguments(values: list[str]) -> tuple[int, int, Path]:
    from racefuzz.outputs import check_output_file

    seeds_text, budget_text, out = values
    try:
        seeds, budget = int(seeds_text), int(budget_text)
    except ValueError:
        raise InvalidArgument(f"--rates SEEDS BUDGET OUT: SEEDS and BUDGET are integers, got {values[:2]}") from None
    if seeds < 1 or budget < 1:
        raise InvalidArgument(f"--rates SEEDS BUDGET OUT: SEEDS and BUDGET are positive, got {seeds} and {budget}")
    return seeds, budget, check_output_file(out, "--rates OUT")


def _plain(module: str) -> Callable[[argparse.ArgumentParser], Callable[[argparse.Namespace], Any]]:
    """A benchmark whose only option is `--json`."""

    def add(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], Any]:
        _json_option(parser)

        def run(args: argparse.Namespace) -> Any:
            benchmark = _module(module)
            return benchmark.run(), benchmark.render

        return run

    return add


def _scenario(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], Any]:
    _json_option(parser)
    parser.add_argument(
        "--host-cost", action="store_true", help="instead: the search's host cost outside the backend (see its doc)"
    )
    parser.add_argument(
        "--examples", type=argtypes.bounded_int(1, argtypes.MAX_EXAMPLES, "a positive integer"), default=None
    )

    def run(args: argparse.Namespace) -> Any:
        from ci.bench import scenario

        if args.host_cost:
            return scenario.host_cost(args.examples or scenario.HOST_COST_EXAMPLES), scenario.render_host_cost
        return scenario.run(args.examples or scenario.EXAMPLES), scenario.render

    return run


def _matrix(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], Any]:
    _json_option(parser)
    parser.add_argument(
        "--out",
        type=argtypes.path,
        help="write each racy cell's replay file and report under DIR/counterexamples/ (default: none; the "
        "committed ones are regenerated with --out docs/results/design-matrix)",
    )

    def run(args: argparse.Namespace) -> Any:
        from racefuzz.outputs import check_output_dir

        if args.out is not None:
            check_output_dir(args.out, "--out")
        matrix = _module("matrix")
        return matrix.run(out=args.out), matrix.render

    return run


def _gpu(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], Any]:
    _json_option(parser)
    parser.add_argument(
        "--processes",
        type=argtypes.bounded_int(1, MAX_PROCESSES, "a positive integer"),
        default=1,
        metavar="N",
        help=f"N search processes share the GPU, 1 to {MAX_PROCESSES} (default 1); the figures are then "
        "examples/s per GPU with N processes",
    )

    def run(args: argparse.Namespace) -> Any:
        gpu = _module("gpu")
        return gpu.run(processes=args.processes), gpu.render

    return run


def _sglang_loop(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], Any]:
    _json_option(parser)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="default cpu")
    parser.add_argument(
        "--examples", type=argtypes.bounded_int(1, argtypes.MAX_EXAMPLES, "a positive integer"), default=None
    )
    parser.add_argument(
        "--version",
        dest="versions",
        action="append",
        default=[],
        metavar="X",
        help="repeatable (default 0.5.15, 0.5.16, 0.5.23; each fetched: racefuzz sglang fetch)",
    )

    def run(args: argparse.Namespace) -> Any:
        from ci.bench import sglang_loop

        versions = tuple(args.versions) or sglang_loop.DEFAULT_VERSIONS
        figures = sglang_loop.run(versions, args.examples or sglang_loop.EXAMPLES, args.device)
        return figures, sglang_loop.render

    return run


def _sglang_sync_cost(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], Any]:
    _json_option(parser)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="default cpu")
    parser.add_argument(
        "--version",
        dest="versions",
        action="append",
        default=[],
        metavar="X",
        help="repeatable (default 0.5.14, 0.5.15)",
    )
    parser.add_argument(
        "--forward-us",
        dest="forward_us",
        action="append",
        type=argtypes.finite_float(0.0, 1e6, "microseconds"),
        default=[],
        metavar="U",
        help="the fake forward's GPU spin, repeatable (default cuda 0, 2000, 8000; cpu 0)",
    )
    parser.add_argument("--repeats", type=argtypes.bounded_int(2, 100, "an integer, 2 to 100"), default=None)
    parser.add_argument("--plan-stream", action="store_true", help="DFLASH's prepare_for_decode on the plan stream")

    def run(args: argparse.Namespace) -> Any:
        from ci.bench import sglang_sync_cost

        versions = tuple(args.versions) or sglang_sync_cost.DEFAULT_VERSIONS
        forward_us = tuple(args.forward_us) or None
        figures = sglang_sync_cost.run(versions, args.device, forward_us, args.repeats, args.plan_stream)
        return figures, sglang_sync_cost.render

    return run


def _selfcheck(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], Any]:
    def run(args: argparse.Namespace) -> Any:
        from racefuzz.selfcheck import main

        return main()

    return run


def _proof(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], Any]:
    parser.add_argument("arguments", nargs=argparse.REMAINDER, help="proof|csan|cost|micro and their options")

    def run(args: argparse.Namespace) -> Any:
        from ci.bench import proof

        return proof.main(args.arguments)

    return run


BENCHMARKS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], Callable[[argparse.Namespace], Any]]]] = {
    "mutants": ("kill rate of every mutant, and the baselines' (stress loop, PCT, CSAN)", _mutants),
    "engine": ("happens-before checker and simulator, ops/s (simulator)", _plain("engine")),
    "scenario": ("the simulator search, examples/s (one core)", _scenario),
    "matrix": ("each built-in design against each hazard alone (simulator)", _matrix),
    "gpu": ("the CUDA backend's search, examples/s and overhead over a plain replay", _gpu),
    "trace": ("racefuzz trace's recording cost per op", _plain("trace")),
    "sglang_loop": ("sglang's own scheduler loop under racefuzz sglang: examples/s, time to a race", _sglang_loop),
    "sglang_sync_cost": (
        "sglang 0.5.14's DFLASH self-event against 0.5.15's WAR barrier, plain runs",
        _sglang_sync_cost,
    ),
    "selfcheck": ("what the CUDA backend measures on this machine (racefuzz selfcheck)", _selfcheck),
    "proof": ("racefuzz trace on sglang's own kernels, and recording costs (ci.bench.proof)", _proof),
}
"""Name -> (what it measures, a function that adds its options and returns how to run it: a function of the
parsed arguments that returns the raw figures and their renderer, or, for `RAW`, an exit code)."""

RAW = ("selfcheck", "proof")
"""The benchmarks that print their own output and return an exit code (no table, no --json)."""


def _module(name: str) -> Any:
    import importlib

    return importlib.import_module(f"ci.bench.{name}")


def _write(path: Path, text: str) -> None:
    from racefuzz.outputs import write_text

    write_text(path, text)


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, Callable[[argparse.Namespace], Any]]]:
    help_v = "print the traceback of an internal error"
    parser = _Parser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true", help=help_v)
    # After the name too; SUPPRESS keeps a subcommand's default from overwriting a -v given before it.
    verbose = argparse.ArgumentParser(add_help=False)
    verbose.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=help_v)
    commands = parser.add_subparsers(dest="benchmark", required=True, parser_class=_Parser, metavar="NAME")
    runners = {}
    for name, (help, add) in BENCHMARKS.items():
        runners[name] = add(commands.add_parser(name, help=help, description=help, parents=[verbose]))
    return parser, runners


def main(argv: Sequence[str] | None = None) -> int:
    parser, runners = build_parser()
    args = parser.parse_args(argv)
    try:
        if getattr(args, "json", None) is not None:
            from racefuzz.outputs import check_output_file

            check_output_file(args.json, "--json")
        outcome = runners[args.benchmark](args)
        if args.benchmark in RAW:
            return int(outcome)
        figures, render = outcome
        print(render(figures))
        if args.json is not None:
            _write(args.json, json.dumps(figures, indent=2) + "\n")
        return ExitCode.CLEAN
    except RacefuzzError as exc:
        print(f"{PROG} {args.benchmark}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"{PROG} {args.benchmark}: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except Exception as exc:  # a bug in a benchmark or in racefuzz: one line, the traceback with -v
        if args.verbose:
            traceback.print_exc()
        message = " | ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        print(f"{PROG} {args.benchmark}: internal error: {type(exc).__name__}: {message}", file=sys.stderr)
        return ExitCode.INTERNAL


if __name__ == "__main__":
    sys.exit(main())
