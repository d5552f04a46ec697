"""Which race a report leads with (`report.primary_race`)."""

from __future__ import annotations

from dataclasses import replace

from racefuzz.backends import executor
from racefuzz.designs import load_design
from racefuzz.report import primary_race
from racefuzz.search import search


def _counterexample():
    # global-war, seed 0: the post-launch rewrite clobbers what verify_page_table reads; it also races, with
    # no manifested effect, with draft_metadata (README's report).
    result = search(load_design("global-war"), executor("sim"), examples=500, seed=0)
    assert result.counterexample is not None and result.counterexample.corruptions
    return result.counterexample


def test_the_race_of_the_corrupted_read_with_its_culprit_leads_whatever_the_order() -> None:
    outcome = _counterexample()
    corruption = outcome.corruptions[0]
    assert len(outcome.races) >= 2
    for races in (outcome.races, list(reversed(outcome.races))):
        race = primary_race(replace(outcome, races=races))
        assert race is not None
        assert corruption.read.index in (race.first.index, race.second.index)
        assert {race.first.index, race.second.index} & set(corruption.culprits)


def test_without_the_culprit_a_race_of_the_read_leads_then_the_first_race() -> None:
    outcome = _counterexample()
    read = outcome.corruptions[0].read.index
    of_read = [r for r in outcome.races if read in (r.first.index, r.second.index)]
    others = [r for r in outcome.races if r not in of_read]
    first = outcome.corruptions[0]
    nobody = (-1,) * len(first.cells)  # every value from the table's fill: no launch to blame
    no_culprit = [replace(first, observed_writers=nobody, expected_writers=nobody)]
    assert no_culprit[0].culprits == ()
    assert primary_race(replace(outcome, corruptions=no_culprit, races=others + of_read)) is of_read[0]
    assert primary_race(replace(outcome, corruptions=[])) is outcome.races[0]
    assert primary_race(replace(outcome, corruptions=[], races=[])) is None


def test_a_waw_race_names_both_writers_and_what_each_writes() -> None:
    """A WAW has no reader: both accesses are told as writes, each with the cells it writes (the reader's
    line once said `read:` with no cells)."""
    from racefuzz.device import Device
    from racefuzz.hb import RaceKind, find_races
    from racefuzz.report import race_account, race_lines

    device = Device()
    forward, schedule = device.stream("forward_stream"), device.stream("schedule_stream")
    table = device.buffer("req_to_token", 4, 16)
    schedule.launch("prefill_write", writes=[(table[1, 0:4], 1)])
    forward.launch("overalloc_write", writes=[(table[1, 2:6], 2)])
    (race,) = find_races(device.finish())
    assert race.kind is RaceKind.WAW
    text = "\n".join(race_lines(race_account(race)))
    assert "read:" not in text
    assert text.count("write:") == 2 and "prefill_write" in text and "overalloc_write" in text
    assert "req_to_token[1, 0:4]" in text and "req_to_token[1, 2:6]" in text
