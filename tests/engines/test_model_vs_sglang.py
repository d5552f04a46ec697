"""The model checked against sglang's own loop (docs/model-fidelity.md): on workloads drawn by Hypothesis, the
model's happens-before verdict and race rows under the design that claims a version equal those of the
version's real `Scheduler` loop (`racefuzz sglang`), with the barrier as the version has it and with it off
(the model's `none`), beside a design deliberately wrong for the version that must disagree in the same run.

The mapping between the two kinds of workload and the comparison live in `ci/bench/model_vs_sglang.py`
(the package's engines may not import its scenarios). The real-loop tests need the version's sources
(`racefuzz sglang fetch --version X`; CPU CI fetches 0.5.23 and 0.5.15) and skip without them.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from engine_support import sources_or_skip
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from ci.bench.model_vs_sglang import (
    VERSION_DESIGNS,
    compare_result,
    model_rows,
    run_version,
    to_harness_workload,
    to_model_workload,
    wrong_design,
)
from racefuzz.engines.sglang import sources
from racefuzz.engines.sglang.workload import Request, workloads
from racefuzz.engines.sglang.workload import Workload as HarnessWorkload
from racefuzz.errors import InvalidArgument
from racefuzz.scenarios.sglang.workload import RequestSpec
from racefuzz.scenarios.sglang.workload import Workload as ModelWorkload

DIFFERENTIAL_VERSIONS = ("0.5.14", "0.5.15", "0.5.16", "0.5.23")
"""One version per barrier position and model option: the loop top (0.5.14's non-DFLASH path, 0.5.15),
after `run_batch` (0.5.16), with the tail-first rows and no over-scheduled finished request (0.5.23)."""

WORKLOADS_PER_RUN = 6
"""Workloads per harness run: one subprocess per version runs them all (3-10 s of sglang's imports, then
about a second a workload, barrier and control)."""


def harness_workloads() -> st.SearchStrategy[HarnessWorkload]:
    """The harness's own drawn workloads, non-speculative (the only loop the mapping covers)."""
    return workloads().filter(lambda w: getattr(w, "spec", "none") == "none")


@settings(max_examples=50, deadline=None, derandomize=True, database=None)
@given(harness_workloads(), st.sampled_from(sorted(VERSION_DESIGNS)))
def test_the_mapping_round_trips(workload: HarnessWorkload, version: str) -> None:
    model = to_model_workload(workload, version)
    assert model.block_size == 1 and model.sglang_admission
    assert to_harness_workload(model).to_json() == workload.to_json()


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"block_size": 2}, "block_size"),
        ({"plan_stream": True}, "plan_stream"),
        ({"read_extent": "rectangle"}, "read_extent"),
        ({"sglang_admission": False}, "sglang_admission"),
        ({"requests": (RequestSpec(prompt_len=8, chunk=4, accepts=()),)}, "chunked prefill"),
        ({"requests": (RequestSpec(prompt_len=4, chunk=4, accepts=(1,)),)}, "re-caches every unfinished"),
    ],
)
def test_a_model_workload_the_harness_cannot_run_is_refused_by_name(changes: dict, named: str) -> None:
    base = {"block_size": 1, "sglang_admission": True, "requests": (RequestSpec(prompt_len=4, chunk=4, accepts=()),)}
    with pytest.raises(InvalidArgument, match=named):
        to_harness_workload(ModelWorkload(**{**base, **changes}))


def _writers(workload: ModelWorkload, design: str = "none") -> set[str]:
    return {row.writer for row in model_rows(workload, design)}


def test_sglangs_admission_keeps_a_freed_row_from_the_next_prefill() -> None:
    """Two requests, one row: r1 waits for r0's row. sglang's `get_num_allocatable_reqs` still counts r0 (finished
    on the host, not yet filtered by `update_running_batch`), so r1's prefill comes an iteration later, after
    the host synchronized on the over-scheduled forward that still reads the row; sglang 0.5.15's loop with the
    barrier off races only on the prefill results' re-caches. The model without `sglang_admission` took the row
    at once (a recycled-row prefill race 0.5.15's loop does not reach: the differential's first disagreement)."""
    stream = HarnessWorkload((Request("r0", 0, 6, 2), Request("r1", 0, 8, 2)), pool_rows=1)
    faithful = to_model_workload(stream, "0.5.15")
    assert _writers(faithful) == {"post_launch_rewrite"}
    assert _writers(replace(faithful, sglang_admission=False)) == {
        "post_launch_rewrite",
        "prefill_write",
    }


def test_from_0_5_22_a_finishing_request_is_not_decoded_again() -> None:
    """r0 finishes at its prefill; with rows from the tail (0.5.18+) r1 takes r0's row. 0.5.22+ leaves r0 out of
    the next decode (`_reqs_finishing_inflight`), so no forward reads the row when r1's prefill writes it: 0.5.23's
    loop with the barrier off races only on r1's re-cache. Without `skip_finishing_decode` the model decoded r0
    once more and raced r1's prefill there."""
    stream = HarnessWorkload((Request("r0", 0, 27, 1), Request("r1", 2, 24, 4)), pool_rows=3)
    faithful = to_model_workload(stream, "0.5.23")
    assert faithful.lifo_rows and faithful.skip_finishing_decode
    assert _writers(faithful) == {"post_launch_rewrite"}
    assert _writers(replace(faithful, skip_finishing_decode=False)) == {
        "post_launch_rewrite",
        "prefill_write",
    }
    assert not to_model_workload(stream, "0.5.21").skip_finishing_decode


def _sources_or_skip(version: str) -> Path:
    return sources_or_skip(sources, "sglang", version)


@pytest.mark.parametrize("version", DIFFERENTIAL_VERSIONS)
@settings(
    max_examples=1,
    derandomize=True,
    deadline=None,
    database=None,
    phases=(Phase.generate,),
    suppress_health_check=list(HealthCheck),
)
@given(
    st.integers(1, 3).flatmap(
        lambda rows: st.lists(
            harness_workloads().map(lambda w: replace(w, pool_rows=rows)),
            min_size=WORKLOADS_PER_RUN,
            max_size=WORKLOADS_PER_RUN,
            unique_by=lambda w: w.describe(),
        )
    )
)
def test_the_model_agrees_with_sglangs_own_loop(version: str, drawn: list[HarnessWorkload]) -> None:
    """One Hypothesis example is a list of drawn workloads of one pool size, run by one harness subprocess
    (each costs seconds; `run_version` says why one pool size per process); derandomized, so CI runs the same
    draw every time. Not shrunk: a failure lists every disagreeing workload, each replayable with `racefuzz
    sglang --version X --workload FILE`."""
    pytest.importorskip("torch")
    _sources_or_skip(version)
    result = run_version(version, drawn, timeout=600)
    assert result.get("status") == "ok", result.get("error")
    wrong = wrong_design(version)
    comparisons = compare_result(result, drawn, version, wrong=wrong)
    assert len(comparisons) == 3 * len(drawn)
    faithful = [c for c in comparisons if c.design != wrong]
    disagreements = [
        f"{c.design} ({'barrier' if c.barrier else 'control'}) {c.workload.to_json()}: real "
        f"{sorted(map(str, c.real))}, model {sorted(map(str, c.model))}"
        for c in faithful
        if not c.agrees
    ]
    assert not disagreements, "\n".join(disagreements)
    # Agreement means something only where races occur: the control (the barrier off) raced on sglang's code ...
    assert any(c.real for c in comparisons if not c.barrier), "the control never raced: nothing was compared"
    # ... and a design wrong for this version disagrees in the same run: the comparison can fail.
    assert any(not c.agrees for c in comparisons if c.design == wrong), f"`{wrong}` agreed with {version} everywhere"
