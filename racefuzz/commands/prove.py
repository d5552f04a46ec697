"""`racefuzz prove`: every workload up to a stated size judged by happens-before (`racefuzz.prove`).

A clean design is reported as proved for exactly the bound enumerated, each iteration count separately,
beside the negative control judged over the same bound (it must race somewhere in it, or the bound is too
small to say anything: INCONCLUSIVE). `--mutants` instead checks that every killable mutant races
somewhere in the bound.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from racefuzz.commands import argtypes
from racefuzz.designs import Design, load_design
from racefuzz.errors import InvalidArgument
from racefuzz.exitcodes import ExitCode
from racefuzz.outputs import DEFAULT_REPORT_DIR, check_output_dir, check_output_file, fallback_dir, write_text
from racefuzz.progress import LINE_EVERY_S

if TYPE_CHECKING:
    from racefuzz.prove import Proof

DEFAULT_MAX_BYTES = 18
DEFAULT_ALPHABET = 2
DEFAULT_ITERATIONS = "1-4"


MAX_PROVED_ITERATIONS = 64
"""The most iterations a bounded proof takes (each count is a proof of its own)."""


def _iterations(text: str) -> tuple[int, ...]:
    """`3` or `1-4`: the fixed iteration counts to prove each."""
    low, _, high = text.partition("-")
    try:
        first, last = int(low), int(high or low)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--iterations takes N or A-B, got {text!r}") from None
    if not 1 <= first <= last <= MAX_PROVED_ITERATIONS:
        raise argparse.ArgumentTypeError(f"--iterations: need 1 <= A <= B <= {MAX_PROVED_ITERATIONS}, got {text!r}")
    return tuple(range(first, last + 1))


def add_parser(command: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """Add the `prove` subcommand through the CLI's subcommand factory."""
    p = command("prove", "prove a design race-free for every workload up to a size (happens-before)")
    p.add_argument("--scenario", default=None, help="built-in scenario name or module:attr (default sglang-overlap)")
    p.add_argument("--design", default=None, help="the design to prove (default: the scenario's default design)")
    p.add_argument("--hazards", default=None, help="comma-separated hazards (default: the scenario's hazards)")
    p.add_argument(
        "--max-bytes",
        type=argtypes.bounded_int(0, 64, "a non-negative integer"),
        default=DEFAULT_MAX_BYTES,
        help=f"longest workload byte string (default {DEFAULT_MAX_BYTES})",
    )
    p.add_argument(
        "--alphabet",
        type=argtypes.bounded_int(1, 256, "an integer from 1"),
        default=DEFAULT_ALPHABET,
        help=f"every byte below this (default {DEFAULT_ALPHABET})",
    )
    p.add_argument(
        "--iterations",
        type=_iterations,
        default=_iterations(DEFAULT_ITERATIONS),
        help=f"iteration counts, each proved separately: N or A-B (default {DEFAULT_ITERATIONS})",
    )
    p.add_argument("--mutants", action="store_true", help="check instead that every killable mutant races in the bound")
    p.add_argument("--json", type=argtypes.path, help="write the proofs here")
    p.add_argument(
        "--report-dir",
        type=argtypes.path,
        default=Path(DEFAULT_REPORT_DIR),
        help=f"where a racing workload's replay file goes (default {DEFAULT_REPORT_DIR}/; checked before the proof)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines")


def _bound(args: argparse.Namespace, **options: object) -> dict[str, object]:
    """`prove`'s bound keywords: one option set per iteration count (plus `options`, e.g. a forced plan stream)."""
    return {
        "max_bytes": args.max_bytes,
        "alphabet": args.alphabet,
        "option_sets": [{"fixed_iterations": True, "max_iterations": n, **options} for n in args.iterations],
    }


def _say(line: str) -> None:
    print(line, flush=True)


def prove_command(args: argparse.Namespace) -> int:
    from racefuzz.prove import prove
    from racefuzz.scenarios import get_scenario

    if args.json is not None:
        args.json = check_output_file(args.json, "--json")  # before the work, not after it
    args.report_dir = check_output_dir(args.report_dir, "--report-dir")
    scenario = get_scenario(args.scenario)
    results: dict[str, object] = {"bound": _bound(args)}
    if args.mutants:
        code = _prove_mutants(args, scenario, results)
    else:
        design = load_design(args.design or scenario.default_design, scenario)
        scenario = design.scenario  # a user's design names its own
        hazards = tuple(h for h in (args.hazards or ",".join(scenario.hazards)).split(",") if h)
        # A mutant states the hazards and plan stream its bug needs; an explicit --hazards wins.
        if args.hazards is None and getattr(design.hooks, "hazards", None):
            hazards = tuple(design.hooks.hazards)
        plan_stream = getattr(design.hooks, "plan_stream", None)
        options = {} if plan_stream is None else {"plan_stream": plan_stream}
        with _progress(args, design.name) as on_progress:
            proof = prove(design, hazards=hazards, on_progress=on_progress, **_bound(args, **options))  # type: ignore[arg-type]
        control_design = load_design(scenario.control_design, scenario)
        with _progress(args, f"the negative control {control_design.name}") as on_progress:
            control = prove(control_design, hazards=hazards, on_progress=on_progress, **_bound(args, **options))  # type: ignore[arg-type]
        results.update(design=proof.to_json(), control=control.to_json())
        _say(_line(proof))
        _say(f"negative control {scenario.control_design}: {control.racing:,} of {control.workloads:,} workloads race")
        if proof.racing:
            code = ExitCode.RACE
            for c in proof.counterexamples:
                # describe() summarizes; the workload's JSON tells apart those it summarizes alike.
                exact = json.dumps(c.workload.to_json(), separators=(",", ":"))
                _say(f"  racing workload ({c.options}): {scenario.describe(c.workload)} {exact}: {c.what}")
            replay_path = _save(design, proof.counterexamples[0].workload, args)
            _say(f"  replay the first: racefuzz replay {replay_path}")
        elif not control.racing:
            _say("INCONCLUSIVE: the control races nowhere in this bound; the proof says nothing")
            code = ExitCode.INCONCLUSIVE
        else:
            code = ExitCode.CLEAN
    if args.json is not None:
        text = json.dumps(results, indent=1) + "\n"
        try:
            write_text(args.json, text)
        except OSError as exc:
            kept = fallback_dir() / args.json.name
            write_text(kept, text)
            _say(f"racefuzz: could not write --json {args.json} ({exc.strerror}); written to {kept} instead")
    return code


@contextmanager
def _progress(args: argparse.Namespace, label: str) -> Iterator[Callable[[int], None] | None]:
    """A progress callback for `prove` (workloads judged so far): a line on stderr at most every
    `LINE_EVERY_S` seconds, so that a proof of minutes is not silent; None with --quiet."""
    if args.quiet:
        yield None
        return
    started = time.monotonic()
    next_line = started + LINE_EVERY_S
    print(
        f"racefuzz: proving {label}: every workload of up to {args.max_bytes} bytes below {args.alphabet}, "
        f"iterations {args.iterations[0]}-{args.iterations[-1]}",
        file=sys.stderr,
        flush=True,
    )

    def line(judged: int) -> None:
        nonlocal next_line
        now = time.monotonic()
        if now >= next_line:
            next_line = now + LINE_EVERY_S
            print(
                f"racefuzz: proving {label}: {judged:,} workloads judged, {now - started:.0f} s",
                file=sys.stderr,
                flush=True,
            )

    yield line


def _save(design: Design, workload: object, args: argparse.Namespace) -> Path:
    """A racing workload's replay file (no delays: happens-before races under every schedule), as `racefuzz
    run` writes a counterexample's; to a temporary directory if --report-dir cannot be written after all."""
    from racefuzz import __version__
    from racefuzz.report import ReplayFile, write_replay
    from racefuzz.schedule import NO_DELAYS

    replay = ReplayFile(design.spec, "sim", 0, workload, NO_DELAYS, "happens-before", __version__, design.scenario)  # type: ignore[arg-type]
    try:
        return write_replay(replay, args.report_dir)
    except OSError as exc:
        elsewhere = fallback_dir()
        print(
            f"racefuzz: error: cannot write to --report-dir {args.report_dir} ({exc.strerror or exc}); "
            f"the replay file goes to {elsewhere}",
            file=sys.stderr,
        )
        return write_replay(replay, elsewhere)


def _line(proof: Proof) -> str:
    verdict = "PROVED race-free" if proof.proved else f"NOT race-free: {proof.racing:,} racing workload(s)"
    return f"{proof.design}: {verdict} for {proof.covers()} ({proof.seconds:.1f} s)"


def _prove_mutants(args: argparse.Namespace, scenario: object, results: dict[str, object]) -> int:
    from racefuzz.prove import prove

    mutants = scenario.mutants()  # type: ignore[attr-defined]
    rows = []
    missed = []
    for name, mutant in mutants.items():
        if getattr(mutant, "equivalent", None):
            continue
        hazards = tuple(getattr(mutant, "hazards", scenario.hazards))  # type: ignore[attr-defined]
        plan_stream = getattr(mutant, "plan_stream", None)
        options = {} if plan_stream is None else {"plan_stream": plan_stream}
        try:
            proof = prove(load_design(name, scenario), hazards=hazards, keep=1, **_bound(args, **options))  # type: ignore[arg-type]
        except InvalidArgument as exc:
            raise InvalidArgument(f"{name}: {exc}") from None
        found = proof.counterexamples[0] if proof.counterexamples else None
        rows.append({**proof.to_json(), "mutant": name})
        _say(
            f"{name}: "
            + (
                f"races in {proof.racing:,} of {proof.workloads:,} workloads, e.g. "
                f"{scenario.describe(found.workload)} ({found.options}): {found.what}"  # type: ignore[attr-defined]
                if found
                else f"NOT FOUND in {proof.workloads:,} workloads"
            )
        )
        if found is None:
            missed.append(name)
    results["mutants"] = rows
    print(f"{len(rows) - len(missed)} of {len(rows)} killable mutants race in the bound", file=sys.stderr)
    return ExitCode.CLEAN if not missed else ExitCode.INCONCLUSIVE
