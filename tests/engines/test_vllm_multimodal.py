"""A multimodal model in the vLLM harness (`racefuzz vllm --workload multimodal`, vLLM #31841's setting):
vLLM's own `GPUModelRunner` rewriting `is_mm_embed`'s host half in `_gather_mm_embeddings` every step, on
0.13.0 (`_preprocess` outside `synchronize_input_prep`, one buffer) and 0.14.0 (inside it, #31373; and two
buffers, #31841), and 0.14.0's tree with its double buffering undone.

The tests need 0.13.0's and 0.14.0's sources in the cache (`racefuzz vllm fetch --version X`); without them
they skip, saying so. Each version runs once (the workload and its control, one subprocess).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from engine_support import sources_or_skip

from racefuzz.engines.vllm import sources

torch = pytest.importorskip("torch")

COPY = "vllm/v1/utils.py"  # CpuGpuBuffer.copy_to_gpu
WRITER = "(_gather_mm_embeddings)"


def _sources_or_skip(version: str) -> Path:
    return sources_or_skip(sources, "vLLM", version)


def _run(path: Path, version: str) -> tuple[list[dict], list[dict]]:
    """The multimodal workload's races as the tree has them and in its control."""
    from racefuzz.commands.vllm import run_harness
    from racefuzz.engines.vllm.workload import MULTIMODAL

    result = run_harness(path, [MULTIMODAL.to_json()], True, version, 600)
    assert result["status"] == "ok", result.get("error")
    as_is = [run for run in result["runs"] if not run["control"]]
    control = [run for run in result["runs"] if run["control"]]
    assert len(as_is) == len(control) == 1
    return as_is[0]["races"], control[0]["races"]


def _is_mm_embed_races(races: list[dict], buffer: str) -> list[dict]:
    """The WARs between a step's copy of `buffer`'s host half and a later step's rewrite of it."""
    return [
        race
        for race in races
        if race["kind"] == "WAR"
        and COPY in race["first"]["source"]
        and WRITER in race["second"]["source"]
        and any(b.startswith(buffer) for b in race["bytes"])
    ]


def test_the_multimodal_workload_round_trips_and_places_one_image_per_request() -> None:
    """Its JSON (a replay file's) keeps `multimodal`; each request of 3 prompt tokens or more has one image
    over all but its first and last token, shorter ones none (no vLLM needed)."""
    from racefuzz.engines.vllm.workload import MULTIMODAL, Request, Workload, image_range

    assert Workload.from_json(MULTIMODAL.to_json()) == MULTIMODAL
    assert Workload.from_json({"requests": [["a", 0, 5, 1]]}).multimodal is False
    assert [image_range(r) for r in MULTIMODAL.requests] == [(1, 10), (1, 7), (1, 8)]
    assert image_range(Request("s", 0, 2, 1)) is None
    assert "multimodal model (3 image(s))" in MULTIMODAL.describe()


def test_is_mm_embed_races_on_0_13_0_and_is_ordered_on_0_14_0() -> None:
    """0.13.0: `_gather_mm_embeddings` zeroes `is_mm_embed.cpu` while the previous step's `copy_to_gpu` of it
    may still read it (the previous step's `prepare_inputs_event` was recorded before that copy); those are its
    only races. 0.14.0: clean; both controls caught."""
    old_path = _sources_or_skip("0.13.0")
    new_path = _sources_or_skip("0.14.0")
    races, control = _run(old_path, "0.13.0")
    assert races and _is_mm_embed_races(races, "is_mm_embed.cpu") == races
    assert control
    races, control = _run(new_path, "0.14.0")
    assert races == []
    assert control


def test_one_is_mm_embed_buffer_on_0_14_0_is_ordered_by_the_event(tmp_path: Path) -> None:
    """0.14.0's tree with `_gather_mm_embeddings` always taking buffer 0 (#31841's double buffering undone) is
    still clean: `_preprocess` is inside `synchronize_input_prep` (#31373). Its control (the event's synchronize
    a no-op) races on that buffer, so the checker sees the rewrite when nothing orders it."""
    original = _sources_or_skip("0.14.0")
    shutil.copytree(original / "vllm", tmp_path / "vllm", copy_function=os.symlink)
    runner_file = tmp_path / "vllm" / "v1" / "worker" / "gpu_model_runner.py"
    text = runner_file.read_text()
    swap = "        self.is_mm_embed_idx = 1 - self.is_mm_embed_idx\n"
    assert text.count(swap) == 1
    runner_file.unlink()
    runner_file.write_text(text.replace(swap, "        self.is_mm_embed_idx = 0\n"))
    (tmp_path / "vllm" / "_version.py").unlink()
    races, control = _run(sources.locate(source=tmp_path), "0.14.0")
    assert races == []
    assert _is_mm_embed_races(control, "is_mm_embed_buffers[0].cpu")


def test_a_version_before_embed_input_ids_refuses_the_workload_in_one_line_exit_2() -> None:
    """0.10.2's `SupportsMultiModal` has `get_input_embeddings`, not `embed_input_ids`: the harness cannot
    drive the workload there, a usage error (exit 2, `unsupported`), not a failure of the harness (5)."""
    import subprocess
    import sys

    _sources_or_skip("0.10.2")
    done = subprocess.run(
        [sys.executable, "-m", "racefuzz.cli", "vllm", "--version", "0.10.2", "--workload", "multimodal"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "unsupported: multimodal: this version's SupportsMultiModal has no embed_input_ids" in done.stdout
