"""The sglang overlap scenario: hazards appear where the model says, designs fence what they claim."""

from __future__ import annotations

from dataclasses import replace

import pytest

from racefuzz import InvalidArgument, Schedule, find_corruptions, find_races, simulate
from racefuzz.designs import load_design
from racefuzz.program import EventSync, Launch, WaitEvent, WaitStream
from racefuzz.scenarios.sglang import RequestSpec, Workload, build_program
from racefuzz.scenarios.sglang.designs import BUILTIN


def races(workload: Workload, design: str) -> set[tuple[str, str, str]]:
    program = build_program(workload, load_design(design).hooks)
    return {(race.kind.value, race.first.kernel, race.second.kernel) for race in find_races(program)}


# One workload per hazard, each the smallest that exhibits it.
RECYCLE = Workload(
    requests=(RequestSpec(0, 4, 64, (1,)), RequestSpec(3, 4, 64, (1,))), iterations=5, rows=1, block_size=2
)
STASH = Workload(requests=(RequestSpec(0, 6, 3, (1,)),), iterations=2)
POST_LAUNCH = Workload(requests=(RequestSpec(0, 4, 64, (1, 1, 1), rewrite_at=(0,)),), iterations=4)
PLAN = Workload(requests=(RequestSpec(0, 4, 64, (2, 2, 2)),), iterations=5, plan_stream=True)


def test_recycled_row_prefill_races_with_the_over_scheduled_forward() -> None:
    program = build_program(RECYCLE, load_design("none").hooks)
    prefills = [op for op in program.launches if op.kernel == "prefill_write"]
    assert prefills[-1].info["recycled_rows"] == [1], "the second request reuses the first one's row"
    found = races(RECYCLE, "none")
    assert ("WAR", "verify_page_table", "prefill_write") in found
    assert races(RECYCLE, "self-event") == found, "self-event leaves prefill iterations unfenced"
    for clean in ("global-war", "read-done", "war-after-launch"):
        assert races(RECYCLE, clean) == set()


def test_chunked_stash_rewrite_races_with_the_previous_chunk() -> None:
    assert races(STASH, "none") == {("WAR", "extend_page_table", "stash_rewrite")}
    assert races(STASH, "self-event") == {("WAR", "extend_page_table", "stash_rewrite")}
    assert races(STASH, "global-war") == set()


def test_post_launch_rewrite_races_unless_the_barrier_follows_the_launch() -> None:
    expected = {("WAR", "draft_metadata", "post_launch_rewrite"), ("WAR", "verify_page_table", "post_launch_rewrite")}
    for design in ("none", "self-event", "global-war", "read-done"):
        assert races(POST_LAUNCH, design) == expected, design
    assert races(POST_LAUNCH, "war-after-launch") == set()
    assert races(replace(POST_LAUNCH, post_launch_rewrites=False), "none") == set()


def test_steady_state_over_allocation_is_column_disjoint_even_unfenced() -> None:
    # Section 2.4 of the model: the plan stream's over-allocation never touches cells the previous
    # forward reads, so even `none` has no race here; plan writes are ordered before forward reads (RAW).
    for design in BUILTIN:
        assert races(PLAN, design) == set(), design
    program = build_program(PLAN, load_design("none").hooks)
    assert any(op.kernel == "overalloc_write" and op.stream.name == "plan_stream" for op in program.launches)


def test_global_war_barrier_is_a_wait_stream_at_the_loop_top() -> None:
    program = build_program(RECYCLE, load_design("global-war").hooks)
    waits = [op for op in program.ops if isinstance(op, WaitStream) and op.stream.name == "schedule_stream"]
    assert any(op.other.name == "forward_stream" for op in waits)


def test_self_event_blocks_the_host_only_without_a_plan_stream() -> None:
    def host_syncs(workload: Workload) -> int:
        program = build_program(workload, load_design("self-event").hooks)
        return sum(type(op).__name__ == "EventSync" and op.event.name == "verify_done" for op in program.ops)

    assert host_syncs(replace(PLAN, plan_stream=False)) > 0
    assert host_syncs(PLAN) == 0


def test_forward_reads_stay_inside_the_allocated_cells() -> None:
    # With 2B headroom every cell a forward reads was written for its request before it (no reads of
    # never-allocated cells), which the sequential reference shows as no initial fill (0) being read.
    for workload in (RECYCLE, STASH, POST_LAUNCH, PLAN):
        program = build_program(workload, load_design("war-after-launch").hooks)
        run = simulate(program)
        for launch in program.launches:
            for observed in run.observations.get(launch.index, ()):
                assert (observed != 0).all(), f"{launch.describe()} read an unallocated cell"


def test_manifests_under_a_read_spin_on_the_racing_reader() -> None:
    program = build_program(POST_LAUNCH, load_design("global-war").hooks)
    (race, *_) = find_races(program)
    spin = Schedule(read_spins={race.first.index: 1000.0})
    run = simulate(program, spin, track_writers=True)
    corruptions = find_corruptions(program, run.observations, run.writers)
    assert corruptions and corruptions[0].read.index == race.first.index
    assert find_corruptions(program, simulate(program).observations) == []


def test_workload_validation_and_json_round_trip() -> None:
    assert Workload.from_json(POST_LAUNCH.to_json()) == POST_LAUNCH
    with pytest.raises(InvalidArgument, match="accept lengths"):
        Workload(requests=(RequestSpec(accepts=(5,)),), block_size=4)
    with pytest.raises(InvalidArgument, match="iterations"):
        Workload(iterations=0)
    with pytest.raises(InvalidArgument, match="malformed"):
        Workload.from_json({"requests": [{"bogus": 1}]})


def test_every_launch_says_where_it_comes_from() -> None:
    program = build_program(POST_LAUNCH, load_design("global-war").hooks)
    for op in program.ops:
        if isinstance(op, Launch):
            assert "iteration" in op.info and "requests" in op.info


def test_reads_beyond_the_allocation_are_a_violation_not_a_race() -> None:
    # Headroom of one block instead of two (a mutant): the forward reads cells that no write allocated for
    # it. No write races that read, so only the scenario's allocation invariant can flag it.
    from types import SimpleNamespace

    from racefuzz.scenarios.sglang.designs.global_war import apply_war_barrier

    short = SimpleNamespace(name="headroom-1", headroom_blocks=1, loop_top=apply_war_barrier)
    workload = Workload(requests=(RequestSpec(0, 2, 64, (1, 1, 1)),), iterations=4, block_size=1)
    program = build_program(workload, short)
    assert program.violations and "beyond its allocation" in program.violations[0]
    assert find_races(program) == []
    assert build_program(workload, load_design("global-war").hooks).violations == ()


def test_a_request_can_finish_at_its_prefill_and_its_row_is_recycled_a_step_earlier() -> None:
    # max_new_tokens=1: the prefill forward is the request's last; it is still over-scheduled in the next
    # (decode) forward, freed during that iteration, and its row is re-prefilled one iteration later.
    workload = Workload(requests=(RequestSpec(0, 4, 64, ()), RequestSpec(2, 4, 64, (1,))), iterations=3, rows=1)
    program = build_program(workload, load_design("none").hooks)
    prefills = [op for op in program.launches if op.kernel == "prefill_write"]
    assert prefills[-1].info["iteration"] == 2 and prefills[-1].info["recycled_rows"] == [1]
    assert ("WAR", "verify_page_table", "prefill_write") in races(workload, "none")
    assert races(workload, "global-war") == set()


# Two requests of different lengths decoding together: the batch rectangle covers the short row's
# columns beyond its length, where the next iteration's over-allocation writes.
WIDE = Workload(requests=(RequestSpec(0, 4, 64, (1, 1, 1)), RequestSpec(0, 9, 64, (2, 2, 2))), iterations=5)


@pytest.mark.parametrize("extent", ["rectangle", "reserved"])
def test_wide_reads_make_the_over_allocation_race_unless_self_event_fences_it(extent: str) -> None:
    from racefuzz.oracle import masked_conflict

    wide = replace(WIDE, read_extent=extent)
    program = build_program(wide, load_design("none").hooks)
    over_allocation = [race for race in find_races(program) if race.second.kernel == "overalloc_write"]
    assert {race.first.kernel for race in over_allocation} >= {"draft_metadata", "verify_page_table"}
    assert all(masked_conflict(race) for race in over_allocation), "only masked columns are overwritten"
    assert races(replace(WIDE, read_extent="exact"), "none") == set(), "exact reads: column-disjoint"
    for fenced in ("self-event", "global-war", "war-after-launch"):
        assert races(wide, fenced) == set(), fenced


def test_a_changed_masked_column_is_an_ordering_conflict_but_not_a_corruption() -> None:
    from racefuzz.device import Device

    device = Device()
    s, f = device.stream("schedule_stream"), device.stream("forward_stream")
    table = device.buffer("req_to_token", 1, 4)
    f.launch("page_table", reads=[table[0, 0:2]], unused_reads=[table[0, 2:4]])
    s.launch("over_allocation", writes=[(table[0, 2:4], 7)])
    s.launch("rewrite", writes=[(table[0, 0:1], 8)])
    program = device.finish()
    reader = program.launches[0]
    assert reader.unused_from == 1 and reader.used(0) and not reader.used(1)
    from racefuzz.oracle import expected_observations, masked_conflict

    assert [masked_conflict(race) for race in find_races(program)] == [True, False]
    expected = expected_observations(program)
    masked_changed = {0: (expected[0][0], expected[0][1] + 7)}
    assert find_corruptions(program, masked_changed) == []
    used_changed = {0: (expected[0][0] + 8, expected[0][1])}
    assert [c.read.kernel for c in find_corruptions(program, used_changed)] == ["page_table"]


def test_read_extents_are_drawn_and_shrink_to_exact() -> None:
    from racefuzz.scenarios.sglang.strategies import decode_workload

    def extent(byte: int) -> str:
        data = bytes([0, 0, 0, byte]) + bytes(7)
        return decode_workload(data, hazards=frozenset(), max_iterations=4, plan_stream=None).read_extent

    assert [extent(b << 2) for b in range(4)] == ["exact", "rectangle", "reserved", "exact"]
    with pytest.raises(InvalidArgument, match="read_extent"):
        Workload(read_extent="diagonal")


def test_the_post_launch_rewrite_follows_a_prefill_result_and_races_the_first_decode() -> None:
    workload = Workload(requests=(RequestSpec(0, 4, 64, (1, 1), rewrite_at=(0,)),), iterations=2)
    program = build_program(workload, load_design("global-war").hooks)
    (rewrite,) = [op for op in program.launches if op.kernel == "post_launch_rewrite"]
    assert rewrite.info["iteration"] == 1 and [str(cells) for cells in rewrite.writes] == ["req_to_token[1, 0:4]"]
    assert races(workload, "global-war") == {
        ("WAR", "draft_metadata", "post_launch_rewrite"),
        ("WAR", "verify_page_table", "post_launch_rewrite"),
    }
    finishing = replace(workload, requests=(RequestSpec(0, 4, 64, (), rewrite_at=(0,)),))
    assert races(finishing, "none") == set(), "a request that finishes at its prefill is not re-cached"


def test_publish_ready_is_one_event_waited_on_by_decode_batches_only() -> None:
    program = build_program(RECYCLE, load_design("none").hooks)
    publish = [e for e in program.events if e.name == "publish_ready"]
    assert len(publish) == 1
    waits = [op for op in program.ops if isinstance(op, WaitEvent) and op.event == publish[0]]
    decode_iterations = {op.info["iteration"] for op in program.launches if op.kernel == "verify_forward"}
    launch_of_wait = [next(o for o in program.ops[op.index :] if isinstance(o, Launch)) for op in waits]
    assert {launch.info["iteration"] for launch in launch_of_wait} == decode_iterations - {0}


def test_the_host_reads_each_result_after_copy_done() -> None:
    program = build_program(POST_LAUNCH, load_design("war-after-launch").hooks)
    reads = [op for op in program.launches if op.kernel == "result_read"]
    assert [op.stream.name for op in reads] == ["host"] * (POST_LAUNCH.iterations - 1)
    assert [str(op.reads[0]) for op in reads] == [f"output_tokens_cpu[0, {k}:{k + 1}]" for k in range(3)]
    for read in reads:
        assert isinstance(program.ops[read.index - 1], EventSync), "copy_done.synchronize() right before it"


def test_host_waits_moved_by_29556_cost_but_order_nothing_new() -> None:
    from racefuzz.scenarios.sglang.compare import STEADY_DECODE
    from racefuzz.scenarios.sglang.costs import measure

    def blocked(design: str, **flags: bool) -> dict[str, float]:
        workload = replace(STEADY_DECODE, forward_cost_us=3000.0, host_work_us=600.0, launch_prep_us=300.0, **flags)
        program = build_program(workload, load_design(design).hooks)
        assert find_races(program) == []
        return measure(program, simulate(program), workload.iterations).blocked_on

    assert "fwd_prepare_d2h_stream" not in blocked("global-war")
    assert blocked("global-war", cpu_seq_lens=True)["fwd_prepare_d2h_stream"] > 1000.0
    # filter_batch's .cpu() after the loop-top barrier stalls the host for the previous forward, as long
    # as self-event's verify_done.synchronize() does: the wait moved, it was not removed.
    moved = blocked("global-war", filter_batch_sync=True)["schedule_stream"]
    assert moved == pytest.approx(blocked("self-event")["verify_done"], rel=0.05)


def test_reports_say_masked_column_and_host() -> None:
    from racefuzz.backends import executor
    from racefuzz.report import render
    from racefuzz.scenarios.sglang import SCENARIO
    from racefuzz.search import explain, judge

    def report(workload: Workload, design: str) -> str:
        outcome = explain(judge(workload, load_design(design), Schedule(), executor("sim")), "sim")
        return render(outcome, design=design, backend="sim", replay_path=None, scenario=SCENARIO)

    masked = report(replace(WIDE, read_extent="rectangle"), "none")
    assert "masked column: ordering conflict, no corruption" in masked and "host:" not in masked
    host = report(POST_LAUNCH, "mutant-skip-copy-done")
    assert "RAW race on output_tokens_cpu" in host and "result_read  on host" in host
    assert "host: one side is the host itself" in host and "masked column" not in host


def test_mixed_chunks_gather_first_and_the_block_is_reused_before_the_barrier() -> None:
    from racefuzz.scenarios.sglang import decode_workload

    # Request 0 decodes while request 1 arrives: iteration 2's prefill is mixed with the running batch.
    mixed = Workload(
        requests=(RequestSpec(0, 4, 64, (1, 1, 1)), RequestSpec(2, 3, 64, (1,))), iterations=4, rows=2, mixed_chunk=True
    )
    assert Workload.from_json(mixed.to_json()) == mixed
    program = build_program(mixed, load_design("war-after-launch").hooks)
    ops = program.ops
    at = {op.kernel: i for i, op in enumerate(ops) if isinstance(op, Launch) and op.info.get("iteration") == 2}
    forward = [
        op.kernel
        for op in ops
        if isinstance(op, Launch) and op.info.get("iteration") == 2 and op.stream.name == "forward_stream"
    ]
    assert forward[0] == "mix_indices_gather", "resolve_forward_inputs runs first on the forward stream"
    assert at["running_indices_write"] < at["mix_indices_gather"] < at["mix_block_reuse"]
    barrier = next(
        i
        for i, op in enumerate(ops)
        if i > at["extend_forward"] and isinstance(op, (WaitStream, WaitEvent)) and op.stream.name == "schedule_stream"
    )
    assert at["mix_block_reuse"] < barrier, "the free is ordered on the schedule stream before the barrier"
    assert all("iteration" in op.info and "requests" in op.info for op in program.launches)
    # The hazard turns it on; nothing else does.
    data = bytes(range(40))
    assert decode_workload(data, hazards=frozenset({"tensor-lifetime"}), max_iterations=8, plan_stream=None).mixed_chunk
    assert not decode_workload(data, hazards=frozenset(), max_iterations=8, plan_stream=None).mixed_chunk
