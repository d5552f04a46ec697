"""Simulator examples per second on the overlap scenario, one core, and time to catch the control.

An example is everything `racefuzz run` does per example: Hypothesis draws a workload and a schedule,
the scenario builds the program under the design, the simulator runs it, and both oracles check it.
The default workload distribution is up to 8 requests; figures are given for exactly 8 iterations (the
issue's "default workload") and for 1 to 8 iterations (what `racefuzz run` draws), each the median of
three runs of 3000 examples. Goal: >= 1,000 examples/s on the default workload (8 iterations). Run it
pinned to one core: `taskset -c 0 python -m ci.bench scenario` (raw output in docs/results/scenario-sim/).

`host_cost()` (`python -m ci.bench scenario --host-cost`) measures the other half of a GPU search:
the host time per example spent *outside* the backend (Hypothesis' draw, decoding the workload, building
the program, the sequential reference, the happens-before verdict, the schedule's decode, the search's
bookkeeping and the comparison of the loads with the reference). It runs `search` with the settings
`python -m ci.bench gpu` uses (a batch of DEFAULT_GPU_BATCH, k = DEFAULT_GPU_REPEAT, 300 us minimum delay)
against `NullExecutor`, a `PreparingExecutor` that runs nothing and returns the reference loads as fresh
arrays, as the CUDA backend returns what it read back; the seconds spent inside it are subtracted. The
figure is the process's CPU time (on a shared VM another process's load stretches wall time, not that);
examples/s is wall time, and includes the null executor.
"""

from __future__ import annotations

import platform
import statistics
import time
import weakref
from datetime import datetime, timezone
from typing import Any

import numpy as np

from racefuzz.backends import Execution, executor
from racefuzz.designs import load_design
from racefuzz.memory import Observations, in_order_loads
from racefuzz.program import Program
from racefuzz.progress import progress
from racefuzz.scenarios.sglang import HAZARDS, PRE_LAUNCH_HAZARDS
from racefuzz.schedule import Schedule
from racefuzz.search import DEFAULT_GPU_BATCH, DEFAULT_GPU_REPEAT, GPU_MIN_DELAY_US, search

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


# -- the host cost outside the backend -------------------------------------------------------------------

HOST_COST_EXAMPLES = 1000
HOST_COST_ROWS = (
    # (label, strategy, exactly 8 iterations): the gpu benchmark's rows
    ("8 gates", "interleave", True),
    ("1-8 gates", "interleave", False),
    ("8", "random", True),
    ("1-8", "random", False),
)


class NullExecutor:
    """A `PreparingExecutor` that runs nothing: every run "loads" the sequential reference, copied into one
    fresh array cut into per-range views (the shape the CUDA backend's readback has), so that the search
    compares them as it compares a GPU run's. `seconds`: the host time spent in it."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.runs = 0
        self._layouts: dict[int, tuple[weakref.ref[Program], list[tuple[int, list[tuple[int, int]]]], np.ndarray]] = {}

    def loads(self, program: Program) -> Observations:
        start = time.process_time()
        known = self._layouts.get(id(program))
        if known is None or known[0]() is not program:
            reference = in_order_loads(program)
            layout = [(index, [a.shape for a in arrays]) for index, arrays in reference.items()]
            arrays = [a for loaded in reference.values() for a in loaded]
            flat = np.concatenate(arrays, axis=None) if arrays else np.zeros(0, np.int32)
            known = self._layouts[id(program)] = (weakref.ref(program), layout, flat)
        _, layout, flat = known
        copied = flat.copy()
        observations: Observations = {}
        at = 0
        for index, shapes in layout:
            views = []
            for rows, cols in shapes:
                views.append(copied[at : at + rows * cols].reshape(rows, cols))
                at += rows * cols
            observations[index] = tuple(views)
        self.runs += 1
        self.seconds += time.process_time() - start
        return observations

    def __call__(self, program: Program, schedule: Schedule) -> Execution:
        return Execution(self.loads(program), [], 0.0)

    def prepare(self, program: Program, schedule: Schedule) -> _NullRun:
        return _NullRun(self, program)


class _NullRun:
    def __init__(self, owner: NullExecutor, program: Program) -> None:
        self.owner, self.program = owner, program

    def start(self) -> _NullRun:
        return self

    def done(self) -> bool:
        return True

    def finish(self) -> Execution:
        return Execution(self.owner.loads(self.program), [], 0.0)


def _host_cost_run(examples: int, seed: int, strategy: str, fixed: bool) -> dict[str, Any]:
    null = NullExecutor()
    start, cpu_start = time.perf_counter(), time.process_time()
    result = search(
        load_design("war-after-launch"),
        null,
        backend="sim",
        strategy=strategy,
        examples=examples,
        seed=seed,
        hazards=HAZARDS,
        fixed_iterations=fixed,
        repeat=DEFAULT_GPU_REPEAT,
        shrink=False,
        batch=DEFAULT_GPU_BATCH,
        min_delay_us=GPU_MIN_DELAY_US,
    )
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    if result.found or result.examples != examples:
        raise AssertionError(f"host cost: expected {examples} clean examples, got {result}")
    return {
        "seed": seed,
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "outside_us": (cpu_seconds - null.seconds) / examples * 1e6,
        "null_executor_us": null.seconds / examples * 1e6,
        "examples_per_s": examples / seconds,
    }


def host_cost(examples: int = HOST_COST_EXAMPLES, seeds: tuple[int, ...] = (0, 1, 2)) -> dict[str, object]:
    """Per-example host µs outside the backend, per row of the gpu benchmark (see the module doc)."""
    _host_cost_run(50, 99, "interleave", True)  # warm-up: imports, Hypothesis' first draws
    rows = []
    for label, strategy, fixed in HOST_COST_ROWS:
        runs = [_host_cost_run(examples, seed, strategy, fixed) for seed in seeds]
        median = sorted(runs, key=lambda run: run["outside_us"])[len(runs) // 2]
        rows.append(
            {
                "row": label,
                "strategy": strategy,
                "iterations": "8" if fixed else "1-8",
                "outside_us": round(median["outside_us"], 1),
                "outside_us_each_seed": [round(run["outside_us"], 1) for run in runs],
                "null_executor_us": round(median["null_executor_us"], 1),
                "examples_per_s": round(median["examples_per_s"], 1),
            }
        )
    return {
        "benchmark": "scenario host cost",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "examples": examples,
        "seeds": list(seeds),
        "rows": rows,
    }


def render_host_cost(results: dict[str, object]) -> str:
    lines = [
        f"racefuzz host cost outside the backend  {results['date']}  python {results['python']}  "
        f"{results['machine']}  ({results['examples']} examples, seeds {results['seeds']}, median)",
        f"{'row':10} {'strategy':>10} {'iters':>5} {'outside us/ex':>13} {'null exec us':>12} {'ex/s':>7}  each seed",
    ]
    for row in results["rows"]:  # type: ignore[union-attr]
        lines.append(
            f"{row['row']:10} {row['strategy']:>10} {row['iterations']:>5} {row['outside_us']:>13.1f} "
            f"{row['null_executor_us']:>12.1f} {row['examples_per_s']:>7.1f}  {row['outside_us_each_seed']}"
        )
    return "\n".join(lines)
