"""What the recorder does to cost less per launch (`python -m ci.bench trace`'s sglang step), pinned by what it
records: the same traces as before, the patches of a CPU recording made once, source lines from the step."""

from __future__ import annotations

import inspect

import pytest

torch = pytest.importorskip("torch")

from racefuzz.program import Launch  # noqa: E402
from racefuzz.trace.capture import TORCH_TENSOR_COPY, recording  # noqa: E402
from racefuzz.trace.env import TraceEnv  # noqa: E402
from racefuzz.trace.recorder import Recorder  # noqa: E402


def launches(recorder: Recorder, kernel: str) -> list[Launch]:
    return [op for op in recorder.builder.ops if isinstance(op, Launch) and op.kernel == kernel]


def test_a_cpu_torch_tensor_copy_names_the_steps_line_not_racefuzzs_patch():
    recorder = Recorder("cpu")
    env = TraceEnv(recorder, "cpu")
    with recording(recorder):
        line = inspect.currentframe().f_lineno + 1
        made = torch.tensor([1, 2, 3], device=env.device)
    (copy,) = launches(recorder, TORCH_TENSOR_COPY)
    assert copy.info["at"].endswith(f":{line} (test_a_cpu_torch_tensor_copy_names_the_steps_line_not_racefuzzs_patch)")
    assert made.tolist() == [1, 2, 3]


def test_a_cpu_recordings_stream_api_is_made_once_and_made_again_when_torch_changed(monkeypatch):
    torchs = torch.cuda.Stream
    with recording(Recorder("cpu")):
        first = torch.cuda.Stream
    assert first is not torchs and torch.cuda.Stream is torchs
    with recording(Recorder("cpu")):
        assert torch.cuda.Stream is first  # the same patch again, not one made anew
    assert torch.cuda.Stream is torchs

    class Replaced:
        """What a step's own patch of `torch.cuda.Stream` would put there."""

    monkeypatch.setattr(torch.cuda, "Stream", Replaced)
    recorder = Recorder("cpu")
    with recording(recorder):
        # Made again over what torch.cuda has now: outside this recording's thread it is `Replaced`'s.
        assert torch.cuda.Stream is not first
        made = torch.cuda.Stream()
        assert type(made).__name__ == "Stream" and made.name.startswith("stream#")
    assert torch.cuda.Stream is Replaced
    monkeypatch.undo()
    with recording(Recorder("cpu")):
        assert torch.cuda.Stream not in (first, Replaced)
    assert torch.cuda.Stream is torchs


def test_two_step_functions_at_one_bytecode_offset_keep_their_own_source_lines():
    # The source cache is keyed by the code object's id and the offset: two functions of one shape, called
    # at the same offset, are two entries.
    def first(x):
        x.add_(1)

    def second(x):
        x.add_(1)

    recorder = Recorder("cpu")
    with recording(recorder):
        x = torch.zeros(4)
        first(x)
        second(x)
        first(x)
    sources = [op.info["at"] for op in launches(recorder, "aten.add_.Tensor")]
    assert [s.rsplit(" ", 1)[-1] for s in sources] == ["(first)", "(second)", "(first)"]
    assert sources[0] == sources[2] != sources[1]


def copies_step(env):
    """What sglang's step did through the dispatch mode: `torch.tensor` copies, a `matmul` (decomposed into
    `mm`), a dtype conversion and a `copy_` between device tensors, allocations (`empty`, `empty_like`), one
    freed; and a host read."""
    side = env.stream("side")
    side.wait_stream(env.current_stream())
    with env.use(side):
        lens = torch.tensor([64, 96, 32], dtype=torch.int64, device=env.device)
        weights = torch.ones(8, 8)
        hidden = weights @ weights
        indptr = torch.zeros(4, dtype=torch.int32)
        indptr[1:] = torch.cumsum(lens, 0).to(torch.int32)
        scratch = torch.empty(16)
        scratch.fill_(1)  # accessed: its free is recorded
        like = torch.empty_like(hidden)
        like.copy_(hidden)
        del scratch
        total = int(indptr[-1])
    host = torch.tensor([1, 2])  # no device: a host tensor, no launch
    env.current_stream().wait_stream(side)
    return {"indptr": indptr, "like": like, "total": torch.tensor(total), "host": host}


def record(step, fast: bool, monkeypatch, **options):
    from racefuzz.trace import fastpath
    from racefuzz.trace.search import run_once

    with monkeypatch.context() as patch:
        if not fast:
            patch.setattr(fastpath, "load", lambda: None)
        return run_once(step, "cpu", watch_frees=True, **options)


@pytest.mark.parametrize("options", [{}, {"serialize": True}, {"snapshot_plan": {}, "evaluate_annotations": False}])
def test_copies_allocations_and_decomposed_ops_are_recorded_below_the_mode_as_the_python_path_records_them(
    monkeypatch, options
):
    from racefuzz.trace import fastpath
    from racefuzz.trace.torch_mode import trace_mode_class

    if fastpath.load() is None:
        pytest.skip("the C++ fast path cannot be built here (see stderr)")
    fast, slow = record(copies_step, True, monkeypatch, **options), record(copies_step, False, monkeypatch, **options)
    assert fast.program.ops == slow.program.ops and fast.program.buffers == slow.program.buffers
    assert fast.launch_ops == slow.launch_ops and fast.program.streams == slow.program.streams
    assert sorted(fast.snapshots) == sorted(slow.snapshots)
    kernels = [op.kernel for op in fast.program.ops if isinstance(op, Launch)]
    assert kernels.count(TORCH_TENSOR_COPY) == 1  # `torch.tensor([1, 2])` without a device is no launch
    assert {"aten.mm.default", "aten._to_copy.default", "aten.copy_.default"} <= set(kernels)
    frees = {
        op.kernel: op.stream.name for op in fast.program.ops if isinstance(op, Launch) and op.info["kind"] == "free"
    }
    assert frees["free(tmp6 (aten.fill_.Scalar))"] == "side"  # `scratch`'s block, allocated by `empty` there

    mode_class = trace_mode_class()
    original = mode_class.__torch_dispatch__
    seen: list[str] = []

    def counted(self, func, types, args=(), kwargs=None):
        seen.append(str(func))
        return original(self, func, types, args, kwargs)

    monkeypatch.setattr(mode_class, "__torch_dispatch__", counted)
    record(copies_step, True, monkeypatch, **options)
    # None of these reaches the mode: each is recorded below it.
    assert not {
        "aten.lift_fresh.default",
        "aten.mm.default",
        "aten._to_copy.default",
        "aten.copy_.default",
        "aten.empty.memory_format",
        "aten.empty_like.default",
    } & set(seen), seen


def test_two_versions_of_the_fast_paths_source_keep_a_build_each(monkeypatch, tmp_path):
    # A tree and its CI copy on one host, of different sources, rebuilt each other's build in one directory
    # (each then loading the other's module: a `configure` of the wrong constants).
    from pathlib import Path

    from racefuzz.trace import fastpath

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    ours, source = fastpath.build_directory(), Path(fastpath.SOURCE).read_bytes()
    copy = tmp_path / "checkout" / "_fastpath.cpp"
    copy.parent.mkdir()
    copy.write_bytes(source)
    monkeypatch.setattr(fastpath, "SOURCE", str(copy))
    assert fastpath.build_directory() == ours  # the same source elsewhere: the same build
    copy.write_bytes(source + b"\n// another version\n")
    assert fastpath.build_directory() != ours
