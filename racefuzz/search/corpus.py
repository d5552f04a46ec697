"""Failures a search found, kept in a Hypothesis example database and tried first on the next run.

Hypothesis keeps a test's failing examples in its example database and replays them before generating
anything -- but not for seeded tests, and racefuzz searches are seeded (the same seed draws the same
examples). So racefuzz keeps its own entries in the same kind of database: any
`hypothesis.database.ExampleDatabase` (a local `DirectoryBasedExampleDatabase(".hypothesis/examples")`,
the default of Hypothesis' settings; a `RedisExampleDatabase` or a `GitHubArtifactDatabase` shared by a CI
fleet; a `MultiplexedDatabase` of several). An entry is one example's draw -- (workload bytes, schedule
bytes) -- under a key that names everything that decides what those bytes mean: the scenario, the design,
the hazards and workload options, the delay strategy and its parameters.

A saved entry that no longer fails (the design was fixed) is deleted, as Hypothesis does with its own.

`racefuzz trace` keeps its failures in the same database (`TraceCorpus`): an entry is a failing delay set
of a traced step -- its (stream, n-th launch on it, microseconds) points, which name launches by
themselves, so the key is only what the step is: its `module:function`, the device and the watched
tensors. A step over drawn workloads (`fuzz(step, workloads=...)`) keeps its failing workloads there
too (`WorkloadCorpus`): an entry is the shrunk workload's Hypothesis choice sequence, keyed by the step and
the strategy that gives the sequence its meaning.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from racefuzz.search.pipeline import Draw

if TYPE_CHECKING:
    from hypothesis.database import ExampleDatabase

KEY_PREFIX = b"racefuzz-search."


def corpus_key(**what: object) -> bytes:
    """The database key of a search: a digest of everything that gives its drawn bytes their meaning."""
    text = json.dumps({k: _plain(v) for k, v in what.items()}, sort_keys=True)
    return KEY_PREFIX + hashlib.sha256(text.encode()).hexdigest()[:32].encode()


def _plain(value: object) -> object:
    if isinstance(value, (frozenset, set)):
        return sorted(value)  # type: ignore[type-var]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in sorted(value.items())}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)


class Corpus:
    """The saved failures of one search key in `database` (None: nothing is saved or replayed)."""

    def __init__(self, database: ExampleDatabase | None, key: bytes) -> None:
        self.database = database
        self.key = key

    def saved(self) -> list[Draw]:
        """The saved draws, oldest encoding first; entries this racefuzz cannot read are skipped."""
        if self.database is None:
            return []
        draws = []
        for value in self.database.fetch(self.key):
            draw = _decode(value)
            if draw is not None:
                draws.append(draw)
        return sorted(draws, key=lambda d: (len(d[0]) + len(d[1]), d))

    def save(self, draw: Draw) -> None:
        if self.database is not None:
            self.database.save(self.key, _encode(draw))

    def delete(self, draws: Iterable[Draw]) -> None:
        if self.database is not None:
            for draw in draws:
                self.database.delete(self.key, _encode(draw))


def _encode(draw: Draw) -> bytes:
    return json.dumps({"workload": draw[0].hex(), "schedule": draw[1].hex()}, sort_keys=True).encode()


def _decode(value: bytes) -> Draw | None:
    try:
        data = json.loads(value)
        return bytes.fromhex(data["workload"]), bytes.fromhex(data["schedule"])
    except (ValueError, KeyError, TypeError):
        return None


TracePoint = tuple[str, int, float]
"""A delay point of a traced step: (stream, n-th launch on it, microseconds of spin before it)."""


def trace_corpus_key(step: str, device: str, watch: Sequence[str]) -> bytes:
    """The database key of a traced step's failures."""
    return corpus_key(frontend="trace", step=step, device=device, watch=sorted(watch))


class TraceCorpus:
    """The saved failing delay sets of one traced step in `database` (None: nothing saved or replayed):
    what `racefuzz.trace.search.fuzz` takes as `saved`."""

    def __init__(self, database: ExampleDatabase | None, key: bytes) -> None:
        self.database = database
        self.key = key

    def saved(self) -> list[list[TracePoint]]:
        """The saved delay sets, fewest points first; entries this racefuzz cannot read are skipped."""
        if self.database is None:
            return []
        found = [delays for value in self.database.fetch(self.key) if (delays := _decode_delays(value)) is not None]
        return sorted(found, key=lambda delays: (len(delays), delays))

    def save(self, delays: Sequence[TracePoint]) -> None:
        if self.database is not None:
            self.database.save(self.key, _encode_delays(delays))

    def delete(self, delays: Sequence[TracePoint]) -> None:
        if self.database is not None:
            self.database.delete(self.key, _encode_delays(delays))


def _encode_delays(delays: Sequence[TracePoint]) -> bytes:
    return json.dumps({"delays": [[stream, n, us] for stream, n, us in delays]}, sort_keys=True).encode()


def _decode_delays(value: bytes) -> list[TracePoint] | None:
    try:
        points = json.loads(value)["delays"]
        delays = [(str(stream), int(n), float(us)) for stream, n, us in points]
    except (ValueError, KeyError, TypeError):
        return None
    return delays if _encode_delays(delays) == value else None  # exactly what `save` writes, nothing coerced


def workload_corpus_key(step: str, device: str, watch: Sequence[str], strategy: object) -> bytes:
    """The database key of a step's failing drawn workloads: the step and what gives a saved choice
    sequence its meaning, the strategy it was drawn from (by its repr, which names its parts and bounds)."""
    return corpus_key(
        frontend="trace-workloads", step=step, device=device, watch=sorted(watch), strategy=repr(strategy)
    )


class WorkloadCorpus:
    """The saved failing workloads of one step over drawn workloads in `database` (None: nothing saved or
    replayed): what `racefuzz.trace.search.fuzz` takes as `saved_workloads`. An entry is the workload's
    Hypothesis choice sequence (what replays it through the strategy) and, for whoever reads the database,
    the workload itself as JSON where it has one (`to_json()`, or a plain JSON value)."""

    def __init__(self, database: ExampleDatabase | None, key: bytes) -> None:
        self.database = database
        self.key = key

    def saved(self) -> list[tuple[object, ...]]:
        """The saved choice sequences, shortest first; entries this racefuzz cannot read are skipped."""
        if self.database is None:
            return []
        found = [choices for value in self.database.fetch(self.key) if (choices := _decode_choices(value)) is not None]
        return sorted(found, key=lambda choices: (len(choices), repr(choices)))

    def save(self, choices: tuple[object, ...], workload: object) -> None:
        if self.database is not None:
            self.database.save(self.key, _encode_choices(choices, workload))

    def delete(self, choices: tuple[object, ...]) -> None:
        if self.database is not None:
            for value in list(self.database.fetch(self.key)):
                if _decode_choices(value) == tuple(choices):
                    self.database.delete(self.key, value)


def _encode_choices(choices: tuple[object, ...], workload: object) -> bytes:
    from hypothesis.database import choices_to_bytes

    as_json = workload.to_json() if callable(getattr(workload, "to_json", None)) else workload  # type: ignore[attr-defined]
    try:
        json.dumps(as_json)
    except (TypeError, ValueError):
        as_json = repr(workload)
    return json.dumps({"choices": choices_to_bytes(choices).hex(), "workload": as_json}, sort_keys=True).encode()


def _decode_choices(value: bytes) -> tuple[object, ...] | None:
    from hypothesis.database import choices_from_bytes

    try:
        choices = choices_from_bytes(bytes.fromhex(json.loads(value)["choices"]))
    except (ValueError, KeyError, TypeError):
        return None
    return None if choices is None else tuple(choices)
