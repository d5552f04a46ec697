"""Engine throughput: happens-before checker and simulator on a 10,000-op program, one core
(`python -m ci.bench engine`, raw output in docs/results/engine/).

The program is random but shaped like an overlap loop: four streams, small rectangles of one table,
events recorded and waited on, `wait_stream` snapshots, and a host sync every ~100 ops (the `copy_done`
sync that bounds the in-flight window). Goals: the checker >= 500,000 ops/s (a traced program of 10^5
launches judged in well under a second), the simulator >= 100,000 ops/s (PyTorch's CSAN spends ~110 us
per op).
"""

from __future__ import annotations

import platform
import statistics
import time
from datetime import datetime, timezone

from racefuzz.hb import find_races
from racefuzz.sim import simulate
from racefuzz.testing_programs import overlap_shaped_program

GOAL_OPS_PER_S = {"checker": 500_000, "simulator": 100_000}


def _best_of(fn, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def run(n_ops: int = 10_000, repeats: int = 7) -> dict[str, object]:
    """Time both engines; returns the raw figures (seconds per run, ops/s of the median run)."""
    program = overlap_shaped_program(n_ops)
    races = len(find_races(program))
    results: dict[str, object] = {
        "benchmark": "engine",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "ops": len(program.ops),
        "launches": len(program.launches),
        "races_in_program": races,
        "goal_ops_per_s": GOAL_OPS_PER_S,
    }
    for name, fn in (("checker", lambda: find_races(program)), ("simulator", lambda: simulate(program))):
        seconds = _best_of(fn, repeats)
        median = statistics.median(seconds)
        results[name] = {
            "seconds": [round(s, 5) for s in seconds],
            "median_s": round(median, 5),
            "ops_per_s": round(len(program.ops) / median),
            "meets_goal": len(program.ops) / median >= GOAL_OPS_PER_S[name],
        }
    return results


def render(results: dict[str, object]) -> str:
    lines = [
        f"racefuzz engine benchmark  {results['date']}  python {results['python']}  {results['machine']}",
        f"program: {results['ops']} ops, {results['launches']} launches, {results['races_in_program']} racing pairs",
    ]
    for name in ("checker", "simulator"):
        r = results[name]
        assert isinstance(r, dict)
        verdict = "meets" if r["meets_goal"] else "MISSES"
        lines.append(
            f"{name:10s} median {r['median_s'] * 1e3:8.2f} ms  {r['ops_per_s']:>9,} ops/s  ({verdict} the goal of "
            f"{GOAL_OPS_PER_S[name]:,} ops/s)"
        )
    return "\n".join(lines)
