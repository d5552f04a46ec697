"""Speculative decoding in the vLLM harness (`racefuzz vllm --workload spec / spec-condense`): the host's NumPy
reads of the accepted-token counts (no vLLM needed), and vLLM's own `GPUModelRunner` with a hybrid model's
accepted-count copy (`_update_states_after_model_execute`) on 0.33.0 (the version CPU CI fetches) and, where
fetched, on 0.17.0 / 0.18.0 (either side of vLLM #36013) and 0.19.0 (the first with the valid-count
correction deferred past `_update_states`).

The runner tests need the versions' sources in the cache (`racefuzz vllm fetch --version X`); without them they
skip, saying so. Each version runs once (both workloads, one subprocess), shared by the tests.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from engine_support import sources_or_skip

from racefuzz.engines.vllm import sources
from racefuzz.exitcodes import ExitCode

torch = pytest.importorskip("torch")

ACCEPTED = "input_batch.num_accepted_tokens_cpu_tensor"
COPY = "(_update_states_after_model_execute)"


def _sources_or_skip(version: str) -> Path:
    return sources_or_skip(sources, "vLLM", version)


_RESULTS: dict[str, dict] = {}


def _result(version: str) -> dict:
    """`version` on the spec and spec-condense workloads, each beside its control (one subprocess, once)."""
    from racefuzz.commands.vllm import run_harness
    from racefuzz.engines.vllm.workload import SPEC_DECODE, SPEC_DECODE_CONDENSE

    if version not in _RESULTS:
        path = _sources_or_skip(version)
        workloads = [SPEC_DECODE.to_json(), SPEC_DECODE_CONDENSE.to_json()]
        _RESULTS[version] = run_harness(path, workloads, True, version, 600)
    result = _RESULTS[version]
    assert result["status"] == "ok", result.get("error")
    return result


def _races(result: dict, control: bool, condense: bool) -> list[dict]:
    runs = [run for run in result["runs"] if run["control"] is control]
    return runs[1 if condense else 0]["races"]


def _pair(races: list[dict], kind: str, reader: str) -> list[dict]:
    """The races of `kind` between the accepted counts' D2H copy and the host access `reader` names."""
    return [
        race
        for race in races
        if race["kind"] == kind
        and COPY in race["first"]["source"]
        and reader in race["second"]["source"]
        and any(b.startswith(ACCEPTED) for b in race["bytes"])
    ]


# The host's NumPy reads, on a step of their own: a D2H copy into a host buffer, then the host reading it
# through its NumPy view, with and without waiting for the copy's event.


def _d2h_step(sync: bool, access: str) -> object:
    from racefuzz.engines.vllm import host_memory
    from racefuzz.engines.vllm.runner import watch_numpy_reads

    def step(env: object) -> None:
        with host_memory.HostTensors().recorded():
            host = torch.ones(8, dtype=torch.int32, device="cpu")
            view = watch_numpy_reads(host_memory.wrap(host.numpy(), host))
            device = torch.full((8,), 3, dtype=torch.int32, device=torch.device("cpu", 0))
            event = torch.cuda.Event()
            env.synchronize()
            host[:4].copy_(device[:4], non_blocking=True)  # the accepted counts' copy to the host
            event.record()
            if sync:
                event.synchronize()
            if access == "read":
                int(view[:4].sum())  # `self.num_accepted_tokens.np[:n] = self.input_batch.num_accepted_tokens_cpu[:n]`
            elif access == "index-array read":
                view[[3, 1]].copy()
            else:
                view[:4] = 1  # a write: NumPy indexes its target, which is no read

    return step


@pytest.mark.parametrize(
    ("sync", "access", "kinds"),
    [
        (False, "read", {"RAW"}),
        (True, "read", set()),
        (False, "index-array read", {"RAW"}),
        (False, "write", {"WAW"}),
        (True, "write", set()),
    ],
)
def test_a_numpy_read_of_a_pending_copy_to_the_host_races(sync: bool, access: str, kinds: set[str]) -> None:
    from racefuzz.trace.judge import trace_races
    from racefuzz.trace.search import run_once

    races = trace_races(run_once(_d2h_step(sync, access), "cpu").program)
    assert {race.race.kind for race in races} == kinds
    for race in races:
        assert (race.first.stream.name, race.second.stream.name) == ("default", "host")
        assert "test_vllm_spec_decode.py" in race.second.info["at"]  # the line that indexed the array


# vLLM's own runner with speculative decoding.


def test_0_33_0_races_where_condense_moves_a_row_the_accepted_count_copy_writes() -> None:
    """vLLM #51571 / #53613 (open): under async scheduling the valid-count correction is deferred until after
    the next step's forward is launched (0.33.0 `GPUModelRunner.execute_model`: `deferred_state_corrections_fn`),
    so `_update_states`'s `InputBatch.condense` reads and writes the accepted counts while the previous step's
    non-blocking copy into them may still run. Without a row move the same workload is clean, beside its
    caught control."""
    from racefuzz.commands.vllm import version_verdict

    result = _result("0.33.0")
    condensed = _races(result, control=False, condense=True)
    assert _pair(condensed, "RAW", "(condense)") and _pair(condensed, "WAW", "(condense)")
    assert all("gpu_input_batch.py" in race["second"]["source"] for race in _pair(condensed, "WAW", "(condense)"))
    assert _races(result, control=False, condense=False) == []
    assert _races(result, control=True, condense=False)
    assert version_verdict(result, control=True) == ExitCode.RACE


@pytest.mark.parametrize("version", ["0.17.0", "0.18.0"])
def test_36013s_pair_is_ordered_on_its_versions_and_caught_by_the_control(version: str) -> None:
    """vLLM #36013 added `num_accepted_tokens_event` (0.18.0) between the accepted counts' copy to the host and
    `_build_attention_metadata`'s NumPy read of them. On 0.17.0 (before) as on 0.18.0 the pair is ordered
    anyway: `_update_states` first waits for `valid_sampled_token_count_event` (0.17.0
    `_get_valid_sampled_token_count`), whose side stream waited for the default stream after the copy was
    queued. Both clean, spec and spec-condense; the control (those events' synchronize no-ops) shows the pair."""
    result = _result(version)
    for condense in (False, True):
        assert _races(result, control=False, condense=condense) == []
    assert _pair(_races(result, control=True, condense=False), "RAW", "(_build_attention_metadata)")


def test_0_19_0_without_36013s_sync_races_on_its_pair(tmp_path: Path) -> None:
    """0.19.0 defers the valid-count correction (and its wait) past the forward's launch: there
    `num_accepted_tokens_event.synchronize()` (`_prepare_inputs`) is all that orders the accepted counts'
    copy before the host reads them. 0.19.0 as released is clean on the spec workload; its tree with that one
    line removed (a checkout) races on #36013's pair; and spec-condense races on `condense` as 0.33.0 does."""
    from racefuzz.commands.vllm import run_harness
    from racefuzz.engines.vllm.workload import SPEC_DECODE

    released = _result("0.19.0")
    assert _races(released, control=False, condense=False) == []
    assert _pair(_races(released, control=False, condense=True), "WAW", "(condense)")
    original = _sources_or_skip("0.19.0")
    shutil.copytree(original / "vllm", tmp_path / "vllm", copy_function=os.symlink)
    runner_file = tmp_path / "vllm" / "v1" / "worker" / "gpu_model_runner.py"
    text = runner_file.read_text()
    guarded = "        if self.num_accepted_tokens_event is not None:\n"
    sync = guarded + "            self.num_accepted_tokens_event.synchronize()\n"
    assert text.count(sync) == 1
    runner_file.unlink()
    runner_file.write_text(text.replace(sync, guarded))
    (tmp_path / "vllm" / "_version.py").unlink()
    result = run_harness(sources.locate(source=tmp_path), [SPEC_DECODE.to_json()], False, "0.19.0", 600)
    assert result["status"] == "ok", result.get("error")
    races = result["runs"][0]["races"]
    assert _pair(races, "RAW", "(_prepare_inputs)")


def test_a_racy_workloads_replay_file_races_again(tmp_path: Path) -> None:
    """`racefuzz vllm --workload spec-condense` on 0.33.0 writes the racy workload's replay file; `racefuzz
    replay` re-runs it on the version it names: the same race, exit 1."""
    _sources_or_skip("0.33.0")
    command = [sys.executable, "-m", "racefuzz.cli", "vllm", "--version", "0.33.0", "--workload", "spec-condense"]
    done = subprocess.run([*command, "--report-dir", str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == ExitCode.RACE, done.stderr
    (replay,) = tmp_path.glob("vllm-0.33.0-*.json")
    data = json.loads(replay.read_text())
    assert (data["kind"], data["vllm_version"], data["spec_tokens"]) == ("vllm", "0.33.0", 1)
    again = subprocess.run(
        [sys.executable, "-m", "racefuzz.cli", "replay", str(replay)], capture_output=True, text=True
    )
    assert again.returncode == ExitCode.RACE, again.stderr
    assert "(condense)" in again.stdout and "num_accepted_tokens_cpu_tensor" in again.stdout


def test_a_spec_workload_with_a_preemption_is_refused_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"requests": [["a", 0, 5, 3, 2]], "spec_tokens": 1}))
    done = subprocess.run(
        [sys.executable, "-m", "racefuzz.cli", "vllm", "--version", "0.33.0", "--workload", str(bad)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == ExitCode.USAGE
    assert "no preemption" in done.stderr and len(done.stderr.strip().splitlines()) == 1
