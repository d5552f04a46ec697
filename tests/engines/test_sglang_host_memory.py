"""sglang's CPU harness with host memory split from device memory (`racefuzz.trace.host_memory`, through
`engines/sglang/device.host_memory_split`): sglang's host tensors (`*_cpu`, results copied to the host,
FutureMap's host copies) are the host's, its device tensors on the stand-in `cpu:0`, so the syncs sglang makes
for host reads are the ones a GPU makes, and the CPU's verdicts are the H200's on the same workloads:

* DFLASH, fixed workload (docs/results/sglang-dflash-h200/dflash-fixed-cuda.json, commit cc52ca8): 0.5.14 and
  0.5.15 each race on the same six (cells, reading phase) pairs: the draft forward's read
  (`dflash_worker_v2.py` forward_batch_generation) and the verify's (`dflash_info.py` prepare_for_verify) of
  each of three rows that a prefill result's `cache_unfinished_req` rewrites (the H200 counts 12 races:
  each read twice, the fake's launch and sglang's Triton kernel inside it). Before the split the CPU run of
  0.5.15 found only the verify's three: `int(seq_lens_cpu.sum())` of a host tensor was taken for a device
  read-back, a sync of the forward stream that hid the draft read;
* 0.5.15, fixed workload (docs/results/sglang-own-loop-h200/manifest-0.5.15-cuda.log, commit d80972b): three
  rows raced, and one latent lifetime hazard, the token allocator's `free_pages` (`torch.cat` on the schedule
  stream, `allocator/token.py` free) pending at its free in `record_batch_in_overlap`. Before the split the
  CPU run did not say the hazard (a `.tolist()` of a host copy was a sync of the schedule stream).

The tests need 0.5.14's and 0.5.15's sources (`racefuzz sglang fetch`); without them they skip.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from racefuzz.engines.sglang import sources
from racefuzz.engines.sglang.workload import FIXED

pytest.importorskip("torch")

DFLASH_FIXED = FIXED.with_spec("dflash")
_RESULTS: dict[str, list[dict]] = {}


def _sources_or_skip(version: str) -> Path:
    try:
        return sources.locate(version=version)
    except sources.SourcesUnavailable as exc:
        pytest.skip(f"sglang {version}'s sources are not here: {exc}")


def _runs(version: str) -> list[dict]:
    """The barrier runs of `version` on the fixed workload, plain and DFLASH (0.5.14: DFLASH only)."""
    from racefuzz.commands.sglang import run_harness

    if version not in _RESULTS:
        workloads = [DFLASH_FIXED.to_json()] if version == "0.5.14" else [FIXED.to_json(), DFLASH_FIXED.to_json()]
        result = run_harness(_sources_or_skip(version), workloads, False, version, 600)
        assert result["status"] == "ok", result.get("error")
        _RESULTS[version] = result["runs"]
    return _RESULTS[version]


def _phase(access: dict) -> str:
    """The sglang function a read was made for (`file (function)`, no line), or the access's own source."""
    chain = (access.get("called_from") or [access["source"]])[0]
    return re.sub(r":\d+ ", " ", chain.split(" <- ")[0])


def _pairs(run: dict) -> set[tuple[str, str]]:
    return {(", ".join(race["bytes"]), _phase(race["first"])) for race in run["races"]}


def test_dflash_races_on_the_h200s_six_pairs_in_both_versions() -> None:
    old = next(run for run in _runs("0.5.14") if run["spec"] == "dflash")
    new = next(run for run in _runs("0.5.15") if run["spec"] == "dflash")
    draft = "sglang/srt/speculative/dflash_worker_v2.py (forward_batch_generation)"
    verify = "sglang/srt/speculative/dflash_info.py (prepare_for_verify)"
    rows = {"req_to_token[1, 0:12]", "req_to_token[2, 0:20]", "req_to_token[1, 15:16]"}
    expected = {(cells, phase) for cells in rows for phase in (draft, verify)}
    assert _pairs(old) == expected
    assert _pairs(new) == expected  # the draft read is found on the CPU too
    assert new["latent"] == [] and old["latent"] == []


def test_0_5_15_fixed_workload_says_the_h200s_latent_free_pages_hazard() -> None:
    run = next(run for run in _runs("0.5.15") if run["spec"] != "dflash")
    assert {", ".join(race["bytes"]) for race in run["races"]} == {
        "req_to_token[1, 0:12]",
        "req_to_token[2, 0:20]",
        "req_to_token[1, 15:16]",
    }
    (latent,) = run["latent"]
    assert latent["kind"] == "WAR"
    assert (latent["first"]["kernel"], latent["first"]["stream"]) == ("aten.cat.default", "schedule_stream")
    assert "allocator/token.py" in latent["first"]["source"]
    assert latent["second"]["kernel"].startswith("free(") and "arange" in latent["second"]["kernel"]
    assert "(record_batch_in_overlap)" in latent["second"]["source"]
