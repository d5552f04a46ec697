"""`racefuzz sglang --workload search` (`racefuzz.engines.sglang.search`): Hypothesis draws request streams
for sglang's own overlap loop in one harness process per version; the first racy one is shrunk to a
minimal stream with the same race, confirmed k of k, saved in the failure database, replayed first and
written as a replay file; the barrier-off control searched beside it.

Needs 0.5.15's and 0.5.23's sources in the cache (`racefuzz sglang fetch --version 0.5.15 --version
0.5.23`); without them the tests skip, saying so. About a minute of CPU on an idle machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from engine_support import sources_or_skip

from racefuzz.engines.sglang import sources
from racefuzz.exitcodes import ExitCode

pytest.importorskip("torch")
pytest.importorskip("hypothesis")


def _sources_or_skip(version: str) -> Path:
    return sources_or_skip(sources, "sglang", version)


def test_0_5_15_shrinks_31687s_race_to_one_request_saves_it_and_replays_it_first(tmp_path: Path) -> None:
    from racefuzz.commands.sglang import workloads_for
    from racefuzz.engines.sglang.search import run_search

    path = _sources_or_skip("0.5.15")
    database, reports, out = tmp_path / "db", tmp_path / "reports", tmp_path / "out.json"
    command = [sys.executable, "-m", "racefuzz.cli", "sglang", "--version", "0.5.15", "--workload", "search"]
    command += ["--examples", "10", "--database", str(database), "--report-dir", str(reports), "--json", str(out)]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == ExitCode.RACE, done.stdout + done.stderr
    (result,) = json.loads(out.read_text())
    found = result["search"]
    # #31687's race: the barrier at the loop top leaves the forward's req_to_token read unordered before a
    # prefill result's maybe_cache_unfinished_req rewrites the row on the schedule stream.
    race = found["race"]
    assert race["kind"] == "WAR" and race["first"]["kernel"] == "attention_kv_indices"
    assert race["second"]["source"].startswith("sglang/srt/mem_cache/memory_pool.py")
    assert any("maybe_cache_unfinished_req" in chain for chain in race["second"]["called_from"])
    # Shrunk to the smallest stream that still races so: one request, arriving at once, one-token prompt,
    # two output tokens (one would finish at its prefill: no unfinished request to cache), one pool row.
    assert found["workload"]["requests"] == [["r0", 0, 1, 2]] and found["workload"]["pool_rows"] == 1
    assert found["drawn"] != found["workload"]
    assert 1 <= found["shrink_runs"] <= 100 and not found["shrink_capped"]
    assert (found["confirmed"], found["confirm_runs"]) == (3, 3)
    assert result["control"]["racy"]
    assert "RACE: WAR" in done.stdout and "shrunk to 1 requests (r0@0:1+2), 1 rows" in done.stdout
    # The replay file is the project's format, kind sglang, and `--workload FILE` reads it as that stream.
    replay = json.loads(Path(result["replay"]).read_text())
    assert (replay["format"], replay["kind"], replay["sglang_version"]) == ("racefuzz-replay", "sglang", "0.5.15")
    assert workloads_for(result["replay"]) == [found["workload"]]
    # The next search tries the saved stream first: no workload drawn, nothing to shrink.
    again = run_search(path, examples=1, control=False, version="0.5.15", database=str(database))
    assert again["search"]["racy"] and again["search"]["workload"] == found["workload"]
    assert (again["search"]["replayed"], again["search"]["examples"], again["search"]["shrink_runs"]) == (1, 0, 0)


def test_0_5_23_is_clean_over_drawn_workloads_beside_its_caught_control() -> None:
    from racefuzz.engines.sglang.search import run_search, search_verdict

    path = _sources_or_skip("0.5.23")
    result = run_search(path, examples=4, control=True, version="0.5.23", database="none")
    assert result["status"] == "ok", result.get("error")
    assert not result["search"]["racy"] and result["search"]["examples"] == 4
    assert "workload" not in result["search"]
    assert result["control"]["racy"]  # the barrier off races on one of the same draws
    assert search_verdict(result, control=True) == ExitCode.CLEAN


def test_search_refuses_what_it_does_not_do(capsys: pytest.CaptureFixture[str]) -> None:
    from racefuzz.cli import main

    _sources_or_skip("0.5.23")
    for extra, said in (
        (["--jobs", "2"], "--jobs applies to drawn workloads"),
        (["--shrink-runs", "-1"], "--shrink-runs must be 0 to 100000"),
    ):
        assert main(["sglang", "--version", "0.5.23", "--workload", "search", *extra]) == ExitCode.USAGE
        assert said in capsys.readouterr().err


def test_racefuzz_replay_reruns_an_sglang_counterexample(tmp_path: Path) -> None:
    """A `kind: sglang` replay file (what --workload search writes) replays through `racefuzz replay`:
    0.5.15's one-request stream races again (exit 1), beside its caught control; a file naming a version
    whose sources are not here, or none, is one line and exit 2."""
    from racefuzz.report import FORMAT, FORMAT_VERSION

    _sources_or_skip("0.5.15")
    replay = {"format": FORMAT, "version": FORMAT_VERSION, "kind": "sglang", "sglang_version": "0.5.15"}
    replay.update({"read_done": "none", "requests": [["r0", 0, 1, 2]], "max_iterations": 40, "pool_rows": 1})
    path = tmp_path / "sglang-replay.json"
    path.write_text(json.dumps(replay))
    done = subprocess.run([sys.executable, "-m", "racefuzz.cli", "replay", str(path)], capture_output=True, text=True)
    assert done.returncode == ExitCode.RACE, done.stdout + done.stderr
    assert "memory_pool.py" in done.stdout and "caught" in done.stdout
    for version in ("9.9.9", "unknown"):
        path.write_text(json.dumps(dict(replay, sglang_version=version)))
        done = subprocess.run(
            [sys.executable, "-m", "racefuzz.cli", "replay", str(path)], capture_output=True, text=True
        )
        assert done.returncode == ExitCode.USAGE, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
