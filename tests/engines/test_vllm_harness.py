"""The vLLM harness (`racefuzz.engines.vllm`): its host-memory model on a step of its own (no vLLM
needed), its sources and CLI, and vLLM's own `GPUModelRunner` on 0.33.0 (the version CPU CI fetches:
`ci/cpu.sh`) and, where fetched, on 0.10.2 / 0.11.0 (the versions either side of vLLM #25279).

The runner tests need the versions' sources in the cache (`racefuzz vllm fetch --version 0.33.0`); without
them they skip, saying so. Each version runs in its own subprocess, as the CLI does.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from engine_support import once_per_session, sources_or_skip

from racefuzz.engines.vllm import sources
from racefuzz.exitcodes import ExitCode

torch = pytest.importorskip("torch")


def _sources_or_skip(version: str) -> Path:
    return sources_or_skip(sources, "vLLM", version)


def _harness_result(tmp_path_factory: pytest.TempPathFactory, version: str) -> dict:
    """One harness run of `version` on the fixed workload (the event as the version has it, and the
    control), computed once per session (shared by xdist workers through a file under a lock)."""
    from racefuzz.commands.vllm import run_harness
    from racefuzz.engines.vllm.workload import FIXED

    path = _sources_or_skip(version)
    return once_per_session(
        tmp_path_factory,
        f"vllm-harness-{version}",
        lambda: run_harness(path, [FIXED.to_json()], True, version, 600, uva_ring=True),
    )


# The host-memory model, on a step of its own: a persistent buffer's host half written through its NumPy
# view after a non-blocking copy to the device half, with and without the host waiting for the copy.


def _buffer_step(sync: str) -> object:
    import numpy as np

    from racefuzz.engines.vllm import host_memory

    def step(env: object) -> None:
        with host_memory.HostTensors().recorded():
            host = torch.zeros(8, dtype=torch.int32, device="cpu")
            device = torch.zeros(8, dtype=torch.int32, device=torch.device("cpu", 0))
            view = host_memory.wrap(host.numpy(), host)
            event = torch.cuda.Event()
            env.synchronize()
            view[0:4] = np.arange(4)  # step 1's host write
            device.copy_(host, non_blocking=True)  # its copy to the device, still reading when the host goes on
            event.record()
            if sync == "event":
                event.synchronize()
            elif sync == "tolist":
                device.tolist()  # a device read-back: the host waits for the stream
            view[2:6] = 7  # step 2's host write of bytes the copy reads

    return step


@pytest.mark.parametrize(("sync", "racy"), [("none", True), ("event", False), ("tolist", False)])
def test_a_host_write_after_an_unwaited_copy_races(sync: str, racy: bool) -> None:
    from racefuzz.trace.judge import trace_races
    from racefuzz.trace.search import run_once

    races = trace_races(run_once(_buffer_step(sync), "cpu").program)
    assert bool(races) is racy
    if racy:
        kinds = {(race.race.kind, race.first.stream.name, race.second.stream.name) for race in races}
        assert ("WAR", "default", "host") in kinds


def test_host_ops_on_host_tensors_are_host_accesses_and_device_ops_launches() -> None:
    from racefuzz.engines.vllm import host_memory
    from racefuzz.trace.search import run_once

    def step(env: object) -> None:
        with host_memory.HostTensors().recorded():
            host = torch.zeros(4, device="cpu")
            device = torch.zeros(4, device=torch.device("cpu", 0))
            host.add_(1)  # the host's own op on host memory
            device.add_(1)  # a device op
            device.copy_(host, non_blocking=True)  # a copy to the device
            back = device.to("cpu", non_blocking=True)  # a copy to the host: a new host tensor
            back.tolist()  # the host's read of it

    ops = [op for op in run_once(step, "cpu").program.ops if type(op).__name__ == "Launch"]
    by_kernel = {}
    for op in ops:
        by_kernel.setdefault(op.kernel, set()).add(op.stream.name)
    assert by_kernel["aten.add_.Tensor (host)"] == {"host"}
    assert by_kernel["aten.add_.Tensor"] == {"default"}
    assert by_kernel["aten.copy_.default"] == {"default"}
    assert by_kernel["aten._to_copy.default"] == {"default"}
    assert by_kernel["Tensor.tolist (host read)"] == {"host"}
    assert "Tensor.tolist (device-to-host copy)" not in by_kernel  # no read-back with a sync


def test_an_index_array_write_records_the_bounding_range() -> None:
    from racefuzz.engines.vllm import host_memory
    from racefuzz.trace.search import run_once

    def step(env: object) -> None:
        with host_memory.HostTensors().recorded():
            host = torch.zeros(3, 4, dtype=torch.int32, device="cpu")
            view = host_memory.wrap(host.numpy(), host)
            view[[2, 0]] = view[[0, 2]]  # `BlockTable.swap_row`'s shape

    writes = [op for op in run_once(step, "cpu").program.ops if getattr(op, "kernel", "") == host_memory.HOST_WRITE]
    assert len(writes) == 1
    (access,) = writes[0].writes
    assert (access.col0, access.col1) == (0, 48)  # rows 0 to 2, 4 int32 each: the bounding range of rows 0 and 2


# Sources and the CLI.


def test_a_version_that_is_not_one_is_a_usage_error() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "racefuzz.cli", "vllm", "--version", "latest"], capture_output=True, text=True
    )
    assert done.returncode == ExitCode.USAGE
    assert "not a vLLM version" in done.stderr and "Traceback" not in done.stderr


def test_missing_sources_are_one_line_naming_the_fetch(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "racefuzz.cli", "vllm", "--version", "0.0.1"],
        capture_output=True,
        text=True,
        env={**os.environ, "RACEFUZZ_VLLM_CACHE": str(tmp_path)},
    )
    assert done.returncode == ExitCode.USAGE
    assert "racefuzz vllm fetch --version 0.0.1" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "racefuzz.cli", "vllm", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("pack", "--version", "0.33.0"), "needs one --version X or --source DIR, and --out"),
        (("fetch", "--version", "0.33.0", "--archive", "/nonexistent.tar.gz"), "no file /nonexistent.tar.gz"),
        (("--version", "0.33.0", "--slot-mapping", "vllm"), "--slot-mapping vllm needs --device cuda"),
    ],
)
def test_bad_pack_fetch_and_device_arguments_are_one_line_usage_errors(args: tuple, message: str) -> None:
    done = _cli(*args)
    assert done.returncode == ExitCode.USAGE
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here")
def test_device_cuda_without_a_gpu_is_one_line() -> None:
    done = _cli("--version", "0.33.0", "--device", "cuda")
    assert done.returncode == ExitCode.USAGE
    assert "torch sees no CUDA device" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def _tree(root: Path, files: list[str]) -> None:
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(f"# {name}\n")


def test_a_slim_archive_holds_the_imported_files_and_their_siblings_and_unpacks(tmp_path: Path) -> None:
    import tarfile

    tree = tmp_path / "tree"
    imported = ["vllm/__init__.py", "vllm/v1/__init__.py", "vllm/v1/worker/__init__.py", sources.MARKER]
    _tree(tree, [*imported, "vllm/v1/worker/block_table.py", "vllm/v1/worker/gpu/model_runner.py"])
    files = sources.slim_files(tree, imported)
    assert "vllm/v1/worker/block_table.py" in files  # a sibling of an imported file
    assert "vllm/v1/worker/gpu/model_runner.py" not in files  # a subpackage nothing was imported from
    archive = tmp_path / "vllm-0.33.0.tar.gz"
    with tarfile.open(archive, "w:gz") as out:
        for name in files:
            out.add(tree / name, arcname=f"python/{name}")
    done = _cli(
        "fetch", "--version", "0.33.0", "--archive", str(archive), env={"RACEFUZZ_VLLM_CACHE": str(tmp_path / "c")}
    )
    assert done.returncode == 0, done.stderr
    unpacked = tmp_path / "c" / "0.33.0" / "python"
    assert sorted(str(p.relative_to(unpacked)) for p in unpacked.rglob("*.py")) == files


def test_an_archive_without_vllm_sources_is_refused_in_one_line(tmp_path: Path) -> None:
    import tarfile

    _tree(tmp_path / "tree", ["python/other/__init__.py"])
    archive = tmp_path / "other.tar.gz"
    with tarfile.open(archive, "w:gz") as out:
        out.add(tmp_path / "tree" / "python", arcname="python")
    done = _cli(
        "fetch", "--version", "0.33.0", "--archive", str(archive), env={"RACEFUZZ_VLLM_CACHE": str(tmp_path / "c")}
    )
    assert done.returncode == ExitCode.USAGE
    assert "not an archive made by `vllm pack`" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_a_directory_that_is_no_vllm_tree_is_refused(tmp_path: Path) -> None:
    with pytest.raises(sources.SourcesUnavailable, match="not a vLLM source tree"):
        sources.locate(source=tmp_path)


def test_drawn_workloads_are_as_many_as_asked_and_distinct() -> None:
    from racefuzz.commands.vllm import draw_workloads

    drawn = draw_workloads(60, seed=3)
    assert len(drawn) == 60 and len(set(drawn)) == 60
    assert draw_workloads(60, seed=3) == drawn  # reproducible from the seed


# vLLM's own runner.


def _races(result: dict, control: bool) -> list[dict]:
    assert result["status"] == "ok", result.get("error")
    return [race for run in result["runs"] if run["control"] is control for race in run["races"]]


def test_0_33_0_is_clean_beside_a_caught_control(tmp_path_factory: pytest.TempPathFactory) -> None:
    from racefuzz.commands.vllm import version_verdict

    result = _harness_result(tmp_path_factory, "0.33.0")
    assert _races(result, control=False) == []
    caught = _races(result, control=True)
    assert caught, "the control (prepare_inputs_event.synchronize a no-op) must race"
    # The control's races are the host rewriting a persistent pinned buffer while the previous step's
    # non-blocking copy to the device may still read it.
    war = [
        r
        for r in caught
        if r["kind"] == "WAR" and r["first"]["stream"] == "default" and r["second"]["stream"] == "host"
    ]
    assert any("copy_to_gpu" in r["first"]["source"] for r in war)
    assert any("gpu_model_runner.py" in r["second"]["source"] for r in war)
    assert version_verdict(result, control=True) == ExitCode.CLEAN
    run = next(run for run in result["runs"] if not run["control"])
    assert run["forwards"] >= 6 and run["host_accesses"] > 0


def test_two_runs_of_one_workload_sample_the_same_tokens() -> None:
    """The fixed workload's request b samples at temperature 1: two runs of it in one process (the state of
    torch's generator moved on by the first) give the same outputs, as a replay of it expects."""
    from racefuzz.commands.vllm import run_harness
    from racefuzz.engines.vllm.workload import FIXED

    path = _sources_or_skip("0.33.0")
    result = run_harness(path, [FIXED.to_json(), FIXED.to_json()], False, "0.33.0", 600)
    assert result["status"] == "ok", result.get("error")
    first, second = (run["outputs"] for run in result["runs"])
    assert any(request.random for request in FIXED.requests) and first["b"]
    assert first == second


def test_model_runner_v2s_pinned_ring_races_only_with_a_speculator_beside_a_caught_control(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """vLLM 0.33.0's own `UvaBufferPool` (2 slots) in MRV2's step order (racefuzz/engines/vllm/uva_ring.py):
    without a speculator every reader of a slot is before `AsyncOutput`'s `copy_event`, which the engine
    waits for before the step that rewrites the slot: clean, beside the control (no output taken) caught.
    With one, `propose` reads `temperature.gpu` after the event: the rewrite two steps later races it."""
    ring = {
        run["case"].split(" (")[0].split(":")[0]: run for run in _harness_result(tmp_path_factory, "0.33.0")["uva_ring"]
    }
    assert ring["no speculator"]["races"] == []
    for case in ("control", "speculator"):
        races = ring[case]["races"]
        assert races, f"{case}: no race"
        assert all(
            r["kind"] == "WAR" and (r["first"]["stream"], r["second"]["stream"]) == ("default", "host") for r in races
        )
        assert all(
            "buffer_utils.py" in r["second"]["source"] and "(copy_to_uva)" in r["second"]["source"] for r in races
        )
        assert {b.split("[")[0] for r in races for b in r["bytes"]} <= {
            "temperature.pool._uva_bufs",
        }


def test_0_10_2_races_where_25279_says_and_0_11_0_is_clean(tmp_path_factory: pytest.TempPathFactory) -> None:
    """vLLM #25279: #24527's synchronized section did not cover `_update_states`, which rewrites the input
    batch's sampling tensors (`InputBatch.condense`) that the previous step's `copy_slice` may still read;
    0.10.2 has #24527 only, 0.11.0 has #25279."""
    before = _harness_result(tmp_path_factory, "0.10.2")
    after = _harness_result(tmp_path_factory, "0.11.0")
    races = _races(before, control=False)
    assert any(
        r["kind"] == "WAR" and "copy_slice" in r["first"]["source"] and "condense" in r["second"]["source"]
        for r in races
    )
    assert _races(after, control=False) == []
    assert _races(after, control=True) and _races(before, control=True)


_SYNCED_UPDATE = """        with (
            record_function_or_nullcontext("gpu_model_runner: preprocess"),
            self.synchronize_input_prep(),
        ):
            # Update persistent batch states.
            deferred_state_corrections_fn = self._update_states(scheduler_output)
"""
_UNSYNCED_UPDATE = """        deferred_state_corrections_fn = self._update_states(scheduler_output)
        with (
            record_function_or_nullcontext("gpu_model_runner: preprocess"),
            self.synchronize_input_prep(),
        ):
"""


def test_a_pull_request_that_moves_update_states_out_of_the_synchronized_section_races(tmp_path: Path) -> None:
    """0.33.0's tree as a checkout (no `_version.py`) with `_update_states` moved back before
    `synchronize_input_prep` (0.10.2's order, what #25279 fixed): the block table's `append_row` then rewrites
    a row the previous step's `commit_block_table` copy may still read."""
    import os
    import shutil

    from racefuzz.commands.vllm import run_harness, version_verdict
    from racefuzz.engines.vllm.workload import FIXED

    original = _sources_or_skip("0.33.0")
    shutil.copytree(original / "vllm", tmp_path / "vllm", copy_function=os.symlink)
    runner_file = tmp_path / "vllm" / "v1" / "worker" / "gpu_model_runner.py"
    text = runner_file.read_text()
    assert text.count(_SYNCED_UPDATE) == 1
    runner_file.unlink()
    runner_file.write_text(text.replace(_SYNCED_UPDATE, _UNSYNCED_UPDATE))
    (tmp_path / "vllm" / "_version.py").unlink()
    result = run_harness(sources.locate(source=tmp_path), [FIXED.to_json()], False, "0.33.0", 600)
    assert result["version"] == "0.33.0"
    assert version_verdict(result, control=False) == ExitCode.RACE
    races = _races(result, control=False)
    assert any(
        r["kind"] == "WAR"
        and "copy_to_gpu" in r["first"]["source"]
        and "append_row" in r["second"]["source"]
        and any(b.startswith("block_table[0].block_table.cpu[") for b in r["bytes"])
        for r in races
    )
