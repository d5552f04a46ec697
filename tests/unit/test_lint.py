"""Design lint (`racefuzz.lint`): the three findings, each naming its hook; the built-in designs are clean."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from racefuzz.designs import load_design
from racefuzz.errors import UserCodeError
from racefuzz.lint import Finding, preflight
from racefuzz.scenarios import get_scenario


def _design(**hooks: object):
    return load_design_object(SimpleNamespace(name="linted", **hooks))


def load_design_object(obj: object):
    import sys
    import types

    module = types.ModuleType("lint_target")
    module.design = obj  # type: ignore[attr-defined]
    sys.modules["lint_target"] = module
    try:
        return load_design("lint_target:design")
    finally:
        del sys.modules["lint_target"]


@pytest.mark.parametrize("name", list(get_scenario().designs()))
def test_built_in_designs_are_clean(name: str) -> None:
    assert preflight(load_design(name)) == []


def test_a_stream_waiting_on_itself_names_its_hook() -> None:
    design = _design(loop_top=lambda ctx: ctx.schedule_stream.wait_stream(ctx.schedule_stream))
    assert preflight(design) == [
        Finding(
            "loop_top", "schedule_stream.wait_stream(schedule_stream): a stream waiting on itself (a no-op in CUDA)"
        )
    ]


def test_a_wait_on_an_event_never_recorded_names_its_hook() -> None:
    def loop_top(ctx) -> None:
        ctx.schedule_stream.wait_event(ctx.device.event("read_done"))

    findings = preflight(_design(loop_top=loop_top))
    assert [(f.hook, f.message.split(" before")[0]) for f in findings] == [
        ("loop_top", "wait_event on event 'read_done'")
    ]


def test_an_event_recorded_and_never_waited_names_its_hook() -> None:
    design = _design(after_reads=lambda ctx: ctx.forward_stream.record_event("read_done"))
    assert preflight(design) == [
        Finding("after_reads", "event 'read_done' is recorded but never waited on nor synchronized")
    ]


def test_the_catalogues_lint_mutants_are_flagged() -> None:
    assert [f.hook for f in preflight(load_design("mutant-plan-exit-self-wait"))] == ["plan_exit"]
    assert [f.hook for f in preflight(load_design("mutant-reused-read-done"))] == ["after_launch"]


def test_a_hook_that_raises_fails_the_preflight_as_user_code() -> None:
    def after_reads(ctx) -> None:
        raise ValueError("broken fence")

    with pytest.raises(UserCodeError, match=r"hook after_reads raised ValueError: broken fence \(at .*test_lint.py:"):
        preflight(_design(after_reads=after_reads))
