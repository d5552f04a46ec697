"""Schedules: validation and JSON round trip."""

from __future__ import annotations

import json

import pytest

from racefuzz import InvalidArgument, Schedule


def test_round_trip_drops_zero_delays() -> None:
    schedule = Schedule(device_delays={4: 100.0, 2: 0.0}, read_spins={7: 1500}, host_delays={1: 3.5})
    assert schedule.device_delays == {4: 100.0}
    assert schedule.nonzero_delays == 3
    again = Schedule.from_json(json.loads(json.dumps(schedule.to_json())))
    assert again == schedule


@pytest.mark.parametrize(
    "data",
    [[], {"device_delays": []}, {"bogus": {}}, {"read_spins": {"x": 1}}, {"host_delays": {"1": "slow"}}],
)
def test_malformed_json_is_rejected(data: object) -> None:
    with pytest.raises(InvalidArgument):
        Schedule.from_json(data)
