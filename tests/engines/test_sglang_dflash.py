"""sglang's own DFLASH code under the harness (`--spec dflash`): 0.5.14's `verify_done` self-event against
0.5.15's global WAR barrier (#29556), on the same workloads, each verdict beside its negative control.

Two workloads, each version in one harness subprocess (barrier and control per workload):

* `OVERALLOC`: two requests decoding for eight tokens, FA3-style rectangle reads (every row read to the
  batch's longest), the radix cache off. The only shared write left is DFLASH's over-allocation
  (`DFlashDraftInputV2.prepare_for_decode` -> `assign_req_to_token_pool`), which writes columns of the
  shorter row that the previous verify's rectangle read. Each version's fence (0.5.14: `verify_done`;
  0.5.15: `_apply_war_barrier` at the loop top) orders it: clean; its control (the fence removed) races.
* `FIXED` under DFLASH (radix cache on): a prefill result's `cache_unfinished_req` rewrites its row after
  the next forward was launched (#31687's race). Neither fence orders it: both versions race, the same
  pairs (0.5.15 adds no race that 0.5.14 lacks here).

The loop tests need 0.5.14's and 0.5.15's sources (`racefuzz sglang fetch --version 0.5.14 --version
0.5.15`, as ci/cpu.sh does); without them they skip, saying so.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from engine_support import sources_or_skip

from racefuzz.engines.sglang import sources
from racefuzz.engines.sglang.workload import FIXED, Request, Workload

torch = pytest.importorskip("torch")

OVERALLOC = Workload(
    (Request("r0", 0, 12, 8), Request("r1", 0, 20, 8)), spec="dflash", attention="fa3", radix_cache=False
)
DFLASH_FIXED = FIXED.with_spec("dflash")


def _sources_or_skip(version: str) -> Path:
    return sources_or_skip(sources, "sglang", version)


_RESULTS: dict[str, dict] = {}


def _runs(version: str) -> dict[str, dict]:
    """`version`'s harness result on both workloads (one subprocess per version per test session):
    `{"fixed": barrier run, "fixed control": ..., "overalloc": ..., "overalloc control": ...}`."""
    from racefuzz.commands.sglang import run_harness

    if version not in _RESULTS:
        path = _sources_or_skip(version)
        _RESULTS[version] = run_harness(path, [DFLASH_FIXED.to_json(), OVERALLOC.to_json()], True, version, 600)
    result = _RESULTS[version]
    assert result["status"] == "ok", result.get("error")
    assert [run["barrier"] for run in result["runs"]] == [True, False, True, False]
    assert all(run["spec"] == "dflash" for run in result["runs"])
    return dict(zip(("fixed", "fixed control", "overalloc", "overalloc control"), result["runs"], strict=True))


def _sites(run: dict, method: str, where: str) -> int:
    """How many `method` calls sglang's code made at call sites containing `where`."""
    return sum(count for site, count in run["syncs"].items() if site.startswith(f"{method} at ") and where in site)


def _chain(access: dict) -> str:
    return " | ".join(access.get("called_from", []))


def _overallocation_races(run: dict) -> list[dict]:
    return [race for race in run["races"] if race["second"]["kernel"] == "assign_req_to_token_pool"]


def test_0_5_14_verify_done_is_clean_beside_a_caught_control() -> None:
    runs = _runs("0.5.14")
    fenced, control = runs["overalloc"], runs["overalloc control"]
    assert fenced["draft_forwards"] >= 3, "too few DFLASH decode steps to mean anything"
    assert fenced["races"] == []
    # The control (verify_done dropped before prepare_for_decode reads it) races: DFLASH's over-allocation
    # write against the previous verify's rectangle read, both named by sglang's lines.
    assert control["races"] and control["races"] == _overallocation_races(control)
    for race in control["races"]:
        assert race["kind"] == "WAR" and race["first"]["stream"] == "forward_stream"
        assert "dflash_info_v2.py" in _chain(race["second"]) and "(prepare_for_decode)" in _chain(race["second"])
        assert "dflash_worker_v2.py" in _chain(race["first"]) and "(run_batch)" in _chain(race["first"])
    # The fence's cost: one host block per decode step in verify_done.synchronize(), no barrier wait.
    assert _sites(fenced, "synchronize", "dflash_info_v2.py") == fenced["draft_forwards"]
    assert _sites(fenced, "wait_stream", "(_apply_war_barrier)") == 0
    assert _sites(control, "synchronize", "dflash_info_v2.py") == 0


def test_0_5_15_barrier_is_clean_beside_a_caught_control() -> None:
    runs = _runs("0.5.15")
    fenced, control = runs["overalloc"], runs["overalloc control"]
    assert fenced["draft_forwards"] >= 3
    assert fenced["races"] == []
    assert control["races"] and control["races"] == _overallocation_races(control)
    # #29556: no host block in prepare_for_decode; the barrier's wait_stream once per loop iteration.
    assert _sites(fenced, "synchronize", "dflash_info_v2.py") == 0
    assert _sites(fenced, "wait_stream", "(_apply_war_barrier)") == fenced["iterations"]
    assert _sites(control, "wait_stream", "(_apply_war_barrier)") == 0


def _post_launch_pairs(run: dict) -> set[tuple[str, str]]:
    """The (cells, reading phase) of each race whose write is a prefill result's `cache_unfinished_req`."""
    pairs = set()
    for race in run["races"]:
        if "cache_unfinished_req" in _chain(race["second"]):
            phase = _chain(race["first"]).split(" <- ")[0].split(":")[0]
            pairs.add((", ".join(race["bytes"]), phase))
    return pairs


def test_both_versions_have_the_post_launch_race_of_31687_under_dflash() -> None:
    old, new = _runs("0.5.14")["fixed"], _runs("0.5.15")["fixed"]
    for run in (old, new):
        assert run["races"], "DFLASH on the fixed workload ran clean: #31687's race was not found"
        assert all(race["kind"] == "WAR" for race in run["races"])
        assert _post_launch_pairs(run), "no race on a prefill result's rewrite"
        assert all(race["second"]["stream"] == "schedule_stream" for race in run["races"])
    # 0.5.15 (the barrier at the loop top) adds no race 0.5.14 lacks on this workload: the same cells, read
    # by the same DFLASH phases, rewritten by the same post-launch cache_unfinished_req.
    assert _post_launch_pairs(new) <= _post_launch_pairs(old)
    assert {", ".join(r["bytes"]) for r in new["races"]} == {", ".join(r["bytes"]) for r in old["races"]}


def test_assign_req_to_token_pool_equivalent_writes_each_rows_span() -> None:
    """The torch equivalent of sglang's Triton kernel (`speculative/triton_ops/cache_locs.py`): row i's
    `[start_i, end_i)` takes the next `end_i - start_i` entries of `out_cache_loc`, nothing else changes."""
    from racefuzz.engines.sglang.stubs import _assign_req_to_token_pool

    table = torch.full((4, 6), -1, dtype=torch.int32)
    _assign_req_to_token_pool(
        req_pool_indices=torch.tensor([2, 1]),
        req_to_token=table,
        start_offset=torch.tensor([1, 4]),
        end_offset=torch.tensor([3, 6]),
        out_cache_loc=torch.tensor([10, 11, 20, 21]),
    )
    expected = torch.full((4, 6), -1, dtype=torch.int32)
    expected[2, 1:3] = torch.tensor([10, 11], dtype=torch.int32)
    expected[1, 4:6] = torch.tensor([20, 21], dtype=torch.int32)
    assert torch.equal(table, expected)


def test_prepare_block_equivalent_gathers_the_block_slots() -> None:
    """The torch equivalent of `_prepare_dflash_draft_block_contig_kernel`: block ids (bonus then masks),
    positions `prefix + j`, and the slots `req_to_token[row, prefix + j]` (0 past the table)."""
    from racefuzz.engines.sglang.stubs import _prepare_dflash_draft_block

    table = torch.arange(18, dtype=torch.int32).view(3, 6)
    ids, positions, slots = (torch.empty((2, 3), dtype=torch.int64) for _ in range(3))
    _prepare_dflash_draft_block(
        verified_id_ptr=torch.tensor([7, 8]),
        prefix_lens_ptr=torch.tensor([1, 4]),
        req_pool_indices_ptr=torch.tensor([2, 0]),
        req_to_token_ptr=table,
        block_ids_out_ptr=ids,
        positions_out_ptr=positions,
        cache_loc_out_ptr=slots,
        req_to_token_width=6,
        block_size=3,
        mask_token_id=99,
    )
    assert ids.tolist() == [[7, 99, 99], [8, 99, 99]]
    assert positions.tolist() == [[1, 2, 3], [4, 5, 6]]
    assert slots.tolist() == [[13, 14, 15], [4, 5, 0]]


_REGISTER_FAKE = """
import sys
import torch
sys.path.insert(0, sys.argv[1])
from racefuzz.engines.sglang import stubs
if sys.argv[2] == "stubbed":
    stubs.install(force=("sgl_kernel",))
# sglang 0.5.14 srt/layers/moe/topk.py, at import under `if _is_cuda:` (a GPU host):
@torch.library.register_fake("sgl_kernel::moe_fused_gate")
def _moe_fused_gate(input_tensor, bias, num_expert_group, topk_group, topk, num_fused_shared_experts=0,
                    routed_scaling_factor=0, apply_routed_scaling_factor_on_output=False):
    return input_tensor, input_tensor
print("registered")
"""


def test_a_stubbed_sgl_kernel_defines_the_operator_0_5_14_registers_a_fake_for() -> None:
    """The H200 failure of 0.5.14's import ("operator sgl_kernel::moe_fused_gate does not exist"): with
    sgl_kernel stubbed its schema exists, so the import-time `register_fake` succeeds; with nothing
    defining it (no stubs installed, no real sgl_kernel) it fails as it did on the H200."""
    root = str(Path(__file__).resolve().parents[2])

    def run(mode: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", _REGISTER_FAKE, root, mode], capture_output=True, text=True, timeout=120
        )

    stubbed = run("stubbed")
    assert stubbed.returncode == 0 and "registered" in stubbed.stdout, stubbed.stderr[-2000:]
    bare = run("bare")
    if "registered" in bare.stdout:
        pytest.skip("a real sgl_kernel is installed here (it defines the operator itself)")
    assert "operator sgl_kernel::moe_fused_gate does not exist" in bare.stderr
