"""`racefuzz run`: search one design for races, beside the negative control."""

from __future__ import annotations

import argparse
import json

from racefuzz import __version__
from racefuzz.backends import executor, resolve_backend
from racefuzz.designs import load_design
from racefuzz.errors import InvalidArgument
from racefuzz.exitcodes import ExitCode
from racefuzz.progress import progress
from racefuzz.report import save_counterexample
from racefuzz.search import SearchResult, search

DEFAULT_DATABASE = ".hypothesis/examples"
"""Where `racefuzz run` keeps failures by default: Hypothesis' own default example database directory."""


def example_database(spec: str | None):
    """The example database `--database` names: a directory, `none`, or `module:attr` of an ExampleDatabase
    (for a fleet: Hypothesis' `RedisExampleDatabase`, `GitHubArtifactDatabase`, `MultiplexedDatabase`).
    Without the option: $RACEFUZZ_DATABASE, else DEFAULT_DATABASE."""
    import importlib
    import os

    from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase

    spec = spec if spec is not None else os.environ.get("RACEFUZZ_DATABASE", DEFAULT_DATABASE)
    if spec.lower() == "none":
        return None
    if ":" in spec and not os.path.exists(spec):
        module_name, _, attr = spec.partition(":")
        try:
            obj = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise InvalidArgument(f"--database {spec}: {exc}") from None
        if not isinstance(obj, ExampleDatabase):
            raise InvalidArgument(f"--database {spec}: not a hypothesis.database.ExampleDatabase")
        return obj
    if os.path.exists(spec) and not os.path.isdir(spec):
        raise InvalidArgument(f"--database {spec}: not a directory")
    return DirectoryBasedExampleDatabase(spec)


def run_search(design, args: argparse.Namespace, backend: str, *, shrink: bool = True) -> SearchResult:
    with progress(args.examples, design.name, quiet=args.quiet) as on_example:
        return search(
            design,
            executor(backend),
            backend=backend,
            examples=args.examples,
            seed=args.seed,
            hazards=args.hazards,
            plan_stream=args.plan_stream,
            max_delays=args.max_delays,
            shrink=shrink,
            repeat=args.repeat,
            strategy=args.strategy,
            on_example=on_example,
            database=args.example_database,
        )


def summary(result: SearchResult) -> dict[str, object]:
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


def run_command(args: argparse.Namespace) -> ExitCode:
    backend = resolve_backend(args.backend)
    args.example_database = example_database(args.database)
    design = load_design(args.design)
    print(
        f"racefuzz {__version__}: design {design.name} on {backend}, up to {args.examples} examples, seed {args.seed}, "
        f"hazards {','.join(args.hazards)}"
    )
    control = None
    control_design = design.scenario.control_design  # the negative control, defined once by the scenario
    if design.name != control_design and not args.no_control:
        control = run_search(load_design(control_design, design.scenario), args, backend, shrink=False)
        if control.found:
            print(
                f"negative control `{control_design}`: caught after {control.first_detection_example} example(s) "
                f"({control.counterexample.oracle})"
            )
        else:
            print(f"negative control `{control_design}`: NOT caught in {control.examples} examples")

    result = run_search(design, args, backend)
    if result.flaky:
        rates = ", ".join(f"{f.reproduced}/{f.runs}" for f in result.flaky[:10])
        print(f"flaky (not counted as races, reproduced fewer than {result.repeat}/{result.repeat} times): {rates}")
    report = {"racefuzz": __version__, "run": summary(result), "control": None if control is None else summary(control)}
    if result.found:
        # The replay file is on disk before anything else can fail; then the report and the timeline.
        replay_path, text, timeline = save_counterexample(result, args.seed, args.report_dir)
        report["replay_file"] = str(replay_path)
        _write_json(args, report)
        print(text)
        for path in timeline:
            print(f"  timeline: {path}")
        print(
            f"RACE FOUND in design {design.name} after {result.first_detection_example} example(s); "
            f"report in {replay_path.with_suffix('.txt')}"
        )
        return ExitCode.RACE
    _write_json(args, report)
    if control is not None and not control.found:
        print(
            f"INCONCLUSIVE: no race in {design.name} over {result.examples} examples, but the negative control was not "
            "caught either; raise --examples or widen --hazards"
        )
        return ExitCode.INCONCLUSIVE
    print(f"no race found in design {design.name} over {result.examples} examples ({result.seconds:.1f} s)")
    return ExitCode.CLEAN


def _write_json(args: argparse.Namespace, report: dict[str, object]) -> None:
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
