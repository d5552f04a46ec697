"""sglang's DFLASH code on a real GPU (`racefuzz sglang --device cuda --spec dflash`): the CPU tests'
expectations (tests/engines/test_sglang_dflash.py) on torch.cuda's streams, with sglang's own Triton
kernels (`assign_req_to_token_pool`, the draft block, accept/bonus) launched for real.

* 0.5.14 imports on the GPU (its `topk.py` registers a fake for `sgl_kernel::moe_fused_gate` at import under
  `is_cuda()`: the stubbed sgl_kernel now defines that operator);
* on the over-allocation workload each version's fence (0.5.14 `verify_done`, 0.5.15 the loop-top barrier)
  is clean beside its caught control;
* under DFLASH on the fixed workload both versions have #31687's post-launch race.

The versions' sources must be in the cache (on the H200, `ci/sglang_gpu.sh` unpacks the carried archives
into `RACEFUZZ_SGLANG_CACHE`); without them a test skips, saying so.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from racefuzz.engines.sglang import sources
from racefuzz.engines.sglang.workload import FIXED, Request, Workload

OVERALLOC = Workload(
    (Request("r0", 0, 12, 8), Request("r1", 0, 20, 8)), spec="dflash", attention="fa3", radix_cache=False
)
_RESULTS: dict[str, dict] = {}


def _runs(version: str) -> dict[str, dict]:
    from racefuzz.commands.sglang import run_harness

    if version not in _RESULTS:
        try:
            path: Path = sources.locate(version=version)
        except sources.SourcesUnavailable as exc:
            pytest.skip(f"sglang {version}'s sources are not here: {exc}")
        workloads = [FIXED.with_spec("dflash").to_json(), OVERALLOC.to_json()]
        _RESULTS[version] = run_harness(path, workloads, True, version, 600, device="cuda")
    result = _RESULTS[version]
    assert result["status"] == "ok", result.get("error")
    assert result.get("device") == "cuda", f"not a cuda run: {result.get('device')!r}"
    return dict(zip(("fixed", "fixed control", "overalloc", "overalloc control"), result["runs"], strict=True))


def _on_req_to_token(run: dict) -> list[dict]:
    return [race for race in run["races"] if any(where.startswith("req_to_token[") for where in race["bytes"])]


@pytest.mark.parametrize("version", ["0.5.14", "0.5.15"])
def test_the_fence_is_clean_beside_a_caught_control_on_the_gpu(version: str) -> None:
    runs = _runs(version)
    assert runs["overalloc"]["draft_forwards"] >= 3
    assert _on_req_to_token(runs["overalloc"]) == []
    caught = [r for r in _on_req_to_token(runs["overalloc control"]) if "assign_req_to_token_pool" in str(r)]
    assert caught, f"{version}'s control (its fence removed) was not caught on the GPU"


@pytest.mark.parametrize("version", ["0.5.14", "0.5.15"])
def test_dflash_has_the_post_launch_race_of_31687_on_the_gpu(version: str) -> None:
    races = _on_req_to_token(_runs(version)["fixed"])
    assert any("cache_unfinished_req" in " ".join(r["second"].get("called_from", [])) for r in races), races[:2]
