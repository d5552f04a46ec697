"""The sglang harness (`racefuzz.engines.sglang`): its sources, stubs and CLI on their own, and sglang's own
overlap loop on 0.5.23 and 0.5.15 (the versions CPU CI fetches: `ci/cpu.sh`).

The loop tests need the versions' sources in the cache (`racefuzz sglang fetch --version 0.5.23 --version
0.5.15`); without them they skip, saying so. Each version runs in its own subprocess, as the CLI does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from engine_support import once_per_session, sources_or_skip

from racefuzz.engines.sglang import sources
from racefuzz.exitcodes import ExitCode

pytest.importorskip("torch")


def _sources_or_skip(version: str) -> Path:
    return sources_or_skip(sources, "sglang", version)


def _harness_result(tmp_path_factory: pytest.TempPathFactory, version: str, read_done: str = "none") -> dict:
    """One harness run of `version` on the fixed workload (barrier and control, or the barrier only with a
    read-done event), computed once per test session: with pytest-xdist the workers share it through a
    file under a lock (each run costs a subprocess importing sglang)."""
    from racefuzz.commands.sglang import run_harness
    from racefuzz.engines.sglang.workload import FIXED

    path = _sources_or_skip(version)
    return once_per_session(
        tmp_path_factory,
        f"sglang-harness-{version}-{read_done}",
        lambda: run_harness(path, [FIXED.to_json()], read_done == "none", version, 600, read_done=read_done),
    )


@pytest.fixture
def loop_results(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """0.5.23 and 0.5.15 on the fixed workload, barrier and control, as the test's parameters name them
    (`@pytest.mark.parametrize("versions", [...])`, default both)."""
    versions = getattr(request, "param", ("0.5.23", "0.5.15"))
    return {version: _harness_result(tmp_path_factory, version) for version in versions}


def _writes_by(race: dict, function: str) -> bool:
    return any(function in chain for chain in race["second"].get("called_from", []))


@pytest.mark.parametrize("loop_results", [("0.5.23",)], indirect=True)
def test_0_5_23_is_clean_beside_a_caught_control(loop_results: dict[str, dict]) -> None:
    from racefuzz.commands.sglang import version_verdict

    result = loop_results["0.5.23"]
    assert result["status"] == "ok", result.get("error")
    barrier, control = result["runs"]
    assert barrier["barrier"] and not control["barrier"]
    assert barrier["forwards"] >= 4, "the loop ran too few forwards to mean anything"
    assert barrier["races"] == []
    # The control (the version's own _war_barrier_enabled, turned off) races: the harness can see the race.
    assert control["races"], "the negative control was not caught"
    assert all(race["kind"] == "WAR" for race in control["races"])
    # Streams carry the names of the attributes sglang assigns them to.
    assert {(r["first"]["stream"], r["second"]["stream"]) for r in control["races"]} == {
        ("forward_stream", "schedule_stream")
    }
    assert any(_writes_by(race, "cache_unfinished_req") or _writes_by(race, "checkpoint") for race in control["races"])
    assert version_verdict(result, control=True) == ExitCode.CLEAN


@pytest.mark.parametrize("loop_results", [("0.5.15",)], indirect=True)
def test_0_5_15_has_the_post_launch_race_of_31687(loop_results: dict[str, dict]) -> None:
    """0.5.15's barrier sits at the loop top, before run_batch: the prefill result's radix-cache rewrite
    of its row (process_batch_result_prefill -> maybe_cache_unfinished_req -> cache_unfinished_req ->
    ReqToTokenPool.write) runs on the schedule stream while the next forward reads the row."""
    from racefuzz.commands.sglang import version_verdict

    result = loop_results["0.5.15"]
    assert result["status"] == "ok", result.get("error")
    barrier = result["runs"][0]
    assert barrier["barrier"]
    assert barrier["races"], "0.5.15 ran clean: #31687's race was not found"
    race = barrier["races"][0]
    assert race["kind"] == "WAR"
    assert race["first"]["stream"] == "forward_stream" and race["second"]["stream"] == "schedule_stream"
    assert race["first"]["called_from"] == ["sglang/srt/managers/scheduler.py:3250 (run_batch)"]
    assert race["second"]["source"] == "sglang/srt/mem_cache/memory_pool.py:271 (write)"
    chain = race["second"]["called_from"][0]
    assert "radix_cache.py:528 (cache_unfinished_req)" in chain
    assert "batch_result_processor.py:242 (process_batch_result_prefill)" in chain
    assert any(where.startswith("req_to_token[") for where in race["bytes"])
    assert version_verdict(result, control=True) == ExitCode.RACE


def test_the_barriers_fast_path_trusts_the_read_done_event(tmp_path_factory: pytest.TempPathFactory) -> None:
    """With a read-done event published after the forward's reads, 0.5.23's `_apply_war_barrier` takes its
    fast path (`schedule_stream.wait_event(ev)`) and stays clean; published before the reads (a wrong
    publisher), the same fast path lets the result processing's rewrite race the reads."""
    after = _harness_result(tmp_path_factory, "0.5.23", "after")
    before = _harness_result(tmp_path_factory, "0.5.23", "before")
    assert after["status"] == before["status"] == "ok", (after.get("error"), before.get("error"))
    assert "sglang/srt/managers/scheduler.py:_apply_war_barrier" in after["runs"][0]["sglang_functions"]
    assert after["runs"][0]["races"] == []
    assert before["runs"][0]["races"], "a read-done event recorded before the reads was trusted unnoticed"


def test_the_assertion_api_raises_as_the_cli_exits(
    loop_results: dict[str, dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`assert_loop_race_free` on the module's harness results (not a third run: the tests stay short)."""
    import racefuzz.commands.sglang as command
    from racefuzz.engines.sglang import assert_loop_race_free
    from racefuzz.errors import RaceFound

    asked = []

    def harness(path: Path, workloads: list, control: bool, version: str | None, *rest: object) -> dict:
        asked.append((path, version, control))
        return loop_results[version or ""]

    monkeypatch.setattr(command, "run_harness", harness)
    with pytest.raises(RaceFound, match=r"cache_unfinished_req"):
        assert_loop_race_free(version="0.5.15")
    assert assert_loop_race_free(version="0.5.23")["status"] == "ok"
    assert [(version, control) for _, version, control in asked] == [("0.5.15", True), ("0.5.23", True)]


def test_a_pull_request_moving_the_barrier_back_is_caught(tmp_path: Path) -> None:
    """The harness runs the code a refactor changes: 0.5.23's tree with `_apply_war_barrier()` moved from
    right after `run_batch` back to the loop top (#31687 reverted), run as a checkout (`--source`, no
    `_version.py`), races where 0.5.23 itself is clean."""
    original = _sources_or_skip("0.5.23")
    checkout = tmp_path / "sglang" / "python"
    checkout.parent.mkdir()
    subprocess.run(["cp", "-rs", str(original), str(checkout)], check=True)  # a tree of symlinks
    (checkout / "sglang" / "_version.py").unlink()
    scheduler = checkout / sources.MARKER
    text = (original / sources.MARKER).read_text()
    launch = (
        "                batch_result = self.run_batch(batch)\n"
        "                # Fence result processing behind this forward's shared reads.\n"
        "                self._apply_war_barrier()\n"
    )
    top = "            # Get the next batch to run\n            plan = self.get_next_batch_to_run("
    assert text.count(launch) == 1 and text.count(top) == 2
    loop = text.index("    def event_loop_overlap(self):")
    moved = text[:loop] + text[loop:].replace(top, "            self._apply_war_barrier()\n" + top, 1)
    moved = moved.replace(launch, "                batch_result = self.run_batch(batch)\n")
    scheduler.unlink()
    scheduler.write_text(moved)
    done = _cli("--source", str(checkout.parent), "--no-control")
    assert done.returncode == ExitCode.RACE, done.stdout[-3000:] + done.stderr[-2000:]
    assert "version unknown" in done.stdout
    assert "checkpoint" in done.stdout and "(run_batch)" in done.stdout


@pytest.mark.parametrize("loop_results", [("0.5.23",)], indirect=True)
def test_the_loop_runs_sglangs_own_functions(loop_results: dict[str, dict]) -> None:
    functions = set(loop_results["0.5.23"]["runs"][0]["sglang_functions"])
    for name in (
        "sglang/srt/managers/scheduler.py:event_loop_overlap",
        "sglang/srt/managers/scheduler.py:run_batch",
        "sglang/srt/managers/scheduler.py:_apply_war_barrier",
        "sglang/srt/managers/scheduler.py:get_next_batch_to_run",
        "sglang/srt/managers/schedule_batch.py:prepare_for_extend",
        "sglang/srt/managers/schedule_batch.py:prepare_for_decode",
        "sglang/srt/managers/overlap_utils.py:resolve_forward_inputs",
    ):
        assert name in functions, name


# -- the pieces, without sglang ------------------------------------------------------------------------


def test_locate_names_what_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(sources.CACHE_ENV, str(tmp_path))
    with pytest.raises(sources.SourcesUnavailable, match=r"racefuzz sglang fetch --version 0.5.99"):
        sources.locate(version="0.5.99")
    with pytest.raises(sources.SourcesUnavailable, match="not an sglang source tree"):
        sources.locate(source=tmp_path)
    with pytest.raises(Exception, match="not an sglang version"):
        sources.check_version("latest")


def test_pack_and_unpack_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree = tmp_path / "checkout" / "python"
    (tree / "sglang/srt/managers").mkdir(parents=True)
    (tree / "sglang/kernels/jit/include").mkdir(parents=True)  # an empty directory sglang checks for
    (tree / sources.MARKER).write_text("# scheduler\n")
    (tree / "sglang/srt/managers/data.bin").write_bytes(b"\0" * 100)  # not a .py file: left out
    assert sources.locate(source=tree.parent) == tree.resolve()
    archive, count, _size = sources.pack(None, tmp_path / "s.tar.gz", source=tree)
    assert count == 1  # the one .py file
    with tarfile.open(archive) as packed:
        names = packed.getnames()
    assert "python/sglang/srt/managers/scheduler.py" in names
    assert "python/sglang/kernels/jit/include" in names
    assert not any(name.endswith("data.bin") for name in names)
    monkeypatch.setenv(sources.CACHE_ENV, str(tmp_path / "cache"))
    unpacked = sources.unpack(archive, "0.5.99")
    assert (unpacked / sources.MARKER).read_text() == "# scheduler\n"
    assert (unpacked / "sglang/kernels/jit/include").is_dir()
    assert sources.locate(version="0.5.99") == unpacked


def test_a_stubbed_triton_kernel_refuses_to_launch() -> None:
    code = (
        "from racefuzz.engines.sglang import stubs\n"
        "stubs.install()\n"
        "import triton, triton.language as tl\n"
        "@triton.jit\n"
        "def kernel(x, BLOCK: tl.constexpr):\n"
        "    pass\n"
        "try:\n"
        "    kernel[(1,)](0, BLOCK=4)\n"
        "except stubs.StubCalled as exc:\n"
        "    print('refused:', exc)\n"
        "import torch.utils._triton as t\n"
        "print('torch sees triton:', t.has_triton_package())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert "refused: the Triton kernel kernel was launched" in done.stdout, done.stderr[-2000:]
    assert "torch sees triton: False" in done.stdout


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "racefuzz.cli", "sglang", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, **(env or {})),
    )


def test_cli_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    for args in ((), ("--version", "latest"), ("--version", "0.5.99"), ("--source", str(tmp_path))):
        done = _cli(*args, env={sources.CACHE_ENV: str(tmp_path)})
        assert done.returncode == ExitCode.USAGE, (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "Traceback" not in done.stderr


def test_a_missing_or_unreadable_archive_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """As `racefuzz vllm fetch --archive` (one mechanism: `racefuzz.commands.engine.fetch_action`)."""
    unreadable = tmp_path / "not-a.tar.gz"
    unreadable.write_text("not a tar file\n")
    for archive, message in ((tmp_path / "absent.tar.gz", "no file"), (unreadable, "not a readable .tar.gz")):
        done = _cli("fetch", "--version", "0.5.99", "--archive", str(archive), env={sources.CACHE_ENV: str(tmp_path)})
        assert done.returncode == ExitCode.USAGE, done.stderr
        assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_verdicts_map_to_exit_codes() -> None:
    from racefuzz.commands.sglang import overall_exit

    def result(barrier_races: int, control_races: int) -> dict:
        race = {"kind": "WAR"}
        return {
            "status": "ok",
            "runs": [
                {"barrier": True, "races": [race] * barrier_races},
                {"barrier": False, "races": [race] * control_races},
            ],
        }

    assert overall_exit([result(0, 2)], control=True) == ExitCode.CLEAN
    assert overall_exit([result(1, 2)], control=True) == ExitCode.RACE
    assert overall_exit([result(0, 0)], control=True) == ExitCode.INCONCLUSIVE
    assert overall_exit([result(0, 2), {"status": "unsupported", "error": "x"}], control=True) == ExitCode.USAGE
    assert overall_exit([{"status": "error", "error": "x"}], control=True) == ExitCode.INTERNAL


def test_workload_round_trips_and_draws() -> None:
    from racefuzz.commands.sglang import draw_workloads
    from racefuzz.engines.sglang.workload import FIXED, Workload

    assert Workload.from_json(json.loads(json.dumps(FIXED.to_json()))) == FIXED
    drawn = draw_workloads(5, seed=3)
    assert 1 <= len(drawn) <= 5
    assert drawn == draw_workloads(5, seed=3)  # reproducible from the seed
    for workload in drawn:
        assert 1 <= len(workload.requests) <= 4 and 1 <= workload.pool_rows <= 3


@pytest.mark.parametrize(("device", "hidden"), [("cpu", True), ("cuda", False)])
def test_a_cpu_run_hides_the_hosts_gpu_from_sglang(monkeypatch: pytest.MonkeyPatch, device: str, hidden: bool) -> None:
    """On a host with a GPU, sglang's `is_cuda()` is True and its barrier ignores the control's switch
    (0.5.16 scheduler.py: `_war_barrier_enabled = is_cuda() or envs.SGLANG_ENABLE_WAR_BARRIER.get()`): the
    CPU harness must run as on a host without one, whatever the host has."""
    import subprocess

    from racefuzz.commands import sglang as command

    seen: dict[str, str] = {}

    def fake_run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess:
        env = kwargs["env"]
        assert isinstance(env, dict)
        seen.update(env)
        return subprocess.CompletedProcess(argv, 0, stdout='{"status": "ok", "runs": []}\n', stderr="")

    monkeypatch.setattr(subprocess, "run", fake_run)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    command.run_harness(Path("python"), [], True, "0.5.16", 10.0, device=device)
    assert (seen["CUDA_VISIBLE_DEVICES"] == "") is hidden


@pytest.mark.parametrize("control", [True, False])
def test_jobs_split_the_workloads_and_merge_the_runs_in_workload_order(
    monkeypatch: pytest.MonkeyPatch, control: bool
) -> None:
    """`--jobs N`: every N-th workload to one harness process; the merged runs are in workload order (the
    control after its workload's run), as one process would give them; a part that failed is the result."""
    from racefuzz.commands import sglang as command

    def fake_harness(python_dir, workloads, control, *args, **kwargs):
        runs = []
        for workload in workloads:
            runs += [{"workload": workload["id"], "barrier": b} for b in ((True, False) if control else (True,))]
        return {"status": "ok", "runs": runs, "import_seconds": 1.0, "seconds": 2.0}

    monkeypatch.setattr(command, "run_harness", fake_harness)
    workloads = [{"id": i} for i in range(7)]
    one = command.run_harness_jobs(Path("p"), workloads, control, None, 10.0, jobs=1)
    three = command.run_harness_jobs(Path("p"), workloads, control, None, 10.0, jobs=3)
    assert three["runs"] == one["runs"] and three["jobs"] == 3
    assert [r["workload"] for r in three["runs"] if r["barrier"]] == list(range(7))

    def failing(python_dir, workloads, *args, **kwargs):
        if workloads[0]["id"] == 1:
            return {"status": "error", "error": "boom"}
        return fake_harness(python_dir, workloads, True)

    monkeypatch.setattr(command, "run_harness", failing)
    assert command.run_harness_jobs(Path("p"), workloads, True, None, 10.0, jobs=3) == {
        "status": "error",
        "error": "boom",
    }


def test_workloads_go_to_the_harness_on_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    """10,000 workloads as arguments are past the command line's limit (E2BIG): they go on stdin."""
    from racefuzz.commands import sglang as command

    seen: dict[str, object] = {}

    def fake_run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess:
        seen["argv"], seen["input"] = argv, kwargs.get("input")
        return subprocess.CompletedProcess(argv, 0, stdout='{"status": "ok", "runs": []}\n', stderr="")

    monkeypatch.setattr(subprocess, "run", fake_run)
    workloads = [{"requests": [["r0", 0, 4, 2]]}] * 10_000
    command.run_harness(Path("python"), workloads, True, "0.5.23", 10.0)
    assert "--workloads-stdin" in seen["argv"] and len(" ".join(seen["argv"])) < 10_000
    assert json.loads(seen["input"]) == workloads


def test_a_confirmed_wrong_read_is_a_race_and_says_where() -> None:
    """`--manifest`: a wrong read confirmed k of k is exit 1 even where happens-before saw no race (a
    value-only finding); one seen short of k of k is not, and says it was flaky."""
    from racefuzz.commands.sglang import format_result, overall_exit

    def result(manifested: bool, confirmed: int) -> dict:
        found = {
            "workload": "1 requests (r0@0:4+2), 1 rows",
            "manifested": manifested,
            "divergence": "value divergence at launch #7 create_flashinfer_kv_indices_triton" if confirmed else None,
            "delays": [["forward_stream", 3, 20000.0]] if confirmed else [],
            "confirmed": confirmed,
            "confirm_runs": 3 if confirmed else 0,
            "aimed_tried": 2,
            "examples": 10,
            "skipped": "",
            "seconds": 1.5,
        }
        runs = [{"barrier": True, "races": [], "iterations": 3, "forwards": 2, "sglang_functions": []}]
        runs.append(
            {"barrier": False, "races": [{"kind": "WAR"}], "iterations": 3, "forwards": 2, "sglang_functions": []}
        )
        return {"status": "ok", "version": "0.5.15", "runs": runs, "manifest": [found]}

    racy = result(True, 3)
    assert overall_exit([racy], control=True) == ExitCode.RACE
    assert "MANIFESTED on 1 requests" in format_result(racy) and "3 of 3 re-runs" in format_result(racy)
    flaky = result(False, 2)
    assert overall_exit([flaky], control=True) == ExitCode.CLEAN
    assert "seen 2 of 3 re-runs (flaky)" in format_result(flaky)
    assert "2 aimed and 10 drawn" in format_result(result(False, 0))


def test_manifest_needs_a_gpu() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "racefuzz.cli", "sglang", "--version", "0.5.23", "--manifest", "5"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == ExitCode.USAGE and "--manifest needs --device cuda" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_drawn_means_that_many_distinct_workloads() -> None:
    """Hypothesis draws duplicates (2000 draws held 1991 distinct workloads): `--examples N` is N distinct."""
    from racefuzz.commands.sglang import draw_workloads

    drawn = draw_workloads(300, 0)
    assert len(drawn) == len(set(drawn)) == 300
    assert draw_workloads(300, 0) == drawn


def test_the_benchmarks_unprofiled_run_finds_the_same_races_and_names_no_functions() -> None:
    """`--no-profile` (the benchmark's measure of the recorder alone) leaves out the function profiler and
    nothing else: 0.5.15's fixed workload races at the same pairs, with no sglang functions or chains."""
    from racefuzz.commands.sglang import run_harness, workloads_for

    path = _sources_or_skip("0.5.15")
    profiled, unprofiled = (
        run_harness(path, workloads_for("fixed"), False, "0.5.15", 600.0, profile=profile) for profile in (True, False)
    )
    assert profiled["status"] == unprofiled["status"] == "ok", (profiled.get("error"), unprofiled.get("error"))
    (with_profile,), (without,) = profiled["runs"], unprofiled["runs"]

    def pairs(run: dict) -> list[tuple]:
        return sorted((r["kind"], r["first"]["source"], r["second"]["source"], tuple(r["bytes"])) for r in run["races"])

    assert with_profile["races"] and pairs(with_profile) == pairs(without)
    assert with_profile["sglang_functions"] and without["sglang_functions"] == []
