"""KV pages above one token in the sglang harness (`Workload.page_size`, `racefuzz sglang --page-size`).

With `page_size` 16 the fake worker hands the scheduler sglang's own `PagedTokenToKVPoolAllocator` and a
page-aligned `RadixCache`, and the loop runs sglang's paged allocation (`alloc_paged_token_slots_extend`,
`alloc_paged_token_slots_decode`, the allocator's `alloc_extend` / `alloc_decode` / `free`). 0.5.15 must
still race as #31687 says (the prefill result's page-aligned radix rewrite after the next launch), and
0.5.23 must stay clean beside a caught control, both at page size 16. The loop tests need 0.5.15's and
0.5.23's sources (`racefuzz sglang fetch --version 0.5.15 --version 0.5.23`) and skip without them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from engine_support import once_per_session, sources_or_skip

from racefuzz.engines.sglang import sources
from racefuzz.engines.sglang.workload import FIXED, MIXED_CHUNK, Request, Workload, workloads
from racefuzz.exitcodes import ExitCode

PAGED_FIXED = FIXED.with_page_size(16)
PAGED_ALLOCATOR = tuple(f"sglang/srt/mem_cache/allocator/paged.py:{name}" for name in ("alloc_extend", "alloc_decode"))


def test_page_size_round_trips_and_old_files_read_as_page_size_one() -> None:
    assert Workload.from_json(json.loads(json.dumps(PAGED_FIXED.to_json()))) == PAGED_FIXED
    assert PAGED_FIXED.to_json()["page_size"] == 16 and "pages of 16" in PAGED_FIXED.describe()
    assert "page_size" not in FIXED.to_json()  # a page-size-1 file is written as before the field existed
    old = {"requests": [["r0", 0, 12, 2]], "max_iterations": 40, "pool_rows": 2}
    assert Workload.from_json(old).page_size == 1
    with pytest.raises(ValueError, match="power of two"):
        Workload((Request("r0", 0, 3, 2),), page_size=3)
    with pytest.raises(ValueError, match="needs spec none"):
        Workload((Request("r0", 0, 3, 2),), page_size=16, spec="dflash")
    with pytest.raises(ValueError, match="multiple of page_size"):
        MIXED_CHUNK.with_page_size(16)  # chunks of 8: sglang's ServerArgs asserts divisibility


def test_page_sizes_are_drawn_and_the_default_draws_are_unchanged() -> None:
    from hypothesis import HealthCheck, given, settings

    from racefuzz.commands.sglang import draw_workloads

    assert draw_workloads(8, seed=3) == draw_workloads(8, seed=3, page_sizes=(1,))
    seen: list[Workload] = []

    @settings(max_examples=40, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(workloads(page_sizes=(1, 16)))
    def plain(workload: Workload) -> None:
        seen.append(workload)

    plain()
    assert {w.page_size for w in seen} == {1, 16}
    mixed: list[Workload] = []

    @settings(max_examples=40, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(workloads(mixed_chunk=True, page_sizes=(1, 16)))
    def chunked(workload: Workload) -> None:
        mixed.append(workload)

    chunked()
    assert {w.page_size for w in mixed} == {1, 16}
    assert all(w.chunked_prefill % w.page_size == 0 for w in mixed)
    assert all(w.page_size == 16 for w in draw_workloads(4, seed=0, page_sizes=(16,)))


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--page-size", "3"], "--page-size: page_size must be a power of two"),
        (["--page-size", "16", "--spec", "dflash"], "--page-size above 1 needs --spec none"),
        (["--page-size", "1", "--page-size", "16"], "--page-size more than once needs --workload drawn"),
        (["--page-size", "16", "--workload", "mixed-chunk"], "--page-size 16: chunked_prefill (8) must be"),
    ],
)
def test_bad_page_sizes_are_one_line_and_exit_2(args: list[str], says: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "racefuzz.cli", "sglang", "--version", "0.5.23", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == ExitCode.USAGE, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], done.stderr


def _sources_or_skip(version: str) -> Path:
    return sources_or_skip(sources, "sglang", version)


def _paged_result(tmp_path_factory: pytest.TempPathFactory, version: str) -> dict:
    """`version` on the fixed workload at page size 16, barrier and control (once per session, shared by
    the xdist workers through a file under a lock)."""
    from racefuzz.commands.sglang import run_harness

    path = _sources_or_skip(version)
    return once_per_session(
        tmp_path_factory,
        f"sglang-harness-{version}-paged16",
        lambda: run_harness(path, [PAGED_FIXED.to_json()], True, version, 600),
    )


def _radix_rewrites(races: list[dict], writer: str) -> list[dict]:
    """The WARs of a forward-stream read of `req_to_token` against `writer`'s pool write on the schedule stream."""
    return [
        race
        for race in races
        if race["kind"] == "WAR"
        and race["first"]["stream"] == "forward_stream"
        and race["second"]["stream"] == "schedule_stream"
        and any(writer in chain for chain in race["second"].get("called_from", []))
        and all(where.startswith("req_to_token[") for where in race["bytes"])
    ]


def _ran_the_paged_allocator(run: dict) -> None:
    assert "pages of 16" in run["workload"]
    functions = set(run["sglang_functions"])
    assert all(name in functions for name in PAGED_ALLOCATOR), "the paged allocator did not run"


def test_0_5_15_still_races_at_page_size_16(tmp_path_factory: pytest.TempPathFactory) -> None:
    from racefuzz.commands.sglang import version_verdict

    result = _paged_result(tmp_path_factory, "0.5.15")
    assert result["status"] == "ok", result.get("error")
    barrier, control = result["runs"]
    assert barrier["barrier"] and not control["barrier"]
    _ran_the_paged_allocator(barrier)
    found = _radix_rewrites(barrier["races"], "radix_cache.py:528 (cache_unfinished_req)")
    assert found, f"0.5.15 at page size 16 did not show #31687's pair: {barrier['races']}"
    assert all(race["first"]["called_from"] == ["sglang/srt/managers/scheduler.py:3250 (run_batch)"] for race in found)
    # The radix cache keeps whole pages only: the rewritten prefixes are page-aligned (16 tokens of rows of
    # 20 and 16), not page size 1's 12 and 20.
    assert {where for race in found for where in race["bytes"]} <= {"req_to_token[1, 0:16]", "req_to_token[2, 0:16]"}
    assert control["races"]
    assert version_verdict(result, control=True) == ExitCode.RACE


def test_0_5_23_is_clean_at_page_size_16_beside_a_caught_control(tmp_path_factory: pytest.TempPathFactory) -> None:
    from racefuzz.commands.sglang import version_verdict

    result = _paged_result(tmp_path_factory, "0.5.23")
    assert result["status"] == "ok", result.get("error")
    barrier, control = result["runs"]
    assert barrier["barrier"] and not control["barrier"]
    _ran_the_paged_allocator(barrier)
    _ran_the_paged_allocator(control)
    assert barrier["forwards"] >= 4
    assert barrier["races"] == []
    assert _radix_rewrites(control["races"], "checkpoint"), f"the control was not caught: {control['races']}"
    assert version_verdict(result, control=True) == ExitCode.CLEAN
