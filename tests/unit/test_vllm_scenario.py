"""The vLLM KV-reuse scenario (racefuzz/scenarios/vllm, docs/vllm-kv-model.md): #45357's race found on its racy
design beside the fix clean, the conditions it needs, manifestation, shrinking, replay, bounded proofs, the
mutants, the CLI's `--scenario` and the assertions the pytest plugin calls."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from racefuzz.backends import executor
from racefuzz.cli import main
from racefuzz.designs import load_design
from racefuzz.errors import InvalidArgument
from racefuzz.exitcodes import ExitCode
from racefuzz.hb import find_races
from racefuzz.oracle import find_corruptions
from racefuzz.prove import prove
from racefuzz.report import load_replay, render, save_counterexample
from racefuzz.scenarios import get_scenario
from racefuzz.scenarios.vllm import HAZARDS, SCENARIO, RequestSpec, Workload, build_program
from racefuzz.scenarios.vllm.mutants import MUTANTS
from racefuzz.schedule import Schedule
from racefuzz.search import search
from racefuzz.sim import simulate
from racefuzz.testing import Config, RaceFound, assert_race_free

NAME = "vllm-kv-reuse"
STALE_WRITE = ("WAW", "reshape_and_cache_flash", "compute_stream", "nixl_read_blocks", "kv_connector")
"""#45357: the over-scheduled step's KV write and the connector's load into the reallocated block, unordered."""

R_FINISHES = RequestSpec(arrival=0, prompt_len=2, output_len=1, eos=True)
"""Samples its stop token in its prefill step (step 0); async scheduling has already scheduled step 1 with it,
which writes the KV of position 2 into a second block."""
R_LOADED = RequestSpec(arrival=1, prompt_len=2, output_len=2, remote=True)
"""A P/D consumer, waiting for a block until R_FINISHES frees its two: the tail one, with step 1's stale KV in
it, is handed out first; its prompt KV is loaded into it, then it decodes (reading it)."""
SHAPE_45357 = Workload(requests=(R_FINISHES, R_LOADED), steps=5, block_size=2, num_blocks=2)
SEED = 2
"""A search seed whose first racy example of `immediate-free` shrinks to #45357's two requests (seed 0's is a
four-request WAR on cells only the over-scheduled step's discarded attention loads: an ordering conflict)."""
BOUND = {"max_bytes": 11, "alphabet": 2, "option_sets": [{"fixed_iterations": True, "max_iterations": 3}]}


def _design(name: str):
    return load_design(name, NAME)


def _keys(workload: Workload, design: str) -> set[tuple[str, ...]]:
    return {race.key for race in find_races(build_program(workload, _design(design).hooks))}


def test_the_scenario_is_built_in_and_its_designs_load_by_name() -> None:
    assert get_scenario(NAME) is SCENARIO and SCENARIO.control_design == "immediate-free"
    assert set(SCENARIO.designs()) == {"none", "immediate-free", "deferred-free", "step-event"}
    assert _design("deferred-free").scenario is SCENARIO
    assert len(MUTANTS) == 7 and all(_design(name).scenario is SCENARIO for name in MUTANTS)
    with pytest.raises(InvalidArgument, match="unknown design 'global-war'"):
        _design("global-war")


def test_45357_needs_async_scheduling_a_stop_token_a_connector_load_and_a_reused_block() -> None:
    assert STALE_WRITE in _keys(SHAPE_45357, "immediate-free")
    assert _keys(SHAPE_45357, "deferred-free") == set() == _keys(SHAPE_45357, "step-event")
    # Each condition taken away, the racy design is clean on this workload.
    assert _keys(replace(SHAPE_45357, async_scheduling=False), "immediate-free") == set()
    stops_at_max_tokens = (replace(R_FINISHES, eos=False), R_LOADED)  # the async scheduler sees it coming
    assert _keys(replace(SHAPE_45357, requests=stops_at_max_tokens), "immediate-free") == set()
    prefilled = (R_FINISHES, replace(R_LOADED, remote=False))  # on the compute stream, behind the stale write
    assert _keys(replace(SHAPE_45357, requests=prefilled), "immediate-free") == set()
    fresh_blocks = replace(SHAPE_45357, num_blocks=4)
    assert STALE_WRITE not in _keys(fresh_blocks, "immediate-free")
    # The offloading connector's transfer stream waits on the compute stream: no deferral needed there.
    assert _keys(replace(SHAPE_45357, connector="offloading"), "immediate-free") == set()


def test_the_race_is_found_on_the_control_and_the_fix_is_clean_beside_it() -> None:
    sim = executor("sim")
    control = search(_design("immediate-free"), sim, examples=400, seed=0, shrink=False)
    fixed = search(_design("deferred-free"), sim, examples=400, seed=0)
    alternative = search(_design("step-event"), sim, examples=400, seed=0)
    assert control.found and control.counterexample is not None
    assert STALE_WRITE in {race.key for race in control.counterexample.races}
    assert not fixed.found and fixed.examples == 400
    assert not alternative.found and alternative.examples == 400


def _delayed_stale_write(design: str) -> list:
    """The corruptions of SHAPE_45357 when the over-scheduled step's KV write is held back 2 ms on its stream."""
    program = build_program(SHAPE_45357, _design(design).hooks)
    (stale,) = [
        op
        for op in program.launches
        if op.kernel == "reshape_and_cache_flash" and op.info["step"] == 1 and op.info["over_scheduled"] == "0"
    ]
    execution = simulate(program, Schedule(device_delays={stale.index: 2000.0}))
    return find_corruptions(program, execution.observations)


def test_the_stale_write_lands_in_the_loaded_requests_kv_only_when_it_is_late() -> None:
    corruptions = _delayed_stale_write("immediate-free")
    assert corruptions, "a stale KV write landing after the load must corrupt the loaded request's reads"
    # What is corrupted is request 1's own attention over its loaded prompt KV, not the finished request's.
    assert {(c.read.kernel, c.read.info["requests"]) for c in corruptions} == {("flash_attn_varlen_func", "1")}
    assert all(c.read.reads[c.range_index].buffer.name == "kv_cache" for c in corruptions)
    assert _delayed_stale_write("deferred-free") == [] == _delayed_stale_write("step-event")
    undelayed = build_program(SHAPE_45357, _design("immediate-free").hooks)
    assert find_corruptions(undelayed, simulate(undelayed).observations) == []  # it depends on the schedule


def test_shrinking_gives_the_small_workload_of_45357() -> None:
    result = search(_design("immediate-free"), executor("sim"), examples=400, seed=SEED)
    counterexample = result.counterexample
    assert counterexample is not None
    w = counterexample.workload
    assert len(w.requests) == 2 and w.steps <= 3 and w.async_scheduling and w.num_blocks <= 4
    assert [r.remote for r in w.requests] == [False, True] and w.requests[0].eos


def test_a_counterexample_replays_to_the_same_report(tmp_path, capsys) -> None:
    result = search(_design("immediate-free"), executor("sim"), examples=400, seed=SEED)
    path, text, _ = save_counterexample(result, SEED, tmp_path)
    assert text.startswith("==== racefuzz: WAW race on kv_cache (design immediate-free, backend sim) ====")
    assert "counterexample: 2 request(s) (1 remote, 1 stopping on EOS)" in text
    assert json.loads(path.read_text())["scenario"] == NAME
    replay = load_replay(path)
    assert replay.scenario is SCENARIO and replay.workload == result.counterexample.workload
    assert (
        render(result.counterexample, design=replay.design, backend="sim", replay_path=path, scenario=SCENARIO) == text
    )
    capsys.readouterr()
    assert main(["replay", str(path)]) == ExitCode.RACE
    assert "WAW race on kv_cache" in capsys.readouterr().out


def test_the_fixes_are_proved_in_a_bound_where_the_control_races() -> None:
    proofs = {name: prove(_design(name), hazards=HAZARDS, **BOUND) for name in ("deferred-free", "step-event")}
    control = prove(_design("immediate-free"), hazards=HAZARDS, **BOUND)
    for proof in proofs.values():
        assert proof.proved and proof.workloads == control.workloads > 500
    assert control.racing > 0 and "nixl_read_blocks" in control.counterexamples[0].what


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_every_mutant_is_caught_where_its_base_is_clean(name: str) -> None:
    mutant = MUTANTS[name]
    hazards = mutant.hazards  # type: ignore[attr-defined]
    caught = search(_design(name), executor("sim"), examples=500, seed=0, hazards=hazards, shrink=False)
    base = search(_design(mutant.base), executor("sim"), examples=500, seed=0, hazards=hazards)  # type: ignore[attr-defined]
    assert caught.found, name
    assert not base.found and base.examples == 500, mutant.base  # type: ignore[attr-defined]


def test_workloads_round_trip_through_json_and_bad_ones_are_one_line_errors() -> None:
    assert SCENARIO.workload_from_json(json.loads(json.dumps(SHAPE_45357.to_json()))) == SHAPE_45357
    for bad, message in (
        ({"steps": 10**6}, "steps must be in"),
        ({"connector": "rdma"}, "connector must be one of"),
        ({"requests": [{"prompt_len": 200}], "num_blocks": 2}, "needs 101 blocks"),
        ({"requests": [{"eos": 1}]}, "eos must be true or false"),
        ({"bogus": 1}, "malformed"),
    ):
        with pytest.raises(InvalidArgument, match=message):
            Workload.from_json(bad)
    with pytest.raises(InvalidArgument, match="no workload option"):
        SCENARIO.workload_space(frozenset(HAZARDS), plan_stream=True)


def test_the_cli_runs_proves_and_compares_the_scenario(tmp_path, capsys) -> None:
    common = ["--scenario", NAME, "--report-dir", str(tmp_path)]
    assert main(["run", *common, "--backend", "sim", "--examples", "400", "--quiet"]) == ExitCode.CLEAN
    out = capsys.readouterr().out
    assert "design deferred-free on sim" in out and "negative control `immediate-free`: caught" in out
    assert main(["run", *common, "--backend", "sim", "--design", "mutant-fence-off-by-one", "--quiet"]) == ExitCode.RACE
    capsys.readouterr()
    prove_argv = ["prove", *common, "--max-bytes", "11", "--iterations", "3", "--quiet"]
    assert main(prove_argv) == ExitCode.CLEAN
    assert "deferred-free: PROVED race-free" in capsys.readouterr().out
    summary = tmp_path / "compare.json"
    assert main(["compare", "--scenario", NAME, "--backend", "sim", "--workloads", "30", "--json", str(summary)]) == 0
    rows = json.loads(summary.read_text())["designs"]
    assert set(rows) == set(SCENARIO.designs()) and rows["deferred-free"]["unordered"] == 0
    assert main(["designs", "--scenario", NAME]) == 0 and "step-event" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "--scenario", "nope"], "unknown scenario 'nope'"),
        (["run", "--scenario", NAME, "--hazards", "plan-stream"], "unknown hazard(s) ['plan-stream']"),
        (["run", "--scenario", NAME, "--plan-stream"], "no workload option(s) ['plan_stream']"),
        (["compare", "--scenario", NAME, "--backend", "sim", "--plot", "x.png"], "draws no plot"),
    ],
)
def test_bad_scenario_input_is_one_line_and_exit_2(argv: list[str], message: str, tmp_path, capsys) -> None:
    assert main([*argv, *(["--report-dir", str(tmp_path)] if argv[0] == "run" else [])]) == ExitCode.USAGE
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err


def test_the_assertions_the_pytest_plugin_calls_drive_the_scenario(tmp_path) -> None:
    config = Config(backend="sim", examples=300, seed=SEED, report_dir=tmp_path)
    result = assert_race_free(_design("deferred-free"), config)  # beside the scenario's control, caught
    assert not result.found
    with pytest.raises(RaceFound, match="race on kv_cache"):
        assert_race_free(_design("mutant-fence-off-by-one"), config)
