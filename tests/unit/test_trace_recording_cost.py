"""What the recorder does to cost less per launch (`python -m ci.bench trace`'s sglang step), pinned by what it
records: the same traces as before, the patches of a CPU recording made once, source lines from the step."""

from __future__ import annotations

import inspect

import pytest

torch = pytest.importorskip("torch")

from racefuzz.trace.capture import TORCH_TENSOR_COPY, recording  # noqa: E402
from racefuzz.trace.env import TraceEnv  # noqa: E402
from racefuzz.trace.model import TraceLaunch  # noqa: E402
from racefuzz.trace.recorder import Recorder  # noqa: E402


def launches(recorder: Recorder, kernel: str) -> list[TraceLaunch]:
    return [op for op in recorder.record.trace.ops if isinstance(op, TraceLaunch) and op.kernel == kernel]


def test_a_cpu_torch_tensor_copy_names_the_steps_line_not_racefuzzs_patch():
    recorder = Recorder("cpu")
    env = TraceEnv(recorder, "cpu")
    with recording(recorder):
        line = inspect.currentframe().f_lineno + 1
        made = torch.tensor([1, 2, 3], device=env.device)
    (copy,) = launches(recorder, TORCH_TENSOR_COPY)
    assert copy.source.endswith(f":{line} (test_a_cpu_torch_tensor_copy_names_the_steps_line_not_racefuzzs_patch)")
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
    sources = [op.source for op in launches(recorder, "aten.add_.Tensor")]
    assert [s.rsplit(" ", 1)[-1] for s in sources] == ["(first)", "(second)", "(first)"]
    assert sources[0] == sources[2] != sources[1]
