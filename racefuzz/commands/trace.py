"""`racefuzz trace module:step`: fuzz a step of real code (see `racefuzz.trace`), or re-run a replay file.

Exit codes as `racefuzz run`'s: 1 a race (happens-before, or values that differ from the serialized run),
0 none, 3 none but the `--control` step (one that must race) was not caught either, 2 a bad step name or
replay file, 4 the step itself failed in its reference run.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from racefuzz.commands import argtypes
from racefuzz.errors import InvalidArgument, ReplayError, UserCodeError
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
    from racefuzz.trace.report import render, report_stem, write_replay, write_timeline
    from racefuzz.trace.search import fuzz

    if args.replay is not None:
        return replay_trace(args.replay, args.device, args.repeat)
    if not args.step:
        raise InvalidArgument("racefuzz trace needs a step (module:function) or --replay FILE")
    step = _load(args.step)
    if not args.run_kernels and args.device != "cpu":
        raise InvalidArgument("--no-run-kernels needs --device cpu (on a GPU the kernels run)")
    options = dict(
        device=args.device,
        watch=tuple(args.watch),
        examples=args.examples,
        max_delays=args.max_delays,
        confirm=args.confirm,
        seed=args.seed,
        run_kernels=args.run_kernels,
    )
    control_caught = None
    if args.control:
        control = fuzz(_load(args.control), **options)
        control_caught = control.racy
        print(f"negative control {control.step}: {'caught' if control_caught else 'NOT caught'}")
    result = _run(fuzz, step, options)
    replay_path = write_replay(result, args.report_dir, tuple(args.watch)) if result.divergence else None
    print(render(result, replay_path))
    if result.racy:
        written = write_timeline(result, report_stem(result, args.report_dir))
        print("timeline (host issue order): " + ", ".join(str(p) for p in written))
        return ExitCode.RACE
    if control_caught is False:
        return ExitCode.INCONCLUSIVE
    return ExitCode.CLEAN


def _load(spec: str) -> Callable:
    from racefuzz.trace.search import load_step

    try:
        return load_step(spec)
    except (ImportError, AttributeError, ValueError) as exc:
        raise InvalidArgument(f"cannot load step {spec!r}: {exc}") from None


def _run(fuzz: Callable, step: Callable, options: dict) -> TraceResult:
    try:
        return fuzz(step, **options)
    except Exception as exc:
        import traceback

        raise UserCodeError(
            f"the step failed in its reference run: {type(exc).__name__}: {exc}", traceback.format_exc()
        ) from None


def replay_trace(path: Path, device_choice: str, repeat: int) -> ExitCode:
    """Re-run the trace replay file `path` `repeat` times (`racefuzz trace --replay`, and `racefuzz replay` of
    a trace file); `device_choice` "auto" runs on the device the file was recorded on."""
    from racefuzz.trace.report import load_replay
    from racefuzz.trace.search import judge_run, resolve_device, run_once, run_with_delays, watched_ordinals

    try:
        spec, device, watch, delays = load_replay(path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ReplayError(f"{path}: {exc}") from None
    step = _load(spec)
    device = resolve_device(device if device_choice == "auto" else device_choice)
    reference = run_once(step, device, serialize=True)
    ordinals = watched_ordinals(reference, watch)
    found = [judge_run(reference, run_with_delays(step, device, reference, delays), ordinals) for _ in range(repeat)]
    hits = [d for d in found if d is not None]
    print(f"racefuzz trace --replay {path}: {spec} on {device}, delays {delays}")
    print(f"reproduced in {len(hits)}/{repeat} run(s)" + (f": {hits[0]}" if hits else ""))
    return ExitCode.RACE if hits else ExitCode.CLEAN
