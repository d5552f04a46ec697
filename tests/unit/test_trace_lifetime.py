"""The caching allocator's lifetime hazards on the CPU (`racefuzz.trace.lifetime`): a block freed while
another stream may still use it races with its reuse by a later allocation on its stream, not with the free;
with no such reuse in the trace it is a latent hazard, said and not counted. Each case beside its control.
tests/cuda/test_trace_lifetime_gpu.py runs the same steps on a GPU."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from racefuzz.trace import fuzz  # noqa: E402
from racefuzz.trace.judge import judge, trace_races  # noqa: E402
from racefuzz.trace.lifetime import SMALL_BLOCK_BYTES, reuse_points  # noqa: E402
from racefuzz.trace.search import run_once  # noqa: E402

SMALL = 1 << 10
"""Elements of the freed buffer (4 KiB of float32: a small-pool block)."""


def lifetime_step(reuse: str, ordered_before_reuse: bool = False):
    """A buffer allocated on the default stream, read on `forward` (no edge back), freed by the host; then,
    as `reuse` says, nothing, an allocation on the default stream of the same pool (it may get the block), one
    of the other pool (cannot), or one on `forward` (another stream's pool). `ordered_before_reuse`: the
    default stream waits for `forward` after the free, before the allocation. On the device the env names
    (tests/cuda runs it on a GPU)."""

    def step(env):
        forward = env.stream("forward")
        buffer = torch.ones(SMALL, device=env.device)
        forward.wait_stream(env.current_stream())
        with env.use(forward):
            total = buffer.sum()
        del buffer
        if ordered_before_reuse:
            env.current_stream().wait_stream(forward)
        if reuse == "default":
            fresh = torch.zeros(SMALL, device=env.device)
        elif reuse == "default-large":
            fresh = torch.zeros(2 * SMALL_BLOCK_BYTES // 4, device=env.device)
        elif reuse == "forward":
            with env.use(forward):
                fresh = torch.zeros(SMALL, device=env.device)
        else:
            fresh = None
        return {"total": total} if fresh is None else {"total": total, "fresh": fresh}

    return step


def judged(step):
    return judge(run_once(step, "cpu", serialize=True).program)


def test_a_free_reused_by_a_later_allocation_on_its_stream_races_with_the_reuse():
    judgement = judged(lifetime_step("default"))
    assert [
        (r.race.kind.value, r.first.stream.name, r.second.info["kind"], r.second.stream.name) for r in judgement.races
    ] == [("WAR", "forward", "free", "default")]
    assert "its block reused by aten.zeros.default" in judgement.races[0].second.kernel
    assert judgement.latent == []
    # The control: the default stream waits for the read after the free, before it allocates again.
    control = judged(lifetime_step("default", ordered_before_reuse=True))
    assert control.races == [] and control.latent == []


def test_a_free_no_later_allocation_can_reuse_is_a_latent_hazard_not_a_race():
    for reuse in ("none", "default-large", "forward"):
        judgement = judged(lifetime_step(reuse))
        assert judgement.races == [], reuse
        assert [(r.first.stream.name, r.second.info["kind"], r.second.stream.name) for r in judgement.latent] == [
            ("forward", "free", "default")
        ], reuse
    # The control, in the same terms: the same step with a reuse is a race.
    assert len(judged(lifetime_step("default")).races) == 1


def test_a_free_ordered_after_every_use_is_neither():
    def step(env):
        forward = env.stream("forward")
        buffer = torch.ones(SMALL)
        forward.wait_stream(env.current_stream())
        with env.use(forward):
            total = buffer.sum()
        env.current_stream().wait_stream(forward)
        del buffer
        return {"total": total, "fresh": torch.zeros(SMALL)}

    judgement = judged(step)
    assert judgement.races == [] and judgement.latent == []
    assert len(judged(lifetime_step("default")).races) == 1  # the control: without the wait


def test_the_search_counts_the_reuse_race_and_not_the_latent_hazard():
    reused = fuzz(lifetime_step("default"), device="cpu")
    assert [r.second.info["kind"] for r in reused.races] == ["free"] and reused.latent == [] and reused.racy
    latent = fuzz(lifetime_step("none"), device="cpu")
    assert latent.races == [] and not latent.racy
    assert [(r.first.stream.name, r.second.info["kind"]) for r in latent.latent] == [("forward", "free")]


def test_storages_name_the_stream_they_were_allocated_on_on_both_recording_paths(monkeypatch):
    from racefuzz.trace import fastpath as fastpath_module

    def allocations(fast: bool):
        if not fast:
            monkeypatch.setattr(fastpath_module, "load", lambda: None)
        trace = run_once(lifetime_step("forward"), "cpu").program
        monkeypatch.undo()
        return sorted((b.name.split(" ", 1)[1], b.allocation.allocated_on) for b in trace.buffers)

    slow = allocations(fast=False)
    assert slow == [
        ("(aten.ones.default)", "default"),
        ("(aten.sum.default)", "forward"),
        ("(aten.zeros.default)", "forward"),
    ]
    if fastpath_module.load() is not None:
        assert allocations(fast=True) == slow


def test_a_storage_made_before_the_recording_is_no_allocation_that_reuses_a_block():
    made_before = torch.zeros(SMALL)

    def step(env):
        forward = env.stream("forward")
        buffer = torch.ones(SMALL)
        forward.wait_stream(env.current_stream())
        with env.use(forward):
            total = buffer.sum()
        del buffer
        made_before.fill_(1)  # first accessed here, on the default stream: not an allocation
        return {"total": total}

    trace = run_once(step, "cpu").program
    assert reuse_points(trace) == {}
    assert trace_races(trace) == []
    assert len(judge(trace).latent) == 1


def test_the_report_says_a_latent_hazard_once_and_does_not_count_it():
    from racefuzz.trace.report import render

    latent = render(fuzz(lifetime_step("none"), device="cpu"))
    assert latent.startswith("==== racefuzz trace: no race")
    assert "happens-before: 0 unordered conflicting pair(s)" in latent
    assert "latent lifetime hazard(s), not counted as races: 1 use(s)" in latent
    assert "free(tmp0 (aten.ones.default)) on default" in latent
    reused = render(fuzz(lifetime_step("default"), device="cpu"))  # the control: the same free, reused
    assert reused.startswith("==== racefuzz trace: RACE") and "latent lifetime" not in reused
    assert "its block reused by aten.zeros.default" in reused


def test_racefuzz_sglang_says_a_latent_hazard_and_does_not_count_it():
    from racefuzz.commands.sglang import format_result, version_verdict

    free = {"kernel": "free(tmp1 (aten.arange.start))", "stream": "default", "source": "scheduler.py:4567"}
    cat = {"kernel": "aten.cat.default", "stream": "schedule_stream", "source": "allocator/token.py:73 (free)"}
    hazard = {"kind": "WAR", "first": cat, "second": free, "bytes": ["tmp1[34:2048] (flat)"], "missing_edge": "no edge"}
    run = {"iterations": 8, "forwards": 6, "sglang_functions": [], "races": [], "latent": [hazard]}
    control = {**run, "barrier": False, "races": [hazard | {"kind": "RAW"}], "latent": []}
    result = {"status": "ok", "version": "0.5.23", "runs": [{**run, "barrier": True}, control]}
    text = format_result(result)
    print(text)
    assert "clean: no happens-before race" in text
    assert "latent lifetime hazard(s), not counted as races: 1 use(s)" in text
    assert "first : aten.cat.default on schedule_stream  allocator/token.py:73 (free)" in text
    assert version_verdict(result, control=True) == 0
    racy = {**result, "runs": [{**run, "barrier": True, "races": [hazard]}, control]}  # the control: counted
    assert version_verdict(racy, control=True) == 1


def latent_step(env):
    """`lifetime_step("none")` by a name a replay file can give."""
    return lifetime_step("none")(env)


def reused_step(env):
    """`lifetime_step("default")` by a name a replay file can give."""
    return lifetime_step("default")(env)


def test_a_replay_on_the_cpu_says_the_latent_hazard_and_exits_clean(tmp_path, capsys):
    import json

    from racefuzz.cli import main

    def replay(step: str) -> tuple[int, str]:
        path = tmp_path / f"{step}.json"
        fields = {"step": f"tests.unit.test_trace_lifetime:{step}", "device": "cpu", "watch": [], "delays": []}
        path.write_text(json.dumps({"format": "racefuzz-trace-replay", "version": 1, **fields}))
        code = main(["replay", str(path)])
        return code, capsys.readouterr().out

    code, out = replay("latent_step")
    assert code == 0 and "latent lifetime hazard(s), not counted as races: 1 use(s)" in out
    code, out = replay("reused_step")  # the control: the same free, reused
    assert code == 1 and "reproduced as 1 happens-before race(s)" in out and "latent lifetime" not in out
