"""A manifestation is a divergence the schedule causes (issue 27, item 1): what varies from run to run
without any delay (a nondeterministic kernel: float atomics on a GPU, `torch.rand` here) is learned from
repeated serialized runs, masked and named once in the report, and never makes a race-free step a RACE.

`racefuzz.trace.search.fuzz` runs here as on a GPU, recorded on the CPU (`as_on_a_gpu`). On the CPU a delay
changes nothing by itself, so a step stands in for a GPU's timing by reading `TIMING.delays`, the delay
points its run applies: `stale_read` returns what a read that a delay let a racing write overtake would
have returned. Every value a step returns is otherwise what the CPU computed."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from racefuzz.exitcodes import ExitCode  # noqa: E402

TIMING = SimpleNamespace(delays={}, runs=[])
"""The delays of the run in progress ((stream, n) -> us), and (serialized, delays) of every run made."""

COUNTER = itertools.count()


@pytest.fixture
def as_on_a_gpu(monkeypatch):
    """`fuzz` takes the GPU's path (learning runs, delay search, confirmation), recorded on the CPU."""
    return record_as_on_a_gpu(monkeypatch)


def record_as_on_a_gpu(monkeypatch) -> SimpleNamespace:
    """What `as_on_a_gpu` does (for other test modules' fixtures); returns `TIMING`."""
    from racefuzz.trace import search

    record_on_cpu = search.run_once

    def run_once(step, device, **options):
        TIMING.delays = dict(options.get("delays") or {})
        TIMING.runs.append((bool(options.get("serialize")), TIMING.delays))
        return record_on_cpu(step, "cpu", **options)

    TIMING.runs = []
    monkeypatch.setattr(search, "resolve_device", lambda device: "cuda")
    monkeypatch.setattr(search, "run_once", run_once)
    # A CPU run has no gates to hold a launch back (on a machine with a GPU too): delays alone are searched.
    monkeypatch.setattr(search, "gates_unavailable", lambda device: "recorded on the CPU")
    return TIMING


def stale_read() -> int:
    """-1 when the run delays the forward stream (a racing write then lands before its read), else 0."""
    return -1 if any(stream == "forward" for stream, _ in TIMING.delays) else 0


def _overlap(env, *, barrier: bool, timing_sensitive: bool, noise: bool):
    table = env.name(torch.arange(4 * 64, dtype=torch.int32, device=env.device).reshape(4, 64), "req_to_token")
    schedule, forward = env.stream("schedule"), env.stream("forward")
    forward.wait_stream(env.current_stream())
    schedule.wait_stream(env.current_stream())
    with env.use(forward):
        rows = torch.tensor([1, 2], device=env.device)
        kv_indices = table[rows, :32].flatten() + (stale_read() if timing_sensitive else 0)
        if noise:  # a nondeterministic kernel: the global generator, not seeded, differs run to run
            sampled = torch.rand(16, device=env.device)
            scores = sampled * 2
    if barrier:
        schedule.wait_stream(forward)
    with env.use(schedule):
        table[1, 0:8] = -1
    env.synchronize()
    out = {"kv_indices": kv_indices}
    if noise:
        out["scores"] = scores
    return out


def noisy_synced_step(env):
    """Race-free (the barrier), one nondeterministic launch and one launch downstream of it."""
    return _overlap(env, barrier=True, timing_sensitive=False, noise=True)


def noisy_racy_step(env):
    """The same with the barrier missing: a real WAR whose value a delay on the forward makes wrong."""
    return _overlap(env, barrier=False, timing_sensitive=True, noise=True)


def hidden_sync_step(env):
    """Race-free to happens-before, but its value depends on the schedule (a sync racefuzz does not see,
    say): a value-only finding."""
    return _overlap(env, barrier=True, timing_sensitive=True, noise=True)


def late_noise_step(env):
    """Race-free; its output varies only from the fourth run on, so the first serialized runs agree and
    the variation is first seen in a fuzzed run."""
    out = noisy_synced_step(env)
    out["late"] = torch.tensor([1 if next(COUNTER) >= 3 else 0], device=env.device)
    return out


def _main(argv: list[str]) -> int:
    from racefuzz.cli import main

    try:
        return main(argv)
    except SystemExit as exit:
        return int(exit.code or 0)


def test_a_race_free_step_with_a_nondeterministic_launch_is_clean_and_names_the_launch(as_on_a_gpu) -> None:
    from racefuzz.trace.report import render
    from racefuzz.trace.search import fuzz

    result = fuzz(noisy_synced_step, examples=20, seed=0)
    text = render(result)
    print(text)
    assert result.races == [] and not result.racy
    assert result.divergence is None and result.examples > 0
    kernels = [
        result.reference.builder.ops[result.reference.launch_ops[o]].kernel for o in result.nondeterministic.launches
    ]
    assert "aten.rand.default" in kernels and "aten.mul.Tensor" in kernels  # the launch and the one downstream
    assert result.nondeterministic.outputs == frozenset({"scores"})
    assert "nondeterministic" in text and "aten.rand.default" in text and "'scores'" in text
    assert "no race" in text.splitlines()[0]
    # Learned from serialized runs without any delay, before the search.
    assert as_on_a_gpu.runs[:3] == [(True, {}), (True, {}), (True, {})]


def test_the_trace_command_exits_0_on_it_and_1_on_the_same_step_with_a_real_race(as_on_a_gpu, tmp_path, capsys) -> None:
    common = ["--examples", "20", "--seed", "0", "--report-dir", str(tmp_path), "--database", "none"]
    code = _main(["trace", "test_trace_nondeterminism:noisy_synced_step", *common])
    out = capsys.readouterr().out
    assert code == ExitCode.CLEAN, out
    assert "nondeterministic" in out and "aten.rand.default" in out
    code = _main(["trace", "test_trace_nondeterminism:noisy_racy_step", *common])
    out = capsys.readouterr().out
    assert code == ExitCode.RACE, out
    assert "confirmed in 3/3 re-run(s)" in out and "nondeterministic" in out


def test_the_negative_control_a_real_race_beside_the_noise_still_manifests_k_of_k(as_on_a_gpu) -> None:
    from racefuzz.trace.search import fuzz

    result = fuzz(noisy_racy_step, examples=50, seed=0, confirm=3)
    assert result.races and result.racy
    assert result.divergence is not None and result.divergence.kind == "value"
    assert any(stream == "forward" for stream, _, _ in result.delays)
    assert result.confirmation is not None and result.confirmation.confirmed  # racefuzz.confirm: 3 of 3
    assert (result.confirmed, result.confirm_runs) == (3, 3)
    assert result.manifested and "aten.rand.default" in [
        result.reference.builder.ops[result.reference.launch_ops[o]].kernel for o in result.nondeterministic.launches
    ]


def test_a_value_that_varies_only_under_delays_manifests_as_a_value_only_finding(as_on_a_gpu) -> None:
    from racefuzz.trace.report import render
    from racefuzz.trace.search import fuzz

    result = fuzz(hidden_sync_step, examples=50, seed=0, confirm=3)
    text = render(result)
    print(text)
    assert result.races == [] and result.manifested and result.racy
    assert result.delays and result.divergence is not None
    header = text.splitlines()[0]
    assert "RACE" in header and "value-only" in header
    assert "happens-before found no unordered pair" in text


def test_variation_first_seen_in_a_fuzzed_run_is_learned_not_reported(as_on_a_gpu) -> None:
    from racefuzz.trace.report import render
    from racefuzz.trace.search import fuzz

    global COUNTER
    COUNTER = itertools.count()
    result = fuzz(late_noise_step, examples=20, seed=0, confirm=3)
    print(render(result))
    assert result.races == [] and not result.racy and result.divergence is None
    assert "late" in result.nondeterministic.outputs


def test_examples_0_records_once_and_judges_by_happens_before_only(as_on_a_gpu) -> None:
    from racefuzz.trace.report import render
    from racefuzz.trace.search import fuzz

    result = fuzz(noisy_racy_step, examples=0)
    assert len(as_on_a_gpu.runs) == 1 and result.races and result.racy and not result.searched
    assert "happens-before only" in render(result)


def unstable_step(env):
    """Race-free; it launches one more kernel from the second run on (host control flow on a value that
    varies): an ordinal no longer names one launch, so the value oracle cannot judge it."""
    out = noisy_synced_step(env)
    if next(COUNTER) >= 1:
        out["kv_indices"] = out["kv_indices"] + 1
    return out


def test_a_step_whose_launch_sequence_varies_is_not_judged_by_values(as_on_a_gpu) -> None:
    from racefuzz.trace.report import render
    from racefuzz.trace.search import fuzz

    global COUNTER
    COUNTER = itertools.count()
    result = fuzz(unstable_step, examples=20, seed=0)
    text = render(result)
    assert not result.racy and not result.searched and result.examples == 0
    assert "value oracle: not run (it cannot judge this step: its launch sequence differs" in text


def test_examples_0_on_the_command_line_is_happens_before_only(as_on_a_gpu, tmp_path, capsys) -> None:
    from racefuzz.cli import build_parser

    common = ["--examples", "0", "--report-dir", str(tmp_path), "--database", "none"]
    assert _main(["trace", "test_trace_nondeterminism:noisy_racy_step", *common]) == ExitCode.RACE
    assert len(as_on_a_gpu.runs) == 1
    assert _main(["trace", "test_trace_nondeterminism:noisy_synced_step", *common]) == ExitCode.CLEAN
    assert len(as_on_a_gpu.runs) == 2
    assert capsys.readouterr().out.count("value oracle: not run with --examples 0 (happens-before only") == 2
    trace = build_parser()._subparsers._group_actions[0].choices["trace"]
    assert "0: record the step once and judge it by happens-before only, on any device" in " ".join(
        trace.format_help().split()
    )


def _replay_file(path, step: str, delays: list[tuple[str, int, float]]):
    import json

    from racefuzz import __version__

    path.write_text(
        json.dumps(
            {
                "format": "racefuzz-replay",
                "version": 1,
                "kind": "trace",
                "racefuzz": __version__,
                "step": step,
                "device": "cuda",
                "watch": [],
                "delays": [{"stream": s, "launch": n, "us": us} for s, n, us in delays],
            }
        )
    )
    return path


def test_a_replay_masks_what_varies_without_delays_as_the_search_does(as_on_a_gpu, tmp_path, capsys) -> None:
    from racefuzz.commands.trace import replay_trace

    delays = [("forward", 0, 5000.0)]
    noisy = _replay_file(tmp_path / "noisy.json", "test_trace_nondeterminism:noisy_synced_step", delays)
    assert replay_trace(noisy, "auto", 3) == ExitCode.CLEAN
    out = capsys.readouterr().out
    assert "nondeterministic without any delay" in out and "aten.rand.default" in out
    assert "reproduced in 0/3 run(s)" in out
    hidden = _replay_file(tmp_path / "hidden.json", "test_trace_nondeterminism:hidden_sync_step", delays)
    assert replay_trace(hidden, "auto", 3) == ExitCode.RACE
    assert "the value divergence reproduced in 3/3 run(s)" in capsys.readouterr().out
