"""The mutant catalogue itself: every mutant loads by name, says what it breaks, plants its bug where the
model says (so that it is killable), and the scenario extension it needs changes nothing by default."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings

from racefuzz.cli import main
from racefuzz.designs import load_design
from racefuzz.exitcodes import ExitCode
from racefuzz.hb import find_races
from racefuzz.program import EventSync
from racefuzz.scenarios.sglang import (
    ALL_HAZARDS,
    HAZARDS,
    LATER_HAZARDS,
    LIFETIME_HAZARDS,
    RequestSpec,
    Workload,
    build_program,
    workloads,
)
from racefuzz.scenarios.sglang.designs import BUILTIN
from racefuzz.scenarios.sglang.mutants import MUTANTS

PAGED = Workload(requests=(RequestSpec(0, 4, 64, (2, 2)),), iterations=4, plan_stream=True, page_size=2)


def races(workload: Workload, design: str) -> set[tuple[str, str, str]]:
    program = build_program(workload, load_design(design).hooks)
    return {(race.kind.value, race.first.kernel, race.second.kernel) for race in find_races(program)}


def test_at_least_twelve_mutants_each_named_described_and_loadable() -> None:
    catalogue = MUTANTS
    assert len(catalogue) >= 12
    for name, mutant in catalogue.items():
        design = load_design(name)
        assert name.startswith("mutant-") and name not in BUILTIN and design.hooks is mutant
        cites = "#" in design.description or "section 7.2" in design.description
        assert cites, f"{name}: the description names no sglang PR/issue (or the model's mutant list)"
        assert set(mutant.hazards) <= set(ALL_HAZARDS + LATER_HAZARDS + LIFETIME_HAZARDS) and mutant.base in BUILTIN


def test_a_mutant_runs_from_the_command_line(tmp_path, capsys) -> None:
    argv = ["run", "--backend", "sim", "--design", "mutant-barrier-wrong-stream", "--examples", "200", "--quiet"]
    assert main([*argv, "--no-control", "--report-dir", str(tmp_path)]) == ExitCode.RACE
    assert "mutant-barrier-wrong-stream" in capsys.readouterr().out


def test_page_size_one_reads_nothing_new() -> None:
    # The opt-in get_last_loc read exists only with page_size > 1: default programs are what they were.
    default = build_program(replace(PAGED, page_size=1), load_design("war-after-launch").hooks)
    assert not any(op.kernel == "get_last_loc" for op in default.launches)
    paged = build_program(PAGED, load_design("war-after-launch").hooks)
    (first, *_) = [op for op in paged.launches if op.kernel == "get_last_loc"]
    assert first.stream.name == "plan_stream" and str(first.reads[0]) == "req_to_token[1, 3:4]"  # R[row, cur_alloc-1]


def test_get_last_loc_races_the_prefill_only_without_the_plan_entry_wait() -> None:
    for design in BUILTIN:
        assert races(PAGED, design) == set(), design
    assert ("RAW", "prefill_write", "get_last_loc") in races(PAGED, "mutant-plan-no-wait-schedule")
    # Without the paged read the same mutant is equivalent on this workload: over-allocation is column-disjoint.
    assert races(replace(PAGED, page_size=1), "mutant-plan-no-wait-schedule") == set()


def test_plan_exit_self_wait_leaves_the_forward_unordered_after_the_over_allocation() -> None:
    found = races(replace(PAGED, page_size=1), "mutant-plan-exit-self-wait")
    assert ("RAW", "overalloc_write", "block_gather") in found


def test_read_done_early_races_only_the_reader_after_the_event() -> None:
    workload = Workload(requests=(RequestSpec(0, 4, 64, (1, 1, 1), rewrite_at=(0,)),), iterations=2)
    found = races(workload, "mutant-read-done-early")
    assert ("WAR", "verify_page_table", "post_launch_rewrite") in found
    assert ("WAR", "draft_metadata", "post_launch_rewrite") not in found  # read before read_done: fenced


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(hazards=ALL_HAZARDS))
def test_skipping_copy_done_races_only_the_hosts_reads_of_the_results(workload: Workload) -> None:
    # Without `copy_done.synchronize()` the host's read of every copied-back result is unordered after the
    # copy (RAW on the host), and the base design has no race at all.
    base = build_program(workload, load_design("war-after-launch").hooks)
    mutant = build_program(workload, load_design("mutant-skip-copy-done").hooks)
    assert [op.kernel for op in base.launches] == [op.kernel for op in mutant.launches]
    assert not any(isinstance(op, EventSync) for op in mutant.ops)
    assert find_races(base) == []
    found = find_races(mutant)
    assert {(race.kind.value, race.first.kernel, race.second.kernel, race.second.stream.name) for race in found} <= {
        ("RAW", "copy_to_cpu", "result_read", "host")
    }
    results_read = sum(op.kernel == "result_read" for op in mutant.launches)
    assert len(found) == results_read, "every host read of a result races its copy"


def test_default_hazards_are_unchanged() -> None:
    assert HAZARDS == ("recycled-row-prefill", "chunked-stash", "post-launch-rewrite", "plan-stream")
    assert (*HAZARDS, "paged-get-last-loc") == ALL_HAZARDS


def test_30261_read_done_before_the_replay_races_the_replays_reads_and_its_fix_does_not() -> None:
    replay = Workload(requests=(RequestSpec(0, 4, 64, (1, 1), rewrite_at=(0,)),), iterations=2, replay_reads=True)
    found = races(replay, "mutant-30261-read-done-before-replay")
    assert found == {("WAR", "verify_forward", "post_launch_rewrite")}, "only the replay's read is left unordered"
    assert races(replay, "war-after-launch") == found, "the design of its time (#29541's event position)"
    assert races(replay, "read-done-post-replay") == set()
    assert races(replace(replay, replay_reads=False), "war-after-launch") == set(), "no replay reads: clean"


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(hazards=ALL_HAZARDS + LATER_HAZARDS))
def test_read_done_post_replay_is_clean_under_every_hazard(workload: Workload) -> None:
    assert find_races(build_program(workload, load_design("read-done-post-replay").hooks)) == []


def test_17850_chunked_row_recycling_races_without_a_barrier() -> None:
    from types import SimpleNamespace

    # A chunked request and one that arrives while it is chunked: the pre-#17850 allocator hands the
    # chunked request's old row to the newcomer, whose prefill write races the previous chunk's extend.
    workload = Workload(requests=(RequestSpec(0, 6, 3, (1,)), RequestSpec(1, 2, 64, (1,))), iterations=3, rows=2)
    unfenced = SimpleNamespace(name="unfenced-pre-17850", recycle_chunked_rows=True)
    program = build_program(workload, unfenced)
    (race,) = find_races(program)
    assert (race.kind.value, race.first.kernel, race.second.kernel) == ("WAR", "extend_page_table", "prefill_write")
    assert race.second.info["rows"] == [2, 1], "the chunked request moved to row 2, the newcomer took row 1"
    assert [str(cells) for cells in race.cells] == ["req_to_token[1, 0:2]"], "the newcomer's write of the old row"
    assert not program.violations, "the moved request's whole prefix is written in its new row"
    assert races(workload, "mutant-17850-chunked-row-recycled") == set(), "the barrier fences it (equivalent)"


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(hazards=("chunked-stash", "recycled-row-prefill")))
def test_the_17850_mutant_is_equivalent_on_its_base(workload: Workload) -> None:
    # Its `equivalent` argument, checked: no workload of its hazards makes it race.
    assert find_races(build_program(workload, load_design("mutant-17850-chunked-row-recycled").hooks)) == []


def test_29352_swa_recovery_races_the_in_graph_translate_only_on_the_fast_path() -> None:
    swa = Workload(
        requests=(RequestSpec(0, 6, 64, (1, 1, 1), swa_recovery=True),),
        iterations=4,
        block_size=2,
        swa_window=4,
        replay_reads=True,
    )
    found = races(swa, "mutant-29352-swa-fast-path")
    assert found == {("WAR", "verify_forward", "swa_recovery_clear")}, "the replay's translate, after read_done"
    assert races(swa, "global-war") == set(), "the coarse barrier (#29353)"
    assert races(swa, "read-done-post-replay") == set()
    assert races(replace(swa, replay_reads=False), "mutant-29352-swa-fast-path") == set(), "load_batch only: fenced"
    assert ("WAR", "verify_page_table", "swa_recovery_clear") in races(swa, "none"), "pre-#26380: no barrier"


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(hazards=("swa-mapping", "replay-reads", "plan-stream")))
def test_the_swa_table_is_written_with_req_to_token_on_the_same_stream(workload: Workload) -> None:
    program = build_program(workload, load_design("global-war").hooks)
    assert find_races(program) == []
    for op in program.launches:
        tables = {cells.buffer.name for cells in op.writes}
        if "req_to_token" in tables:
            assert tables == {"req_to_token", "full_to_swa_index_mapping"}, op.describe()


# A request decoding while a second one arrives: iteration 2's prefill batch is mixed with the running batch.
MIXED = Workload(requests=(RequestSpec(0, 4, 64, (1, 1, 1)), RequestSpec(2, 3, 64, (1,))), iterations=4, rows=2)


def test_34076_the_reused_block_races_the_gather_unless_record_stream() -> None:
    lifetime = replace(MIXED, mixed_chunk=True)
    racy = {("WAR", "mix_indices_gather", "mix_block_reuse")}
    for design in BUILTIN:
        if design != "record-stream":  # no commit up to `8905cbd42` carries the record_stream
            assert races(lifetime, design) == racy, design
    assert races(lifetime, "record-stream") == set()
    assert races(lifetime, "mutant-34076-no-record-stream") == racy
    program = build_program(lifetime, load_design("mutant-34076-no-record-stream").hooks)
    (race,) = find_races(program)
    assert [str(cells) for cells in race.cells] == ["mix_running_indices[0, 0:1]"], "the block, not a table"
    # Without mixed chunks nothing of it is built: default programs are what they were.
    default = build_program(MIXED, load_design("record-stream").hooks)
    assert not any(cells.buffer.name == "mix_running_indices" for op in default.launches for cells in op.reads)
    assert [op.kernel for op in default.launches] == [
        op.kernel for op in build_program(MIXED, load_design("read-done-post-replay").hooks).launches
    ]


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(hazards=ALL_HAZARDS + LATER_HAZARDS + LIFETIME_HAZARDS))
def test_record_stream_is_clean_under_every_hazard(workload: Workload) -> None:
    assert find_races(build_program(workload, load_design("record-stream").hooks)) == []


def test_26380_the_swa_mapping_races_without_the_barrier_and_the_decode_prep_sync_orders_nothing() -> None:
    swa = Workload(
        requests=(RequestSpec(0, 6, 64, (1, 1, 1), swa_recovery=True),), iterations=4, block_size=2, swa_window=4
    )
    program = build_program(swa, load_design("mutant-26380-swa-no-barrier").hooks)
    (race,) = find_races(program)
    assert (race.kind.value, race.first.kernel, race.second.kernel) == (
        "WAR",
        "verify_page_table",
        "swa_recovery_clear",
    )
    assert {cells.buffer.name for cells in race.cells} == {"full_to_swa_index_mapping"}
    assert races(swa, "global-war") == set(), "#26380's loop-top barrier"
    assert races(swa, "mutant-26380-swa-no-barrier") == races(swa, "none"), "the S sync adds no order against F"


@settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(hazards=ALL_HAZARDS))
def test_no_builtin_design_races_on_get_last_loc(workload: Workload) -> None:
    # Its writers are all on the schedule stream or the plan stream, and the loop's plan-stream entry and exit
    # waits (dflash_info_v2.py:193/:238), which no built-in overrides, order the plan stream with them.
    for design in BUILTIN:
        for race in find_races(build_program(workload, load_design(design).hooks)):
            assert "get_last_loc" not in (race.first.kernel, race.second.kernel), (design, str(race))
