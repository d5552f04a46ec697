"""Engine throughput: happens-before checker and simulator on a 10,000-op program, one core.

The program is random but shaped like an overlap loop: four streams, small rectangles of one table,
events recorded and waited on, `wait_stream` snapshots, and a host sync every ~100 ops (the `copy_done`
sync that bounds the in-flight window). Goals: the checker >= 500,000 ops/s (a traced program of 10^5
launches judged in well under a second), the simulator >= 100,000 ops/s (PyTorch's CSAN spends ~110 us
per op).
"""

from __future__ import annotations

import platform
import random
import statistics
import time
from datetime import datetime, timezone

from racefuzz.device import Device
from racefuzz.hb import find_races
from racefuzz.program import Program
from racefuzz.sim import simulate

GOAL_OPS_PER_S = {"checker": 500_000, "simulator": 100_000}


def overlap_shaped_program(n_ops: int = 10_000, seed: int = 0) -> Program:
    """A reproducible random program of exactly `n_ops` ops."""
    rng = random.Random(seed)
    device = Device()
    streams = [device.stream(name) for name in ("schedule_stream", "forward_stream", "plan_stream", "copy_stream")]
    events = [device.event(f"e{i}") for i in range(8)]
    table = device.buffer("req_to_token", 64, 512)
    while device.op_count < n_ops:
        stream = rng.choice(streams)
        roll = rng.random()
        row = rng.randrange(64)
        col = rng.randrange(0, 480)
        cells = table[row, col : col + rng.randint(1, 32)]
        if device.op_count % 100 == 99:
            streams[3].record_event("copy_done").synchronize() if rng.random() < 0.5 else device.synchronize()
        elif roll < 0.30:
            stream.launch("page_table_build", reads=[cells])
        elif roll < 0.55:
            stream.launch("prefill_write", writes=[(cells, rng.randrange(1 << 20))])
        elif roll < 0.70:
            rng.choice(events).record(stream)
        elif roll < 0.85:
            stream.wait_event(rng.choice(events))
        else:
            stream.wait_stream(rng.choice(streams))
    program = device.finish()
    return Program(program.streams, program.events, program.buffers, program.ops[:n_ops])


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
