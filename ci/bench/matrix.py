"""The design x hazard matrix of docs/designs.md: each built-in design against each hazard alone.

For every cell, a search on the simulator restricted to that one hazard gives both verdicts --
manifested corruption (some schedule made a forward read a clobbered value) and happens-before (an
unordered conflicting pair exists) -- and, for a racy cell, the shrunk counterexample. The `plan-stream`
column runs with the plan stream on and no other hazard. It doubles as the shrinking benchmark: each
counterexample's size (requests, iterations, non-zero delays) and the seconds spent shrinking it
(Hypothesis, then `racefuzz.minimize`) after the first detection.

By default it writes nothing: it prints the table (Markdown), and `--json PATH` writes the raw figures.
`--out DIR` also writes each racy cell's replay file and report under `DIR/counterexamples/<design>.<hazard>/`
(paths relative to the working directory, as given). The committed matrix of docs/designs.md is regenerated
from the repository root with

    python -m ci.bench matrix --out docs/results/design-matrix --json docs/results/design-matrix/design-matrix.json \
        > docs/results/design-matrix/design-matrix.md

after removing the old `docs/results/design-matrix/counterexamples/` (file names are content hashes).
"""

from __future__ import annotations

import platform
from datetime import datetime, timezone
from pathlib import Path

from racefuzz import __version__
from racefuzz.backends import executor
from racefuzz.designs import load_design
from racefuzz.progress import progress
from racefuzz.report import ReplayFile, primary_race, write_replay
from racefuzz.report import render as render_report
from racefuzz.scenarios import get_scenario
from racefuzz.scenarios.sglang import HAZARDS
from racefuzz.search import search

EXAMPLES = 2000
CONTROLS = {"plan-stream": "mutant-plan-exit-self-wait"}
"""The negative control per hazard where the scenario's (`none`) is not one (see
racefuzz/scenarios/sglang/mutants.py)."""
COUNTEREXAMPLES = "counterexamples"
"""The folder under `--out` that receives one sub-folder of replay file and report per racy cell."""


def run(examples: int | None = None, out: Path | None = None) -> dict[str, object]:
    """Search every (built-in design, hazard) cell with up to `examples` examples (default `EXAMPLES`); with
    `out`, write the counterexamples under `out/counterexamples/` (nothing is written without it)."""
    examples = EXAMPLES if examples is None else examples
    sim = executor("sim")
    scenario = get_scenario()  # sglang's overlap loop
    cells = []
    for name in scenario.designs():
        design = load_design(name)
        for hazard in HAZARDS:
            plan_stream = hazard == "plan-stream"
            with progress(examples, f"{name} x {hazard}") as on_example:
                result = search(
                    design,
                    sim,
                    examples=examples,
                    seed=0,
                    hazards=(hazard,),
                    plan_stream=plan_stream,
                    on_example=on_example,
                )
            c = result.counterexample
            cell: dict[str, object] = {
                "design": name,
                "hazard": hazard,
                "examples": result.examples,
                "manifested": bool(c and c.corruptions),
                "unordered": bool(c and c.races),
                "examples_to_detect": result.first_detection_example,
                "seconds": round(result.seconds, 3),
            }
            if c is not None:
                assert c.oracle is not None
                if out is not None:
                    replay = ReplayFile(name, "sim", 0, c.workload, c.schedule, c.oracle, __version__, scenario)
                    path = write_replay(replay, out / COUNTEREXAMPLES / f"{name}.{hazard}")
                    text = render_report(c, design=name, backend="sim", replay_path=path, scenario=scenario)
                    path.with_suffix(".txt").write_text(text + "\n")
                    cell["replay_file"] = str(path)
                race = primary_race(c)
                cell.update(
                    shrink_seconds=round(result.seconds - (result.first_detection_seconds or 0.0), 3),
                    requests=len(c.workload.requests),
                    iterations=c.workload.iterations,
                    nonzero_delays=c.schedule.nonzero_delays,
                    race=None
                    if race is None
                    else f"{race.kind} {race.first.kernel} ({race.first.stream}) -> "
                    f"{race.second.kernel} ({race.second.stream})",
                )
            cells.append(cell)
    # Every "clean" cell needs a negative control caught on the same hazard in the same run: `none`
    # where it races; the plan-stream column, where even `none` is clean, uses a broken plan-stream exit.
    controls = []
    for hazard in HAZARDS:
        name = CONTROLS.get(hazard, scenario.control_design)
        caught = search(
            load_design(name),
            sim,
            examples=examples,
            seed=0,
            hazards=(hazard,),
            plan_stream=hazard == "plan-stream",
            shrink=False,
        )
        controls.append(
            {
                "hazard": hazard,
                "control": name,
                "caught": caught.found,
                "examples_to_detect": caught.first_detection_example,
            }
        )
    return {
        "benchmark": "matrix",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "racefuzz": __version__,
        "python": platform.python_version(),
        "examples_per_cell": examples,
        "cells": cells,
        "controls": controls,
    }


def _verdict(cell: dict[str, object]) -> str:
    if not cell["unordered"] and not cell["manifested"]:
        return f"clean ({cell['examples']} ex.)"
    both = "corrupted + unordered" if cell["manifested"] else "unordered only"
    return f"**racy**: {both}"


def render(results: dict[str, object]) -> str:
    cells = results["cells"]
    assert isinstance(cells, list)
    lines = [
        f"Generated by `python -m ci.bench matrix` on {results['date']} (racefuzz {results['racefuzz']}, simulator, "
        f"seed 0, up to {results['examples_per_cell']} examples per cell).",
        "",
        "| design | " + " | ".join(HAZARDS) + " |",
        "|---|" + "---|" * len(HAZARDS),
    ]
    for name in dict.fromkeys(c["design"] for c in cells):
        row = [c for c in cells if c["design"] == name]
        lines.append(f"| `{name}` | " + " | ".join(_verdict(c) for c in row) + " |")
    controls = results.get("controls", [])
    assert isinstance(controls, list)
    found = [
        f"{c['hazard']}: `{c['control']}` "
        + (f"caught at example {c['examples_to_detect']}" if c["caught"] else "NOT caught")
        for c in controls
    ]
    lines += ["", f"Negative controls, same hazards, same run: {'; '.join(found)}."]
    lines += [
        "",
        "Minimal counterexamples (shrunk by Hypothesis, then minimized structurally; replay with "
        "`racefuzz replay FILE`; written with `--out DIR` only):",
        "",
    ]
    lines.append("| design | hazard | race | requests | iterations | non-zero delays | shrink s | replay file |")
    lines.append("|---|---|---|---|---|---|---|---|")
    for c in cells:
        if "requests" in c:  # a racy cell: its shrunk counterexample
            replay_file = f"`{c['replay_file']}`" if c.get("replay_file") else "-"
            lines.append(
                f"| `{c['design']}` | {c['hazard']} | {c['race']} | {c['requests']} | {c['iterations']} | "
                f"{c['nonzero_delays']} | {c['shrink_seconds']:.2f} | {replay_file} |"
            )
    return "\n".join(lines)
