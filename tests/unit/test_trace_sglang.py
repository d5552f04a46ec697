"""sglang 0.5.23's overlap step (racefuzz.scenarios.sglang.real_kernels) judged on the CPU from committed traces.

The traces under tests/unit/traces/ were recorded from sglang's real pool and kernels with
`run_once(step, "cpu", serialize=True, run_kernels=False)` (the Triton kernels recorded from their
annotations, not run); the H200 run in docs/results/sglang-step-proof-h200/proof.log gave the same verdicts. Where
sglang and Triton are importable, the traces are also recorded afresh and must match.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from racefuzz.trace.convert import find_trace_races
from racefuzz.trace.model import TraceWait, trace_from_json, trace_to_json

TRACES = Path(__file__).parent / "traces"
DESIGNS = ("none", "global-war", "war-after-launch", "self-event")


def committed(design: str):
    return trace_from_json(json.loads((TRACES / f"sglang-{design}.json").read_text()))


def test_none_races_exactly_where_the_scheduler_rewrites_a_row_the_forward_reads():
    races = find_trace_races(committed("none"))
    assert [(str(r.race.kind), r.first.kernel, r.second.kernel, r.where) for r in races] == [
        ("WAR", "create_flashinfer_kv_indices_triton", "write_req_to_token_pool_triton", ("req_to_token[1, 0:48]",)),
        ("WAR", "aten.index.Tensor", "write_req_to_token_pool_triton", ("req_to_token[1, 0:32]",)),
    ]
    # The plan stream's over-allocation writes columns 128:136 of row 4, which no forward launch reads.
    assert all(r.second.kernel != "assign_req_to_token_pool" for r in races)


@pytest.mark.parametrize("design", ["global-war", "war-after-launch", "self-event"])
def test_every_barrier_orders_the_pairs(design: str):
    trace = committed(design)
    assert find_trace_races(trace) == []
    # The verdict rests on the barrier's wait: drop the scheduler's waits on the forward and it races.
    trace.ops = [op for op in trace.ops if not (isinstance(op, TraceWait) and op.stream == "schedule_stream")]
    assert find_trace_races(trace) != []


def test_the_traces_round_trip_through_json():
    trace = committed("none")
    assert trace_from_json(json.loads(json.dumps(trace_to_json(trace)))) == trace


@pytest.mark.skipif(
    importlib.util.find_spec("sglang") is None or importlib.util.find_spec("triton") is None,
    reason="needs sglang 0.5.23 (pip install --no-deps sglang==0.5.23) and Triton",
)
@pytest.mark.parametrize("design", DESIGNS)
def test_recording_sglangs_code_afresh_gives_the_committed_verdicts(design: str):
    pytest.importorskip("torch")
    from racefuzz.scenarios.sglang import real_kernels
    from racefuzz.trace.search import run_once

    fresh = run_once(real_kernels.step_for(design), "cpu", serialize=True, run_kernels=False).trace
    assert [str(r) for r in find_trace_races(fresh)] == [str(r) for r in find_trace_races(committed(design))]
