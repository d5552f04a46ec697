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
  CPU run did not say the hazard (a `.tolist()` of a host copy was a sync of the schedule stream);
* 0.5.23, fixed workload (docs/sglang-gpu.md: clean, with the same latent hazard): before
  `adapters.cuda_host_copies` the CPU said no latent pair. 0.5.23's `async_d2h` (utils/common.py:608) asks
  `tensor.device.type == "cpu"`, which the stand-in `cpu:0` answers as the host's: `next_token_ids` stayed on
  the device and its `.tolist()` (batch_result_processor.py:1127) was a sync of the schedule stream that
  ordered the `cat` before the free.

The tests need 0.5.14's, 0.5.15's and 0.5.23's sources (`racefuzz sglang fetch`); without them they skip.
"""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
from engine_support import sources_or_skip

from racefuzz.engines.sglang import sources
from racefuzz.engines.sglang.workload import FIXED

pytest.importorskip("torch")

DFLASH_FIXED = FIXED.with_spec("dflash")
_RESULTS: dict[str, list[dict]] = {}


def _sources_or_skip(version: str) -> Path:
    return sources_or_skip(sources, "sglang", version)


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


def _assert_free_pages_hazard(latent: dict) -> None:
    """`latent` is the H200's pair: `free`'s `torch.cat` of `free_pages` on the schedule stream, pending at the
    free of its block in `record_batch_in_overlap`."""
    assert latent["kind"] == "WAR"
    assert (latent["first"]["kernel"], latent["first"]["stream"]) == ("aten.cat.default", "schedule_stream")
    assert "allocator/token.py" in latent["first"]["source"]
    assert latent["second"]["kernel"].startswith("free(") and "arange" in latent["second"]["kernel"]
    assert "(record_batch_in_overlap)" in latent["second"]["source"]


def test_0_5_15_fixed_workload_says_the_h200s_latent_free_pages_hazard() -> None:
    run = next(run for run in _runs("0.5.15") if run["spec"] != "dflash")
    assert {", ".join(race["bytes"]) for race in run["races"]} == {
        "req_to_token[1, 0:12]",
        "req_to_token[2, 0:20]",
        "req_to_token[1, 15:16]",
    }
    (latent,) = run["latent"]
    _assert_free_pages_hazard(latent)


def test_0_5_23_fixed_workload_says_the_h200s_latent_free_pages_hazard() -> None:
    """Clean with the barrier (as on the H200), its control racing in the same harness run, and the latent
    pair said: before `cuda_host_copies` it was not (the `.tolist()` of `next_token_ids` left on the device
    synced the schedule stream)."""
    from racefuzz.commands.sglang import run_harness

    result = run_harness(_sources_or_skip("0.5.23"), [FIXED.to_json()], True, "0.5.23", 600)
    assert result["status"] == "ok", result.get("error")
    barrier, control = result["runs"]
    assert (barrier["barrier"], control["barrier"]) == (True, False)
    assert barrier["races"] == [] and control["races"] != []
    (latent,) = barrier["latent"]
    _assert_free_pages_hazard(latent)


def test_a_copy_to_the_host_that_asks_the_device_type_takes_the_accelerator_branch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`adapters.cuda_host_copies` recompiles a function shaped as 0.5.23's `async_d2h` with `X.device.type ==
    "cpu"` read as `not X.is_cuda` and `is_pin_memory_available(X.device)` as `X.is_cuda`, in its module and
    in a module that bound it under another name; a host tensor still comes back as itself."""
    from racefuzz.engines.sglang.adapters import cuda_host_copies

    (tmp_path / "copies_mod.py").write_text(
        textwrap.dedent(
            """
            def is_pin_memory_available(device=None):
                return False  # sglang's base platform: no pinned memory


            def async_d2h(tensor):
                if tensor.device.type == "cpu":
                    return tensor
                if not is_pin_memory_available(tensor.device):
                    return "blocking copy"
                return "pinned copy"


            def untouched(tensor):
                return tensor.device.type == "cpu"
            """
        )
    )
    (tmp_path / "binder_mod.py").write_text("from copies_mod import async_d2h as _async_d2h\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("copies_mod", "binder_mod"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    import binder_mod
    import copies_mod

    cpu = SimpleNamespace(type="cpu")
    device_tensor = SimpleNamespace(device=cpu, is_cuda=True)  # the split's device tensor: `cpu:0`, is_cuda
    host_tensor = SimpleNamespace(device=cpu, is_cuda=False)
    assert copies_mod.async_d2h(device_tensor) is device_tensor  # the stand-in's device type says "host"

    assert cuda_host_copies((("copies_mod", "async_d2h"),)) == ["copies_mod:async_d2h"]
    assert copies_mod.async_d2h(device_tensor) == "pinned copy"
    assert binder_mod._async_d2h(device_tensor) == "pinned copy"
    assert copies_mod.async_d2h(host_tensor) is host_tensor
    assert copies_mod.untouched(device_tensor) is True  # a function not named is left as it was
