"""Differential test of the recorder's C++ fast path: random small torch programs over rows of a table,
standalone tensors and fresh results, on three streams with waits and frees, recorded with the fast path
and with the Python path; the traces, storages, launch ordinals and snapshots must be the same. The
hand-written steps of test_trace_fastpath.py pin known cases; this searches for the ones nobody wrote."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from racefuzz.trace import fastpath  # noqa: E402
from racefuzz.trace.search import run_once  # noqa: E402

if fastpath.load() is None:  # compiled once per torch and Python version (10-60 s)
    pytest.skip("the C++ fast path cannot be built here (see stderr)", allow_module_level=True)

STREAMS = ("schedule", "forward", "plan")
LENGTH = 8

# Each action: (name, how many pool indices it takes). Every pool tensor is 1-D of LENGTH elements.
ACTIONS = {
    "add_": 2,  # in-place, two reads (one storage or two)
    "mul_scalar_": 1,  # in-place with a wrapped number
    "add_out": 2,  # `out=`: torch.add(a, 1, out=b)
    "add": 2,  # fresh output
    "mul_scalar": 1,  # fresh output, one read
    "where": 2,  # fresh output, three reads (a mask made on the fly)
    "cumsum": 1,  # fresh output
    "flip": 1,  # fresh output of a strided read
    "clone": 1,
    "copy_": 2,  # a sync rule: the mode
    "index_put": 1,  # a tensor list: the mode
    "unsqueeze_squeeze": 1,  # in-place view ops on a fresh tensor: no accesses
    "sum_item": 1,  # a host sync
    "max_dim": 1,  # two fresh outputs (values, indices)
    "autocast_mm": 2,  # autocast's casts: the mode
    "requires_grad": 1,  # autograd works on it: the mode
    "free": 1,  # drop a fresh tensor (its free, on the stream it was made on)
}

action = st.tuples(
    st.sampled_from(sorted(ACTIONS)),
    st.integers(0, len(STREAMS) - 1),
    st.lists(st.integers(0, 63), min_size=2, max_size=2),
)
wait = st.tuples(st.just("wait"), st.integers(0, len(STREAMS) - 1), st.integers(0, len(STREAMS) - 1))
programs = st.lists(st.one_of(action, action, action, wait), min_size=1, max_size=24)


def program_step(program: list[tuple[Any, ...]]):
    def step(env):
        table = env.name(torch.arange(4 * LENGTH, dtype=torch.float32).reshape(4, LENGTH), "req_to_token")
        streams = [env.stream(name) for name in STREAMS]
        for stream in streams:
            stream.wait_stream(env.current_stream())
        pool: list[Any] = [table[0], table[1], table[2], table[3], torch.ones(LENGTH), torch.zeros(LENGTH)]
        fixed = len(pool)  # rows and standalone tensors: never freed
        for item in program:
            if item[0] == "wait":
                streams[item[1]].wait_stream(streams[item[2]])
                continue
            name, stream, picks = item
            a, b = (pool[k % len(pool)] for k in picks)
            with env.use(streams[stream]):
                if name == "add_":
                    a.add_(b)
                elif name == "mul_scalar_":
                    a.mul_(2)
                elif name == "add_out":
                    torch.add(a, 1, out=b)
                elif name == "add":
                    pool.append(a + b)
                elif name == "mul_scalar":
                    pool.append(a * 3)
                elif name == "where":
                    pool.append(torch.where(a > b, a, b))
                elif name == "cumsum":
                    pool.append(a.cumsum(0))
                elif name == "flip":
                    pool.append(table[:, 0].repeat(2).flip(0))
                elif name == "clone":
                    pool.append(a.clone())
                elif name == "copy_":
                    b.copy_(a)
                elif name == "index_put":
                    a[torch.tensor([1, 3])] = 5.0
                elif name == "unsqueeze_squeeze":
                    fresh = a.clone()
                    fresh.unsqueeze_(0).squeeze_(0)
                    pool.append(fresh)
                elif name == "sum_item":
                    a.sum().item()
                elif name == "max_dim":
                    pool.append(a.reshape(2, 4).max(1).values.repeat(4))
                elif name == "autocast_mm":
                    with torch.autocast("cpu", dtype=torch.bfloat16):
                        product = torch.mm(a.reshape(2, 4), b.reshape(4, 2))
                    pool.append(product.float().reshape(-1).repeat(2))
                elif name == "requires_grad":
                    weight = a.detach().clone().requires_grad_()
                    grown = weight * 2
                    grown.mul_(weight)  # autograd saves a clone of `grown` first
                    pool.append(grown.detach())
                elif name == "free" and len(pool) > fixed:
                    del pool[fixed + picks[0] % (len(pool) - fixed)]
        for stream in streams:
            env.current_stream().wait_stream(stream)
        return {"table": table, "last": pool[-1]}

    return step


def snapshots(record):
    return {k: [(s.slot, s.lo, s.hi, s.intervals, s.data.tolist()) for s in v] for k, v in record.snapshots.items()}


@settings(
    max_examples=100,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(program=programs, serialize=st.booleans())
def test_random_programs_are_recorded_alike_by_both_paths(monkeypatch, program, serialize):
    step = program_step(program)
    options = {"watch_frees": True, "serialize": serialize}  # frees as on a GPU; every write snapshotted

    def record(fast: bool):
        with monkeypatch.context() as patch:
            if not fast:
                patch.setattr(fastpath, "load", lambda: None)
            return run_once(step, "cpu", **options)  # one line: a free after the step is attributed to it

    fast, slow = record(True), record(False)
    assert fast.program.ops == slow.program.ops
    assert fast.program.buffers == slow.program.buffers and fast.program.streams == slow.program.streams
    assert fast.launch_ops == slow.launch_ops
    assert snapshots(fast) == snapshots(slow)
    assert all(torch.equal(fast.outputs[k], slow.outputs[k]) for k in slow.outputs)
