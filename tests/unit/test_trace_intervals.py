"""racefuzz.trace's pure side, without torch: byte intervals of strided views, and a program emitted through
the trace's builder judged by the happens-before checker."""

from __future__ import annotations

from collections.abc import Callable

from racefuzz.program import CellRange, Program
from racefuzz.trace.builder import HOST, ProgramBuilder, launch_source
from racefuzz.trace.intervals import MAX_RUNS, merge, overlap, view_intervals
from racefuzz.trace.judge import judge, trace_races
from racefuzz.trace.lifetime import with_reuse
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


Emit = Callable[[ProgramBuilder], None]


def launch(stream: str, kernel: str, reads=(), writes=()) -> Emit:
    def emit(builder: ProgramBuilder) -> None:
        (table_buffer,) = builder.buffers

        def cells(spec) -> tuple[CellRange, ...]:
            return tuple(CellRange(table_buffer, 0, 1, start, end) for start, end in spec)

        builder.launch(stream, kernel, "torch", cells(reads), cells(writes), f"step.py:{len(builder.ops)}")

    return emit


def record(event: str, stream: str) -> Emit:
    return lambda builder: builder.record(event, stream)


def wait(stream: str, event: str) -> Emit:
    return lambda builder: builder.wait(stream, event)


def stream_sync(stream: str) -> Emit:
    return lambda builder: builder.stream_sync(stream)


def device_sync() -> Emit:
    return lambda builder: builder.device_sync()


def program_of(*ops: Emit) -> Program:
    builder = ProgramBuilder()
    builder.new_buffer("req_to_token", 4 * ROW, 4, ROW, "")
    for name in ("schedule", "forward"):
        builder.stream(name)
    for emit in ops:
        emit(builder)
    return builder.program()


def test_disjoint_rows_of_one_table_do_not_conflict():
    races = trace_races(
        program_of(
            launch("forward", "gather_row_1", reads=[(ROW, 2 * ROW)]),
            launch("schedule", "write_row_2", writes=[(2 * ROW, 3 * ROW)]),
        )
    )
    assert races == []


def test_a_write_inside_a_row_conflicts_with_a_read_of_the_table():
    races = trace_races(
        program_of(
            launch("forward", "read_all", reads=[(0, 4 * ROW)]),
            launch("schedule", "write_R_1_4_8", writes=[(ROW + 16, ROW + 32)]),
        )
    )
    assert [str(r.race.kind) for r in races] == ["WAR"]
    assert races[0].where == ("req_to_token[1, 4:8]",)
    assert races[0].first.kernel == "read_all" and launch_source(races[0].second) == "step.py:1"
    assert "schedule had never synchronized with forward" in race_text(races[0])


def test_an_event_or_a_host_sync_orders_the_pair():
    read = launch("forward", "read", reads=[(0, ROW)])
    write = launch("schedule", "write", writes=[(0, ROW)])
    by_event = program_of(read, record("e", "forward"), wait("schedule", "e"), write)
    by_sync = program_of(read, stream_sync("forward"), device_sync(), write)
    assert trace_races(by_event) == [] and trace_races(by_sync) == []
    waited_too_early = program_of(record("e", "forward"), wait("schedule", "e"), read, write)
    assert len(trace_races(waited_too_early)) == 1


def test_the_host_is_a_participant_ordered_before_what_it_issues_next():
    host_write = launch(HOST, "host fills pinned", writes=[(0, ROW)])
    device_read = launch("forward", "copy to device", reads=[(0, ROW)])
    assert trace_races(program_of(host_write, device_read)) == []  # issued after: ordered
    device_write = launch("forward", "copy to host", writes=[(0, ROW)])
    host_read = launch(HOST, "host reads pinned", reads=[(0, ROW)])
    races = trace_races(program_of(device_write, host_read))  # non-blocking copy read without a sync
    assert [(r.first.kernel, r.second.kernel) for r in races] == [("copy to host", "host reads pinned")]
    synced = program_of(device_write, stream_sync("forward"), launch(HOST, "host reads", reads=[(0, ROW)]))
    assert trace_races(synced) == []


def test_the_host_order_is_emitted_as_it_happens_once_per_stream():
    program = program_of(
        launch(HOST, "host fills pinned", writes=[(0, ROW)]),
        launch("forward", "first read", reads=[(0, ROW)]),
        launch("forward", "second read", reads=[(0, ROW)]),
    )
    kinds = [type(op).__name__ for op in program.ops]
    assert kinds == ["Launch", "Record", "WaitEvent", "Launch", "Launch"]  # one wait: forward is ordered since


def test_a_storage_is_a_one_row_buffer_of_its_bytes():
    program = program_of(launch("forward", "read", reads=[(ROW, 2 * ROW)]))
    (buffer,) = program.buffers
    assert (buffer.rows, buffer.cols) == (1, 4 * ROW)
    assert (buffer.allocation.itemsize, buffer.allocation.row_bytes) == (4, ROW)
    (cells,) = program.launches[0].reads
    assert (cells.row0, cells.row1, cells.col0, cells.col1) == (0, 1, ROW, 2 * ROW)
    assert program.launches[0].kernel == "read" and cells.describe() == "req_to_token[1, 0:16]"


def test_a_free_moved_to_its_reuse_keeps_its_index_and_the_host_order_is_emitted_again():
    builder = ProgramBuilder()
    used = builder.new_buffer("used", 64, 4, 0, "side")
    reusing = builder.new_buffer("reusing", 64, 4, 0, "side")
    host_side = builder.new_buffer("pinned", 64, 4, 0, "")

    def whole(key: int) -> tuple[CellRange, ...]:
        return (CellRange(builder.buffers[key], 0, 1, 0, 64),)

    builder.stream("side")
    builder.launch("forward", "read", "torch", whole(used), (), "step.py:1")
    builder.launch(HOST, "host fills pinned", "host", (), whole(host_side), "step.py:2")
    builder.free(used, "side", "step.py:3")  # side waits on the host order first
    builder.launch("side", "write", "torch", (), whole(reusing), "step.py:4")  # the reuse of used's block
    program = builder.program()
    kinds = [type(op).__name__ for op in program.ops]
    assert kinds == ["Launch", "Launch", "Record", "WaitEvent", "Launch", "Launch"]
    judged = judge(program)
    (race,) = judged.races
    assert race.second.index == 4 and program.ops[4].kernel == "free(used)"  # the recorded free's index
    assert race.second.kernel == "free(used), its block reused by write (step.py:4)" and judged.latent == []
    moved, origin, unreused = with_reuse(program)
    assert [type(op).__name__ for op in moved.ops] == kinds  # one host-order wait, before the moved free
    assert [origin[op.index] for op in moved.ops] == [0, 1, -1, -1, 4, 5] and unreused == set()
