"""The vLLM KV-reuse scenario on a real GPU (docs/vllm-kv-model.md): the CUDA backend runs its programs as it
runs sglang's, so #45357's stale KV write is seen landing in the loaded request's KV k of k where the racy
design lets it, never where the fix orders it, and a search calls the fix clean beside the racy control."""

from __future__ import annotations

import pytest

from racefuzz.backends import executor
from racefuzz.designs import load_design
from racefuzz.oracle import find_corruptions
from racefuzz.scenarios.vllm import RequestSpec, Workload, build_program
from racefuzz.schedule import Schedule
from racefuzz.search import search

K = 5
SHAPE_45357 = Workload(
    requests=(
        RequestSpec(arrival=0, prompt_len=2, output_len=1, eos=True),
        RequestSpec(arrival=1, prompt_len=2, output_len=2, remote=True),
    ),
    steps=5,
    block_size=2,
    num_blocks=2,
)
"""As in tests/unit/test_vllm_scenario.py: request 0 stops in step 0, step 1 (already launched) writes its KV
into a block the scheduler then hands to request 1, whose prompt KV the connector loads into it."""


def _corrupted_runs(design: str) -> list[set[tuple[str, object]]]:
    program = build_program(SHAPE_45357, load_design(design, "vllm-kv-reuse").hooks)
    (stale,) = [
        op
        for op in program.launches
        if op.kernel == "reshape_and_cache_flash" and op.info["step"] == 1 and op.info["over_scheduled"] == "0"
    ]
    schedule = Schedule(device_delays={stale.index: 2000.0})  # the in-flight step's KV write held back 2 ms
    run = executor("cuda")
    found = []
    for _ in range(K):
        corruptions = find_corruptions(program, run(program, schedule).observations)
        found.append({(c.read.kernel, c.read.info["requests"]) for c in corruptions})
    return found


def test_the_stale_kv_write_lands_in_the_loaded_request_k_of_k_and_never_under_the_fix() -> None:
    racy = _corrupted_runs("immediate-free")
    print(f"immediate-free: corrupted reads per run {racy}")
    assert all(reads == {("flash_attn_varlen_func", "1")} for reads in racy), racy
    for fixed in ("deferred-free", "step-event"):
        runs = _corrupted_runs(fixed)
        print(f"{fixed}: corrupted reads per run {runs}")
        assert all(reads == set() for reads in runs), (fixed, runs)


@pytest.mark.parametrize("fixed", ["deferred-free", "step-event"])
def test_a_gpu_search_finds_the_control_and_calls_the_fix_clean(fixed: str) -> None:
    run = executor("cuda")
    control = search(load_design("immediate-free", "vllm-kv-reuse"), run, backend="cuda", examples=400, shrink=False)
    clean = search(load_design(fixed, "vllm-kv-reuse"), run, backend="cuda", examples=200)
    print(
        f"control caught after {control.first_detection_example}; {fixed}: {clean.examples} examples, "
        f"flaky {clean.flaky}"
    )
    assert control.found
    assert not clean.found and not clean.flaky
