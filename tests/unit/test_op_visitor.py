"""The one op dispatch (`racefuzz.program.OpVisitor`): exhaustive, checked when a visitor class is defined.

Adding an op type to `racefuzz.program.Op` must break, at import, every visitor that does not handle it,
instead of letting the simulator, the checker or a backend skip the new op silently.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import NamedTuple

import pytest

import racefuzz
from racefuzz.litmus import all_litmus
from racefuzz.program import OP_METHODS, OP_TYPES, Op, OpVisitor, missing_visit_methods


class Counter(OpVisitor[str]):
    """Names each op's type: a visitor that handles every op type."""

    def visit_launch(self, op):
        return "launch"

    def visit_record(self, op):
        return "record"

    def visit_wait_event(self, op):
        return "wait_event"

    def visit_wait_stream(self, op):
        return "wait_stream"

    def visit_event_sync(self, op):
        return "event_sync"

    def visit_stream_sync(self, op):
        return "stream_sync"

    def visit_device_sync(self, op):
        return "device_sync"

    def visit_host_delay(self, op):
        return "host_delay"


def test_every_op_type_has_one_method() -> None:
    assert set(OP_TYPES) == set(Op.__args__)
    assert sorted(OP_METHODS.values()) == sorted(
        f"visit_{name}"
        for name in (
            "launch",
            "record",
            "wait_event",
            "wait_stream",
            "event_sync",
            "stream_sync",
            "device_sync",
            "host_delay",
        )
    )


def test_visit_and_dispatcher_call_the_method_of_the_ops_type() -> None:
    counter = Counter()
    dispatch = counter.dispatcher()
    seen = set()
    for litmus in all_litmus():
        for op in litmus.program.ops:
            name = counter.visit(op)
            assert name == OP_METHODS[type(op)].removeprefix("visit_")
            assert dispatch[type(op)](op) == name
            seen.add(type(op))
    assert {t.__name__ for t in seen} >= {"Launch", "Record", "WaitEvent", "WaitStream"}


def test_a_visitor_missing_an_op_type_is_refused_when_defined() -> None:
    with pytest.raises(TypeError, match=r"lacks visit_host_delay\b"):

        class Forgetful(OpVisitor[None]):
            visit_launch = visit_record = visit_wait_event = visit_wait_stream = Counter.visit_launch
            visit_event_sync = visit_stream_sync = visit_device_sync = Counter.visit_launch


def test_a_partial_base_defers_the_check_to_its_subclasses() -> None:
    class Base(OpVisitor[str], partial=True):
        def visit_launch(self, op):
            return "base"

    with pytest.raises(TypeError, match="visit_record"):

        class Incomplete(Base):
            pass

    class Complete(Base, Counter):
        pass

    assert Complete().visit(all_litmus()[0].program.launches[0]) == "base"


class Barrier(NamedTuple):
    """A made-up op type, not in the IR."""

    index: int


def test_a_new_op_type_is_unhandled_by_every_visitor_of_the_library() -> None:
    import racefuzz.hb
    import racefuzz.sim

    visitors = [cls for module in (racefuzz.sim, racefuzz.hb) for cls in vars(module).values()]
    visitors = [c for c in visitors if isinstance(c, type) and issubclass(c, OpVisitor) and c is not OpVisitor]
    assert len(visitors) >= 2
    for cls in [*visitors, Counter]:
        assert missing_visit_methods(cls) == []
        assert missing_visit_methods(cls, (*OP_TYPES, Barrier)) == ["visit_barrier"]


def test_adding_an_op_type_to_the_ir_fails_the_import_of_every_visitor() -> None:
    """Patch a `Barrier` op into a copy of the IR module; importing the simulator must then fail."""
    program_py = Path(racefuzz.__file__).with_name("program.py")
    code = textwrap.dedent(
        f"""
        import sys, types
        source = open({str(program_py)!r}).read()
        union = "Op = Launch | Record | WaitEvent | WaitStream | EventSync | StreamSync | DeviceSync | HostDelay"
        assert source.count(union) == 1, "the Op union moved: update this test"
        barrier = "class Barrier(NamedTuple):\\n    index: int\\n\\n\\n"
        source = source.replace(union, barrier + union + " | Barrier")
        module = types.ModuleType("racefuzz.program")
        module.__file__ = {str(program_py)!r}
        sys.modules["racefuzz.program"] = module
        exec(compile(source, {str(program_py)!r}, "exec"), module.__dict__)
        for name in ("racefuzz.sim", "racefuzz.hb"):
            try:
                __import__(name)
            except TypeError as exc:
                assert "visit_barrier" in str(exc), exc
                print(name, "refused")
            else:
                raise SystemExit(name + " imported with an unhandled op type")
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["racefuzz.sim refused", "racefuzz.hb refused"]
