"""On a GPU, what the fast path now records below the dispatch mode (`torch.tensor`'s copy to the device, copies
between device tensors, allocations, `matmul`'s decomposition) is recorded as the Python path records it, and
what syncs the host (a copy to the host) is still the mode's, its sync in the trace."""

from __future__ import annotations

import pytest

from racefuzz.program import Launch, StreamSync
from racefuzz.trace import fastpath
from racefuzz.trace.search import run_once

pytestmark = pytest.mark.cuda


def copies_step(env):
    import torch

    side = env.stream("side")
    side.wait_stream(env.current_stream())
    with env.use(side):
        lens = torch.tensor([64, 96, 32], dtype=torch.int64, device=env.device)  # a blocking copy, then a sync
        weights = torch.ones(8, 8, device=env.device)
        hidden = weights @ weights
        indptr = torch.zeros(4, dtype=torch.int32, device=env.device)
        indptr[1:] = torch.cumsum(lens, 0).to(torch.int32)
        like = torch.empty_like(hidden)
        like.copy_(hidden)
        on_host = like.cpu()  # a copy to the host: it syncs, the mode's
    env.current_stream().wait_stream(side)
    return {"indptr": indptr, "like": like, "on_host": on_host}


def record(fast: bool, monkeypatch, **options):
    with monkeypatch.context() as patch:
        if not fast:
            patch.setattr(fastpath, "load", lambda: None)
        return run_once(copies_step, "cuda", **options)


@pytest.mark.parametrize("options", [{"serialize": True}, {"snapshot_plan": {}, "evaluate_annotations": False}])
def test_copies_and_allocations_below_the_mode_record_what_the_python_path_records_on_the_gpu(monkeypatch, options):
    if fastpath.load() is None:
        pytest.skip("the C++ fast path cannot be built here (see stderr)")
    fast, slow = record(True, monkeypatch, **options), record(False, monkeypatch, **options)
    print(*fast.program.ops, sep="\n")
    assert fast.program.ops == slow.program.ops and fast.program.buffers == slow.program.buffers
    assert fast.launch_ops == slow.launch_ops
    ops = fast.program.ops
    kernels = [op.kernel if isinstance(op, Launch) else type(op).__name__ for op in ops]
    copy = kernels.index("torch.tensor (host-to-device copy)")
    assert kernels[copy + 1] == "StreamSync"  # the host waited for the copy
    to_host = max(i for i, k in enumerate(kernels) if k == "aten._to_copy.default")  # the last: `.cpu()`
    assert isinstance(ops[to_host + 1], StreamSync)  # `.cpu()`: a blocking copy to the host
    assert {"aten.mm.default", "aten.copy_.default"} <= set(kernels)
