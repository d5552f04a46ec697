"""Counterexamples as people read and replay them: the text report and the versioned replay file.

The replay file is plain JSON holding everything needed to rebuild the run: racefuzz's version, the
scenario, the design (as loaded: a built-in name or `module:attr`), the workload, the schedule, the
backend and the seed. It is written before the text report and before anything is printed, so a race
found is on disk even if the rest fails.

The text report opens with a fixed, greppable header (`==== racefuzz: ... ====`), then, for the first
race, the writing access and the reading access (stream, kernel, iteration, requests, cells), the value
read against the value expected, the missing ordering edge in plain words, and the command that replays
it.
"""

from __future__ import annotations

import hashlib
import json
import os
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
        try:
            return cls(
                design=str(data["design"]),
                backend=str(data["backend"]),
                seed=int(data["seed"]),
                workload=scenario.workload_from_json(data["workload"]),
                schedule=Schedule.from_json(data["schedule"]),
                oracle=str(data["oracle"]),
                racefuzz_version=str(data.get("racefuzz", "?")),
                scenario=scenario,
            )
        except KeyError as exc:
            raise ReplayError(f"{source}: missing field {exc}") from None
        except (InvalidArgument, TypeError, ValueError) as exc:
            raise ReplayError(f"{source}: {exc}") from None


def load_replay(path: str | os.PathLike[str]) -> ReplayFile:
    """Read a replay file; any problem is a one-line `ReplayError`."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ReplayError(f"cannot read replay file {path}: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ReplayError(f"{path}: malformed JSON ({exc.msg} at line {exc.lineno})") from None
    return ReplayFile.from_json(data, str(path))


def write_replay(replay: ReplayFile, report_dir: str | os.PathLike[str]) -> Path:
    """Write `replay` under `report_dir` (created if needed) and return its path. Same content, same name."""
    text = json.dumps(replay.to_json(), indent=2, sort_keys=True) + "\n"
    digest = hashlib.sha256(text.encode()).hexdigest()[:10]
    directory = Path(report_dir)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{replay.design.replace(':', '.').replace('/', '_')}-{digest}.json"
    path.write_text(text)
    return path


# -- text --------------------------------------------------------------------------------------------------


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
    lines = [f"==== racefuzz: {what} {table} (design {design}, backend {backend}) ===="]
    if outcome.corruptions:
        lines.append(
            f"verdict: manifested corruption: {len(outcome.corruptions)} read range(s) differ from the sequential "
            f"reference; happens-before: {len(outcome.races)} unordered conflicting pair(s)"
        )
    elif outcome.races:
        lines.append(
            f"verdict: happens-before: {len(outcome.races)} unordered conflicting pair(s), not manifested under "
            "this schedule"
        )
    for violation in outcome.violations[:5]:
        lines.append(f"  allocation: {violation}")
    if race is not None:
        writer, reader = (race.second, race.first) if race.kind.value == "WAR" else (race.first, race.second)
        lines.append(f"  write:  {_where(writer)}")
        lines.append(f"          cells {_cells(writer.writes)}")
        lines.append(f"  read:   {_where(reader)}")
        lines.append(f"          cells {_cells(reader.reads)}")
        lines.append(f"  shared: {_cells(race.cells)}")
        if masked_conflict(race):
            lines.append(
                "  masked column: ordering conflict, no corruption (the reader loads these cells but does not use "
                "their values)"
            )
        if HOST in (writer.stream.name, reader.stream.name):
            lines.append("  host: one side is the host itself; only a host-side sync can order it")
    for corruption in outcome.corruptions[:3]:
        lines.append(f"  values read by op #{corruption.read.index} {corruption.read.kernel}:")
        lines.extend(_corruption_lines(corruption, outcome))
    if race is not None:
        lines.append(f"  missing edge: {race.missing_edge()}")
    others = [r for r in outcome.races if r is not race]
    if others:
        lines.append(f"  other unordered pairs ({len(others)}):")
        for other in others[:5]:
            lines.append(f"    {other}")
        if len(others) > 5:
            lines.append(f"    ... and {len(others) - 5} more")
    w, s = outcome.workload, outcome.schedule
    ops = outcome.program.ops

    def at(index: int) -> str:
        op = ops[index]
        it = op.info.get("iteration") if isinstance(op, Launch) else None
        return f"op #{index} {getattr(op, 'kernel', type(op).__name__)}" + ("" if it is None else f", iteration {it}")

    delays = [f"spin {v:g} us on the stream before {at(k)}" for k, v in s.device_delays.items()]
    delays += [f"read spin {v:g} us inside {at(k)}" for k, v in s.read_spins.items()]
    delays += [f"host delay {v:g} us before {at(k)}" for k, v in s.host_delays.items()]
    lines.append(
        f"  counterexample: {scenario.describe(w)}; {s.nonzero_delays} non-zero delay(s)"
        + (f": {'; '.join(delays)}" if delays else "")
    )
    # Forced orders against issue order are what the counterexample chose; the others keep issue order.
    inverted = [(a, b) for a, b in s.orders if a > b]
    for first, then in inverted:
        lines.append(f"  forced: {at(first)} finished before {at(then)} started (a gate)")
    if len(s.orders) > len(inverted):
        lines.append(f"  forced in issue order (gates): {len(s.orders) - len(inverted)} other racing pair(s)")
    if replay_path is not None:
        lines.append(f"  replay: racefuzz replay {replay_path}")
    return "\n".join(lines)


def save_counterexample(
    result: SearchResult, seed: int, report_dir: str | os.PathLike[str]
) -> tuple[Path, str, list[Path]]:
    """Write a search's counterexample: the replay file first (so it is on disk before anything else can
    fail), then the text report, then the timeline. Returns the replay path, the report and the timeline
    files."""
    from racefuzz import __version__
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
    text = render(outcome, design=design.spec, backend=result.backend, replay_path=path, scenario=design.scenario)
    path.with_suffix(".txt").write_text(text + "\n")
    race = primary_race(outcome)
    title = f"{design.name}: {race.kind} {race.first.kernel} -> {race.second.kernel}" if race else design.name
    timeline = write_timeline(outcome, result.backend, race, path.parent / path.stem, title)
    return path, text, timeline
