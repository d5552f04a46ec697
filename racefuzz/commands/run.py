"""`racefuzz run`: search one design for races, beside the negative control.

In order, so that nothing found is lost and a mistake costs a second, not a search: the output paths are
checked, then the design is loaded and its programs for a few fixed workloads built and linted
(`racefuzz.lint.preflight`: a hook that raises fails here), then the backend is resolved and the example
database opened (its directory checked like the outputs), and only then does the search run, inside
`racefuzz.watchdog.stoppable` (Ctrl-C and `--example-timeout`). A race found is written before it is
printed; if its directory cannot be written after all, to a temporary directory.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from racefuzz import __version__
from racefuzz.backends import BACKENDS
from racefuzz.commands import ParserFactory, argtypes
from racefuzz.designs import Design, label, load_design, raise_hook_error
from racefuzz.errors import InvalidArgument, UserCodeError
from racefuzz.exitcodes import ExitCode
from racefuzz.outputs import DEFAULT_REPORT_DIR, check_output_dir, check_output_file, fallback_dir, write_text
from racefuzz.progress import progress
from racefuzz.scenarios import Scenario, check_hazards, get_scenario
from racefuzz.schedulers import STRATEGIES
from racefuzz.watchdog import (
    StopRequested,
    WatchedExecutor,
    checkpoint,
    hold,
    interrupted_line,
    pause_point,
    stop_requested,
    stoppable,
)

DEFAULT_DATABASE = ".hypothesis/examples"
"""Where `racefuzz run` keeps failures by default: Hypothesis' own default example database directory."""

SCENARIO_HELP = (
    "built-in scenario name (e.g. vllm-kv-reuse) or module:attr (default: the design's, else sglang-overlap)"
)
"""`--scenario`'s help, as `run` and `compare` give it."""


def hazards_help() -> str:
    """`--hazards`' help, as `run` and `compare` give it: the default scenario's hazards listed."""
    scenario = get_scenario()
    return (
        f"comma-separated hazards of the scenario (default: all but the opt-in ones); for {scenario.name}: "
        f"{','.join(scenario.hazards)}; opt-in, only when named: {','.join(scenario.opt_in_hazards)}"
    )


def add_parser(command: ParserFactory) -> None:
    """Add the `run` subcommand through the CLI's subcommand factory."""
    run = command("run", "search one design for races (with a negative control)")
    run.add_argument("--backend", choices=BACKENDS, default="auto", help="auto: cuda if a GPU is usable, else sim")
    run.add_argument("--scenario", default=None, help=SCENARIO_HELP)
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
    run.add_argument("--hazards", type=argtypes.hazard_list, default=None, help=hazards_help())
    run.add_argument(
        "--examples",
        type=argtypes.examples,
        default=2000,
        help=f"examples to try, 1 to {argtypes.MAX_EXAMPLES:,} (default 2000)",
    )
    run.add_argument("--seed", type=argtypes.seed, default=0, help="Hypothesis seed, 0 to 2**32-1 (default 0)")
    run.add_argument(
        "--max-delays", type=argtypes.max_delays, default=4, help="delays per schedule, 0 to 64 (default 4)"
    )
    run.add_argument(
        "--strategy",
        choices=STRATEGIES,
        default="random",
        help="schedule strategy: random (default), pct (PCT-style stream priorities), orders (forced orders of "
        "racing pairs, gates, no spin), interleave (forced orders of any unordered launches), none",
    )
    run.add_argument(
        "--repeat",
        type=argtypes.repeat,
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
        type=argtypes.timeout,
        default=argtypes.DEFAULT_EXAMPLE_TIMEOUT_S,
        metavar="SECONDS",
        help=f"stop with exit code {int(ExitCode.TIMEOUT)} when one example (a design hook, a run) takes longer "
        f"(default {argtypes.DEFAULT_EXAMPLE_TIMEOUT_S:g}); a hung hook or GPU kernel is abandoned",
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


def example_database(spec: str | None):
    """The example database `--database` names: a directory, `none`, or `module:attr` of an ExampleDatabase
    (for a fleet: Hypothesis' `RedisExampleDatabase`, `GitHubArtifactDatabase`, `MultiplexedDatabase`).
    Without the option: $RACEFUZZ_DATABASE, else DEFAULT_DATABASE."""
    import importlib
    import os

    from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase

    spec = spec if spec is not None else os.environ.get("RACEFUZZ_DATABASE", DEFAULT_DATABASE)
    if not spec.strip():  # not the working directory: Hypothesis' folders would land beside the user's files
        raise InvalidArgument("--database: an empty value names no directory (a directory, none, or module:attr)")
    if spec.lower() == "none":
        return None
    if ":" in spec and not os.path.exists(spec):
        module_name, _, attr = spec.partition(":")
        try:
            obj = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError, ValueError) as exc:  # ValueError: an empty module name (":x")
            raise InvalidArgument(f"--database {spec}: {exc}") from None
        if not isinstance(obj, ExampleDatabase):
            raise InvalidArgument(f"--database {spec}: not a hypothesis.database.ExampleDatabase")
        return obj
    check_output_dir(spec, "--database")
    return DirectoryBasedExampleDatabase(spec)


def run_search(design: Design, args: argparse.Namespace, backend: str, run, *, shrink: bool = True):
    from racefuzz.search import search

    # `--plan-stream` is sglang's workload option: passed only when given (another scenario rejects it).
    options = {} if args.plan_stream is None else {"plan_stream": args.plan_stream}
    with progress(args.examples, design.name, quiet=args.quiet) as on_example:
        return search(
            design,
            run,
            backend=backend,
            examples=args.examples,
            seed=args.seed,
            hazards=args.hazards,
            max_delays=args.max_delays,
            shrink=shrink,
            repeat=args.repeat,
            strategy=args.strategy,
            on_example=on_example,
            database=args.example_database,
            **options,
        )


def summary(result) -> dict[str, object]:
    c = result.counterexample
    return {
        "design": result.design.name,
        "backend": result.backend,
        "examples": result.examples,
        "seconds": round(result.seconds, 3),
        "found": result.found,
        "oracle": c.oracle if c else None,
        "examples_to_detect": result.first_detection_example,
        "seconds_to_detect": None
        if result.first_detection_seconds is None
        else round(result.first_detection_seconds, 3),
        "shrunk": None
        if c is None
        else {
            "requests": len(c.workload.requests),
            "iterations": c.workload.iterations,
            "nonzero_delays": c.schedule.nonzero_delays,
        },
        "races": [] if c is None else sorted({" ".join(race.key) for race in c.races}),
        "repeat": result.repeat,
        "infeasible": result.infeasible,
        "stop_reason": result.stop_reason.value,
        "phases": [{"phase": p.phase, "runs": p.runs, "seconds": round(p.seconds, 3)} for p in result.phases],
        "flaky": [
            {
                "reproduced": f.reproduced,
                "runs": f.runs,
                "workload": f.workload.to_json(),
                "schedule": f.schedule.to_json(),
            }
            for f in result.flaky
        ],
    }


def check_outputs(args: argparse.Namespace) -> None:
    """Every output path is usable, before any work (see the module docstring)."""
    args.report_dir = check_output_dir(args.report_dir, "--report-dir")
    if args.json is not None:
        args.json = check_output_file(args.json, "--json")


def scenario_hazards(scenario: Scenario, hazards: tuple[str, ...] | None) -> tuple[str, ...]:
    """`--hazards` checked against the design's scenario (None: the scenario's default hazards), in order."""
    chosen = tuple(scenario.hazards) if hazards is None else hazards
    check_hazards(scenario, chosen)
    return chosen


def lint(design: Design, args: argparse.Namespace) -> None:
    """Build and lint the design's programs for a few fixed workloads; warnings on stderr, errors with --strict."""
    from racefuzz.lint import preflight

    options = {} if args.plan_stream is None else {"plan_stream": args.plan_stream}
    findings = preflight(design, args.hazards, **options)
    if findings and args.strict:
        listed = "; ".join(str(f) for f in findings)
        raise UserCodeError(f"design {design.spec} fails the lint (--strict): {listed}")
    for finding in findings:
        print(f"racefuzz: warning: design {design.spec}: {finding}", file=sys.stderr)


def run_command(args: argparse.Namespace) -> ExitCode:
    from racefuzz.backends import executor, resolve_backend

    check_outputs(args)
    control = result = None
    try:
        # Everything that runs the user's code is watched: a design module or hook that never returns is
        # abandoned after --example-timeout, and Ctrl-C stops at the next checkpoint.
        with stoppable(args.example_timeout):
            scenario = get_scenario(args.scenario)
            args.design = args.design or scenario.default_design
            checkpoint(f"loading design {args.design}")
            design = load_design(args.design, scenario)
            args.hazards = scenario_hazards(design.scenario, args.hazards)
            control_name = design.scenario.control_design  # the negative control, defined once by the scenario
            control_design = None
            if design.name != control_name and not args.no_control:
                control_design = load_design(control_name, design.scenario)
            checkpoint(f"building design {args.design}'s programs for the lint")
            lint(design, args)
            backend = resolve_backend(args.backend)
            print(
                f"racefuzz {__version__}: design {label(design)} on {backend}, up to {args.examples} examples, "
                f"seed {args.seed}, hazards {','.join(args.hazards)}",
                flush=True,
            )
            # After the design and the first line: both come before Hypothesis is imported (a fast start).
            args.example_database = example_database(args.database)
            run = WatchedExecutor(executor(backend), backend)
            if control_design is not None:
                control = run_search(control_design, args, backend, run, shrink=False)
                if control.found:
                    print(
                        f"negative control `{control_name}`: caught after {control.first_detection_example} "
                        f"example(s) ({control.counterexample.oracle})",
                        flush=True,
                    )
                else:
                    print(f"negative control `{control_name}`: NOT caught in {control.examples} examples", flush=True)
            result = run_search(design, args, backend, run)
            raise_hook_error(design)  # a hook that raised once inside the search, even if not again
            stopped = stop_requested()  # a Ctrl-C after the last checkpoint: the run finished, then say so
    except StopRequested as stop:
        return _stopped(stop, args)
    if result.infeasible:
        print(
            f"{result.infeasible} run(s) skipped, not judged: their forced orders could not be realized "
            "(on the GPU a gate's wait timed out)"
        )
    if result.flaky:
        rates = ", ".join(f"{f.reproduced}/{f.runs}" for f in result.flaky[:10])
        print(f"flaky (not counted as races, reproduced fewer than {result.repeat}/{result.repeat} times): {rates}")
    print(result.statistics_line())
    report = {"racefuzz": __version__, "run": summary(result), "control": None if control is None else summary(control)}
    if result.found:
        replay_path = _save(result, args, report)
        _write_json(args, report)
        print(
            f"RACE FOUND in design {label(design)} after {result.first_detection_example} example(s); "
            f"report in {replay_path.with_suffix('.txt')}"
        )
        if stopped or stop_requested():  # a signal during the search's last steps or while writing
            print(interrupted_line(), file=sys.stderr)
            return ExitCode.INTERRUPTED
        return ExitCode.RACE
    json_ok = _write_json(args, report)
    if stopped:
        print(interrupted_line(), file=sys.stderr)
        return ExitCode.INTERRUPTED
    if control is not None and not control.found:
        print(
            f"INCONCLUSIVE: no race in {label(design)} over {result.examples} examples, but the negative control was "
            "not caught either; raise --examples or widen --hazards"
        )
        return ExitCode.INCONCLUSIVE
    print(f"no race found in design {label(design)} over {result.examples} examples ({result.seconds:.1f} s)")
    return ExitCode.CLEAN if json_ok else ExitCode.USAGE


def _stopped(stop: StopRequested, args: argparse.Namespace) -> ExitCode:
    """Ctrl-C or the watchdog stopped the run: write what the search had found, say so, return the code."""
    partial = stop.partial
    # Only the searched design's own counterexample: a stop during the negative control finds the control's.
    if partial is not None and partial.found and partial.design.spec == args.design:  # type: ignore[attr-defined]
        replay_path = _save(partial, args, None)
        print(
            f"RACE FOUND in design {label(partial.design)} (not minimized: the search was stopped); "  # type: ignore[attr-defined]
            f"replay {replay_path}"
        )
    if stop.reason == "timeout":
        print(f"racefuzz: error: {stop.detail}", file=sys.stderr)
        return ExitCode.TIMEOUT
    print(interrupted_line(), file=sys.stderr)
    return ExitCode.INTERRUPTED


def _save(result, args: argparse.Namespace, report: dict[str, object] | None) -> Path:
    """Write the counterexample (replay file first) and print its report; to a temporary directory if
    `--report-dir` cannot be written after all. Signals are held meanwhile (`racefuzz.watchdog.hold`): a
    Ctrl-C or SIGTERM here lets the files be written and the report printed, then the run exits 130."""
    from racefuzz.report import save_counterexample

    with hold("stopping once the counterexample is written"):
        pause_point("writing")
        try:
            replay_path, text, timeline = save_counterexample(result, args.seed, args.report_dir)
        except OSError as exc:
            elsewhere = fallback_dir()
            print(
                f"racefuzz: error: cannot write to --report-dir {args.report_dir} ({exc.strerror or exc}); "
                f"the counterexample goes to {elsewhere}",
                file=sys.stderr,
            )
            replay_path, text, timeline = save_counterexample(result, args.seed, elsewhere)
        pause_point("written")
        if report is not None:
            report["replay_file"] = str(replay_path)
        print(text)
        for path in timeline:
            print(f"  timeline: {path}")
        if not any(path.suffix == ".png" for path in timeline):
            print("  timeline: no PNG (matplotlib is not installed: pip install 'racefuzz[plot]')")
    return replay_path


def _write_json(args: argparse.Namespace, report: dict[str, object]) -> bool:
    """Write the JSON summary if asked for; on failure say so in one line (the report is already printed)."""
    if args.json is None:
        return True
    try:
        write_text(args.json, json.dumps(report, indent=2) + "\n")
    except OSError as exc:
        print(f"racefuzz: error: cannot write --json {args.json}: {exc.strerror or exc}", file=sys.stderr)
        return False
    return True
