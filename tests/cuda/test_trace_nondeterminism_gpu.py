"""Nondeterministic kernels on a real GPU (issue 27, item 1): a race-free step whose `index_add_` adds
floats with atomics (the sums come out in another order, so other bits, in every run) is no race, and its
report names the nondeterministic launches; beside it, on the same seeds, the same step without its WAR
barrier is caught (happens-before) and its wrong values still manifest, k of k, through the mask.
tests/unit/test_trace_nondeterminism.py has the CPU side (a nondeterministic `torch.rand`).

Each test prints what it saw (run with `-s` for the record)."""

from __future__ import annotations

import pytest

from racefuzz.trace import fuzz
from racefuzz.trace.report import render

pytestmark = pytest.mark.cuda

SEEDS = (0, 1, 2)


def _atomics(env, barrier: bool):
    import torch

    generator = torch.Generator(device=env.device).manual_seed(7)  # the same inputs in every run
    table = env.name(torch.arange(4 * 64, dtype=torch.int32, device=env.device).reshape(4, 64), "req_to_token")
    schedule, forward = env.stream("schedule"), env.stream("forward")
    forward.wait_stream(env.current_stream())
    schedule.wait_stream(env.current_stream())
    with env.use(forward):
        rows = torch.tensor([1, 2], device=env.device)
        kv_indices = table[rows, :32].flatten()
        # 2^20 float adds into 16 bins: the atomics' order, and so the rounding, differs from run to run.
        index = torch.randint(0, 16, (1 << 20,), device=env.device, generator=generator)
        values = torch.rand(1 << 20, device=env.device, generator=generator)
        sums = env.name(torch.zeros(16, device=env.device), "sums").index_add_(0, index, values)
        scaled = sums * 2
    if barrier:
        schedule.wait_stream(forward)
    with env.use(schedule):
        table[1, 0:8] = -1
    env.synchronize()
    return {"kv_indices": kv_indices, "scaled": scaled}


def synced_atomics(env):
    return _atomics(env, barrier=True)


def racy_atomics(env):
    return _atomics(env, barrier=False)


def _nondeterministic_kernels(result) -> list[str]:
    ops, launch_ops = result.reference.builder.ops, result.reference.launch_ops
    return [ops[launch_ops[ordinal]].kernel for ordinal in result.nondeterministic.launches]


@pytest.mark.parametrize("seed", SEEDS)
def test_index_add_atomics_are_no_race_and_named_beside_a_caught_control(seed: int) -> None:
    control = fuzz(racy_atomics, device="cuda", examples=200, seed=seed, confirm=3)
    print(render(control))
    assert control.races and control.racy, "the negative control must be caught"
    assert control.manifested and control.divergence is not None, "its wrong kv_indices manifest through the mask"
    result = fuzz(synced_atomics, device="cuda", examples=200, seed=seed, confirm=3)
    text = render(result)
    print(text)
    assert result.races == [] and not result.racy and result.divergence is None and result.examples > 0
    kernels = _nondeterministic_kernels(result)
    assert "aten.index_add_.default" in kernels and "aten.mul.Tensor" in kernels
    assert "scaled" in result.nondeterministic.outputs and "kv_indices" not in result.nondeterministic.outputs
    assert "no race" in text.splitlines()[0] and "aten.index_add_.default" in text


def test_the_trace_command_exits_0_on_the_atomics_and_1_on_the_control(tmp_path, capsys) -> None:
    from racefuzz.cli import main

    common = ["--device", "cuda", "--examples", "100", "--seed", "0", "--report-dir", str(tmp_path)]
    common += ["--database", str(tmp_path / "db")]
    step = "test_trace_nondeterminism_gpu:synced_atomics"
    assert main(["trace", step, "--control", "test_trace_nondeterminism_gpu:racy_atomics", *common]) == 0
    out = capsys.readouterr().out
    print(out)
    assert "negative control test_trace_nondeterminism_gpu:racy_atomics: caught" in out
    assert "nondeterministic without any delay" in out and "aten.index_add_.default" in out


def test_examples_0_is_a_happens_before_only_run_on_the_gpu(tmp_path, capsys) -> None:
    from racefuzz.cli import main

    common = ["--device", "cuda", "--examples", "0", "--report-dir", str(tmp_path)]
    assert main(["trace", "racefuzz.trace.example:racy_step", *common]) == 1
    assert main(["trace", "racefuzz.trace.example:synced_step", *common]) == 0
    out = capsys.readouterr().out
    assert out.count("value oracle: not run with --examples 0 (happens-before only") == 2
