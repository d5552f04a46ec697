"""The sglang harness's function profiler (`racefuzz.engines.sglang.scheduler.profile_functions`) around a
recording: it stands aside while the recorder handles a torch op, and is back for the code after; the
launches are still named by the line that made them."""

from __future__ import annotations

import importlib.util
import sys

import pytest

torch = pytest.importorskip("torch")

from racefuzz.engines.sglang.scheduler import profile_functions  # noqa: E402
from racefuzz.trace import fastpath  # noqa: E402
from racefuzz.trace.search import run_once  # noqa: E402
from racefuzz.trace.torch_mode import trace_mode_class  # noqa: E402


def test_the_profiler_stands_aside_while_the_recorder_handles_an_op(tmp_path, monkeypatch):
    package = tmp_path / "sglang"
    package.mkdir()
    (package / "pool.py").write_text("def after_op():\n    return 1\n")
    spec = importlib.util.spec_from_file_location("racefuzz_test_profiled_pool", package / "pool.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    mode_class = trace_mode_class()
    own_dispatch = mode_class.__dict__["__torch_dispatch__"]
    record = mode_class._record
    hooks_inside: list[object] = []

    def spying_record(self, *args):
        hooks_inside.append(sys.getprofile())
        return record(self, *args)

    monkeypatch.setattr(mode_class, "_record", spying_record)
    monkeypatch.setattr(fastpath, "load", lambda: None)  # every op through `_record`, the Python path
    start, stop = profile_functions(str(tmp_path))
    results = []

    def step(env):
        start()
        try:
            torch.ones(4).add_(1)
            module.after_op()
        finally:
            results.append(stop())

    run_once(step, "cpu")
    assert hooks_inside, "no op reached the recorder's mode"
    assert all(hook is None for hook in hooks_inside), hooks_inside
    functions, _ = results[0]
    assert "sglang/pool.py:after_op" in functions  # the hook was back after the ops
    assert mode_class.__dict__["__torch_dispatch__"] is own_dispatch
    assert sys.getprofile() is None


def test_a_launch_under_the_profiler_is_named_by_the_line_that_made_it(tmp_path):
    start, stop = profile_functions(str(tmp_path))

    def step(env):
        start()
        try:
            torch.ones(4).add_(1)
        finally:
            stop()

    record = run_once(step, "cpu")
    sources = [record.program.ops[i].info["at"] for i in record.launch_ops]
    assert sources and all(source.endswith("(step)") for source in sources), sources
