"""`racefuzz replay FILE`: re-run a counterexample and print its report.

One file format for both frontends (`racefuzz.report.FORMAT`), told apart by its `kind`: `model` (a
`racefuzz run` counterexample: a design, a workload and a schedule; a file without `kind` is one) or
`trace` (a `racefuzz trace` counterexample: a step of real code and its delay points; the legacy
`racefuzz-trace-replay` files are read as one), `sglang` / `vllm` (an engine harness's racy workload, re-run
on the version it names). `replay_command` reads the file once, takes its kind, and
replays it under the same watchdog (`--example-timeout`, Ctrl-C) and `--repeat` either way.

A model's replay on the simulator is deterministic: it reproduces or racefuzz has a bug. On the GPU it runs
`--repeat` times and says how many reproduced the manifested corruption. Every field of the file is checked
against its documented range before anything runs (`racefuzz.report.ReplayFile.from_json`). A trace's is
`racefuzz.commands.trace.replay_trace`, as `racefuzz trace --replay FILE` runs it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from racefuzz.commands import ParserFactory, argtypes
from racefuzz.errors import BackendUnavailable, ExampleTimeout, InvalidArgument, ReplayError
from racefuzz.exitcodes import ExitCode

KINDS = ("model", "trace", "sglang", "vllm")
"""The kinds of counterexample a replay file holds."""


def add_parser(command: ParserFactory) -> None:
    """Add the `replay` subcommand through the CLI's subcommand factory."""
    replay = command("replay", "re-run a replay file and print its report")
    replay.add_argument("file", type=argtypes.path)
    replay.add_argument("--backend", choices=("sim", "cuda"), help="default: the backend recorded in the file")
    replay.add_argument(
        "--repeat", type=argtypes.repeat, default=1, help="runs, 1 to 1000 (default 1; 5 is sensible on GPU)"
    )
    replay.add_argument(
        "--example-timeout",
        type=argtypes.timeout,
        default=argtypes.DEFAULT_EXAMPLE_TIMEOUT_S,
        metavar="SECONDS",
        help=f"as for run (default {argtypes.DEFAULT_EXAMPLE_TIMEOUT_S:g})",
    )


def replay_command(args: argparse.Namespace) -> ExitCode:
    from racefuzz.report import read_json_file
    from racefuzz.watchdog import StopRequested, stoppable

    data = read_json_file(args.file)  # bounded, regular files only: `racefuzz replay /dev/zero` is one line
    replays = {"model": _model_replay, "trace": _trace_replay, "sglang": _sglang_replay, "vllm": _vllm_replay}
    replay = replays[replay_kind(data, args.file)](data, args)
    try:
        with stoppable(args.example_timeout):  # a hung hook, kernel or step is abandoned, Ctrl-C stops between runs
            return replay()
    except StopRequested as stop:
        if stop.reason == "timeout":
            raise ExampleTimeout(stop.detail) from None
        raise


def replay_kind(data: object, source: Path | str) -> str:
    """The kind of counterexample `data` (a replay file's JSON) holds; a one-line ReplayError if it is not
    a racefuzz replay file or its kind is unknown."""
    from racefuzz.report import FORMAT, KIND
    from racefuzz.trace.report import LEGACY_FORMAT

    if isinstance(data, dict) and data.get("format") == LEGACY_FORMAT:
        return "trace"
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ReplayError(f'{source}: not a racefuzz replay file (no "format": "{FORMAT}")')
    kind = data.get("kind", KIND)  # a file written before the field is a model's
    if kind not in KINDS:
        raise ReplayError(f'{source}: "kind" must be one of {", ".join(KINDS)}, got {kind!r}')
    return kind


def _model_replay(data: object, args: argparse.Namespace) -> Callable[[], ExitCode]:
    """Check the model counterexample `data` and resolve its design and backend (usage errors, before the
    watchdog); the returned call makes its runs."""
    from racefuzz.backends import executor, resolve_backend
    from racefuzz.designs import label, load_design
    from racefuzz.report import ReplayFile, render
    from racefuzz.search import explain, judge
    from racefuzz.watchdog import WatchedExecutor

    replay = ReplayFile.from_json(data, str(args.file))
    try:
        design = load_design(replay.design, replay.scenario)
    except InvalidArgument as exc:
        raise ReplayError(f"{args.file}: design {replay.design!r}: {exc}") from None
    try:
        backend = resolve_backend(args.backend or replay.backend)
    except BackendUnavailable as exc:
        if args.backend is None and replay.backend == "cuda":
            raise BackendUnavailable(
                f"{exc}; {args.file} was recorded on cuda: replay it on the simulator with --backend sim"
            ) from None
        raise
    run = WatchedExecutor(executor(backend), backend)

    def runs() -> ExitCode:
        outcomes = [judge(replay.workload, design, replay.schedule, run) for _ in range(args.repeat)]
        manifested = sum(bool(o.corruptions) for o in outcomes)
        shown = next((o for o in outcomes if o.corruptions), outcomes[0])
        if shown.oracle is None:
            print(f"racefuzz replay: {args.file} did not reproduce on {backend} ({args.repeat} run(s)): no race")
            return ExitCode.CLEAN
        shown = explain(shown, backend)
        print(render(shown, design=label(design), backend=backend, replay_path=args.file, scenario=replay.scenario))
        if replay.oracle == "corruption":
            print(f"reproduced the manifested corruption in {manifested}/{args.repeat} run(s) on {backend}")
            if manifested < args.repeat:
                # racefuzz.confirm's rule: a manifestation short of k of k is flaky; the exit 1 stands on the
                # happens-before race, which does not depend on the timing.
                print(f"flaky: the corruption is confirmed only {manifested}/{args.repeat}; the verdict is the race")
        return ExitCode.RACE

    return runs


def _sglang_replay(data: object, args: argparse.Namespace) -> Callable[[], ExitCode]:
    """A `racefuzz sglang --workload search` counterexample: its workload run again on the sglang version it
    names (its sources fetched), with the barrier as the version has it and beside the control, as
    `racefuzz sglang --version V --workload FILE` runs it. Happens-before on a deterministic host program:
    one run (`--repeat` does not apply)."""
    from racefuzz.commands.sglang import DEFAULT_TIMEOUT_S, format_result, run_harness, version_verdict
    from racefuzz.engines.sglang import sources
    from racefuzz.engines.sglang.workload import Workload

    assert isinstance(data, dict)  # replay_kind checked it
    version = data.get("sglang_version")
    if not isinstance(version, str) or version == "unknown":
        raise ReplayError(
            f"{args.file}: names no sglang version (a search of a checkout): run racefuzz sglang --source DIR "
            f"--workload {args.file}"
        )
    try:
        workload = Workload.from_json(data)
    except (ValueError, KeyError, TypeError) as exc:
        raise ReplayError(f"{args.file}: not an sglang workload ({type(exc).__name__}: {exc})") from None
    python_dir = sources.locate(version=version)  # not fetched: one line naming the fetch command
    read_done = data.get("read_done") or "none"

    def runs() -> ExitCode:
        result = run_harness(python_dir, [workload.to_json()], True, version, DEFAULT_TIMEOUT_S, str(read_done))
        result["label"] = version
        print(format_result(result))
        return version_verdict(result, control=True)

    return runs


def _vllm_replay(data: object, args: argparse.Namespace) -> Callable[[], ExitCode]:
    """A `racefuzz vllm` racy workload: run again on the vLLM version it names (its sources fetched) or the
    checkout it names (`source`), beside the control, as `racefuzz vllm --version V --workload FILE` runs it
    (happens-before: one run)."""
    from racefuzz.commands.vllm import DEFAULT_TIMEOUT_S, format_result, run_harness, version_verdict
    from racefuzz.engines.vllm import sources
    from racefuzz.engines.vllm.workload import Workload

    assert isinstance(data, dict)  # replay_kind checked it
    version, source = data.get("vllm_version"), data.get("source")
    if not isinstance(version, str) or (version == "unknown" and not source):
        raise ReplayError(f"{args.file}: names no vLLM version: run racefuzz vllm --source DIR --workload {args.file}")
    try:
        workload = Workload.from_json(data)
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise ReplayError(f"{args.file}: not a vLLM workload ({type(exc).__name__}: {exc})") from None
    # A checkout's run replays on that checkout; a version's on its fetched sources (one line if absent).
    python_dir = sources.locate(source=source) if isinstance(source, str) else sources.locate(version=version)

    def runs() -> ExitCode:
        result = run_harness(python_dir, [workload.to_json()], True, version, DEFAULT_TIMEOUT_S)
        result["label"] = version
        print(format_result(result))
        return version_verdict(result, control=True)

    return runs


def _trace_replay(data: object, args: argparse.Namespace) -> Callable[[], ExitCode]:
    """Ready the trace counterexample of `args.file` (torch present, the recorder's fast path built before the
    watchdog: its first build is not an example's run); the returned call re-runs its step."""
    if args.backend == "sim":
        raise InvalidArgument(
            f"{args.file} is a trace replay file (real code): replay it with --backend cuda, or without "
            "--backend on the device it was recorded on"
        )
    from racefuzz.commands.trace import replay_trace, require_torch
    from racefuzz.trace.search import build_recorder

    require_torch()
    build_recorder()
    return lambda: replay_trace(args.file, args.backend or "auto", args.repeat)
