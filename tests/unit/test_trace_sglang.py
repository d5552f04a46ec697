"""sglang 0.5.23's overlap step (racefuzz.scenarios.sglang.real_kernels) judged on the CPU from committed traces.

The traces under tests/unit/traces/ were recorded from sglang's real pool and kernels with
`run_once(step, "cpu", serialize=True, run_kernels=False)` (the Triton kernels recorded from their
annotations, not run); the H200 run in docs/results/sglang-step-proof-h200/proof.log gave the same verdicts. Where
sglang and Triton are importable, the traces are also recorded afresh and must match.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import pytest

from racefuzz.program import Program, WaitEvent, program_from_json, program_to_json
from racefuzz.trace.judge import trace_races

TRACES = Path(__file__).parent / "traces"
DESIGNS = ("none", "global-war", "war-after-launch", "self-event")


def committed(design: str) -> Program:
    return program_from_json(json.loads((TRACES / f"sglang-{design}.json").read_text()))


def test_none_races_exactly_where_the_scheduler_rewrites_a_row_the_forward_reads():
    races = trace_races(committed("none"))
    assert [(str(r.race.kind), r.first.kernel, r.second.kernel, r.where) for r in races] == [
        ("WAR", "create_flashinfer_kv_indices_triton", "write_req_to_token_pool_triton", ("req_to_token[1, 0:48]",)),
        ("WAR", "aten.index.Tensor", "write_req_to_token_pool_triton", ("req_to_token[1, 0:32]",)),
    ]
    # The plan stream's over-allocation writes columns 128:136 of row 4, which no forward launch reads.
    assert all(r.second.kernel != "assign_req_to_token_pool" for r in races)


@pytest.mark.parametrize("design", ["global-war", "war-after-launch", "self-event"])
def test_every_barrier_orders_the_pairs(design: str):
    program = committed(design)
    assert trace_races(program) == []
    # The verdict rests on the barrier's wait: drop the scheduler's waits on the forward and it races.
    kept = [op for op in program.ops if not (isinstance(op, WaitEvent) and op.stream.name == "schedule_stream")]
    unsynced = dataclasses.replace(program, ops=tuple(op._replace(index=i) for i, op in enumerate(kept)))
    assert trace_races(unsynced) != []


def test_the_traces_round_trip_through_json():
    program = committed("none")
    assert program_from_json(json.loads(json.dumps(program_to_json(program)))) == program


@pytest.mark.skipif(
    importlib.util.find_spec("sglang") is None or importlib.util.find_spec("triton") is None,
    reason="needs sglang 0.5.23 (pip install --no-deps sglang==0.5.23) and Triton",
)
@pytest.mark.parametrize("design", DESIGNS)
def test_recording_sglangs_code_afresh_gives_the_committed_verdicts(design: str):
    pytest.importorskip("torch")
    from racefuzz.scenarios.sglang import real_kernels
    from racefuzz.trace.search import run_once

    fresh = run_once(real_kernels.step_for(design), "cpu", serialize=True, run_kernels=False).program
    assert [str(r) for r in trace_races(fresh)] == [str(r) for r in trace_races(committed(design))]
