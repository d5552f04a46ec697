"""sglang's own overlap loop under racefuzz (`racefuzz sglang`): examples per second, and time to a race.

An example here is what `racefuzz sglang --workload drawn` does per workload: sglang's real `Scheduler` is
built and its overlap loop runs the workload to the end under the recorder, once with the WAR barrier as
the version has it and once with it off (the negative control), each judged by happens-before. The
figures per version come from the harness's own clocks (its JSON): `import_s` (sglang's modules, once
per process), `runs_s` (the sum of the recorded runs), `examples_per_s` (workloads / `runs_s`, the control
runs included, since every verdict needs both), `iterations_per_s` (loop iterations of the barrier's runs
/ their seconds) and `wall_s` (the whole subprocess, from the parent).

`time_to_race_s` is the wall time of one harness process on the fixed workload of a version that races
(0.5.15, #31687's race), control off: start-up, imports, one recorded run, the verdict; no shrinking (the
fixed workload is already small; `racefuzz sglang --workload search` shrinks, on the CPU only). Its parts,
from the harness's clocks: `process_s` (the harness's `main`), `sglang_import_s`, `run_s` (the recorded run,
sglang's `Scheduler.__init__` included) and `startup_s` (wall - process: the interpreter and the imports
before `main`); `other_s` is the rest of `main` (the stubs, which import torch, torch._dynamo and
torch._inductor first; the verdict). On the H200 most of it was Python compiling sources to bytecode, the
host writing none: docs/results/sglang-sync-cost-h200/time-to-race.txt (and `racefuzz.engines.sglang.bytecode`).

    python -m ci.bench sglang_loop [--device cpu|cuda] [--examples N] [--version X ...] [--json PATH]

Raw output: docs/results/sglang-loop-speed-cpu/ and docs/results/sglang-loop-speed-h200/.
"""

from __future__ import annotations

import platform
import time
from datetime import datetime, timezone
from typing import Any

DEFAULT_VERSIONS = ("0.5.15", "0.5.16", "0.5.23")
RACY_VERSION = "0.5.15"
EXAMPLES = 50
SEED = 0


def run(versions: tuple[str, ...] = DEFAULT_VERSIONS, examples: int = EXAMPLES, device: str = "cpu") -> dict[str, Any]:
    """The raw figures (JSON-able): one row per version, and the time to the racy version's race."""
    from racefuzz.commands.sglang import run_harness, version_verdict, workloads_for
    from racefuzz.engines.sglang import sources
    from racefuzz.exitcodes import ExitCode

    figures: dict[str, Any] = {
        "benchmark": "sglang_loop",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "device": device,
        "examples": examples,
        "seed": SEED,
        "rows": [],
    }
    drawn = workloads_for("drawn", examples, SEED)
    for version in versions:
        path = sources.locate(version=version)
        began = time.perf_counter()
        result = run_harness(path, drawn, True, version, 3600.0, device=device)
        wall = time.perf_counter() - began
        row: dict[str, Any] = {"version": version, "status": result.get("status"), "wall_s": round(wall, 3)}
        if result.get("status") == "ok":
            runs = result["runs"]
            barrier = [r for r in runs if r["barrier"]]
            runs_s = sum(r["seconds"] for r in runs)
            barrier_s = sum(r["seconds"] for r in barrier)
            iterations = sum(r["iterations"] for r in barrier)
            row.update(
                verdict=ExitCode(version_verdict(result, control=True)).name,
                workloads=len(barrier),
                runs=len(runs),
                iterations=iterations,
                launches=sum(r["launches"] for r in barrier),
                import_s=result.get("import_seconds"),
                runs_s=round(runs_s, 3),
                examples_per_s=round(len(barrier) / runs_s, 3) if runs_s else None,
                iterations_per_s=round(iterations / barrier_s, 2) if barrier_s else None,
                races_with_barrier=sum(len(r["races"]) for r in barrier),
                controls_caught=sum(1 for r in runs if not r["barrier"] and r["races"]),
            )
        else:
            row["error"] = result.get("error")
        figures["rows"].append(row)
    path = sources.locate(version=RACY_VERSION)
    began = time.perf_counter()
    result = run_harness(path, workloads_for("fixed"), False, RACY_VERSION, 3600.0, device=device)
    wall = time.perf_counter() - began
    raced = result.get("status") == "ok" and any(r["races"] for r in result["runs"])
    figures["time_to_race"] = {
        "version": RACY_VERSION,
        "workload": "fixed",
        "raced": raced,
        "races": sum(len(r["races"]) for r in result.get("runs", [])),
        "time_to_race_s": round(wall, 3),
        **_time_parts(result, wall),
        "error": None if result.get("status") == "ok" else result.get("error"),
    }
    figures["recording_cost"] = [recording_cost(version, device) for version in versions]
    return figures


COST_REPEATS = 4
"""Runs of the cost workload per version and mode in one process: a warm-up, then three measured."""


def recording_cost(version: str, device: str) -> dict[str, Any]:
    """The recorder's cost per loop iteration against the iteration's own time, on one version: the cost
    workload (`racefuzz.engines.sglang.costs.COST_WORKLOAD`, speculative decoding off) run by sglang's loop
    plainly (`racefuzz.engines.sglang.costs`: no recorder) and under `racefuzz sglang`'s recorder (the
    harness: dispatch mode, patched streams, the profiler that names sglang's functions; and once more without
    that profiler, `--no-profile`, to say its share), each `COST_REPEATS` times in one process, the first a
    warm-up. Both clocks time the loop alone (from `run_event_loop`'s start
    to its end: not the `Scheduler`'s construction, not the verdict); medians of the measured runs."""
    import statistics

    from ci.bench.sglang_sync_cost import run_costs
    from racefuzz.commands.sglang import run_harness
    from racefuzz.engines.sglang import sources
    from racefuzz.engines.sglang.costs import COST_WORKLOAD

    workload = dict(COST_WORKLOAD, spec="none", plan_stream=False)
    path = sources.locate(version=version)
    row: dict[str, Any] = {"version": version}
    plain = run_costs(str(path), version, device, (0.0,), COST_REPEATS, workload)
    recorded = run_harness(path, [workload] * COST_REPEATS, False, version, 3600.0, device=device)
    unprofiled = run_harness(path, [workload] * COST_REPEATS, False, version, 3600.0, device=device, profile=False)
    failed = [r for r in (plain, recorded, unprofiled) if r.get("status") != "ok"]
    if failed:
        row["error"] = failed[0].get("error")
        return row
    summary = plain["settings"][0]["summary"]
    measured = recorded["runs"][1:]
    iterations = measured[0]["iterations"]
    recorded_us = statistics.median(r["loop_seconds"] * 1e6 / r["iterations"] for r in measured)
    unprofiled_us = statistics.median(r["loop_seconds"] * 1e6 / r["iterations"] for r in unprofiled["runs"][1:])
    launches = statistics.median(r["launches"] / r["iterations"] for r in measured)
    cost = recorded_us - summary["iteration_us"]
    row.update(
        iterations=iterations,
        same_iterations=summary["same_iterations"]
        and summary["iterations"] == iterations
        and all(r["iterations"] == iterations for r in measured),
        plain_us_per_iteration=summary["iteration_us"],
        recorded_us_per_iteration=round(recorded_us, 1),
        recording_us_per_iteration=round(cost, 1),
        recorded_over_plain=round(recorded_us / summary["iteration_us"], 2),
        unprofiled_us_per_iteration=round(unprofiled_us, 1),
        profiler_us_per_iteration=round(recorded_us - unprofiled_us, 1),
        launches_per_iteration=round(launches, 1),
        recording_us_per_launch=round(cost / launches, 1) if launches else None,
    )
    return row


def _time_parts(result: dict[str, Any], wall: float) -> dict[str, float | None]:
    """`time_to_race_s` split by the harness's clocks (the module doc); None where it reported none."""
    process = result.get("seconds")
    runs = result.get("runs") or []
    run = sum(r["seconds"] for r in runs) if runs else None
    imports = result.get("import_seconds")
    parts: dict[str, float | None] = {"process_s": process, "sglang_import_s": imports, "run_s": run}
    parts["startup_s"] = round(wall - process, 3) if process is not None else None
    known = [x for x in (imports, run) if x is not None]
    parts["other_s"] = round(process - sum(known), 3) if process is not None else None
    return parts


def render(figures: dict[str, Any]) -> str:
    """The table of `run`'s figures."""
    lines = [
        f"# sglang's own loop under racefuzz: device {figures['device']}, {figures['examples']} drawn workloads "
        f"(seed {figures['seed']}) per version, each run with the barrier and without (control); "
        f"{figures['date']}, python {figures['python']}",
        "",
        "| version | verdict | workloads | iterations | launches | imports s | runs s | examples/s | "
        "iterations/s | controls caught | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in figures["rows"]:
        if row["status"] != "ok":
            lines.append(
                f"| {row['version']} | {row['status']}: {row.get('error')} | | | | | | | | | {row['wall_s']} |"
            )
            continue
        lines.append(
            f"| {row['version']} | {row['verdict']} | {row['workloads']} | {row['iterations']} | {row['launches']} | "
            f"{row['import_s']} | {row['runs_s']} | {row['examples_per_s']} | {row['iterations_per_s']} | "
            f"{row['controls_caught']}/{row['workloads']} | {row['wall_s']} |"
        )
    race = figures["time_to_race"]
    found = f"{race['races']} race(s)" if race["raced"] else f"NO race ({race['error']})"
    lines += [
        "",
        f"time to the race on {race['version']} (fixed workload, one process, control off, no shrinking): "
        f"{race['time_to_race_s']} s, {found}",
        f"  of which: start-up {race.get('startup_s')} s, sglang imports {race.get('sglang_import_s')} s, the recorded "
        f"run {race.get('run_s')} s, the rest (stubs with torch's imports, verdict) {race.get('other_s')} s",
    ]
    lines += [
        "",
        "recording cost per loop iteration (the cost workload, speculative decoding off; loop time only, medians of "
        f"{COST_REPEATS - 1} runs after a warm-up; plain = sglang's loop with no recorder):",
        "",
        "| version | iterations | plain us/iteration | recorded us/iteration | recording us/iteration | recorded/plain "
        "| of which the function profiler us/iteration | launches/iteration | recording us/launch |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in figures.get("recording_cost", []):
        if "error" in row:
            lines.append(f"| {row['version']} | error: {row['error']} | | | | | | | |")
            continue
        same = "" if row["same_iterations"] else " (iterations differ between runs)"
        lines.append(
            f"| {row['version']} | {row['iterations']}{same} | {row['plain_us_per_iteration']} | "
            f"{row['recorded_us_per_iteration']} | {row['recording_us_per_iteration']} | {row['recorded_over_plain']} "
            f"| {row['profiler_us_per_iteration']} | {row['launches_per_iteration']} | "
            f"{row['recording_us_per_launch']} |"
        )
    return "\n".join(lines)
