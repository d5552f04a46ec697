"""A traced step's report and replay file.

The report is laid out as `racefuzz run`'s (`racefuzz.report.layout`): the greppable header (`====
racefuzz trace: ... ====`), what was recorded and the kernels whose sets were assumed, then every
happens-before race (both launches by kernel, stream and the Python line that launched each, the bytes as
elements, the missing edge in words), and the value oracle's verdict with its shrunk delay points, how it
was confirmed and the command that replays them.

The replay file (JSON) is a `racefuzz run` replay file's format (`racefuzz.report.FORMAT`) of kind
`trace`: it names the step as `module:function`, the device, the watched tensors, the delay points and
the forced orders (`orders`: each {"first": point, "then": point}; a file without it forces none);
`racefuzz replay FILE` (and `racefuzz trace --replay FILE`) re-runs it. A file of the format this replaced
(`racefuzz-trace-replay`, version 1: the same fields without `kind`) is read as one of kind `trace`.

The timeline (`write_timeline`: a Perfetto/Chrome trace and a PNG, through `racefuzz.timeline`) shows the
reference trace in host issue order, one track per stream: one unit per op, not measured time (a traced
run records no device timestamps), with the delay points as spins and the first race's two launches
flagged.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from racefuzz import __version__
from racefuzz.program import Launch
from racefuzz.report import FORMAT, FORMAT_VERSION, Access, RaceAccount, Report, layout, race_lines
from racefuzz.trace.builder import HOST, launch_kind, launch_source, launch_text, sets_assumed
from racefuzz.trace.judge import TraceRace
from racefuzz.trace.oracle import Nondeterminism
from racefuzz.trace.orders import describe_order, schedule_text
from racefuzz.trace.recorder import RunRecord
from racefuzz.trace.search import DelayPoint, TraceResult

KIND = "trace"
"""The `kind` of a real-code counterexample in the shared replay format (a model's is `model`)."""
LEGACY_FORMAT = "racefuzz-trace-replay"
"""The format trace counterexamples had before they shared `FORMAT` (version 1, no `kind`): still read."""
MAX_RACES_SHOWN = 8
MAX_REPLAY_DELAYS = 64
"""Bounds on a replay file's delay points (as `racefuzz trace --max-delays`): a file is input, never trusted."""
MAX_REPLAY_LAUNCH = 10**7
MAX_REPLAY_DELAY_US = 1e7


def render(result: TraceResult, replay_path: Path | None = None) -> str:
    races = result.races
    verdict = ("RACE (value-only)" if result.value_only else "RACE") if result.racy else "no race"
    record = result.reference
    streams = record.builder.streams
    context = [f"recorded {len(record.launch_ops)} launches on streams {', '.join(streams)}"]
    if record.assumed_kernels:
        context.append(
            "read/write sets assumed (every tensor argument read and written over its view; annotate them with "
            "racefuzz.trace.annotate): " + ", ".join(record.assumed_kernels)
        )
    if record.whole_view_indexing:
        context.append(
            "index ops recorded over their whole views (their index values could not be read where they are "
            "the ones the op sees: a conservative set): " + ", ".join(record.whole_view_indexing)
        )
    more = [f"... and {len(races) - MAX_RACES_SHOWN} more"] if len(races) > MAX_RACES_SHOWN else []
    findings = [*latent_lines(result.latent), *_nondeterministic_lines(result)]
    schedule: list[str] = []
    confirmation: list[str] = []
    replay = ""
    if result.candidate_orders:
        shown = ", ".join(describe_order(order) for order in result.candidate_orders[:MAX_RACES_SHOWN])
        more_orders = len(result.candidate_orders) - MAX_RACES_SHOWN
        where = (
            "not searched: they need a GPU"
            if not result.searched
            else f"not searched: {result.orders_unsearched}"
            if result.orders_unsearched
            else "searched"
        )
        findings.append(
            f"forced orders ({where}): {len(result.candidate_orders)} candidate(s) from the races, each making one "
            f"manifest: {shown}" + (f" ... and {more_orders} more" if more_orders > 0 else "")
        )
    if result.infeasible:
        findings.append(
            f"forced orders: {result.infeasible} fuzzed run(s) not judged: a gate timed out (the run did not keep "
            "its orders)"
        )
    if not result.searched:
        findings.append(f"value oracle: not run {result.skipped}")
    elif result.divergence is None:
        tried = f" and {result.replayed} saved delay set(s)" if result.replayed else ""
        findings.append(
            f"value oracle: no divergence from the serialized run in {result.examples} fuzzed run(s){tried}"
        )
    else:
        findings.append(f"value oracle: {result.divergence}")
        schedule.append("  " + schedule_text(result.schedule))
        flaky = "" if result.manifested else ": flaky, not counted as a race (a divergence counts only k of k)"
        confirmation.append(f"  confirmed in {result.confirmed}/{result.confirm_runs} re-run(s){flaky}")
        if result.replayed:
            found = "found by one of them" if result.examples == 0 else f"then {result.examples} fuzzed run(s)"
            confirmation.append(f"  tried first: {result.replayed} saved delay set(s) of the failure database, {found}")
        confirmation.append(
            f"  not without the schedule: {result.serialized_runs} serialized run(s) without delays agree with each "
            "other where the oracle compares"
        )
        if result.value_only:
            confirmation.append(
                "  value-only: happens-before found no unordered pair, yet this schedule changes what the step "
                "stores, k of k, and the step without it does not: an access or a sync racefuzz does not see or "
                "models wrongly (a kernel's annotation, a C++ extension's own stream or sync, memory outside the "
                "recorded storages)"
            )
        if replay_path is not None:
            replay = f"racefuzz trace --replay {replay_path}"
    if result.searched and result.phases:
        findings.append(f"value search {result.statistics_line()}")
    return layout(
        Report(
            tool="racefuzz trace",
            title=f"{verdict} in {result.step} ({result.device})",
            context=tuple(context),
            verdict=(f"happens-before: {len(races)} unordered conflicting pair(s)",),
            races=tuple(race_account(race) for race in races[:MAX_RACES_SHOWN]),
            more_races=tuple(more),
            findings=tuple(findings),
            schedule=tuple(schedule),
            confirmation=tuple(confirmation),
            replay=replay,
        )
    )


def race_account(race: TraceRace) -> RaceAccount:
    """A traced race told in full: both launches by kernel, stream, what they are and the source line that
    issued each (in issue order), the bytes they share as elements of the step's tensors."""

    def launch(side: Launch) -> str:
        assumed = ", sets assumed" if sets_assumed(side) else ""
        return f"{side.kernel} on {side.stream}  ({launch_kind(side)}{assumed})  {launch_source(side)}"

    return RaceAccount(
        accesses=(Access("first", launch(race.first)), Access("second", launch(race.second))),
        shared=("bytes", ", ".join(race.where)),
        missing_edge=race.race.missing_edge(),
        heading=f"{race.race.kind} race between two launches on different streams with no happens-before edge:",
    )


def race_text(race: TraceRace) -> str:
    """`race_account(race)` as the report prints it (for output beside a report: a replay's races)."""
    return "\n".join(race_lines(race_account(race)))


def _nondeterministic_lines(result: TraceResult) -> list[str]:
    return nondeterministic_lines(result.reference, result.nondeterministic, result.serialized_runs)


def nondeterministic_lines(reference: RunRecord, found: Nondeterminism, runs: int) -> list[str]:
    """The launches and outputs of `reference` that differed between `runs` serialized runs without any
    delay, said once (none: no line)."""
    if not found.stores and not found.outputs:
        return []
    ops, launch_ops = reference.builder.ops, reference.launch_ops
    lines = [
        f"nondeterministic without any delay (they differed between {runs} serialized runs; the value oracle "
        "does not compare them, happens-before still judges them):"
    ]
    lines.extend(f"  launch {launch_text(ops[launch_ops[ordinal]])}" for ordinal in found.launches)  # type: ignore[arg-type]
    if found.outputs:
        lines.append("  returned " + ", ".join(repr(name) for name in sorted(found.outputs)))
    return lines


def replay_json(result: TraceResult, watch: tuple[str, ...] = ()) -> dict[str, object]:
    return {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "kind": KIND,
        "racefuzz": __version__,
        "step": result.step,
        "device": result.device,
        "watch": list(watch),
        "delays": [{"stream": s, "launch": n, "us": us} for s, n, us in result.delays],
        "orders": [
            {"first": {"stream": a[0], "launch": a[1]}, "then": {"stream": b[0], "launch": b[1]}}
            for a, b in result.orders
        ],
    }


def write_replay(result: TraceResult, directory: str | os.PathLike[str], watch: tuple[str, ...] = ()) -> Path:
    stem = report_stem(result, directory)
    stem.parent.mkdir(parents=True, exist_ok=True)
    target = stem.parent / f"{stem.name}.json"
    target.write_text(json.dumps(replay_json(result, watch), indent=2) + "\n")
    return target


def load_replay(path: str | os.PathLike[str]) -> tuple[str, str, tuple[str, ...], list[DelayPoint]]:
    """(step spec, device, watch, delays) of a replay file; ValueError if it is not one."""
    data = json.loads(Path(path).read_text())
    if not is_trace_replay(data):
        raise ValueError(f"{path}: not a racefuzz trace replay file")
    if data.get("version") != FORMAT_VERSION:
        raise ValueError(f"format version {data.get('version')!r}; this racefuzz reads version {FORMAT_VERSION}")
    if not isinstance(data["delays"], list) or len(data["delays"]) > MAX_REPLAY_DELAYS:
        raise ValueError(f"'delays' must be a list of at most {MAX_REPLAY_DELAYS} delay points")
    delays = [(str(d["stream"]), int(d["launch"]), float(d["us"])) for d in data["delays"]]
    for stream, launch, us in delays:
        if not 0 <= launch <= MAX_REPLAY_LAUNCH or not math.isfinite(us) or not 0.0 <= us <= MAX_REPLAY_DELAY_US:
            raise ValueError(
                f"delay point ({stream!r}, {launch}, {us}) out of range: launch 0 to {MAX_REPLAY_LAUNCH}, "
                f"microseconds 0 to {MAX_REPLAY_DELAY_US:g}"
            )
    if str(data["device"]) not in ("cpu", "cuda"):
        raise ValueError(f"'device' must be 'cpu' or 'cuda', got {data['device']!r}")
    return str(data["step"]), str(data["device"]), tuple(data.get("watch", ())), delays


def is_trace_replay(data: object) -> bool:
    """Whether `data` (a replay file's JSON) is a trace counterexample: `FORMAT` of kind `trace`, or the
    legacy format."""
    if not isinstance(data, dict):
        return False
    return data.get("format") == LEGACY_FORMAT or (data.get("format") == FORMAT and data.get("kind") == KIND)


def write_timeline(result: TraceResult, stem: Path) -> list[Path]:
    """Write `<stem>.trace.json` and `<stem>.png` (with matplotlib) of the reference trace (see the module
    doc); returns what was written."""
    from racefuzz.backends import HOST as HOST_TRACK
    from racefuzz.backends import Execution, Span
    from racefuzz.program import DeviceSync, EventSync, Launch, StreamSync
    from racefuzz.timeline import write_png, write_trace

    program = result.reference.program
    delayed = {(stream, n): us for stream, n, us in result.delays}
    launches_on: dict[str, int] = {}
    spans = []
    for op in program.ops:
        if isinstance(op, Launch):
            stream = op.stream.name
            n = launches_on.get(stream, 0)
            launches_on[stream] = n + 1
            track = HOST_TRACK if stream == HOST else stream
            if (stream, n) in delayed:
                spans.append(
                    Span(op.index, track, "spin", op.index - 0.5, op.index, f"delay {delayed[stream, n]:g} us")
                )
            spans.append(Span(op.index, track, "kernel", op.index, op.index + 0.9, op.kernel))
        elif isinstance(op, (StreamSync, EventSync, DeviceSync)):
            spans.append(Span(op.index, HOST_TRACK, "sync", op.index, op.index + 0.9, type(op).__name__))
    execution = Execution(observations={}, timeline=spans, host_end_us=float(len(program.ops)))
    race = result.races[0].race if result.races else None
    title = f"racefuzz trace: {result.step} ({result.device}), host issue order (one unit per op, not time)"
    stem.parent.mkdir(parents=True, exist_ok=True)
    written = [write_trace(stem.parent / f"{stem.name}.trace.json", execution, race, title)]
    png = write_png(stem.parent / f"{stem.name}.png", execution, race, title)
    if png is not None:
        written.append(png)
    return written


def report_stem(result: TraceResult, directory: str | os.PathLike[str]) -> Path:
    """Where a result's files go: `<directory>/trace-<module.function>`."""
    return Path(directory) / f"trace-{result.step.replace(':', '.').replace('<', '').replace('>', '')}"


def latent_lines(latent: list[TraceRace]) -> list[str]:
    """The latent lifetime hazards (`racefuzz.trace.judge.judge`), said once, not counted as races."""
    if not latent:
        return []
    lines = [
        f"latent lifetime hazard(s), not counted as races: {len(latent)} use(s) on another stream pending at a "
        "free that no later allocation in the trace reuses (harmless here; a corruption once the program "
        "allocates on the block's stream again: record_stream the tensor, or make that stream wait before the free)"
    ]
    lines.extend(race_text(race) for race in latent[:MAX_RACES_SHOWN])
    if len(latent) > MAX_RACES_SHOWN:
        lines.append(f"... and {len(latent) - MAX_RACES_SHOWN} more")
    return lines
