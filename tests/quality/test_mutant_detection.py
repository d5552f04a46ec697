"""Detection probabilities of the mutant catalogue on the simulator, per mutant: what racefuzz relies on,
and a check of it.

For every mutant of `racefuzz.scenarios.sglang.mutants`, `EXPECTED` states two probabilities of one `search`
(random delay strategy, the mutant's hazards, shrinking off), each measured over seeds 0-49 and committed
as docs/results/mutant-rates-sim/rates.json (`python -m ci.bench mutants --rates 50 1000 PATH`):

* P(caught by any oracle within `detect_within` examples), and
* P(a corruption manifests within `manifest_within` examples) (None: the mutant is caught by a
  timing-independent oracle only, and its check is that nothing manifests).

What the test relies on is the 95% lower confidence bound of each measured rate (Clopper-Pearson: the
least p under which the measured count or more has at least a 5% chance). The check reruns seeds 0-4 and
asserts at least as many successes as that p makes 99% likely (`least_successes`): a change that halves
a mutant's detection probability is likely to fail it, ordinary seed-to-seed variation is not. A
separate test checks that the stated counts are the committed measurement's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from _binomial import least_successes, lower_bound

from racefuzz.backends import executor
from racefuzz.designs import load_design
from racefuzz.scenarios.sglang.mutants import MUTANTS
from racefuzz.search import search

ROOT = Path(__file__).resolve().parents[2]
RATES = ROOT / "docs/results/mutant-rates-sim/rates.json"
MEASURED_SEEDS = 50
CHECK_SEEDS = range(5)


@dataclass(frozen=True)
class Expected:
    """Measured over `MEASURED_SEEDS` seeds: `detected` of them caught within `detect_within` examples,
    `manifested` of them manifested within `manifest_within` (None: never expected to manifest)."""

    detect_within: int
    detected: int
    manifest_within: int | None
    manifested: int


EXPECTED: dict[str, Expected] = {
    "mutant-plan-no-wait-schedule": Expected(50, 50, 1000, 42),
    "mutant-plan-exit-self-wait": Expected(50, 50, 1000, 50),
    "mutant-read-done-early": Expected(50, 50, 1000, 44),
    "mutant-reused-read-done": Expected(50, 50, 1000, 50),
    "mutant-headroom-one-block": Expected(50, 50, None, 0),  # the allocation oracle: no write races the read
    "mutant-skip-copy-done": Expected(50, 50, 100, 50),
    "mutant-barrier-decode-only": Expected(50, 50, 1000, 50),
    "mutant-wait-previous-event": Expected(300, 50, 1000, 36),
    "mutant-barrier-wrong-stream": Expected(50, 50, 200, 50),
    "mutant-read-done-on-schedule-stream": Expected(50, 50, 1000, 50),
    "mutant-18744-recycled-row": Expected(300, 50, 1000, 44),
    "mutant-31687-loop-top-barrier": Expected(50, 50, 1000, 50),
    "mutant-28034-plan-overwrite": Expected(50, 50, 1000, 50),
    "mutant-30261-read-done-before-replay": Expected(50, 50, 100, 50),
    "mutant-29352-swa-fast-path": Expected(50, 50, 1000, 50),
    "mutant-34076-no-record-stream": Expected(50, 50, 1000, 49),  # measured later: the JSON's "additions"
    "mutant-26380-swa-no-barrier": Expected(50, 50, 400, 50),
}
EQUIVALENT_BUDGET = 300
"""Examples per seed under which the equivalent mutant must stay clean (it did over 50 seeds x 1000)."""


def test_every_killable_mutant_states_its_probabilities() -> None:
    killable = {name for name, m in MUTANTS.items() if not getattr(m, "equivalent", None)}
    assert set(EXPECTED) == killable


def test_stated_probabilities_are_the_committed_measurement() -> None:
    rates = json.loads(RATES.read_text())
    assert rates["seeds"] == MEASURED_SEEDS and rates["strategy"] == "random"
    for name, expected in EXPECTED.items():
        measured = rates["mutants"][name]
        detected = sum(x is not None and x <= expected.detect_within for x in measured["examples_to_detect"])
        assert detected == expected.detected, name
        if expected.manifest_within is None:
            assert not any(measured["examples_to_manifest"]), name
        else:
            manifested = sum(x is not None and x <= expected.manifest_within for x in measured["examples_to_manifest"])
            assert manifested == expected.manifested, name


def test_the_margin_arithmetic() -> None:
    assert lower_bound(50, 50) == pytest.approx(0.05 ** (1 / 50), abs=1e-6)
    assert least_successes(5, 0.94) == 3  # P(<= 2 of 5) = 0.002 at p = 0.94; P(<= 3 of 5) = 0.03
    assert least_successes(5, 0.5) == 0


@pytest.mark.parametrize("name", list(EXPECTED))
def test_mutant_is_caught_as_often_as_stated(name: str) -> None:
    expected = EXPECTED[name]
    mutant = MUTANTS[name]
    budget = max(expected.detect_within, expected.manifest_within or 0)
    detected = manifested = 0
    for seed in CHECK_SEEDS:
        result = search(
            load_design(name),
            executor("sim"),
            examples=budget,
            seed=seed,
            hazards=mutant.hazards,
            plan_stream=mutant.plan_stream,
            shrink=False,
        )
        first = result.first_detection_example
        detected += first is not None and first <= expected.detect_within
        if expected.manifest_within is None:
            assert result.first_manifested_example is None, f"{name} manifested: it has nothing to manifest"
        else:
            first = result.first_manifested_example
            manifested += first is not None and first <= expected.manifest_within
    n = len(CHECK_SEEDS)
    p_detect = lower_bound(expected.detected, MEASURED_SEEDS)
    need = least_successes(n, p_detect)
    assert detected >= need, (
        f"{name}: caught within {expected.detect_within} examples in {detected}/{n} seeds; relying on "
        f"p >= {p_detect:.2f} (measured {expected.detected}/{MEASURED_SEEDS}) needs >= {need}"
    )
    if expected.manifest_within is not None:
        p_manifest = lower_bound(expected.manifested, MEASURED_SEEDS)
        need = least_successes(n, p_manifest)
        assert manifested >= need, (
            f"{name}: manifested within {expected.manifest_within} examples in {manifested}/{n} seeds; "
            f"relying on p >= {p_manifest:.2f} (measured {expected.manifested}/{MEASURED_SEEDS}) needs >= {need}"
        )


def test_the_equivalent_mutant_stays_clean() -> None:
    # Measured: 0 of 50 seeds x 1000 examples found anything; an equivalent mutant must never be caught.
    (name,) = [name for name, m in MUTANTS.items() if getattr(m, "equivalent", None)]
    mutant = MUTANTS[name]
    for seed in CHECK_SEEDS:
        result = search(
            load_design(name),
            executor("sim"),
            examples=EQUIVALENT_BUDGET,
            seed=seed,
            hazards=mutant.hazards,
            shrink=False,
        )
        assert not result.found, f"{name} is marked equivalent but was caught ({result.counterexample.oracle})"
