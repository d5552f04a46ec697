"""Simulator examples per second on the overlap scenario, one core, and time to catch the control.

An example is everything `racefuzz run` does per example: Hypothesis draws a workload and a schedule,
the scenario builds the program under the design, the simulator runs it, and both oracles check it.
The default workload distribution is up to 8 requests; figures are given for exactly 8 iterations (the
issue's "default workload") and for 1 to 8 iterations (what `racefuzz run` draws), each the median of
three runs of 3000 examples. Goal: >= 1,000 examples/s on the default workload (8 iterations). Run it
pinned to one core: `taskset -c 0 racefuzz bench scenario`.
"""

from __future__ import annotations

import platform
import statistics
import time
from datetime import datetime, timezone

from racefuzz.backends import executor
from racefuzz.designs import load_design
from racefuzz.progress import progress
from racefuzz.scenarios.sglang import HAZARDS, PRE_LAUNCH_HAZARDS
from racefuzz.search import search

GOAL_EXAMPLES_PER_S = 1000
EXAMPLES = 3000
REPEATS = 3


def run(examples: int = EXAMPLES) -> dict[str, object]:
    results: dict[str, object] = {
        "benchmark": "scenario",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "goal_examples_per_s": GOAL_EXAMPLES_PER_S,
        "rows": [],
    }
    rows = results["rows"]
    assert isinstance(rows, list)
    sim = executor("sim")
    # Clean (design, hazards) pairs, so every row runs all its examples rather than stopping at a race.
    for design, hazards in (("war-after-launch", HAZARDS), ("global-war", PRE_LAUNCH_HAZARDS)):
        for fixed in (True, False):
            # The median of three runs: a shared 2-core VM varies by +-20% from run to run.
            runs = []
            for _ in range(REPEATS):
                start = time.perf_counter()
                with progress(examples, f"{design} {'8' if fixed else '1-8'} iterations") as on_example:
                    result = search(
                        load_design(design),
                        sim,
                        examples=examples,
                        seed=0,
                        hazards=hazards,
                        fixed_iterations=fixed,
                        shrink=False,
                        on_example=on_example,
                    )
                runs.append(time.perf_counter() - start)
            seconds = statistics.median(runs)
            rows.append(
                {
                    "design": design,
                    "hazards": "all" if hazards == HAZARDS else "pre-launch",
                    "iterations": "8" if fixed else "1-8",
                    "examples": result.examples,
                    "seconds": round(seconds, 3),
                    "seconds_each_run": [round(r, 3) for r in runs],
                    "examples_per_s": round(result.examples / seconds, 1),
                    "found": result.found,
                    "meets_goal": result.examples / seconds >= GOAL_EXAMPLES_PER_S,
                }
            )
    control = search(load_design("none"), sim, examples=examples, seed=0, shrink=True)
    results["control"] = {
        "design": "none",
        "found": control.found,
        "examples_to_detect": control.first_detection_example,
        "seconds_to_detect": None
        if control.first_detection_seconds is None
        else round(control.first_detection_seconds, 4),
        "seconds_with_shrinking": round(control.seconds, 3),
    }
    return results


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def render(results: dict[str, object]) -> str:
    lines = [
        f"racefuzz scenario benchmark  {results['date']}  python {results['python']}  {results['machine']}  (one core)",
        f"{'design':18} {'hazards':>10} {'iters':>5} {'examples':>8} {'seconds':>8} {'ex/s':>8}  "
        f"goal {GOAL_EXAMPLES_PER_S}/s",
    ]
    for row in results["rows"]:  # type: ignore[union-attr]
        lines.append(
            f"{row['design']:18} {row['hazards']:>10} {row['iterations']:>5} {row['examples']:>8} "
            f"{row['seconds']:>8.2f} "
            f"{row['examples_per_s']:>8.1f}  {'meets' if row['meets_goal'] else 'MISSES'}"
            + ("  (stopped at a race)" if row["found"] else "")
        )
    c = results["control"]
    lines.append(
        f"negative control none: caught={c['found']} after {c['examples_to_detect']} examples, "  # type: ignore[index]
        f"{c['seconds_to_detect']} s; {c['seconds_with_shrinking']} s including shrinking"  # type: ignore[index]
    )
    return "\n".join(lines)
