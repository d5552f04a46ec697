"""`racefuzz replay FILE`: re-run a counterexample and print its report.

On the simulator a replay is deterministic: it reproduces or racefuzz has a bug. On the GPU it runs
`--repeat` times and says how many reproduced the manifested corruption.
"""

from __future__ import annotations

import argparse

from racefuzz.backends import executor, resolve_backend
from racefuzz.designs import load_design
from racefuzz.errors import ReplayError
from racefuzz.exitcodes import ExitCode
from racefuzz.report import load_replay, render
from racefuzz.search import explain, judge


def replay_command(args: argparse.Namespace) -> ExitCode:
    replay = load_replay(args.file)
    try:
        design = load_design(replay.design, replay.scenario)
    except Exception as exc:
        raise ReplayError(f"{args.file}: design {replay.design!r}: {exc}") from None
    backend = resolve_backend(args.backend or replay.backend)
    run = executor(backend)
    outcomes = [judge(replay.workload, design, replay.schedule, run) for _ in range(args.repeat)]
    manifested = sum(bool(o.corruptions) for o in outcomes)
    shown = next((o for o in outcomes if o.corruptions), outcomes[0])
    if shown.oracle is None:
        print(f"racefuzz replay: {args.file} did not reproduce on {backend} ({args.repeat} run(s)): no race")
        return ExitCode.CLEAN
    shown = explain(shown, backend)
    print(render(shown, design=replay.design, backend=backend, replay_path=args.file, scenario=replay.scenario))
    if replay.oracle == "corruption":
        print(f"reproduced the manifested corruption in {manifested}/{args.repeat} run(s) on {backend}")
    return ExitCode.RACE
