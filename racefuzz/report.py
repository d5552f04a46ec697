"""Counterexamples as people read and replay them: the text report and the versioned replay file.

The replay file is plain JSON holding everything needed to rebuild the run: racefuzz's version, the
scenario, the design (as loaded: a built-in name or `module:attr`), the workload, the schedule, the
backend and the seed. It is written before the text report and before anything is printed, so a race
found is on disk even if the rest fails.

The text report opens with a fixed, greppable header (`==== racefuzz: ... ====`), then, for the first
race, the writing access and the reading access (stream, kernel, iteration, requests, cells), the value
read against the value expected, the missing ordering edge in plain words, and the command that replays
it.

The layout of a report is written once, here (`Report`, `RaceAccount`, `layout`), for both frontends: a
frontend fills the sections in its own terms -- the model describes a launch by its program op
(`op #N kernel on stream, iteration, requests`), a traced step (`racefuzz.trace.report`) by its kernel,
stream and source line -- and `layout` puts them in one order.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from racefuzz.errors import InvalidArgument, ReplayError
from racefuzz.execution import HOST
from racefuzz.hb import Race
from racefuzz.oracle import UNKNOWN, Corruption, masked_conflict
from racefuzz.program import Launch
from racefuzz.results import Outcome, SearchResult
from racefuzz.scenarios import Scenario, Workload, get_scenario, scenario_spec
from racefuzz.schedule import Schedule

FORMAT = "racefuzz-replay"
FORMAT_VERSION = 1
KIND = "model"
"""The `kind` of this file's replay files; a `racefuzz trace` counterexample shares the format with kind
`trace` (`racefuzz.trace.report`). A file without `kind` is a model's (written before the field)."""
ORACLES = ("corruption", "happens-before", "allocation")
"""The `oracle` a replay file may record: what caught the counterexample (`Outcome.oracle`)."""
MAX_CELLS_SHOWN = 6


@dataclass(frozen=True)
class ReplayFile:
    """The contents of a replay file."""

    design: str
    backend: str
    seed: int
    workload: Workload
    schedule: Schedule
    oracle: str
    racefuzz_version: str
    scenario: Scenario

    def to_json(self) -> dict[str, object]:
        return {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "kind": KIND,
            "racefuzz": self.racefuzz_version,
            "scenario": scenario_spec(self.scenario),
            "design": self.design,
            "backend": self.backend,
            "seed": self.seed,
            "oracle": self.oracle,
            "workload": self.workload.to_json(),
            "schedule": self.schedule.to_json(),
        }

    @classmethod
    def from_json(cls, data: object, source: str) -> ReplayFile:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ReplayError(f'{source}: not a racefuzz replay file (no "format": "{FORMAT}")')
        version = data.get("version")
        if type(version) is not int or version != FORMAT_VERSION:
            kind = "" if type(version) is int else f" (a {type(version).__name__}, not an integer)"
            raise ReplayError(
                f"{source}: replay format version {version!r}{kind}; this racefuzz reads version {FORMAT_VERSION}"
            )
        if data.get("kind", KIND) != KIND:
            raise ReplayError(
                f'{source}: a replay file of kind {data.get("kind")!r}, not a model\'s ("kind": "{KIND}")'
            )
        for name, allowed in (("backend", ("sim", "cuda")), ("oracle", ORACLES)):
            if data.get(name) not in allowed:
                raise ReplayError(f'{source}: "{name}" must be one of {", ".join(allowed)}, got {data.get(name)!r}')
        seed = data.get("seed")
        if type(seed) is not int or not 0 <= seed < 2**32:
            raise ReplayError(f'{source}: "seed" must be an integer in [0, 2**32), got {seed!r}')
        if not isinstance(data.get("design"), str) or not data["design"]:
            raise ReplayError(f'{source}: "design" must be a design name or module:attr, got {data.get("design")!r}')
        spec = data.get("scenario")
        if not isinstance(spec, str):
            raise ReplayError(f'{source}: no scenario named ("scenario" must be a string, got {spec!r})')
        try:
            scenario = get_scenario(spec)
        except InvalidArgument as exc:
            raise ReplayError(f"{source}: {exc}") from None
        for name in ("workload", "schedule"):
            if name not in data:
                raise ReplayError(f'{source}: missing field "{name}"')
        if not isinstance(data.get("racefuzz"), str):
            raise ReplayError(
                f'{source}: "racefuzz" must be the version string that wrote it, got {data.get("racefuzz")!r}'
            )
        try:
            workload = scenario.workload_from_json(data["workload"])
            schedule = Schedule.from_json(data["schedule"])
        except KeyError as exc:
            raise ReplayError(f"{source}: missing field {exc}") from None
        except (InvalidArgument, TypeError, ValueError) as exc:
            raise ReplayError(f"{source}: {exc}") from None
        # Every field stated, none defaulted or coerced: JSON round-trips a workload and a schedule exactly.
        check_round_trip(data["workload"], json.loads(json.dumps(workload.to_json())), f"{source}: workload")
        check_round_trip(data["schedule"], json.loads(json.dumps(schedule.to_json())), f"{source}: schedule")
        return cls(
            design=str(data["design"]),
            backend=str(data["backend"]),
            seed=int(data["seed"]),
            workload=workload,
            schedule=schedule,
            oracle=str(data["oracle"]),
            racefuzz_version=data["racefuzz"],
            scenario=scenario,
        )


MAX_REPLAY_BYTES = 4 * 1024 * 1024
"""The largest replay file read: a search's counterexample is a few kB (256 requests of 256 accept lengths,
the workload's limits, stay under 1 MB), and a bound read first keeps `/dev/zero` or a huge file from
filling memory."""


def read_json_file(path: str | os.PathLike[str], what: str = "replay file") -> object:
    """The JSON value of the regular file `path`, read at most `MAX_REPLAY_BYTES`; a missing, unreadable,
    non-regular (a device, a FIFO, a directory), oversized, non-UTF-8, malformed or too deeply nested file
    is a one-line `ReplayError`."""
    import stat

    try:
        info = os.stat(path)
    except OSError as exc:
        raise ReplayError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ReplayError(f"cannot read {what} {path}: not a regular file")
    if info.st_size > MAX_REPLAY_BYTES:
        raise ReplayError(f"{path}: {info.st_size:,} bytes, more than a {what} holds (at most {MAX_REPLAY_BYTES:,})")
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_REPLAY_BYTES + 1)  # the file may have grown since the stat
    except OSError as exc:
        raise ReplayError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_REPLAY_BYTES:
        raise ReplayError(f"{path}: more than {MAX_REPLAY_BYTES:,} bytes, more than a {what} holds")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ReplayError(f"{path}: not UTF-8 text (byte {exc.start}); a {what} is JSON") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ReplayError(f"{path}: malformed JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:
        raise ReplayError(f"{path}: malformed JSON (nested too deeply)") from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise ReplayError(f"{path}: malformed JSON ({exc})") from None


def check_round_trip(given: object, read_back: object, where: str) -> None:
    """Raise `ReplayError` unless `given` (a replay file's JSON) is exactly what racefuzz writes for the value
    it was read as (`read_back`, that value's JSON): a missing field would otherwise take a default (a
    request without `prompt_len` replays with 4 tokens, another workload than the one that raced)."""
    if isinstance(read_back, dict) and isinstance(given, dict):
        missing = [key for key in read_back if key not in given]
        if missing:
            names = ", ".join(f'"{key}"' for key in missing)
            raise ReplayError(f"{where}: missing field(s) {names} (a replay file states every field)")
        for key, value in read_back.items():
            check_round_trip(given[key], value, f"{where}.{key}")
        return
    if isinstance(read_back, list) and isinstance(given, list) and len(read_back) == len(given):
        for index, (item, back) in enumerate(zip(given, read_back, strict=True)):
            check_round_trip(item, back, f"{where}[{index}]")
        return
    if type(given) is not type(read_back) and not (type(given) in (int, float) and type(read_back) in (int, float)):
        raise ReplayError(f"{where}: expected a {type(read_back).__name__}, got {given!r}")
    if given != read_back:
        raise ReplayError(f"{where}: {given!r} does not read back as itself ({read_back!r})")


def load_replay(path: str | os.PathLike[str]) -> ReplayFile:
    """Read a replay file; any problem is a one-line `ReplayError` (see `read_json_file`, `ReplayFile.from_json`)."""
    return ReplayFile.from_json(read_json_file(path), str(path))


MAX_STEM_CHARS = 80
"""The longest design part of a report file's name: with the digest and suffixes far below the 255 bytes a
file name may have, however long the design's path."""


def file_stem(spec: str) -> str:
    """A design spec as the start of a file name that `ls` shows: only letters, digits, `-`, `_` and `.`, no
    leading dot (`../x/d.py:design` is `x_d.py.design`, not the hidden `.._.._x_d.py.design`), at most
    MAX_STEM_CHARS characters (the end kept: the attribute and file name tell designs apart)."""
    text = spec.replace(":", ".")
    text = re.sub(r"[^A-Za-z0-9._-]", "_", text)
    stem = "_".join(part for part in text.split("_") if part.strip(".")).lstrip(".-")
    return stem[-MAX_STEM_CHARS:].lstrip("._-") or "design"


def write_replay(replay: ReplayFile, report_dir: str | os.PathLike[str]) -> Path:
    """Write `replay` under `report_dir` (created if needed) and return its path. Same content, same name."""
    text = json.dumps(replay.to_json(), indent=2, sort_keys=True) + "\n"
    digest = hashlib.sha256(text.encode()).hexdigest()[:10]
    directory = Path(report_dir)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{file_stem(replay.design)}-{digest}.json"
    path.write_text(text)
    return path


# -- text --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Access:
    """One side of a race, in its frontend's terms."""

    role: str
    """What it does in the race: `write` / `read` (the model), `first` / `second` (a trace, in issue order)."""
    launch: str
    """The launch that makes it, as the frontend describes one."""
    extent: str = ""
    """What this side touches (the model's cells); empty when only the shared part is said."""


@dataclass(frozen=True)
class RaceAccount:
    """One race told in full: an optional heading, both accesses, what they share, notes, the evidence that
    it manifested (the values read), and the missing edge."""

    accesses: tuple[Access, Access]
    shared: tuple[str, str]
    """(label, text): what both touch, e.g. ("shared", the cells) or ("bytes", the elements)."""
    missing_edge: str
    heading: str = ""
    notes: tuple[str, ...] = ()
    evidence: tuple[str, ...] = ()


@dataclass(frozen=True)
class Report:
    """A counterexample report's sections, in the order `layout` writes them. Lines of a section are given
    whole (indented as they are printed); empty sections are left out."""

    tool: str
    """The command that found it, in the header: `racefuzz` or `racefuzz trace`."""
    title: str
    """The header's verdict: what raced where, on what."""
    context: tuple[str, ...] = ()
    """What was examined (a trace's launches and its assumptions)."""
    verdict: tuple[str, ...] = ()
    """The oracles' verdict line(s)."""
    races: tuple[RaceAccount, ...] = ()
    """The races told in full."""
    more_races: tuple[str, ...] = ()
    """The others, a line each, or how many more there are."""
    findings: tuple[str, ...] = ()
    """What else was found beside the races (latent hazards, nondeterminism, the value oracle's verdict)."""
    schedule: tuple[str, ...] = ()
    """The schedule of the counterexample: its workload, delays and forced orders."""
    confirmation: tuple[str, ...] = ()
    """How it was confirmed: re-runs, the runs without the schedule."""
    replay: str = ""
    """The command that replays it (with the file); empty: none was written."""


_LABEL_WIDTH = 8
"""`  write:  ` / `  shared: `: a race's labels padded to one column, an access's extent below its launch."""


def race_lines(race: RaceAccount) -> list[str]:
    """One race as a report tells it (see `RaceAccount`)."""
    lines = [race.heading] if race.heading else []
    for access in race.accesses:
        lines.append(f"  {access.role + ':':<{_LABEL_WIDTH}}{access.launch}")
        if access.extent:
            lines.append(f"  {'':<{_LABEL_WIDTH}}{access.extent}")
    label, shared = race.shared
    lines.append(f"  {label + ':':<{_LABEL_WIDTH}}{shared}")
    lines.extend(race.notes)
    lines.extend(race.evidence)
    lines.append(f"  missing edge: {race.missing_edge}")
    return lines


def layout(report: Report) -> str:
    """The text of a report: the header, then each section of `Report` in its order."""
    lines = [f"==== {report.tool}: {report.title} ====", *report.context, *report.verdict]
    for race in report.races:
        lines.extend(race_lines(race))
    lines.extend((*report.more_races, *report.findings, *report.schedule, *report.confirmation))
    if report.replay:
        lines.append(f"  replay: {report.replay}")
    return "\n".join(lines)


def _where(launch: Launch) -> str:
    info = launch.info
    parts = [f"op #{launch.index}", launch.kernel, f"on {launch.stream}"]
    if "iteration" in info:
        parts.append(f"iteration {info['iteration']}")
    if "requests" in info:
        parts.append(f"requests {info['requests']}")
    return "  ".join(parts)


def _cells(cells) -> str:
    return ", ".join(str(c) for c in cells)


def primary_race(outcome: Outcome) -> Race | None:
    """The race the report leads with: one between the first corrupted read and the launch whose store
    explains it, else any race of that read, else the first race."""
    if outcome.corruptions:
        corruption = outcome.corruptions[0]
        of_read = [r for r in outcome.races if corruption.read.index in (r.first.index, r.second.index)]
        for race in of_read:
            if {race.first.index, race.second.index} & set(corruption.culprits):
                return race
        if of_read:
            return of_read[0]
    return outcome.races[0] if outcome.races else None


def _corruption_lines(corruption: Corruption, outcome: Outcome) -> list[str]:
    ops = outcome.program.ops
    lines = []
    writers = corruption.observed_writers or (None,) * len(corruption.cells)
    shown = zip(
        corruption.cells, corruption.observed, corruption.expected, writers, corruption.expected_writers, strict=False
    )
    for (row, col), got, want, got_by, want_by in list(shown)[:MAX_CELLS_SHOWN]:
        table = corruption.read.reads[corruption.range_index].buffer.name
        got_from = "" if got_by is None else f" (stored by {_writer(ops, got_by)})"
        lines.append(
            f"    {table}[{row}, {col}] read {got}{got_from}, expected {want} (stored by {_writer(ops, want_by)})"
        )
    hidden = len(corruption.cells) - MAX_CELLS_SHOWN
    if hidden > 0:
        lines.append(f"    ... and {hidden} more cells")
    return lines


def _writer(ops, index: int) -> str:
    if index == UNKNOWN:
        return "an unidentified launch: the value is not unique"
    if index < 0:
        return "nobody: the table's initial fill"
    launch = ops[index]
    return f"op #{index} {launch.kernel} on {launch.stream}"


def render(outcome: Outcome, *, design: str, backend: str, replay_path: Path | None, scenario: Scenario) -> str:
    """The text report of a counterexample of `scenario`."""
    race = primary_race(outcome)
    kind = race.kind.value if race else ("allocation" if outcome.violations else "ordering")
    table = race.cells[0].buffer.name if race else scenario.table
    what = f"{kind} race on" if race else f"{kind} violation in"
    verdict = []
    if outcome.corruptions:
        verdict.append(
            f"verdict: manifested corruption: {len(outcome.corruptions)} read range(s) differ from the sequential "
            f"reference; happens-before: {len(outcome.races)} unordered conflicting pair(s)"
        )
    elif outcome.races:
        verdict.append(
            f"verdict: happens-before: {len(outcome.races)} unordered conflicting pair(s), not manifested under "
            "this schedule"
        )
    verdict.extend(f"  allocation: {violation}" for violation in outcome.violations[:5])
    values = []
    for corruption in outcome.corruptions[:3]:
        values.append(f"  values read by op #{corruption.read.index} {corruption.read.kernel}:")
        values.extend(_corruption_lines(corruption, outcome))
    others = [r for r in outcome.races if r is not race]
    more = [f"  other unordered pairs ({len(others)}):"] if others else []
    more.extend(f"    {other}" for other in others[:5])
    if len(others) > 5:
        more.append(f"    ... and {len(others) - 5} more")
    return layout(
        Report(
            tool="racefuzz",
            title=f"{what} {table} (design {design}, backend {backend})",
            verdict=tuple(verdict),
            # The values read are the evidence of the race told in full; with no race, they stand alone.
            races=() if race is None else (race_account(race, tuple(values)),),
            more_races=tuple(more) if race is not None else (*values, *more),
            schedule=tuple(_schedule_lines(outcome, scenario)),
            replay="" if replay_path is None else f"racefuzz replay {replay_path}",
        )
    )


def race_account(race: Race, evidence: tuple[str, ...] = ()) -> RaceAccount:
    """The model's race told in full: the writer and the reader by their program ops, with their cells."""
    writer, reader = (race.second, race.first) if race.kind.value == "WAR" else (race.first, race.second)
    notes = []
    if masked_conflict(race):
        notes.append(
            "  masked column: ordering conflict, no corruption (the reader loads these cells but does not use "
            "their values)"
        )
    if HOST in (writer.stream.name, reader.stream.name):
        notes.append("  host: one side is the host itself; only a host-side sync can order it")
    if race.kind.value == "WAW":  # two writers: each by what it writes (a WAW has no reader)
        accesses = (
            Access("write", _where(race.first), f"cells {_cells(race.first.writes)}"),
            Access("write", _where(race.second), f"cells {_cells(race.second.writes)}"),
        )
    else:
        accesses = (
            Access("write", _where(writer), f"cells {_cells(writer.writes)}"),
            Access("read", _where(reader), f"cells {_cells(reader.reads)}"),
        )
    return RaceAccount(
        accesses=accesses,
        shared=("shared", _cells(race.cells)),
        missing_edge=race.missing_edge(),
        notes=tuple(notes),
        evidence=evidence,
    )


def _schedule_lines(outcome: Outcome, scenario: Scenario) -> list[str]:
    """The counterexample's workload and delays, and its forced orders against issue order."""
    w, s = outcome.workload, outcome.schedule
    ops = outcome.program.ops

    def at(index: int) -> str:
        op = ops[index]
        it = op.info.get("iteration") if isinstance(op, Launch) else None
        return f"op #{index} {getattr(op, 'kernel', type(op).__name__)}" + ("" if it is None else f", iteration {it}")

    delays = [f"spin {v:g} us on the stream before {at(k)}" for k, v in s.device_delays.items()]
    delays += [f"read spin {v:g} us inside {at(k)}" for k, v in s.read_spins.items()]
    delays += [f"host delay {v:g} us before {at(k)}" for k, v in s.host_delays.items()]
    lines = [
        f"  counterexample: {scenario.describe(w)}; {s.nonzero_delays} non-zero delay(s)"
        + (f": {'; '.join(delays)}" if delays else "")
    ]
    # Forced orders against issue order are what the counterexample chose; the others keep issue order.
    inverted = [(a, b) for a, b in s.orders if a > b]
    for first, then in inverted:
        lines.append(f"  forced: {at(first)} finished before {at(then)} started (a gate)")
    if len(s.orders) > len(inverted):
        lines.append(f"  forced in issue order (gates): {len(s.orders) - len(inverted)} other racing pair(s)")
    return lines


def save_counterexample(
    result: SearchResult, seed: int, report_dir: str | os.PathLike[str]
) -> tuple[Path, str, list[Path]]:
    """Write a search's counterexample: the replay file first (so it is on disk before anything else can
    fail), then the text report, then the timeline. Returns the replay path, the report and the timeline
    files."""
    from racefuzz import __version__
    from racefuzz.designs import label
    from racefuzz.timeline import write_timeline

    outcome, design = result.counterexample, result.design
    assert outcome is not None and outcome.oracle is not None
    replay = ReplayFile(
        design.spec,
        result.backend,
        seed,
        outcome.workload,
        outcome.schedule,
        outcome.oracle,
        __version__,
        design.scenario,
    )
    path = write_replay(replay, report_dir)
    text = render(outcome, design=label(design), backend=result.backend, replay_path=path, scenario=design.scenario)
    path.with_suffix(".txt").write_text(text + "\n")
    race = primary_race(outcome)
    title = f"{design.name}: {race.kind} {race.first.kernel} -> {race.second.kernel}" if race else design.name
    timeline = write_timeline(outcome, result.backend, race, path.parent / path.stem, title)
    return path, text, timeline
