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
    return figures


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
    return "\n".join(lines)
