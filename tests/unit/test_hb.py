"""The happens-before checker: every unordered conflicting pair, with the missing edge named."""

from __future__ import annotations

from racefuzz import Device, RaceKind, find_races


def _setup(streams: int = 2):
    device = Device()
    handles = [device.stream(name) for name in ("forward_stream", "schedule_stream", "plan_stream")[:streams]]
    table = device.buffer("req_to_token", 4, 16)
    return device, handles, table


def test_every_unordered_pair_is_reported_not_just_the_last() -> None:
    # Two reads on forward, then two writes on schedule: four WAR pairs, all unordered.
    device, (forward, schedule), table = _setup()
    forward.launch("block_gather", reads=[table[0, 0:4]])
    forward.launch("page_table_build", reads=[table[0, 0:8]])
    schedule.launch("prefill_write", writes=[(table[0, 0:2], 1)])
    schedule.launch("prefill_write", writes=[(table[0, 6:8], 2)])
    races = find_races(device.finish())
    pairs = sorted((race.first.index, race.second.index) for race in races)
    # op 3 (cols 6:8) does not touch block_gather's 0:4.
    assert pairs == [(0, 2), (1, 2), (1, 3)]
    assert all(race.kind is RaceKind.WAR for race in races)
    shared = {(race.first.index, race.second.index): [str(c) for c in race.cells] for race in races}
    assert shared[(1, 3)] == ["req_to_token[0, 6:8]"]


def test_raw_and_waw_kinds() -> None:
    device, (forward, schedule), table = _setup()
    schedule.launch("prefill_write", writes=[(table[1, 0:4], 1)])
    forward.launch("overalloc_write", writes=[(table[1, 2:6], 2)])
    forward.launch("block_gather", reads=[table[1, 0:2]])
    kinds = {(race.kind, race.first.index, race.second.index) for race in find_races(device.finish())}
    assert kinds == {(RaceKind.WAW, 0, 1), (RaceKind.RAW, 0, 2)}


def test_same_stream_is_ordered_by_fifo() -> None:
    device, (forward, _), table = _setup()
    forward.launch("block_gather", reads=[table[0, 0:4]])
    forward.launch("prefill_write", writes=[(table[0, 0:4], 1)])
    assert find_races(device.finish()) == []


def test_reads_never_conflict_with_reads() -> None:
    device, (forward, schedule), table = _setup()
    forward.launch("block_gather", reads=[table[0, 0:4]])
    schedule.launch("page_table_build", reads=[table[0, 0:4]])
    assert find_races(device.finish()) == []


def test_other_rows_and_buffers_do_not_conflict() -> None:
    device, (forward, schedule), table = _setup()
    other = device.buffer("full_to_swa", 4, 16)
    forward.launch("block_gather", reads=[table[0, 0:4]])
    schedule.launch("prefill_write", writes=[(table[1, 0:4], 1), (other[0, 0:4], 1)])
    assert find_races(device.finish()) == []


def test_missing_edge_names_streams_ops_and_what_was_seen() -> None:
    device, (forward, schedule), table = _setup()
    forward.launch("page_table_build", reads=[table[0, 0:8]])
    schedule.wait_stream(forward)
    forward.launch("block_gather", reads=[table[0, 0:8]])
    schedule.launch("prefill_write", writes=[(table[0, 0:8], 1)])
    (race,) = find_races(device.finish())
    assert race.first.kernel == "block_gather" and race.seen_up_to is not None
    assert race.seen_up_to.kernel == "page_table_build"
    text = race.missing_edge()
    assert "op #2 block_gather on forward_stream" in text
    assert "schedule_stream was ordered only after forward_stream's op #0" in text
    assert "schedule_stream.wait_stream(forward_stream)" in text


def test_never_synchronized_is_said_so() -> None:
    device, (forward, schedule), table = _setup()
    forward.launch("block_gather", reads=[table[0, 0:8]])
    schedule.launch("prefill_write", writes=[(table[0, 0:8], 1)])
    (race,) = find_races(device.finish())
    assert race.seen_up_to is None
    assert "had never synchronized with forward_stream" in race.missing_edge()


def test_transitivity_over_four_hops() -> None:
    # forward -> schedule (event) -> plan (wait_stream) -> copy (event) orders copy's write after the read.
    device = Device()
    forward, schedule, plan, copy = (device.stream(n) for n in ("forward", "schedule", "plan", "copy"))
    table = device.buffer("req_to_token", 2, 8)
    forward.launch("block_gather", reads=[table[0, 0:8]])
    schedule.wait_event(forward.record_event("read_done"))
    plan.wait_stream(schedule)
    copy.wait_event(plan.record_event("handoff"))
    copy.launch("prefill_write", writes=[(table[0, 0:8], 1)])
    assert find_races(device.finish()) == []


def test_event_sync_orders_streams_that_never_waited() -> None:
    device, (forward, schedule, plan), table = _setup(3)
    forward.launch("block_gather", reads=[table[0, 0:8]])
    forward.record_event("verify_done").synchronize()
    plan.launch("overalloc_write", writes=[(table[0, 0:8], 1)])
    schedule.launch("prefill_write", writes=[(table[0, 0:8], 2)])
    races = find_races(device.finish())
    # plan and schedule both come after the read, but are unordered with each other (WAW).
    assert [(race.kind, race.first.kernel, race.second.kernel) for race in races] == [
        (RaceKind.WAW, "overalloc_write", "prefill_write")
    ]


def test_a_race_reads_as_one_line() -> None:
    device, (forward, schedule), table = _setup()
    forward.launch("draft_metadata", reads=[table[1, 0:4], table[2, 0:4]])
    schedule.launch("post_launch_rewrite", writes=[(table[1, 0:1], 4), (table[2, 2:3], 5)])
    (race,) = find_races(device.finish())
    assert str(race) == (
        "WAR op #0 draft_metadata (forward_stream) -> op #1 post_launch_rewrite (schedule_stream) "
        "on req_to_token[1, 0:1], req_to_token[2, 2:3]"
    )
