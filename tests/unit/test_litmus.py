"""Every litmus program: the checker's verdict, and the simulator corrupting (or not) as predicted."""

from __future__ import annotations

import pytest

from racefuzz import find_corruptions, find_races, simulate
from racefuzz.litmus import all_litmus

LITMUS = {litmus.name: litmus for litmus in all_litmus()}


def test_there_are_enough_litmus_programs_covering_each_rule() -> None:
    assert len(LITMUS) >= 12
    assert sum(litmus.racy for litmus in LITMUS.values()) >= 6
    assert sum(not litmus.racy for litmus in LITMUS.values()) >= 6
    for rule in (
        "wait_stream_snapshot",
        "wait_event_binds_at_call",
        "wait_event_never_recorded",
        "reused_event_rearmed",
        "transitive_three_streams",
        "transitive_later_record",
        "host_event_sync",
        "host_sync_before_read",
    ):
        assert rule in LITMUS


@pytest.mark.parametrize("name", sorted(LITMUS))
def test_checker_verdict(name: str) -> None:
    litmus = LITMUS[name]
    kinds = tuple(sorted({race.kind.value for race in find_races(litmus.program)}))
    assert kinds == tuple(sorted(litmus.races))


@pytest.mark.parametrize("name", sorted(n for n, litmus in LITMUS.items() if litmus.racy))
def test_racy_litmus_corrupts_under_its_corrupting_schedule_only(name: str) -> None:
    litmus = LITMUS[name]
    assert litmus.corrupting is not None and litmus.benign is not None
    run = simulate(litmus.program, litmus.corrupting, track_writers=True)
    corruptions = find_corruptions(litmus.program, run.observations, run.writers)
    assert corruptions, "the corrupting schedule must manifest the race"
    races = find_races(litmus.program)
    racing_ops = {race.first.index for race in races} | {race.second.index for race in races}
    for corruption in corruptions:
        assert corruption.read.index in racing_ops
        assert set(corruption.culprits) & racing_ops, "the clobbering (or missed) writer is one of the racers"
    benign = simulate(litmus.program, litmus.benign)
    assert find_corruptions(litmus.program, benign.observations) == []


@pytest.mark.parametrize("name", sorted(n for n, litmus in LITMUS.items() if not litmus.racy))
def test_race_free_litmus_never_corrupts(name: str) -> None:
    litmus = LITMUS[name]
    assert litmus.stressing is not None
    for schedule in (litmus.stressing, None):
        run = simulate(litmus.program) if schedule is None else simulate(litmus.program, schedule)
        assert find_corruptions(litmus.program, run.observations) == []
