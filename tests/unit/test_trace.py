"""racefuzz.trace on the CPU: torch ops recorded through the dispatch mode on virtual streams, kernels
without a schema through annotations, the value oracle, the delay search, the report, replay and CLI."""

from __future__ import annotations

import json
import math
import statistics

import pytest

torch = pytest.importorskip("torch")

from racefuzz.schedule import Schedule  # noqa: E402
from racefuzz.trace import WHOLE, annotate, launch_kernel, rows  # noqa: E402
from racefuzz.trace.annotations import _REGISTRY  # noqa: E402
from racefuzz.trace.capture import recording  # noqa: E402
from racefuzz.trace.env import TraceEnv  # noqa: E402
from racefuzz.trace.judge import trace_races  # noqa: E402
from racefuzz.trace.oracle import compare  # noqa: E402
from racefuzz.trace.recorder import Recorder  # noqa: E402
from racefuzz.trace.report import load_replay, race_text, render, replay_json  # noqa: E402
from racefuzz.trace.search import fuzz, run_once, search_schedules  # noqa: E402


def overlap(env, *, sync: bool = False, rows_written=(1,)):
    """A forward gathers rows 1 and 2 of req_to_token; the scheduler then rewrites some rows."""
    table = env.name(torch.zeros(4, 16, dtype=torch.int32), "req_to_token")
    schedule, forward = env.stream("schedule"), env.stream("forward")
    forward.wait_stream(env.current_stream())
    schedule.wait_stream(env.current_stream())
    with env.use(forward):
        kv = table[1:3].sum(0)
    if sync:
        schedule.wait_stream(forward)
    with env.use(schedule):
        for row in rows_written:
            table[row, 4:8] = 7
    env.synchronize()  # the table's free (the step's end) after both streams' use of it
    return {"kv": kv}


def races_of(step):
    return trace_races(run_once(step, "cpu", serialize=True).program)


def test_a_view_write_racing_a_read_is_found_with_its_source_line():
    (race,) = races_of(overlap)
    assert str(race.race.kind) == "WAR"
    assert (race.first.stream.name, race.second.stream.name) == ("forward", "schedule")
    assert race.first.kernel == "aten.sum.dim_IntList" and race.second.kernel.startswith("aten.fill_")
    assert race.where == ("req_to_token[1, 4:8]",)
    assert race.first.info["at"].endswith("(overlap)") and "test_trace.py" in race.first.info["at"]


def test_a_wait_stream_orders_it_and_disjoint_rows_never_conflict():
    assert races_of(lambda env: overlap(env, sync=True)) == []
    assert races_of(lambda env: overlap(env, rows_written=(0, 3))) == []  # rows the forward does not read


def test_events_and_host_syncs_are_recorded_as_on_a_gpu():
    def step(env):
        overlap(env)  # the racy pair
        done = env.event()
        done.record(env.current_stream())
        env.current_stream().wait_event(done)
        env.synchronize()

    trace = run_once(step, "cpu").program
    kinds = [type(op).__name__ for op in trace.ops]
    assert {"Record", "WaitEvent", "DeviceSync"} <= set(kinds)
    assert [s.name for s in trace.streams[:3]] == ["default", "forward", "schedule"]


def test_item_is_a_host_sync_of_the_current_stream():
    def step(env):
        value = torch.ones(2)
        forward = env.stream("forward")
        with env.use(forward):
            value.add_(1)
            assert value.sum().item() == 4.0

    trace = run_once(step, "cpu").program
    assert any(type(op).__name__ == "StreamSync" and op.stream.name == "forward" for op in trace.ops)


def test_ops_that_read_a_count_back_sync_before_their_launch_and_a_mask_assignment_does_not():
    def step(env):
        forward = env.stream("forward")
        table = torch.arange(8)
        with env.use(forward):
            table.nonzero()  # counts, reads the count back, then writes its output
            table[table > 3]  # a read through a boolean mask: nonzero inside
            table[torch.tensor([1, 2])]  # an integer index: no sync
            table[table > 6] = 0  # an assignment through a mask with a scalar: masked_fill_, no sync
            table.sum().item()  # a copy to the host, then the sync

    ops = run_once(step, "cpu").program.ops
    kernels = [op.kernel if type(op).__name__ == "Launch" else type(op).__name__ for op in ops]
    syncs = [i for i, kernel in enumerate(kernels) if kernel == "StreamSync"]
    assert [kernels[i + 1] for i in syncs[:2]] == ["aten.nonzero.default", "aten.index.Tensor"]  # before
    assert kernels[syncs[2] - 1] == "aten._local_scalar_dense.default" and len(syncs) == 3  # after
    assert all(ops[i].stream.name == "forward" for i in syncs)


def test_a_storage_grown_in_place_frees_its_old_block_then():
    recorder = Recorder("cpu", watch_frees=True)
    TraceEnv(recorder, "cpu")
    with recording(recorder):
        out = torch.zeros(4)
        before = out.untyped_storage().data_ptr()
        out.resize_(0)  # an `out=` tensor to be grown (without torch's warning for a non-empty one)
        torch.add(torch.ones(1 << 16), 1, out=out)  # grows `out`: its storage moves to a new block
        after = out.untyped_storage().data_ptr()
        out.add_(1)
    assert before != after
    ops = recorder.builder.ops
    kinds = [(op.info["kind"], op.kernel.split("(")[0]) for op in ops if type(op).__name__ == "Launch"]
    assert ("free", "free") in kinds
    free = next(op for op in ops if getattr(op, "info", {}).get("kind") == "free")
    add = next(op for op in ops if getattr(op, "kernel", "") == "aten.add.out")
    assert free.index == add.index - 1  # freed when the op grew it, before its launch
    assert free.writes[0].buffer.id != add.writes[0].buffer.id  # the old block, not the new one
    assert set(recorder.storage_table.watched) >= {after} and before not in recorder.storage_table.watched


def test_an_allocation_inside_an_opaque_launch_is_freed_on_its_stream():
    recorder = Recorder("cpu", watch_frees=True)
    env = TraceEnv(recorder, "cpu")
    side = env.stream("side")

    def launcher(**_):
        return torch.zeros(1 << 16)  # the launcher's own tensor (opaque), returned to the step

    with recording(recorder):
        made = launch_kernel("made_by_a_launcher", launcher)
        with env.use(side):
            made.sum()  # used on another stream, no edge back
        del made  # freed on the default stream
        _reused = torch.zeros(1 << 16)  # the default stream's next allocation: it may be handed the block
    races = trace_races(recorder.record.program)
    assert [(r.first.stream.name, r.second.info["kind"]) for r in races] == [("side", "free")]


def test_a_storage_dying_while_recording_is_its_free_and_its_address_a_new_storage():
    recorder = Recorder("cpu", watch_frees=True)  # as on a GPU: no storage kept alive
    env = TraceEnv(recorder, "cpu")
    forward = env.stream("forward")
    with recording(recorder):
        with env.use(forward):
            buffer = torch.empty(1 << 16)  # allocated on forward (not an access)
        buffer.fill_(2)  # on the default stream
        ptr = buffer.untyped_storage().data_ptr()
        del buffer  # freed: a write of the whole block on forward, unordered after the fill
        # A block at that address from now on is a new storage (malloc may or may not hand it out again
        # here; tests/cuda checks the caching allocator's reuse).
        assert recorder.storage_table.keys.get((ptr, recorder.storage_table.epochs[ptr])) is None
        with env.use(forward):
            _reused = torch.zeros(1 << 16)  # forward's next allocation: where the freed block may be reused
    ops = recorder.builder.ops
    frees = [op for op in ops if getattr(op, "info", {}).get("kind") == "free"]
    assert [(op.stream.name, op.writes[0].col0, op.writes[0].col1) for op in frees] == [("forward", 0, 4 << 16)]
    assert [(r.first.kernel, r.second.info["kind"]) for r in trace_races(recorder.record.program)] == [
        ("aten.fill_.Scalar", "free")
    ]


def test_views_and_allocations_are_not_accesses():
    def step(env):
        x = torch.empty(8)
        x.view(2, 4).t()
        x.fill_(1)

    trace = run_once(step, "cpu").program
    assert [op.kernel for op in trace.launches if op.info["kind"] != "free"] == ["aten.fill_.Scalar"]


def gather_rows(table, indices, lengths, out):
    for i, (row, n) in enumerate(zip(indices.tolist(), lengths.tolist(), strict=True)):
        out[i, :n] = table[row, :n]


@pytest.fixture
def annotated():
    annotate(
        "gather_rows",
        reads={"table": rows("table", "indices", lengths="lengths"), "indices": WHOLE, "lengths": WHOLE},
        writes={"out": WHOLE},
    )
    yield
    _REGISTRY.pop("gather_rows", None)


def kernel_step(env, write_row: int):
    table = env.name(torch.arange(64, dtype=torch.int32).reshape(4, 16), "req_to_token")
    out = torch.zeros(2, 16, dtype=torch.int32)
    indices, lengths = torch.tensor([1, 2]), torch.tensor([4, 8])
    forward, schedule = env.stream("forward"), env.stream("schedule")
    for stream in (forward, schedule):
        stream.wait_stream(env.current_stream())
    with env.use(forward):
        launch_kernel("gather_rows", gather_rows, table=table, indices=indices, lengths=lengths, out=out)
    with env.use(schedule):
        table[write_row, 6:10] = -1
    env.synchronize()  # the tensors' frees (the step's end) after every use
    return {"out": out}


def test_an_annotated_kernel_reads_only_the_cells_it_indexes(annotated):
    assert races_of(lambda env: kernel_step(env, write_row=3)) == []  # a row it does not read
    assert races_of(lambda env: kernel_step(env, write_row=1)) == []  # row 1 is read over columns 0:4 only
    (race,) = races_of(lambda env: kernel_step(env, write_row=2))  # row 2 is read over 0:8
    assert race.where == ("req_to_token[2, 6:8]",) and race.first.kernel == "gather_rows"
    assert race.first.info["kind"] == "external" and not race.first.info.get("assumed", False)


def test_an_unannotated_kernel_gets_the_conservative_default_once():
    reference = run_once(lambda env: kernel_step(env, write_row=3), "cpu", serialize=True)
    assert reference.assumed_kernels == ["gather_rows"]
    races = trace_races(reference.program)
    assert races and all(
        r.first.info.get("assumed", False) for r in races
    )  # the whole table is assumed read (and written)
    assert "sets assumed" in race_text(races[0])


class Flaky:
    """A step whose forward reads a value the 'fuzzed' run changes (standing in for a manifested race)."""

    def __init__(self) -> None:
        self.runs = 0

    def __call__(self, env):
        self.runs += 1
        table = env.name(torch.zeros(4, 16, dtype=torch.int32), "req_to_token")
        forward = env.stream("forward")
        with env.use(forward):
            table[0].fill_(3)
            if self.runs > 1:
                table[1, 2] = 9  # what a racing writer would have left
            gathered = table[1].clone()
            total = gathered.sum()
        return {"total": total}


def test_the_oracle_names_the_first_launch_that_stored_a_wrong_value():
    step = Flaky()
    reference = run_once(step, "cpu", serialize=True)
    fuzzed = run_once(step, "cpu", evaluate_annotations=False, snapshot_plan=reference.snapshots)
    divergence = compare(reference, fuzzed)
    assert divergence is not None and divergence.kind == "control-flow"  # it launched an extra kernel
    assert "launched aten" in divergence.detail
    assert compare(reference, reference) is None


def test_the_oracle_compares_stored_values_launch_by_launch():
    def step(env, poison: bool):
        table = env.name(torch.zeros(4, 16, dtype=torch.int32), "req_to_token")
        with env.use(env.stream("forward")):
            table[1].fill_(9 if poison else 1)  # same launch sequence, different stored values
            gathered = table[1].clone()
        return {"gathered": gathered}

    reference = run_once(lambda env: step(env, False), "cpu", serialize=True)
    fuzzed = run_once(lambda env: step(env, True), "cpu", evaluate_annotations=False, snapshot_plan=reference.snapshots)
    divergence = compare(reference, fuzzed)
    assert divergence is not None and divergence.kind == "value"
    assert divergence.launch is not None and divergence.launch.kernel.startswith("aten.fill_")
    assert "byte 64 of req_to_token" in divergence.detail


def test_the_delay_search_shrinks_to_the_one_point_that_matters():
    points = [("forward", n) for n in range(6)] + [("schedule", n) for n in range(6)]

    def attempt(schedule):
        return "manifested" if ("forward", 3) in schedule.device_delays else None

    schedule, found, _ = search_schedules(points, attempt, examples=300, max_delays=3, seed=1)
    assert found == "manifested" and list(schedule.device_delays) == [("forward", 3)] and not schedule.orders
    assert schedule.device_delays[("forward", 3)] == 5000.0  # shrunk towards the longest (most reliable) delay
    nothing, none_found, ran_clean = search_schedules(points, lambda d: None, examples=50, max_delays=2, seed=1)
    assert nothing == Schedule() and none_found is None and ran_clean == 50


def test_fuzz_on_the_cpu_reports_the_hb_verdict_and_says_the_search_did_not_run(tmp_path):
    result = fuzz(overlap, device="cpu")
    assert result.racy and not result.searched
    text = render(result)
    assert text.startswith("==== racefuzz trace: RACE in test_trace:overlap (cpu) ====") or "RACE in" in text
    assert "not run on the CPU" in text and "req_to_token[1, 4:8]" in text
    result.schedule = Schedule(device_delays={("forward", 2): 200.0})
    path = tmp_path / "r.json"
    path.write_text(json.dumps(replay_json(result, ("req_to_token",))))
    assert load_replay(path) == (result.step, "cpu", ("req_to_token",), [("forward", 2, 200.0)])


def test_the_freed_block_is_written_on_the_stream_it_was_allocated_on():
    recorder = Recorder("cpu")
    env = TraceEnv(recorder, "cpu")
    forward = env.stream("forward")
    with recording(recorder):
        buffer = torch.ones(16)
        ptr = buffer.untyped_storage().data_ptr()  # allocated on the default stream (`Recorder.allocated`)
        buffer.fill_(2)  # on the default stream
        forward.wait_stream(env.current_stream())
        with env.use(forward):
            buffer.sum()  # used on another stream without record_stream
        recorder.on_free(ptr)  # a CPU recorder keeps its storages alive: the free by hand
        _reused = torch.zeros(16)  # the default stream's next allocation: it may be handed the block
    races = trace_races(recorder.record.program)
    assert [(r.first.stream.name, r.second.kernel.startswith("free(")) for r in races] == [("forward", True)]


def trace_cli(argv: list[str]) -> int:
    """`racefuzz trace ARGS` through the subcommand's own parser (the CLI registers it the same way)."""
    import argparse

    from racefuzz.commands.trace import add_parser, trace_command

    parser = argparse.ArgumentParser(prog="racefuzz")
    commands = parser.add_subparsers(dest="command", required=True)
    add_parser(lambda name, help: commands.add_parser(name, help=help))
    return trace_command(parser.parse_args(["trace", *argv]))


def test_the_trace_command_exits_1_on_a_race_and_0_beside_a_caught_control(capsys, tmp_path):
    code = trace_cli(["racefuzz.trace.example:racy_step", "--device", "cpu", "--report-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 1 and "RACE" in out and "req_to_token[1, 0:8]" in out
    trace = json.loads((tmp_path / "trace-racefuzz.trace.example.racy_step.trace.json").read_text())
    flagged = [e for e in trace["traceEvents"] if e.get("args", {}).get("conflict")]
    assert sorted(e["name"] for e in flagged) == ["aten.fill_.Tensor", "aten.index.Tensor"]
    assert (tmp_path / "trace-racefuzz.trace.example.racy_step.png").exists()
    clean = trace_cli(
        ["racefuzz.trace.example:synced_step", "--device", "cpu", "--control", "racefuzz.trace.example:racy_step"]
    )
    out = capsys.readouterr().out
    assert clean == 0 and "negative control racefuzz.trace.example:racy_step: caught" in out
    inconclusive = trace_cli(
        ["racefuzz.trace.example:synced_step", "--device", "cpu", "--control", "racefuzz.trace.example:synced_step"]
    )
    assert inconclusive == 3


def test_a_failure_that_does_not_replay_is_still_reported():
    """On a GPU a schedule manifests with some probability: Hypothesis' replay may not fail again."""
    points = [("forward", n) for n in range(4)]
    calls = {"n": 0}

    def attempt(schedule):
        calls["n"] += 1
        return "manifested" if schedule.device_delays and calls["n"] == 3 else None  # exactly once

    schedule, found, _ = search_schedules(points, attempt, examples=50, max_delays=2, seed=3)
    assert found == "manifested" and schedule.device_delays


def test_watch_selects_the_launches_that_touch_the_watched_tensors():
    from racefuzz.trace.search import launch_points, watched_ordinals

    reference = run_once(overlap, "cpu", serialize=True)
    chosen = watched_ordinals(reference, ["req_to_token"])
    kernels = [reference.program.ops[reference.launch_ops[i]].kernel for i in sorted(chosen)]
    assert kernels[0] == "aten.zeros.default" and any(k.startswith("aten.fill_") for k in kernels)
    assert watched_ordinals(reference, []) is None
    assert launch_points(reference)[:2] == [("default", 0), ("forward", 0)]


def test_a_fuzzed_run_snapshots_only_after_the_watched_launches():
    from racefuzz.trace.search import judge_run, run_with_delays, watched_ordinals

    def step(env):
        table = env.name(torch.zeros(16, dtype=torch.int32), "table")
        model = torch.zeros(64)  # a tensor nobody watches, written twice
        with env.use(env.stream("s")):
            model.add_(1)
            table.fill_(3)
        return {"table": table}

    reference = run_once(step, "cpu", serialize=True)
    chosen = watched_ordinals(reference, ["table"])
    assert chosen == {0, 3} and set(reference.snapshots) == {0, 1, 2, 3}
    watched_run = run_with_delays(step, "cpu", reference, [], chosen)
    assert set(watched_run.snapshots) == chosen
    assert set(run_with_delays(step, "cpu", reference, []).snapshots) == {0, 1, 2, 3}
    assert judge_run(reference, watched_run, chosen) is None


def test_a_default_stream_kept_from_an_earlier_run_is_a_user_code_error_saying_so():
    import gc

    from racefuzz.errors import UserCodeError

    kept = []

    def first(env):
        kept.append(env.current_stream())
        kept.append(env.current_stream().record_event())

    def second(env):
        kept[0].wait_stream(env.stream("s"))

    def third(env):
        kept[1].record()

    run_once(first, "cpu")
    gc.collect()
    with pytest.raises(UserCodeError, match="stream 'default' belongs to a run that has ended"):
        run_once(second, "cpu")
    with pytest.raises(UserCodeError, match="event 'event#1' belongs to a run that has ended"):
        run_once(third, "cpu")


def test_run_kernels_false_records_a_kernel_from_its_annotation_without_running_it(annotated):
    def explode(**_):
        raise AssertionError("a run_kernels=False recorder must not run the kernel")

    def step(env):
        table = env.name(torch.zeros(4, 16, dtype=torch.int32), "req_to_token")
        with env.use(env.stream("forward")):
            launch_kernel(
                "gather_rows", explode, table=table, indices=torch.tensor([2]), lengths=torch.tensor([3]), out=None
            )

    trace = run_once(step, "cpu", serialize=True, run_kernels=False).program
    (launch,) = [op for op in trace.launches if op.kernel == "gather_rows"]
    table_read = launch.reads[0]
    assert table_read.describe() == "req_to_token[2, 0:3]"


def test_a_replay_file_reruns_its_step_with_its_delays(tmp_path, capsys):
    from racefuzz.errors import ReplayError

    path = _trace_replay_file(tmp_path / "replay.json")
    # On the CPU the run is eager: a delay cannot reorder anything, so the happens-before verdict is re-judged.
    assert trace_cli(["--replay", str(path), "--repeat", "2"]) == 1
    out = capsys.readouterr().out
    assert "reproduced as 1 happens-before race(s)" in out and "req_to_token[1, 0:8]" in out
    assert "reproduced in 0/2" not in out
    path.write_text(json.dumps({"format": "racefuzz-replay"}))
    with pytest.raises(ReplayError, match="not a racefuzz trace replay file"):
        trace_cli(["--replay", str(path)])


def _trace_replay_file(path, **fields):
    data = {
        "format": "racefuzz-trace-replay",
        "version": 1,
        "step": "racefuzz.trace.example:racy_step",
        "device": "cpu",
        "watch": ["req_to_token"],
        "delays": [{"stream": "forward", "launch": 0, "us": 5000.0}],
    }
    data.update(fields)
    path.write_text(json.dumps(data))
    return path


def test_racefuzz_replay_runs_a_trace_replay_file(tmp_path, capsys):
    """`racefuzz replay FILE` recognises a trace replay file and re-runs its step (as `trace --replay`)."""
    from racefuzz.cli import main

    path = _trace_replay_file(tmp_path / "replay.json")
    assert main(["replay", str(path), "--repeat", "2"]) == 1  # the happens-before race, on the CPU
    assert "reproduced as 1 happens-before race(s)" in capsys.readouterr().out
    synced = _trace_replay_file(tmp_path / "synced.json", step="racefuzz.trace.example:synced_step")
    assert main(["replay", str(synced)]) == 0
    assert "can only be re-run on a GPU" in capsys.readouterr().out
    assert main(["replay", str(path), "--backend", "sim"]) == 2
    assert "is a trace replay file" in capsys.readouterr().err


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"delays": [{"stream": "forward", "launch": 0, "us": 1e12}]}, "out of range"),
        ({"delays": [{"stream": "forward", "launch": -1, "us": 10.0}]}, "out of range"),
        ({"delays": [{"stream": "forward", "launch": 0, "us": float("nan")}]}, "out of range"),
        ({"delays": [{"stream": "forward", "launch": 0, "us": 1.0}] * 65}, "at most 64"),
        ({"version": 2}, "this racefuzz reads version 1"),
        ({"device": "tpu"}, "'device' must be"),
    ],
)
def test_a_trace_replay_file_out_of_range_is_one_usage_line(tmp_path, capsys, fields, message):
    from racefuzz.cli import main

    path = _trace_replay_file(tmp_path / "replay.json", **fields)
    assert main(["replay", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


# --- review findings -----------------------------------------------------------------------------------


def test_identical_outputs_holding_nan_or_nested_in_containers_do_not_diverge():
    def step(env):
        with env.use(env.stream("forward")):
            logits = torch.tensor([1.0, float("nan"), -0.0])
            pair = (logits * 2, torch.arange(3))
        return {"logits": logits, "pair": pair, "by_layer": {"0": [logits + 1]}, "nan": float("nan")}

    reference = run_once(step, "cpu", serialize=True)
    fuzzed = run_once(step, "cpu", evaluate_annotations=False, snapshot_plan=reference.snapshots)
    assert compare(reference, fuzzed) is None
    assert isinstance(reference.outputs["pair"], tuple) and isinstance(
        reference.outputs["by_layer"]["0"][0], torch.Tensor
    )


def test_outputs_that_differ_inside_a_container_or_in_a_nan_are_an_output_divergence():
    def step(env, value):
        with env.use(env.stream("forward")):
            out = torch.tensor([1.0, value])
        return {"nested": {"rows": [out]}}

    reference = run_once(lambda env: step(env, float("nan")), "cpu", serialize=True)
    for other in (2.0, -float("nan")):  # a different value, and a NaN of another sign bit
        fuzzed = run_once(lambda env, v=other: step(env, v), "cpu", snapshot_plan=reference.snapshots)
        divergence = compare(reference, fuzzed)
        assert divergence is not None and divergence.kind == "output" and "'nested'" in divergence.detail


def test_a_step_returning_a_bare_tensor_is_one_user_code_line_saying_what_is_expected(capsys):
    from racefuzz.cli import main
    from racefuzz.errors import UserCodeError

    with pytest.raises(UserCodeError, match=r"returned a Tensor: a step returns a dict of name -> tensor"):
        run_once(lambda env: torch.ones(3), "cpu", serialize=True)
    assert main(["trace", "test_trace:bare_tensor_step", "--device", "cpu"]) == 4
    err = capsys.readouterr().err
    assert "returned a Tensor" in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def bare_tensor_step(env):
    return torch.ones(3)


def test_an_unknown_watch_name_is_a_usage_error_listing_the_named_storages(capsys):
    from racefuzz.cli import main
    from racefuzz.errors import InvalidArgument
    from racefuzz.trace.search import watched_ordinals

    reference = run_once(overlap, "cpu", serialize=True)
    with pytest.raises(InvalidArgument, match=r"unknown watch name\(s\) req_to_tokn: .*named: req_to_token$"):
        watched_ordinals(reference, ["req_to_token", "req_to_tokn"])
    with pytest.raises(InvalidArgument, match="req_to_tokn"):
        fuzz(overlap, device="cpu", watch=["req_to_tokn"])  # on the CPU too, where no value check runs
    code = main(["trace", "racefuzz.trace.example:racy_step", "--device", "cpu", "--watch", "kv"])
    err = capsys.readouterr().err
    assert code == 2 and "unknown watch name(s) kv" in err and "req_to_token" in err


def failing_step(env):
    raise RuntimeError("the step's own bug")


def test_a_failing_control_or_replayed_step_is_an_error_in_user_code_not_an_internal_one(tmp_path, capsys):
    from racefuzz.cli import main

    code = main(
        ["trace", "racefuzz.trace.example:synced_step", "--device", "cpu", "--control", "test_trace:failing_step"]
    )
    err = capsys.readouterr().err
    assert code == 4 and "negative control test_trace:failing_step failed" in err and "the step's own bug" in err
    path = _trace_replay_file(tmp_path / "replay.json", step="test_trace:failing_step")
    for argv in (["trace", "--replay", str(path)], ["replay", str(path)]):
        assert main(argv) == 4
        err = capsys.readouterr().err
        assert "replayed step test_trace:failing_step failed" in err and len(err.strip().splitlines()) == 1


def test_cuda_without_a_usable_gpu_is_a_usage_error_before_any_user_code_runs(tmp_path, capsys, monkeypatch):
    from racefuzz.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    ran = []
    monkeypatch.setattr("racefuzz.trace.search.load_step", lambda spec: ran.append(spec))
    assert main(["trace", "racefuzz.trace.example:racy_step", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "'cuda' is not usable here" in err and len(err.strip().splitlines()) == 1
    path = _trace_replay_file(tmp_path / "replay.json", device="cuda")
    for argv in (["trace", "--replay", str(path)], ["replay", str(path)]):
        assert main(argv) == 2
        assert "'cuda' is not usable here" in capsys.readouterr().err
    assert ran == []  # the step's module was never even imported


def test_a_bad_report_dir_is_refused_before_the_step_runs(tmp_path, capsys, monkeypatch):
    from racefuzz.cli import main

    ran = []
    monkeypatch.setattr("racefuzz.trace.search.load_step", lambda spec: ran.append(spec))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code = main(["trace", "racefuzz.trace.example:racy_step", "--device", "cpu", "--report-dir", str(blocker / "d")])
    assert code == 2 and "--report-dir" in capsys.readouterr().err and ran == []


def test_a_report_dir_that_goes_bad_during_the_run_falls_back_to_a_temporary_one(tmp_path, capsys, monkeypatch):
    """The directory is removed (and a file put in its place) while the step runs: the race is kept."""
    from racefuzz.cli import main
    from racefuzz.trace.example import racy_step

    report_dir = tmp_path / "reports"
    report_dir.mkdir()

    def step(env):
        report_dir.rmdir()
        report_dir.write_text("not a directory any more")
        return racy_step(env)

    monkeypatch.setattr("racefuzz.trace.search.load_step", lambda spec: step)
    assert main(["trace", "whatever:step", "--device", "cpu", "--report-dir", str(report_dir)]) == 1
    captured = capsys.readouterr()
    assert f"cannot write to --report-dir {report_dir}" in captured.err
    elsewhere = captured.err.strip().rsplit(" go to ", 1)[1]
    assert "RACE" in captured.out and elsewhere in captured.out
    assert any(p.name.endswith(".trace.json") for p in __import__("pathlib").Path(elsewhere).iterdir())


def test_the_fixture_writes_the_timeline_of_a_race_and_fails_an_uncaught_control_as_inconclusive(tmp_path):
    from racefuzz.testing import Inconclusive, RaceFound
    from racefuzz.trace.example import racy_step, synced_step
    from racefuzz.trace.fixture import RaceInTrace, TraceFixture

    fixture = TraceFixture("sim", 10, None, tmp_path)
    with pytest.raises(RaceInTrace) as raised:
        fixture.fuzz(racy_step)
    assert isinstance(raised.value, RaceFound)
    timeline = tmp_path / "trace-racefuzz.trace.example.racy_step.trace.json"
    assert timeline.exists() and str(timeline) in str(raised.value)
    with pytest.raises(Inconclusive, match=r"negative control racefuzz\.trace\.example:synced_step did not race"):
        fixture.fuzz(synced_step, control=synced_step)


def test_source_lines_are_exact_per_call_site_and_recording_leaves_the_gc_as_it_found_it():
    import gc

    def step(env):
        x = torch.zeros(8)
        for _ in range(2):
            x.add_(1)  # first site
            x.mul_(2)  # second site
        return {"x": x}

    frozen = gc.get_freeze_count()
    trace = run_once(step, "cpu").program
    assert gc.get_freeze_count() == frozen and gc.isenabled()
    in_place = ("aten.add_.Tensor", "aten.mul_.Tensor")
    sources = [op.info["at"] for op in trace.ops if getattr(op, "kernel", "") in in_place]
    first, second = sources[0], sources[1]
    assert first != second and sources == [first, second, first, second]
    assert int(second.split(":")[1].split()[0]) == int(first.split(":")[1].split()[0]) + 1


def test_the_recording_cost_is_measured_on_the_cpu_and_printed_with_its_overhead(capsys):
    from ci.bench.proof import main, recording_cost

    figures = recording_cost(ops=20, runs=3, device="cpu")
    measured = {"plain", "plain_installed", "trace", "trace_with_snapshots"}
    derived = {"trace_minus_plain", "snapshots_minus_plain", "installed_minus_plain", "recording_overhead"}
    assert set(figures) == {f"{name}_us_per_op" for name in measured | derived}
    assert figures["trace_minus_plain_us_per_op"] == figures["trace_us_per_op"] - figures["plain_us_per_op"]
    assert main(["micro", "--device", "cpu", "--ops", "20", "--runs", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("RECORDING micro device=cpu ops=20 runs=1 plain_us_per_op=")
    assert "RECORDING-OVERHEAD trace_minus_plain_us_per_op=" in out and "FASTEST micro device=cpu" in out
    assert "recording_overhead_us_per_op=" in out


def test_the_recording_overhead_pairs_each_round_with_its_own_plain_run():
    from ci.bench.proof import _overheads

    samples = {  # a machine that slows down by 10 us/op between the rounds
        "plain_us_per_op": [20.0, 30.0, 40.0],
        "plain_installed_us_per_op": [21.0, 31.0, 41.0],
        "trace_us_per_op": [35.0, 38.0, 52.0],
        "trace_with_snapshots_us_per_op": [60.0, 70.0, 80.0],
    }
    figures = _overheads(samples, statistics.median)
    assert figures["recording_overhead_us_per_op"] == 12.0  # rounds: 15, 8, 12
    assert figures["installed_minus_plain_us_per_op"] == 1.0
    assert figures["trace_minus_plain_us_per_op"] == 38.0 - 30.0  # unpaired: the drift leaks in
    assert _overheads(samples, min)["recording_overhead_us_per_op"] == 8.0
    assert _overheads(samples, min, paired=False)["recording_overhead_us_per_op"] == 35.0 - 20.0
    samples["plain_installed_us_per_op"] = [18.0, 28.0, 38.0]  # patches that make unrecorded code faster
    assert _overheads(samples, statistics.median)["installed_minus_plain_us_per_op"] == -2.0


def test_the_cost_baseline_takes_racefuzzs_cuda_patches_out_and_puts_them_back(monkeypatch):
    """`cuda_api.unpatched` restores what each patched owner had (deleting an attribute the patch added to a
    subclass, so the base's method shows through) and re-installs the patches after, even on an error."""
    from types import SimpleNamespace

    from racefuzz.trace import cuda_api

    class Base:
        def record(self) -> str:
            return "torch's record"

    class Event(Base):
        def wait(self) -> str:
            return "torch's wait"

    module = SimpleNamespace(synchronize=lambda: "torch's synchronize")
    originals = [(Event, "record", cuda_api.ABSENT), (Event, "wait", Event.__dict__["wait"])]
    originals.append((module, "synchronize", module.synchronize))
    monkeypatch.setattr(cuda_api, "ORIGINALS", originals)
    Event.record = lambda self: "patched record"
    Event.wait = lambda self: "patched wait"
    module.synchronize = lambda: "patched synchronize"
    with cuda_api.unpatched():
        assert (Event().record(), Event().wait(), module.synchronize()) == (
            "torch's record",
            "torch's wait",
            "torch's synchronize",
        )
        assert "record" not in vars(Event)
    assert (Event().record(), Event().wait(), module.synchronize()) == (
        "patched record",
        "patched wait",
        "patched synchronize",
    )
    with pytest.raises(RuntimeError, match="the baseline failed"), cuda_api.unpatched():
        raise RuntimeError("the baseline failed")
    assert Event().record() == "patched record"
    monkeypatch.setattr(cuda_api, "ORIGINALS", [])
    with cuda_api.unpatched():  # no patches installed: nothing to take out
        assert Event().record() == "patched record"


def test_the_step_cost_pairs_each_run_with_an_empty_dispatch_mode_on_the_cpu():
    from ci.bench.proof import _step_cost

    figures = _step_cost(overlap, rounds=5, device="cpu")
    assert set(figures) == {
        "step_median_us",
        "step_installed_median_us",
        "recorded_step_median_us",
        "installed_us",
        "recording_us",
        "dispatch_floor_us",
    }
    assert all(math.isfinite(value) for value in figures.values())
    # Recording (a recorder, the dispatch mode, a trace of ~20 ops) costs far more than the step's CPU ops.
    assert figures["recorded_step_median_us"] > figures["step_median_us"]


def test_a_resize_that_moves_a_storage_frees_its_old_block_then():
    recorder = Recorder("cpu", watch_frees=True)
    env = TraceEnv(recorder, "cpu")
    side = env.stream("side")
    with recording(recorder):
        x = torch.zeros(16)  # allocated on the default stream
        side.wait_stream(env.current_stream())
        with env.use(side):
            x.sum()  # read on side
        before = x.untyped_storage().data_ptr()
        x.resize_(1 << 16)  # a new block now: the old one freed on the default stream, unordered after the read
        assert x.untyped_storage().data_ptr() != before
        _reused = torch.zeros(16)  # the default stream's next allocation: it may be handed the old block
        env.current_stream().wait_stream(side)  # too late for that reuse
        x.add_(1)
    races = trace_races(recorder.record.program)
    assert [(r.first.stream.name, r.second.info["kind"]) for r in races] == [("side", "free")]


def test_a_cpu_recorder_takes_a_grown_storages_old_address_for_a_new_storage():
    recorder = Recorder("cpu")  # keeps its storages alive instead of watching them: no frees
    TraceEnv(recorder, "cpu")
    with recording(recorder):
        out = torch.zeros(4)
        before = out.untyped_storage().data_ptr()
        out.resize_(0)
        torch.add(torch.ones(1 << 12), 1, out=out)  # grown: the old block may be handed out again
    assert recorder.storage_table.keys.get((before, recorder.storage_table.epochs.get(before, 0))) is None


def test_the_recorder_knows_a_storage_it_accessed_until_its_block_is_freed():
    recorder = Recorder("cpu", watch_frees=True)
    TraceEnv(recorder, "cpu")
    with recording(recorder):
        seen = torch.zeros(8)
        seen.add_(1)
        unseen = torch.empty(8)  # allocated, never accessed
        assert recorder.knows(seen) and recorder.knows(seen[2:]) and not recorder.knows(unseen)
        ptr = seen.untyped_storage().data_ptr()
        del seen  # its epoch ends: a tensor the allocator puts on that block again is another storage
        assert recorder.storage_table.epochs[ptr] == 1 and (ptr, 1) not in recorder.storage_table.keys


def test_a_copy_torch_made_out_of_sight_is_recorded_without_a_delay_point():
    """`torch.tensor`'s copy to the GPU has run when the mode sees it: a `copy` launch, which neither takes a
    delay nor counts among the stream's delay points."""
    from racefuzz.trace.search import launch_points

    recorder = Recorder("cpu", delays={("default", 0): 1.0}, snapshot_plan={})
    TraceEnv(recorder, "cpu")
    with recording(recorder):
        made = torch.empty(4)  # allocation only: no launch
        recorder.launch("a hidden copy", "copy", lambda: made, [], [("out0", made)])
        made.add_(1)  # the stream's first delay point
    record = recorder.finish({})
    assert [op.info["kind"] for op in record.program.ops if hasattr(op, "info")] == ["copy", "torch"]
    assert record.delays_applied == [("default", 0, 1.0)]
    assert launch_points(record) == [("default", 0)]


def test_a_new_allocation_forgets_an_old_blocks_record_stream():
    recorder = Recorder("cpu", watch_frees=True)
    TraceEnv(recorder, "cpu")
    tensor = torch.zeros(4)
    ptr = tensor.untyped_storage().data_ptr()
    recorder.storage_table.recorded_streams.add(ptr)  # left by a block at this address that died unseen
    recorder.allocated(tensor)
    assert ptr not in recorder.storage_table.recorded_streams


def test_a_view_returned_by_an_opaque_launch_is_not_an_allocation():
    recorder = Recorder("cpu", watch_frees=True)
    env = TraceEnv(recorder, "cpu")
    side = env.stream("side")

    def launcher(x):
        return torch.ops.aten._unsafe_view(x, [2, 8])  # a fresh-looking output on x's storage

    with recording(recorder):
        x = torch.zeros(16)  # allocated on the default stream
        with env.use(side):
            launch_kernel("viewer", launcher, x=x)
    assert recorder.storage_table.alloc_streams[x.untyped_storage().data_ptr()] == "default"


class _FakeCudaTensor:
    """What the sync rules read of a tensor, for the GPU cases this CPU cannot make."""

    def __init__(self, cuda=True, numel=4, contiguous=True, dtype="f32", conj=False, neg=False, pinned=False):
        self.is_cuda, self._numel, self._contiguous, self.dtype = cuda, numel, contiguous, dtype
        self._conj, self._neg, self._pinned = conj, neg, pinned

    def numel(self):
        return self._numel

    def is_contiguous(self):
        return self._contiguous

    def is_conj(self):
        return self._conj

    def is_neg(self):
        return self._neg

    def is_pinned(self):
        return self._pinned


def _fake_sync_rules():
    from racefuzz.trace.sync_rules import SyncRules

    return SyncRules(_FakeCudaTensor, frozenset({torch.bool, torch.uint8}))


def test_where_the_host_waits_in_a_copy_between_host_and_gpu():
    rules = _fake_sync_rules()
    gpu, cpu = _FakeCudaTensor(), _FakeCudaTensor(cuda=False)

    def copy_(dst, src, *, non_blocking=False, on_gpu=True):
        return rules.in_copy((dst, src, non_blocking), {}, dst, on_gpu)

    assert copy_(cpu, gpu) == "after"  # to the host: memcpy_and_sync is the last step
    assert copy_(gpu, cpu) == "after"  # to the device, nothing after the copy
    assert copy_(_FakeCudaTensor(contiguous=False), cpu) == "before"  # a kernel after the sync
    assert copy_(_FakeCudaTensor(dtype="f16"), cpu) == "before"
    assert copy_(gpu, _FakeCudaTensor(cuda=False, conj=True)) == "before"  # conj_physical_ after the sync
    assert copy_(gpu, _FakeCudaTensor(cuda=False, neg=True)) == "before"
    assert copy_(cpu, gpu, non_blocking=True) == ""  # never promised
    assert copy_(_FakeCudaTensor(cuda=False, numel=0), _FakeCudaTensor(numel=0)) == ""  # copies nothing
    assert copy_(gpu, _FakeCudaTensor()) == ""  # device to device
    assert copy_(cpu, gpu, on_gpu=False) == ""  # a CPU run has no host/device copies
    assert rules.in_copy((gpu,), {"non_blocking": True}, cpu, True) == ""  # `_to_copy`'s keyword


def test_ops_that_count_sync_only_on_non_empty_device_tensors_in_a_gpu_run():
    rules = _fake_sync_rules()
    gpu, cpu, empty = _FakeCudaTensor(), _FakeCudaTensor(cuda=False), _FakeCudaTensor(numel=0)
    mask, host_mask = _FakeCudaTensor(dtype=torch.bool), _FakeCudaTensor(cuda=False, dtype=torch.bool)
    assert [rules.on_input((t,), {}, None, True) for t in (gpu, cpu, empty)] == ["before", "", ""]
    assert rules.after_copy_out((gpu,), {}, None, True) == "after"
    assert rules.after_copy_out((cpu,), {}, None, True) == ""
    on_mask = [rules.on_mask((gpu, [None, index]), {}, None, True) for index in (mask, host_mask, gpu)]
    assert on_mask == ["before", "", ""]  # a device boolean mask; not a host one, nor integer indices
