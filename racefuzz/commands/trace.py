"""`racefuzz trace module:step`: fuzz a step of real code (see `racefuzz.trace`), or re-run a replay file.

Exit codes as `racefuzz run`'s: 1 a race (happens-before, or values that differ from the serialized run),
0 none, 3 none but the `--control` step (one that must race) was not caught either, 2 a bad step name,
replay file, `--watch` name or `--report-dir`, or `--device cuda` without a usable GPU, 4 the step (or the
control, or the replayed step) itself failed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from racefuzz.commands import argtypes
from racefuzz.errors import InvalidArgument, RacefuzzError, ReplayError, UserCodeError
from racefuzz.exitcodes import ExitCode

if TYPE_CHECKING:
    from racefuzz.trace.search import TraceResult


def add_parser(command: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """Add the `trace` subcommand through the CLI's subcommand factory."""
    trace = command("trace", "fuzz a step of your own torch/Triton code (module:function)")
    trace.add_argument("step", nargs="?", help="the step, as module:function (it takes a racefuzz.trace.TraceEnv)")
    trace.add_argument("--control", help="a step that must race (module:function): the negative control")
    trace.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="default: cuda if usable")
    trace.add_argument(
        "--examples", type=argtypes.examples, default=200, help="fuzzed runs per step on the GPU (default 200)"
    )
    trace.add_argument(
        "--max-delays", type=argtypes.max_delays, default=2, help="delay points per run, 0 to 64 (default 2)"
    )
    trace.add_argument(
        "--confirm", type=argtypes.repeat, default=3, help="re-runs of a shrunk counterexample, 1 to 1000 (default 3)"
    )
    trace.add_argument("--watch", action="append", default=[], help="a tensor name the oracle watches (repeatable)")
    trace.add_argument("--seed", type=argtypes.seed, help="Hypothesis seed (default: derandomized)")
    trace.add_argument("--report-dir", type=Path, default=Path(".racefuzz"), help="where replay files go")
    trace.add_argument(
        "--no-run-kernels",
        dest="run_kernels",
        action="store_false",
        help="with --device cpu: record Triton/CuPy launches from their annotations without running them",
    )
    trace.add_argument("--replay", type=Path, help="re-run this trace replay file instead of searching")
    trace.add_argument("--repeat", type=argtypes.repeat, default=3, help="with --replay: runs, 1 to 1000 (default 3)")


def trace_command(args: argparse.Namespace) -> ExitCode:
    from racefuzz.outputs import check_output_dir
    from racefuzz.trace.search import fuzz, resolve_device

    if args.replay is not None:
        return replay_trace(args.replay, args.device, args.repeat)
    if not args.step:
        raise InvalidArgument("racefuzz trace needs a step (module:function) or --replay FILE")
    if not args.run_kernels and args.device != "cpu":
        raise InvalidArgument("--no-run-kernels needs --device cpu (on a GPU the kernels run)")
    # Before any work, and before any of the user's code (importing the step) runs: a race found must have
    # a place to go, and a device that is not there is a usage error, not a failing step.
    report_dir = check_output_dir(args.report_dir, "--report-dir")
    device = resolve_device(args.device)
    step = _load(args.step)
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
        control = _run(fuzz, _load(args.control), options, f"the negative control {args.control}")
        control_caught = control.racy
        print(f"negative control {control.step}: {'caught' if control_caught else 'NOT caught'}")
    result = _run(fuzz, step, options, f"the step {args.step}")
    if result.racy:
        _write_race(result, report_dir, tuple(args.watch))
        return ExitCode.RACE
    print(_render(result, None))
    if control_caught is False:
        return ExitCode.INCONCLUSIVE
    return ExitCode.CLEAN


def _render(result: TraceResult, replay_path: Path | None) -> str:
    from racefuzz.trace.report import render

    return render(result, replay_path)


def _write_race(result: TraceResult, report_dir: Path, watch: tuple[str, ...]) -> None:
    """Write the replay file (on a value divergence) and the timeline, then print the report; to a fresh
    temporary directory if `report_dir` cannot be written after all (the message says where)."""
    from racefuzz.outputs import fallback_dir
    from racefuzz.trace.report import report_stem, write_replay, write_timeline

    def write(directory: Path) -> tuple[Path | None, list[Path]]:
        replay_path = write_replay(result, directory, watch) if result.divergence else None
        return replay_path, write_timeline(result, report_stem(result, directory))

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
    print("timeline (host issue order): " + ", ".join(str(p) for p in written))


def _load(spec: str) -> Callable:
    from racefuzz.trace.search import load_step

    try:
        return load_step(spec)
    except (ImportError, AttributeError, ValueError) as exc:
        raise InvalidArgument(f"cannot load step {spec!r}: {exc}") from None


def _run(call: Callable, step: Callable, options: dict, what: str) -> Any:
    """`call(step, **options)`; an exception from the user's code is a `UserCodeError` naming `what` (exit 4),
    racefuzz's own errors (a bad --watch name, an unusable device) pass as they are."""
    try:
        return call(step, **options)
    except RacefuzzError:
        raise
    except Exception as exc:
        import traceback

        raise UserCodeError(
            f"{what} failed in its reference run: {type(exc).__name__}: {exc}", traceback.format_exc()
        ) from None


def replay_trace(path: Path, device_choice: str, repeat: int) -> ExitCode:
    """Re-run the trace replay file `path` `repeat` times (`racefuzz trace --replay`, and `racefuzz replay` of
    a trace file); `device_choice` "auto" runs on the device the file was recorded on.

    On the CPU a delay cannot reorder anything (the step runs eagerly), so there the file's delays are not
    re-run: the step's happens-before trace is judged instead, as `racefuzz trace --device cpu` does, and a
    race there exits 1 (the output says which verdict it is)."""
    from racefuzz.trace.convert import find_trace_races
    from racefuzz.trace.report import load_replay
    from racefuzz.trace.search import judge_run, resolve_device, run_once, run_with_delays, watched_ordinals

    try:
        spec, recorded_on, watch, delays = load_replay(path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ReplayError(f"{path}: {exc}") from None
    device = resolve_device(recorded_on if device_choice == "auto" else device_choice)
    step = _load(spec)
    reference = _run(run_once, step, {"device": device, "serialize": True}, f"the replayed step {spec}")
    ordinals = watched_ordinals(reference, watch)
    print(f"racefuzz trace --replay {path}: {spec} on {device}, delays {delays}")
    if device == "cpu":
        races = find_trace_races(reference.trace)
        print(
            "on the CPU the step runs eagerly and a delay cannot reorder anything: the delays are not re-run, "
            "the happens-before verdict of the recorded trace is reported instead"
        )
        for race in races:
            print(race.explain())
        if races:
            print(f"reproduced as {len(races)} happens-before race(s) (no value check on the CPU)")
            return ExitCode.RACE
        print(
            "no happens-before race; the value race of this file can only be re-run on a GPU (--device cuda)"
            if delays
            else "no happens-before race"
        )
        return ExitCode.CLEAN
    runs = (run_with_delays(step, device, reference, delays, ordinals) for _ in range(repeat))
    found = [judge_run(reference, run, ordinals) for run in runs]
    hits = [d for d in found if d is not None]
    print(f"reproduced in {len(hits)}/{repeat} run(s)" + (f": {hits[0]}" if hits else ""))
    return ExitCode.RACE if hits else ExitCode.CLEAN
