"""Designs are public API: built-ins, user designs by module path, and clear errors."""

from __future__ import annotations

import sys
import textwrap

import pytest

from racefuzz import InvalidArgument, find_races
from racefuzz.designs import load_design
from racefuzz.errors import UserCodeError
from racefuzz.scenarios.sglang import RequestSpec, Workload, build_program
from racefuzz.scenarios.sglang.designs import BUILTIN

USER_DESIGN = '''
"""A user's own global WAR barrier, written against racefuzz's public API only."""


class MyBarrier:
    name = "my-barrier"
    description = "loop-top wait on the previous forward's read_done, else the whole forward stream"

    def after_reads(self, ctx):
        ctx.state["read_done"] = ctx.forward_stream.record_event("read_done")

    def loop_top(self, ctx):
        read_done = ctx.state.pop("read_done", None)
        if read_done is not None:
            ctx.schedule_stream.wait_event(read_done)
        else:
            ctx.schedule_stream.wait_stream(ctx.forward_stream)


design = MyBarrier()
not_a_design = 42
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "mysync.py").write_text(textwrap.dedent(USER_DESIGN))
    (tmp_path / "broken_sync.py").write_text("raise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "mysync"
    for name in ("mysync", "broken_sync"):
        sys.modules.pop(name, None)


def test_builtins_have_names_and_descriptions() -> None:
    builtins = [
        "none",
        "self-event",
        "global-war",
        "read-done",
        "war-after-launch",
        "read-done-post-replay",
        "record-stream",
    ]
    assert list(BUILTIN) == builtins
    for name in BUILTIN:
        design = load_design(name)
        assert design.name == name and design.description != "(no description)"


def test_user_design_loads_and_fences_like_read_done(user_module: str) -> None:
    design = load_design(f"{user_module}:design")
    assert design.name == "my-barrier"
    workload = Workload(
        requests=(RequestSpec(0, 4, 64, (1,)), RequestSpec(3, 4, 64, (1,))), iterations=5, rows=1, block_size=2
    )
    assert find_races(build_program(workload, load_design("none").hooks)), "the workload is racy unfenced"
    assert find_races(build_program(workload, design.hooks)) == []


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no-such-design", "unknown design"),
        ("nonexistent_module_xyz:design", "cannot import design module"),
        ("mysync:missing", "has no attribute 'missing'"),
        ("mysync:not_a_design", "is not a design"),
    ],
)
def test_bad_design_specs(user_module: str, spec: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        load_design(spec)


def test_a_module_that_raises_on_import_is_an_error_in_user_code(user_module: str) -> None:
    with pytest.raises(UserCodeError, match=r"importing design module 'broken_sync' failed: RuntimeError: boom \(at "):
        load_design("broken_sync:design")


def test_hooks_must_be_callable() -> None:
    from types import SimpleNamespace

    from racefuzz.designs import check_design
    from racefuzz.scenarios.sglang import SCENARIO

    with pytest.raises(InvalidArgument, match="not callable"):
        check_design(SimpleNamespace(name="x", loop_top=3), "x", SCENARIO)
    with pytest.raises(InvalidArgument, match="headroom_blocks"):
        check_design(SimpleNamespace(name="x", headroom_blocks=-1), "x", SCENARIO)


def test_a_misspelt_hook_is_an_error_not_a_missing_fence() -> None:
    from types import SimpleNamespace

    from racefuzz.designs import check_design
    from racefuzz.scenarios.sglang import SCENARIO

    with pytest.raises(InvalidArgument, match="'loop_tob' is not a design hook; did you mean 'loop_top'"):
        check_design(SimpleNamespace(name="x", loop_tob=lambda ctx: None), "x", SCENARIO)
