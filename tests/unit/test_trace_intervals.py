"""racefuzz.trace's pure side, without torch: byte intervals of strided views, and a trace judged by the
happens-before checker through its conversion to the Program IR."""

from __future__ import annotations

from racefuzz.trace.convert import find_trace_races, to_program
from racefuzz.trace.intervals import MAX_RUNS, merge, overlap, view_intervals
from racefuzz.trace.model import (
    HOST,
    Access,
    Storage,
    Trace,
    TraceDeviceSync,
    TraceLaunch,
    TraceRecord,
    TraceStreamSync,
    TraceWait,
)
from racefuzz.trace.report import race_text

# A 4 x 16 int32 table: 64 bytes per row.
ROW = 64


def table(offset: int, sizes: tuple[int, ...], strides: tuple[int, ...]) -> list[tuple[int, int]]:
    intervals, coarse = view_intervals(offset, sizes, strides, 4)
    assert not coarse
    return intervals


def test_a_contiguous_table_is_one_run():
    assert table(0, (4, 16), (16, 1)) == [(0, 256)]


def test_a_view_inside_one_row_covers_exactly_its_bytes():
    # R[1, 4:8]: where CSAN keys by the view's start address, this is 16 bytes at offset 80.
    assert table(16 + 4, (4,), (1,)) == [(80, 96)]


def test_a_column_slice_is_one_run_per_row():
    assert table(0, (4, 4), (16, 1)) == [(r * ROW, r * ROW + 16) for r in range(4)]


def test_transposed_broadcast_and_empty_views():
    assert table(0, (16, 4), (1, 16)) == [(0, 256)]  # R.t() covers all of R
    assert table(16, (3, 16), (0, 1)) == [(64, 128)]  # row 1 expanded three times
    assert table(0, (0, 16), (16, 1)) == []


def test_a_view_of_too_many_runs_is_coarsened_to_its_bounding_interval():
    intervals, coarse = view_intervals(0, (MAX_RUNS + 1, 1), (2, 1), 4)
    assert coarse and intervals == [(0, (2 * MAX_RUNS + 1) * 4)]


def test_merge_and_overlap():
    assert merge([(8, 12), (0, 4), (4, 6)]) == [(0, 6), (8, 12)]
    assert overlap([(0, 16), (64, 80)], [(8, 70)]) == [(8, 16), (64, 70)]
    assert overlap([(0, 16)], [(16, 32)]) == []


def launch(index: int, stream: str, kernel: str, reads=(), writes=()) -> TraceLaunch:
    def accesses(spec):
        return tuple(Access(0, (iv,)) for iv in spec)

    return TraceLaunch(index, stream, kernel, "torch", accesses(reads), accesses(writes), f"step.py:{index}")


def trace_of(*ops) -> Trace:
    trace = Trace(storages={0: Storage(0, "req_to_token", 4 * ROW, 4, ROW)}, streams=["schedule", "forward"])
    trace.ops = list(ops)
    return trace


def test_disjoint_rows_of_one_table_do_not_conflict():
    races = find_trace_races(
        trace_of(
            launch(0, "forward", "gather_row_1", reads=[(ROW, 2 * ROW)]),
            launch(1, "schedule", "write_row_2", writes=[(2 * ROW, 3 * ROW)]),
        )
    )
    assert races == []


def test_a_write_inside_a_row_conflicts_with_a_read_of_the_table():
    races = find_trace_races(
        trace_of(
            launch(0, "forward", "read_all", reads=[(0, 4 * ROW)]),
            launch(1, "schedule", "write_R_1_4_8", writes=[(ROW + 16, ROW + 32)]),
        )
    )
    assert [str(r.race.kind) for r in races] == ["WAR"]
    assert races[0].where == ("req_to_token[1, 4:8]",)
    assert races[0].first.kernel == "read_all" and races[0].second.source == "step.py:1"
    assert "schedule had never synchronized with forward" in race_text(races[0])


def test_an_event_or_a_host_sync_orders_the_pair():
    read = launch(0, "forward", "read", reads=[(0, ROW)])
    write = launch(3, "schedule", "write", writes=[(0, ROW)])
    by_event = trace_of(read, TraceRecord(1, "e", "forward"), TraceWait(2, "schedule", "e"), write)
    by_sync = trace_of(read, TraceStreamSync(1, "forward"), TraceDeviceSync(2), write)
    assert find_trace_races(by_event) == [] and find_trace_races(by_sync) == []
    waited_too_early = trace_of(TraceRecord(0, "e", "forward"), TraceWait(1, "schedule", "e"), read, write)
    assert len(find_trace_races(waited_too_early)) == 1


def test_the_host_is_a_participant_ordered_before_what_it_issues_next():
    host_write = launch(0, HOST, "host fills pinned", writes=[(0, ROW)])
    device_read = launch(1, "forward", "copy to device", reads=[(0, ROW)])
    assert find_trace_races(trace_of(host_write, device_read)) == []  # issued after: ordered
    device_write = launch(0, "forward", "copy to host", writes=[(0, ROW)])
    host_read = launch(1, HOST, "host reads pinned", reads=[(0, ROW)])
    races = find_trace_races(trace_of(device_write, host_read))  # non-blocking copy read without a sync
    assert [(r.first.kernel, r.second.kernel) for r in races] == [("copy to host", "host reads pinned")]
    synced = trace_of(device_write, TraceStreamSync(1, "forward"), launch(2, HOST, "host reads", reads=[(0, ROW)]))
    assert find_trace_races(synced) == []


def test_a_storage_is_a_one_row_buffer_of_its_bytes():
    converted = to_program(trace_of(launch(0, "forward", "read", reads=[(ROW, 2 * ROW)])))
    (buffer,) = converted.program.buffers
    assert (buffer.rows, buffer.cols) == (1, 4 * ROW)
    (cells,) = converted.program.launches[0].reads
    assert (cells.row0, cells.row1, cells.col0, cells.col1) == (0, 1, ROW, 2 * ROW)
    assert converted.launches[0].kernel == "read"
