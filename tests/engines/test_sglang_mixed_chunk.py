"""Mixed chunked prefill in the sglang harness: sglang #34076's lifetime race, 0.5.21 against 0.5.22.

#34076 added `batch.mix_running_indices.record_stream(...)` to `resolve_forward_inputs` (0.5.22
managers/overlap_utils.py:99-102): the mixed batch's decode tokens are gathered on the forward stream by
`mix_running_indices`, an alias of the running batch's `req_pool_indices` (allocated on the schedule stream),
whose last owner can be dropped before the gather ran. The harness tests need 0.5.21's and 0.5.22's sources
(`racefuzz sglang fetch --version 0.5.21 --version 0.5.22`) and skip without them; one harness subprocess per
version, shared by the tests of a session.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
from engine_support import once_per_session, sources_or_skip

from racefuzz.engines.sglang import sources
from racefuzz.engines.sglang.workload import MIXED_CHUNK, Request, Workload, workloads

GATHER = "sglang/srt/managers/overlap_utils.py:98 (resolve_forward_inputs)"
"""0.5.21's gather of the decode tokens by `mix_running_indices` (on the forward stream)."""
RING_FREE = "sglang/srt/managers/scheduler.py:4291 (record_batch_in_overlap)"
"""0.5.21's line where the 2-slot record ring drops the running batch, freeing the aliased indices."""


def test_mixed_chunk_fields_round_trip_and_validate() -> None:
    assert Workload.from_json(json.loads(json.dumps(MIXED_CHUNK.to_json()))) == MIXED_CHUNK
    assert MIXED_CHUNK.to_json()["requests"][1] == ["r1", 2, 4, 3, True]  # the embeds flag, only when set
    assert "r1@2:4+3 embeds" in MIXED_CHUNK.describe() and "chunks of 8 mixed" in MIXED_CHUNK.describe()
    plain = Workload((Request("r0", 0, 3, 2),))
    assert "chunked_prefill" not in plain.to_json() and plain.to_json()["requests"] == [["r0", 0, 3, 2]]
    with pytest.raises(ValueError, match="mixed_chunk needs chunked_prefill"):
        Workload((Request("r0", 0, 3, 2),), mixed_chunk=True)
    with pytest.raises(ValueError, match="chunked_prefill must be"):
        Workload((Request("r0", 0, 3, 2),), chunked_prefill=-1)
    with pytest.raises(ValueError, match="mixed_chunk needs spec none"):
        Workload((Request("r0", 0, 3, 2),), chunked_prefill=8, mixed_chunk=True, spec="dflash")


def test_mixed_chunk_workloads_are_drawn_and_the_plain_draws_unchanged() -> None:
    from hypothesis import HealthCheck, given, settings

    seen: list[Workload] = []

    @settings(max_examples=30, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(workloads(mixed_chunk=True))
    def mixed(workload: Workload) -> None:
        seen.append(workload)

    mixed()
    assert all(w.mixed_chunk and w.chunked_prefill in (4, 8, 16) and 2 <= w.pool_rows <= 4 for w in seen)
    assert any(r.embeds for w in seen for r in w.requests)

    @settings(max_examples=30, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(workloads())
    def plain(workload: Workload) -> None:
        assert not workload.chunked_prefill and not any(r.embeds for r in workload.requests)

    plain()


def test_a_cpu_guard_around_record_stream_is_taken_as_on_cuda(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`adapters.cuda_record_streams` recompiles a function whose `record_stream` sits behind `if
    x.device.type != "cpu":` (0.5.22's form) with the guard's test True, its line numbers kept, in its module
    and in a module that imported it by name; other code is untouched."""
    from racefuzz.engines.sglang.adapters import cuda_record_streams

    (tmp_path / "guarded_mod.py").write_text(
        textwrap.dedent(
            """
            def resolve(t, stream):
                if t.device.type != "cpu":
                    t.record_stream(stream)
                return t.device.type


            def untouched(t):
                if t.device.type != "cpu":
                    return "device"
                return "cpu"


            class Holder:
                def keep(self, t, stream):
                    if t.device.type != "cpu":
                        t.record_stream(stream)
            """
        )
    )
    (tmp_path / "importer_mod.py").write_text("from guarded_mod import resolve\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("guarded_mod", "importer_mod"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    import guarded_mod
    import importer_mod

    recorded: list[str] = []
    tensor = SimpleNamespace(device=SimpleNamespace(type="cpu"), record_stream=recorded.append)
    line = guarded_mod.resolve.__code__.co_firstlineno
    guarded_mod.resolve(tensor, "s0")
    assert recorded == []  # the CPU guard skips it

    assert sorted(cuda_record_streams(("guarded_mod",))) == ["guarded_mod:Holder.keep", "guarded_mod:resolve"]
    guarded_mod.resolve(tensor, "s1")
    importer_mod.resolve(tensor, "s2")
    guarded_mod.Holder().keep(tensor, "s3")
    assert recorded == ["s1", "s2", "s3"]
    assert guarded_mod.resolve.__code__.co_firstlineno == line
    assert guarded_mod.untouched(tensor) == "cpu"  # no record_stream behind its guard: left as it was


def _sources_or_skip(version: str) -> Path:
    return sources_or_skip(sources, "sglang", version)


def _mixed_result(tmp_path_factory: pytest.TempPathFactory, version: str) -> dict:
    """One harness run of `version` on `--workload mixed-chunk` (barrier and control), once per session."""
    from racefuzz.commands.sglang import run_harness

    path = _sources_or_skip(version)
    return once_per_session(
        tmp_path_factory,
        f"sglang-mixed-chunk-{version}",
        lambda: run_harness(path, [MIXED_CHUNK.to_json()], True, version, 600),
    )


def _ring_frees(races: list[dict]) -> list[dict]:
    """The races (or freed-in-use pairs) of #34076's gather against the record ring's free."""
    return [
        race
        for race in races
        if race["first"]["source"] == GATHER
        and race["second"]["kernel"].startswith("free(")
        and race["second"]["source"] == RING_FREE
    ]


def test_0_5_21_frees_the_mixed_indices_in_use_and_0_5_22_does_not(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """0.5.21: with the barrier, #34076's pair is freed in use (its block's reuse on the schedule stream is
    ordered after the gather by `_apply_war_barrier`: no race under the caching allocator); with the barrier
    off it is a race, the block reused by the next result processing. 0.5.22 (`record_stream`): neither, while
    its control is caught by #31687's row rewrites. Both run `mix_with_running`."""
    old = _mixed_result(tmp_path_factory, "0.5.21")
    new = _mixed_result(tmp_path_factory, "0.5.22")
    for result in (old, new):
        assert result["status"] == "ok", result.get("error")
        assert all(
            "sglang/srt/managers/schedule_batch.py:mix_with_running" in run["sglang_functions"]
            for run in result["runs"]
        )
    (old_barrier, old_control), (new_barrier, new_control) = old["runs"], new["runs"]
    assert old_barrier["races"] == [] and old_barrier["latent"] == []
    (pair,) = _ring_frees(old_barrier["freed_in_use"])
    assert (pair["first"]["stream"], pair["second"]["stream"]) == ("forward_stream", "schedule_stream")
    (race,) = _ring_frees(old_control["races"])
    assert "its block reused by" in race["second"]["kernel"]

    assert new_barrier["races"] == [] and new_barrier["freed_in_use"] == []
    assert new_control["races"], "0.5.22's negative control was not caught"
    assert not any(
        r["second"]["kernel"].startswith("free(") for r in new_control["races"] + new_control["freed_in_use"]
    )


def test_the_command_names_both_accesses(tmp_path_factory: pytest.TempPathFactory) -> None:
    from racefuzz.commands.sglang import format_result

    old = dict(_mixed_result(tmp_path_factory, "0.5.21"), label="0.5.21", mixed_chunk=True)
    new = dict(_mixed_result(tmp_path_factory, "0.5.22"), label="0.5.22", mixed_chunk=True)
    old_text, new_text = format_result(old), format_result(new)
    assert "freed in use, not counted as races: 1 use(s)" in old_text
    assert "lifetime race(s) in the control: 1 use(s)" in old_text
    assert GATHER in old_text and RING_FREE in old_text
    assert "freed in use" not in new_text and "no lifetime race in the control" in new_text
