"""`racefuzz replay FILE`: re-run a counterexample and print its report.

On the simulator a replay is deterministic: it reproduces or racefuzz has a bug. On the GPU it runs
`--repeat` times and says how many reproduced the manifested corruption. Every field of the file is checked
against its documented range before anything runs (`racefuzz.report.ReplayFile.from_json`). A replay file
of `racefuzz trace` (real code) is re-run by `racefuzz.commands.trace.replay_trace`, as `racefuzz trace
--replay FILE` does.
"""

from __future__ import annotations

import argparse

from racefuzz.errors import BackendUnavailable, ExampleTimeout, InvalidArgument, ReplayError
from racefuzz.exitcodes import ExitCode


def replay_command(args: argparse.Namespace) -> ExitCode:
    from racefuzz.backends import executor, resolve_backend
    from racefuzz.designs import label, load_design
    from racefuzz.report import ReplayFile, read_json_file, render
    from racefuzz.search import explain, judge
    from racefuzz.watchdog import StopRequested, WatchedExecutor, stoppable

    data = read_json_file(args.file)  # bounded, regular files only: `racefuzz replay /dev/zero` is one line
    if _is_trace_replay(data):
        if args.backend == "sim":
            raise InvalidArgument(
                f"{args.file} is a trace replay file (real code): replay it with --backend cuda, or without "
                "--backend on the device it was recorded on"
            )
        from racefuzz.commands.trace import replay_trace, require_torch
        from racefuzz.trace.search import build_recorder

        require_torch()
        build_recorder()  # before the watchdog: the fast path's first build is not an example's run
        try:
            with stoppable(args.example_timeout):  # a replayed step that never returns is abandoned
                return replay_trace(args.file, args.backend or "auto", args.repeat)
        except StopRequested as stop:
            if stop.reason == "timeout":
                raise ExampleTimeout(stop.detail) from None
            raise
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
    try:
        with stoppable(args.example_timeout):  # a hung hook or kernel is abandoned, Ctrl-C stops between runs
            outcomes = [judge(replay.workload, design, replay.schedule, run) for _ in range(args.repeat)]
    except StopRequested as stop:
        if stop.reason == "timeout":
            raise ExampleTimeout(stop.detail) from None
        raise
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


def _is_trace_replay(data: object) -> bool:
    """Whether `data` (a replay file's JSON) is a `racefuzz trace` replay file."""
    from racefuzz.trace.report import FORMAT

    return isinstance(data, dict) and data.get("format") == FORMAT
