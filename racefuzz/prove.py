"""Bounded proofs: every workload up to a stated size, judged by happens-before, under every schedule.

Happens-before judges a program for every schedule at once: a program with no unordered conflicting pair
and no scenario violation observes the sequential reference however its streams interleave (the property
`tests/unit/test_engine_properties.py` checks on the simulator, and the forced-order agreement test on the
GPU). So "no race in any workload up to size S" can be proved by enumeration instead of sampled.

What is enumerated. A scenario's workloads are decoded from byte strings (`Scenario.workload_space`: the
same decoder the search draws through, so a proof and a search speak of the same workloads). `prove`
decodes *every* byte string of length 0 to `max_bytes` whose every byte is below `alphabet`, under each
workload option set of `option_sets` (e.g. each fixed iteration count), and judges each distinct workload
once. With sglang's decoder (`racefuzz.scenarios.sglang.strategies`: a 4-byte header, 7 bytes a request,
every field `minimum + byte % range`), `max_bytes=18, alphabet=2` is every workload of one or two requests
whose every field takes one of its two simplest values (block size 1-2, rows 1-2, plan stream off/on,
arrival 0-1, prompt 1-2 tokens, chunk 1-2, 1-2 decode steps, accept lengths 1-2, each rewrite bit),
for each iteration count asked. That is the statement `Proof.covers` makes, with the number of distinct
workloads checked; nothing outside it is claimed.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from racefuzz.designs import Design
from racefuzz.errors import InvalidArgument
from racefuzz.hb import find_races
from racefuzz.scenarios import Workload

MAX_STRINGS = 50_000_000
"""The most byte strings one proof may decode (alphabet ** (max_bytes + 1) bounds it): a typo such as
`alphabet=16` must not start a computation of years."""


@dataclass(frozen=True)
class Counterexample:
    """A workload in the bound whose program races (or breaks a scenario invariant)."""

    workload: Workload
    what: str
    options: Mapping[str, object]


@dataclass
class Proof:
    """What `prove` checked: the bound, how many distinct workloads, and every one that was not clean.

    `racing` counts the workloads that race or break an invariant; `counterexamples` keeps the first few.
    `proved` is True only when at least one workload was checked and none raced or broke an invariant.
    """

    design: str
    hazards: tuple[str, ...]
    max_bytes: int
    alphabet: int
    option_sets: tuple[Mapping[str, object], ...]
    strings: int = 0
    workloads: int = 0
    seconds: float = 0.0
    racing: int = 0
    counterexamples: list[Counterexample] = field(default_factory=list)

    @property
    def proved(self) -> bool:
        return self.workloads > 0 and self.racing == 0

    def covers(self) -> str:
        """The statement, in words: what was enumerated and under which options."""
        options = "; ".join(", ".join(f"{k}={v}" for k, v in o.items()) or "default options" for o in self.option_sets)
        return (
            f"every workload decoded from a byte string of at most {self.max_bytes} bytes, each byte below "
            f"{self.alphabet} ({self.strings:,} strings, {self.workloads:,} distinct workloads), hazards "
            f"{', '.join(self.hazards)}, under {options}; every schedule of each (happens-before)"
        )

    def to_json(self) -> dict[str, object]:
        return {
            "design": self.design,
            "hazards": list(self.hazards),
            "max_bytes": self.max_bytes,
            "alphabet": self.alphabet,
            "option_sets": [dict(o) for o in self.option_sets],
            "strings": self.strings,
            "workloads": self.workloads,
            "seconds": round(self.seconds, 3),
            "racing": self.racing,
            "proved": self.proved,
            "covers": self.covers(),
            "counterexamples": [
                {"workload": c.workload.to_json(), "race": c.what, "options": dict(c.options)}  # type: ignore[attr-defined]
                for c in self.counterexamples
            ],
        }


def byte_strings(max_bytes: int, alphabet: int) -> Iterator[bytes]:
    """Every byte string of length 0 to `max_bytes` over the bytes 0 .. alphabet-1, shortest first."""
    symbols = bytes(range(alphabet))
    for length in range(max_bytes + 1):
        for combination in itertools.product(symbols, repeat=length):
            yield bytes(combination)


def prove(
    design: Design,
    *,
    hazards: Sequence[str],
    max_bytes: int,
    alphabet: int,
    option_sets: Sequence[Mapping[str, object]] = ({},),
    keep: int = 5,
    on_progress: Callable[[int], None] | None = None,
) -> Proof:
    """Judge every workload in the bound (see the module docstring) by happens-before; keep the first
    `keep` counterexamples (the enumeration goes on: the count of racing workloads is part of the answer)."""
    if not 1 <= alphabet <= 256:
        raise InvalidArgument(f"prove: alphabet must be in [1, 256], got {alphabet}")
    if max_bytes < 0:
        raise InvalidArgument(f"prove: max_bytes must be >= 0, got {max_bytes}")
    total = 0
    for length in range(max_bytes + 1):  # summed term by term: the bound may be astronomically large
        total += alphabet**length * len(option_sets)
        if total > MAX_STRINGS:
            raise InvalidArgument(
                f"prove: more than {MAX_STRINGS:,} byte strings to decode (alphabet {alphabet}, up to {max_bytes} "
                f"bytes, {len(option_sets)} option set(s)); lower the bound"
            )
    scenario = design.scenario
    proof = Proof(design.spec, tuple(sorted(hazards)), max_bytes, alphabet, tuple(dict(o) for o in option_sets))
    start = time.perf_counter()
    for options in option_sets:
        space = scenario.workload_space(frozenset(hazards), **options)
        seen: set[Workload] = set()
        for data in byte_strings(max_bytes, alphabet):
            proof.strings += 1
            workload = space.decode(data)
            if workload in seen:
                continue
            seen.add(workload)
            proof.workloads += 1
            program = scenario.build_program(workload, design.hooks)
            if program.violations or (races := find_races(program)):
                proof.racing += 1
                if len(proof.counterexamples) < keep:
                    what = program.violations[0] if program.violations else str(races[0])
                    proof.counterexamples.append(Counterexample(workload, what, dict(options)))
            if on_progress is not None and proof.workloads % 1000 == 0:
                on_progress(proof.workloads)
    proof.seconds = time.perf_counter() - start
    return proof
