"""`racefuzz trace module:step`: fuzz a step of real code (see `racefuzz.trace`), or re-run a replay file.

Exit codes as `racefuzz run`'s: 1 a race (happens-before, or values that a schedule changes, k of k, and
that do not differ without it; its replay file is written first), 0 none, 3 none but the `--control` step
(one that must race) was not caught either, 2 a bad step name, replay file, `--watch` name, `--report-dir`
or `--database`, `--device cuda` without a usable GPU, or no torch, 4 the step (or the control, or the
replayed step) itself failed -- raised, or called `sys.exit` --, 5 racefuzz's own failure (a bug in the
recorder), 6 one run of the step took longer than `--example-timeout`.

A step is `package.module:function` (imported with the working directory on the import path, as `racefuzz
run --design` does) or `path/to/steps.py:function`. `--examples 0` records it once and judges it by
happens-before only, on any device; failing delay sets are kept in `--database` as `racefuzz run` keeps
its failures.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from racefuzz.commands import argtypes
from racefuzz.errors import BackendUnavailable, InvalidArgument, ReplayError, UserCodeError
from racefuzz.exitcodes import ExitCode

if TYPE_CHECKING:
    from racefuzz.schedule import Schedule
    from racefuzz.trace.search import TraceResult


def add_parser(command: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """Add the `trace` subcommand through the CLI's subcommand factory."""
    trace = command("trace", "fuzz a step of your own torch/Triton code (module:function)")
    trace.add_argument("step", nargs="?", help="the step, as module:function (it takes a racefuzz.trace.TraceEnv)")
    trace.add_argument("--control", help="a step that must race (module:function): the negative control")
    trace.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="default: cuda if usable")
    trace.add_argument(
        "--examples",
        type=argtypes.bounded_int(0, argtypes.MAX_EXAMPLES, "a non-negative integer"),
        default=200,
        help="fuzzed runs per step on the GPU (default 200); 0: record the step once and judge it by "
        "happens-before only, on any device (no serialized re-runs, no delay search)",
    )
    trace.add_argument(
        "--max-delays",
        type=argtypes.max_delays,
        default=2,
        help="delay points per run, and forced orders per run, 0 to 64 each (default 2)",
    )
    trace.add_argument(
        "--confirm", type=argtypes.repeat, default=3, help="re-runs of a shrunk counterexample, 1 to 1000 (default 3)"
    )
    trace.add_argument("--watch", action="append", default=[], help="a tensor name the oracle watches (repeatable)")
    trace.add_argument("--seed", type=argtypes.seed, help="Hypothesis seed (default: derandomized)")
    trace.add_argument("--report-dir", type=argtypes.path, default=Path(".racefuzz"), help="where replay files go")
    trace.add_argument(
        "--database",
        default=None,
        metavar="DIR|none|module:attr",
        help="where failing delay sets are saved and tried first on the next run (as racefuzz run's): a "
        "directory, none, or a Hypothesis ExampleDatabase object (default $RACEFUZZ_DATABASE, else "
        ".hypothesis/examples)",
    )
    trace.add_argument(
        "--no-run-kernels",
        dest="run_kernels",
        action="store_false",
        help="with --device cpu: record Triton/CuPy launches from their annotations without running them",
    )
    trace.add_argument(
        "--replay",
        type=argtypes.path,
        help="re-run this trace replay file instead of searching (STEP, if given, must match)",
    )
    trace.add_argument("--repeat", type=argtypes.repeat, default=3, help="with --replay: runs, 1 to 1000 (default 3)")
    trace.add_argument(
        "--example-timeout",
        type=argtypes.timeout,
        default=argtypes.DEFAULT_EXAMPLE_TIMEOUT_S,
        metavar="SECONDS",
        help=f"stop with exit code {int(ExitCode.TIMEOUT)} when one run of the step takes longer (default "
        f"{argtypes.DEFAULT_EXAMPLE_TIMEOUT_S:g}); a step that never returns is abandoned",
    )


def trace_command(args: argparse.Namespace) -> ExitCode:
    from racefuzz.errors import ExampleTimeout
    from racefuzz.trace.search import build_recorder
    from racefuzz.watchdog import StopRequested, stoppable

    require_torch()
    build_recorder()
    try:
        # Everything that runs the step is watched: a run that never returns is abandoned after
        # --example-timeout (exit 6), and Ctrl-C stops at the next run.
        with stoppable(args.example_timeout):
            if args.replay is not None:
                return replay_trace(
                    args.replay, args.device, args.repeat, step_given=args.step, watch_given=tuple(args.watch)
                )
            return _search(args)
    except StopRequested as stop:
        if stop.reason == "timeout":
            raise ExampleTimeout(stop.detail) from None
        raise


def require_torch() -> None:
    """A usage error (exit 2) with the install hint when torch is missing: a traced step is torch code, and
    without torch nothing can record it (the step's own `import torch` would otherwise read as its bug)."""
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        raise BackendUnavailable(
            f"racefuzz trace records torch code and needs torch ({exc}): pip install torch (a CUDA build to run "
            "on the GPU; the CPU build records and judges happens-before)"
        ) from None


def _search(args: argparse.Namespace) -> ExitCode:
    from racefuzz.commands.run import example_database
    from racefuzz.outputs import check_output_dir
    from racefuzz.trace.search import fuzz, resolve_device, watched_step
    from racefuzz.watchdog import checkpoint

    if not args.step:
        raise InvalidArgument("racefuzz trace needs a step (module:function) or --replay FILE")
    if not args.run_kernels and args.device != "cpu":
        raise InvalidArgument("--no-run-kernels needs --device cpu (on a GPU the kernels run)")
    # Before any work, and before any of the user's code (importing the step) runs: a race found must have
    # a place to go, and a device that is not there is a usage error, not a failing step.
    report_dir = check_output_dir(args.report_dir, "--report-dir")
    database = example_database(args.database)
    device = resolve_device(args.device)
    checkpoint(f"loading the step {args.step}")
    step = watched_step(_load(args.step), args.step)
    checkpoint(f"recording the step {args.step}")  # the first recording may build the recorder's fast path
    options = dict(
        device=device,
        watch=tuple(args.watch),
        examples=args.examples,
        max_delays=args.max_delays,
        confirm=args.confirm,
        seed=args.seed,
        run_kernels=args.run_kernels,
    )
    control_caught = None
    if args.control:
        control = _run(
            fuzz,
            watched_step(_load(args.control), args.control),
            {**options, "saved": _saved(database, args.control, device, args.watch)},
            f"the negative control {args.control}",
        )
        control_caught = control.racy
        print(f"negative control {control.step}: {'caught' if control_caught else 'NOT caught'}")
    result = _run(
        fuzz, step, {**options, "saved": _saved(database, args.step, device, args.watch)}, f"the step {args.step}"
    )
    if result.racy:
        _write_race(result, report_dir, tuple(args.watch), args.step)
        return ExitCode.RACE
    print(_render(result, None))
    if control_caught is False:
        return ExitCode.INCONCLUSIVE
    return ExitCode.CLEAN


def _saved(database: Any, spec: str, device: str, watch: list[str]) -> Any:
    """The step's failing delay sets kept in `database` (`--database`), keyed by the step as given."""
    from racefuzz.search.corpus import TraceCorpus, trace_corpus_key

    return TraceCorpus(database, trace_corpus_key(spec, device, watch))


def _render(result: TraceResult, replay_path: Path | None) -> str:
    from racefuzz.trace.report import render

    return render(result, replay_path)


def _write_race(result: TraceResult, report_dir: Path, watch: tuple[str, ...], spec: str) -> None:
    """Write the replay file (a value divergence's delays, or none for a happens-before race: its replay
    judges the step's trace again) and the timeline, then print the report; to a fresh temporary directory
    if `report_dir` cannot be written after all (the message says where). The file names the step as
    `spec` (the step loaded, a file's path made absolute), so that `racefuzz trace --replay` loads it
    again from anywhere."""
    import json

    from racefuzz.designs import split_spec
    from racefuzz.outputs import fallback_dir
    from racefuzz.report import file_stem
    from racefuzz.trace.report import replay_json, report_stem, write_timeline

    file_path, _, attr = split_spec(spec)
    replayed = spec if file_path is None else f"{file_path.resolve()}:{attr}"

    def write(directory: Path) -> tuple[Path, list[Path]]:
        stem = report_stem(result, directory) if file_path is None else directory / f"trace-{file_stem(spec)}"
        stem.parent.mkdir(parents=True, exist_ok=True)
        replay_path = stem.parent / f"{stem.name}.json"
        replay_path.write_text(json.dumps({**replay_json(result, watch), "step": replayed}, indent=2) + "\n")
        return replay_path, write_timeline(result, stem)

    try:
        replay_path, written = write(report_dir)
    except OSError as exc:
        elsewhere = fallback_dir()
        print(
            f"racefuzz: error: cannot write to --report-dir {report_dir} ({exc.strerror or exc}); "
            f"the replay file and timeline go to {elsewhere}",
            file=sys.stderr,
        )
        replay_path, written = write(elsewhere)
    print(_render(result, replay_path))
    if result.divergence is None:
        print(f"  replay: racefuzz trace --replay {replay_path}")
    print("timeline (host issue order): " + ", ".join(str(p) for p in written))


def _load(spec: str) -> Callable:
    """The step `spec` names: `package.module:function` (the working directory on the import path, as for
    `racefuzz run --design`) or `path/to/steps.py:function`. A name that does not resolve is a usage error;
    the step's module raising (or calling sys.exit) while it is imported is an error in user code."""
    import traceback

    from racefuzz.designs import import_user_file, one_line, split_spec, user_frame, working_directory_on_path
    from racefuzz.trace import search

    file_path, module_name, attr = split_spec(spec)
    if not attr or (file_path is None and not module_name):
        raise InvalidArgument(f"cannot load step {spec!r}: expected module:function or path/to/steps.py:function")
    if file_path is None:
        cwd = working_directory_on_path()
        try:
            return search.load_step(spec)
        except ImportError as exc:
            if exc.name is None or not module_name.startswith(exc.name):  # the step's module imports a missing one
                raise UserCodeError(
                    f"importing step module {module_name!r} failed: {type(exc).__name__}: {exc}{user_frame(exc)}",
                    traceback.format_exc(),
                ) from None
            raise InvalidArgument(
                f"cannot load step {spec!r}: {exc} (searched from {cwd}; a file path such as path/to/steps.py:step "
                "works too)"
            ) from None
        except (AttributeError, ValueError) as exc:
            raise InvalidArgument(f"cannot load step {spec!r}: {exc}") from None
        except (Exception, SystemExit) as exc:  # the step's module raised (or called sys.exit) while importing
            raise UserCodeError(
                f"importing step module {module_name!r} failed: {type(exc).__name__}: {one_line(exc)}{user_frame(exc)}",
                traceback.format_exc(),
            ) from None
    target: Any = import_user_file(file_path, spec, "step")
    try:
        for part in attr.split("."):
            target = getattr(target, part)
    except AttributeError as exc:
        raise InvalidArgument(f"cannot load step {spec!r}: {exc}") from None
    if not callable(target):
        raise InvalidArgument(f"cannot load step {spec!r}: {attr} is not callable")
    return target


def _run(call: Callable, step: Callable, options: dict, what: str) -> Any:
    """`call(step, **options)`. The step itself failing (`StepFailed`: it raised or called sys.exit) is an
    error in user code naming `what` (exit 4); racefuzz's own errors (a bad --watch name, an unusable
    device) pass as they are, and anything else is racefuzz's bug (exit 5), not blamed on the step."""
    from racefuzz.trace.search import StepFailed

    try:
        return call(step, **options)
    except StepFailed as failed:
        raise UserCodeError(f"{what} failed in its reference run: {failed.summary}", failed.details) from None


def load_trace_replay(path: Path) -> tuple[str, str, tuple[str, ...], Schedule]:
    """(step spec, device, watch, schedule) of a trace replay file -- the schedule of its delay points and its
    forced orders (`orders`, optional: a file without them has none) -- every field checked (present, of its
    type, in its range); any problem is a one-line `ReplayError`. The file is read as `racefuzz replay` reads its
    own (`racefuzz.report.read_json_file`: bounded, regular files only)."""
    from racefuzz.report import read_json_file
    from racefuzz.trace.report import (
        FORMAT,
        FORMAT_VERSION,
        KIND,
        MAX_REPLAY_DELAY_US,
        MAX_REPLAY_DELAYS,
        MAX_REPLAY_LAUNCH,
        is_trace_replay,
    )

    data = read_json_file(path, "trace replay file")
    if not is_trace_replay(data):
        if isinstance(data, dict) and data.get("format") == FORMAT:
            raise ReplayError(
                f"{path}: not a racefuzz trace replay file (a counterexample of kind {data.get('kind', 'model')!r}, "
                f"not {KIND!r}): replay it with racefuzz replay {path}"
            )
        raise ReplayError(f'{path}: not a racefuzz trace replay file (no "format": "{FORMAT}", "kind": "{KIND}")')
    if data.get("format") == FORMAT and not isinstance(data.get("racefuzz"), str):
        raise ReplayError(f'{path}: "racefuzz" must be the version string that wrote it, got {data.get("racefuzz")!r}')
    for name in ("version", "step", "device", "watch", "delays"):
        if name not in data:
            raise ReplayError(f'{path}: missing field "{name}"')
    if type(data["version"]) is not int or data["version"] != FORMAT_VERSION:
        raise ReplayError(f"{path}: format version {data['version']!r}; this racefuzz reads version {FORMAT_VERSION}")
    step, device, watch, raw_delays = data["step"], data["device"], data["watch"], data["delays"]
    if not isinstance(step, str) or ":" not in step:
        raise ReplayError(f'{path}: "step" must be module:function, got {step!r}')
    if device not in ("cpu", "cuda"):
        raise ReplayError(f"{path}: 'device' must be 'cpu' or 'cuda', got {device!r}")
    if not isinstance(watch, list) or not all(isinstance(name, str) and name for name in watch):
        raise ReplayError(f'{path}: "watch" must be a list of tensor names, got {watch!r}')
    if not isinstance(raw_delays, list) or len(raw_delays) > MAX_REPLAY_DELAYS:
        raise ReplayError(f'{path}: "delays" must be a list of at most {MAX_REPLAY_DELAYS} delay points')
    delays = []
    for i, point in enumerate(raw_delays):
        if not isinstance(point, dict) or set(point) != {"stream", "launch", "us"}:
            raise ReplayError(f'{path}: delay point {i} must be {{"stream": name, "launch": n, "us": microseconds}}')
        stream, launch, us = point["stream"], point["launch"], point["us"]
        if not isinstance(stream, str) or not stream:
            raise ReplayError(f"{path}: delay point {i}: stream must be a stream name, got {stream!r}")
        if type(launch) is not int or not 0 <= launch <= MAX_REPLAY_LAUNCH:
            raise ReplayError(
                f"{path}: delay point {i} out of range: launch must be an integer in [0, {MAX_REPLAY_LAUNCH}], "
                f"got {launch!r}"
            )
        if type(us) not in (int, float) or not 0.0 <= us <= MAX_REPLAY_DELAY_US:  # nan fails both comparisons
            raise ReplayError(
                f"{path}: delay point {i} out of range: us must be microseconds in [0, {MAX_REPLAY_DELAY_US:g}], "
                f"got {us!r}"
            )
        delays.append((stream, launch, float(us)))
    orders = _replay_orders(path, data.get("orders", []), MAX_REPLAY_DELAYS, MAX_REPLAY_LAUNCH)
    from racefuzz.trace.orders import real_code_schedule

    try:
        schedule = real_code_schedule(delays, orders)
    except InvalidArgument as exc:  # a delay above the schedule's cap, two orders' points on one stream
        raise ReplayError(f"{path}: {exc}") from None
    return step, device, tuple(watch), schedule


def _replay_orders(path: Path, raw: object, most: int, last_launch: int) -> list[Any]:
    """The forced orders of a trace replay file (its optional `orders` field: a list of {"first": point,
    "then": point}, each point {"stream": name, "launch": n}), every field checked; a one-line ReplayError."""
    if not isinstance(raw, list) or len(raw) > most:
        raise ReplayError(f'{path}: "orders" must be a list of at most {most} forced orders')
    orders = []
    for i, order in enumerate(raw):
        if not isinstance(order, dict) or set(order) != {"first", "then"}:
            raise ReplayError(f'{path}: forced order {i} must be {{"first": point, "then": point}}')
        pair = []
        for side in ("first", "then"):
            point = order[side]
            if not isinstance(point, dict) or set(point) != {"stream", "launch"}:
                raise ReplayError(f'{path}: forced order {i}: "{side}" must be {{"stream": name, "launch": n}}')
            stream, launch = point["stream"], point["launch"]
            if not isinstance(stream, str) or not stream:
                raise ReplayError(f"{path}: forced order {i}: {side}'s stream must be a stream name, got {stream!r}")
            if type(launch) is not int or not 0 <= launch <= last_launch:
                raise ReplayError(
                    f"{path}: forced order {i} out of range: {side}'s launch must be an integer in [0, {last_launch}], "
                    f"got {launch!r}"
                )
            pair.append((stream, launch))
        orders.append(tuple(pair))
    return orders


def check_delay_points(path: Path, schedule: Schedule, reference: Any) -> None:
    """Every delay point and every forced order's point names a launch the replayed step makes (stream and
    n-th launch on it): a point on a stream the step does not use, or past its launches, would be silently
    dropped (or leave a gate waiting), and the replay would judge another schedule than the one that raced.
    The orders must also be ones the step's reference run can keep (`racefuzz.trace.orders.OrderFacts`): one
    whose gate would wait forever is refused, not run."""
    from racefuzz.schedule import ScheduleInfeasible
    from racefuzz.trace.orders import OrderFacts
    from racefuzz.trace.search import launch_points

    counts: dict[str, int] = {}
    for stream, _ in launch_points(reference):
        counts[stream] = counts.get(stream, 0) + 1
    points = [("delay", "before", point) for point in schedule.device_delays]
    points += [("forced order", "at", point) for order in schedule.orders for point in order]
    for what, where, (stream, launch) in points:
        if stream not in counts:
            known = ", ".join(sorted(counts)) or "none"
            raise ReplayError(
                f"{path}: {what} on stream {stream!r}, which the step does not launch on (it does on: {known})"
            )
        if launch >= counts[stream]:
            raise ReplayError(
                f"{path}: {what} {where} launch {launch} on {stream!r}, but the step makes {counts[stream]} there"
            )
    if schedule.orders:
        try:
            OrderFacts(reference).check(schedule.orders)
        except ScheduleInfeasible as exc:
            raise ReplayError(f"{path}: {exc}") from None


def replay_trace(
    path: Path,
    device_choice: str,
    repeat: int,
    *,
    step_given: str | None = None,
    watch_given: tuple[str, ...] = (),
) -> ExitCode:
    """Re-run the trace replay file `path` `repeat` times (`racefuzz trace --replay`, and `racefuzz replay` of
    a trace file); `device_choice` "auto" runs on the device the file was recorded on. `step_given` (the
    STEP of `racefuzz trace STEP --replay FILE`) and `watch_given` must be the file's, if given.

    On the CPU a delay cannot reorder anything and a forced order cannot hold a launch back (the step runs
    eagerly), so there the file's schedule is not re-run: the step's happens-before trace is judged instead,
    as `racefuzz trace --device cpu` does, and a race there exits 1 (the output says which verdict it is).
    On the GPU a re-run whose gate timed out did not keep the file's orders: it is said, and not counted."""
    from racefuzz.confirm import confirm
    from racefuzz.schedule import ScheduleInfeasible
    from racefuzz.trace.judge import judge
    from racefuzz.trace.oracle import masked
    from racefuzz.trace.orders import schedule_text
    from racefuzz.trace.report import latent_lines, race_text
    from racefuzz.trace.search import (
        SERIALIZED_REPEATS,
        judge_run,
        resolve_device,
        run_once,
        run_with_delays,
        watched_ordinals,
        watched_step,
        without_the_schedule,
    )
    from racefuzz.watchdog import checkpoint

    require_torch()
    spec, recorded_on, watch, schedule = load_trace_replay(path)
    if step_given is not None and step_given != spec:
        raise InvalidArgument(
            f"racefuzz trace {step_given} --replay {path}: the file replays the step {spec}, not {step_given} "
            "(give the file alone, or its own step)"
        )
    if watch_given and tuple(watch_given) != watch:
        raise InvalidArgument(f"--watch {', '.join(watch_given)}: {path} watches {', '.join(watch) or 'nothing'}")
    device = resolve_device(recorded_on if device_choice == "auto" else device_choice)
    checkpoint(f"loading the step {spec}")
    step = watched_step(_load(spec), spec)
    reference = _run(run_once, step, {"device": device, "serialize": True}, f"the replayed step {spec}")
    check_delay_points(path, schedule, reference)
    ordinals = watched_ordinals(reference, watch)
    print(f"racefuzz trace --replay {path}: {spec} on {device}, {schedule_text(schedule)}")
    judgement = judge(reference.program)
    races = judgement.races
    if device == "cpu":
        print(
            "on the CPU the step runs eagerly and a delay cannot reorder anything, nor a forced order hold a launch "
            "back: the schedule is not re-run, the happens-before verdict of the recorded trace is reported instead"
        )
        for race in races:
            print(race_text(race))
        print(*latent_lines(judgement.latent), sep="\n", end="\n" if judgement.latent else "")
        if races:
            print(f"reproduced as {len(races)} happens-before race(s) (no value check on the CPU)")
            return ExitCode.RACE
        print(
            "no happens-before race; the value race of this file can only be re-run on a GPU (--device cuda)"
            if schedule.device_delays or schedule.orders
            else "no happens-before race"
        )
        return ExitCode.CLEAN
    for race in races:
        print(race_text(race))
    print(*latent_lines(judgement.latent), sep="\n", end="\n" if judgement.latent else "")
    # As in the search that wrote the file: what differs between serialized runs without any delay is not
    # compared, and a divergence counts only k of k (racefuzz.confirm) and if the step without the schedule
    # does not diverge too. The happens-before races of the trace do not depend on the delays.
    learned = without_the_schedule(step, device, reference, ordinals, SERIALIZED_REPEATS)
    _print_nondeterminism(learned, reference, 1 + SERIALIZED_REPEATS)
    if learned.unstable:
        print(f"the value oracle cannot judge this step ({learned.unstable}): the delays are not re-run")
        return _replay_verdict(races, False)
    compared = masked(reference, learned)
    hits: list[object] = []

    def diverges() -> bool:
        try:
            run = run_with_delays(step, device, compared, schedule, ordinals)
        except ScheduleInfeasible as exc:  # a gate timed out: this run did not keep the orders
            print(f"a re-run not counted: {exc}")
            return False
        found = judge_run(compared, run, ordinals)
        if found is not None:
            hits.append(found)
        return found is not None

    confirmation = confirm(diverges, repeat)
    print(f"the value divergence reproduced in {confirmation} run(s)" + (f": {hits[0]}" if hits else ""))
    if hits and not confirmation.confirmed:
        print(f"flaky: the divergence showed in {confirmation} runs, not {repeat} of {repeat}: not counted as a race")
    counted = confirmation.confirmed
    if counted:
        grown = learned | without_the_schedule(step, device, reference, ordinals, repeat)
        if grown != learned:
            _print_nondeterminism(grown, reference, 1 + SERIALIZED_REPEATS + repeat)
            print("not the schedule's doing: the step without any delay differs as well; not counted as a race")
            counted = False
    return _replay_verdict(races, counted)


def _print_nondeterminism(found: Any, reference: Any, runs: int) -> None:
    """Print what differed between `runs` serialized runs without any delay (`found`: a `Nondeterminism`)."""
    from racefuzz.trace.report import nondeterministic_lines

    for line in nondeterministic_lines(reference, found, runs):
        print(line)


def _replay_verdict(races: list[Any], manifested: bool) -> ExitCode:
    if races:
        print(f"{len(races)} happens-before race(s) in the trace")
    return ExitCode.RACE if races or manifested else ExitCode.CLEAN
