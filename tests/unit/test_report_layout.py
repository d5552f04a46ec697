"""One report layout for both frontends (`racefuzz.report.layout`): the sections in one order, and a race told
the same way whether the model describes its launches by program op or a trace by kernel, stream and line."""

from __future__ import annotations

import pytest

from racefuzz.backends import executor
from racefuzz.designs import load_design
from racefuzz.report import Access, RaceAccount, Report, layout, render
from racefuzz.search import search


def test_the_layout_writes_the_header_then_each_section_in_its_order_and_leaves_empty_ones_out() -> None:
    race = RaceAccount(
        accesses=(Access("write", "W", "cells w"), Access("read", "R")),
        shared=("shared", "S"),
        missing_edge="E",
        heading="H",
        notes=("  note",),
        evidence=("  values",),
    )
    report = Report(
        tool="racefuzz",
        title="T",
        context=("context",),
        verdict=("verdict",),
        races=(race,),
        more_races=("more",),
        findings=("finding",),
        schedule=("  schedule",),
        confirmation=("  confirmed",),
        replay="racefuzz replay F",
    )
    assert layout(report).splitlines() == [
        "==== racefuzz: T ====",
        "context",
        "verdict",
        "H",
        "  write:  W",
        "          cells w",
        "  read:   R",
        "  shared: S",
        "  note",
        "  values",
        "  missing edge: E",
        "more",
        "finding",
        "  schedule",
        "  confirmed",
        "  replay: racefuzz replay F",
    ]
    assert (
        layout(Report(tool="racefuzz trace", title="no race in s (cpu)"))
        == "==== racefuzz trace: no race in s (cpu) ===="
    )


def _race_block(text: str) -> list[str]:
    """The lines of a report from its first access to its missing edge."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(("  write:  ", "  first:  ")))
    end = next(i for i, line in enumerate(lines) if line.startswith("  missing edge: "))
    return lines[start : end + 1]


def test_a_model_race_and_a_traced_race_are_told_in_one_layout() -> None:
    pytest.importorskip("torch")
    from racefuzz.trace.example import racy_step
    from racefuzz.trace.report import render as render_trace
    from racefuzz.trace.search import fuzz

    design = load_design("none")
    found = search(design, executor("sim"), examples=300, seed=0)
    assert found.counterexample is not None  # the control races on the model
    model = _race_block(
        render(found.counterexample, design="none", backend="sim", replay_path=None, scenario=design.scenario)
    )
    traced = fuzz(racy_step, device="cpu")
    assert traced.races  # and on real code
    trace = _race_block(render_trace(traced))
    # The same labels at the same column, each side's launch in its frontend's terms, the edge said last:
    # the model's sides with their cells (and the values read before the edge), the trace's with the bytes.
    assert [line[:10] for line in model[:5]] == ["  write:  ", "          ", "  read:   ", "          ", "  shared: "]
    assert model[0].startswith("  write:  op #") and model[1].startswith("          cells ")
    assert [line[:10] for line in trace] == ["  first:  ", "  second: ", "  bytes:  ", "  missing "]
    assert trace[0].startswith("  first:  aten.") and "racefuzz/trace/example.py:" in trace[0]
    for block in (model, trace):
        assert block[-1].startswith("  missing edge: no happens-before edge from op #")
