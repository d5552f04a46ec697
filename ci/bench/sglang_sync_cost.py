"""The cost of sglang's two DFLASH sync designs, on sglang's own loop run plainly (no recorder).

0.5.14 fences DFLASH's shared `req_to_token` writes with a self-event: the worker records `verify_done`
after each forward (dflash_worker_v2.py:1279, :1305, :1679) and the next `prepare_for_decode` blocks the
host on it (`self.verify_done.synchronize()`, dflash_info_v2.py:143), the scheduler's global WAR barrier
being off for DFLASH (scheduler.py:1482-1484). 0.5.15 (#29556) drops `verify_done` and puts DFLASH under
the global barrier, `Scheduler._apply_war_barrier` (scheduler.py:1516): a device-side
`schedule_stream.wait_stream(forward_stream)` at the loop's top (:1530), no host block. This benchmark runs
both versions' loops on the same DFLASH workload (`racefuzz.engines.sglang.costs`, one process per
version, no recorder: the times are sglang's code and the fake model's) and gives, per loop iteration:

* the host time blocked in each stream/event sync call sglang makes, by its file:line (`verify_done`'s
  `synchronize`, the barrier's `wait_stream`, the result processing's `copy_done.synchronize`, ...);
* the GPU idle between consecutive forwards (timing events on the forward stream around each forward,
  `cuda` only) and the forward stream's busy share;
* iterations per second.

`--forward-us` makes the fake target forward compute for that long on the GPU (a spin): at 0 the loop is
host-bound (a host block costs little: the forward is done by then); with a forward longer than the host's
scheduling the self-event's host block shows as GPU idle. On the CPU (`--device cpu`) the streams are
virtual and do nothing: a "blocked" time there is the call's own Python, not a wait, and there is no GPU
idle; the CPU rows measure the loop's host cost and check the benchmark, they are not GPU times.

    python -m ci.bench sglang_sync_cost [--device cpu|cuda] [--version X ...] [--forward-us U ...]
        [--repeats N] [--plan-stream] [--json PATH]

Raw output: docs/results/sglang-sync-cost-cpu/ (and the H200's, when run there).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone
from typing import Any

DEFAULT_VERSIONS = ("0.5.14", "0.5.15")
FORWARD_US_CUDA = (0.0, 2000.0, 8000.0)
"""The fake forward's spin on a GPU: none (host-bound), 2 ms and 8 ms (longer than the host's iteration)."""
REPEATS_CUDA = 6
REPEATS_CPU = 6
TIMEOUT_S = 600.0
SELF_EVENT_SITE = "synchronize at sglang/srt/speculative/dflash_info_v2.py"
"""The prefix of 0.5.14's `verify_done.synchronize()` call sites (prepare_for_decode)."""
BARRIER_FUNCTION = "(_apply_war_barrier)"
"""The suffix of the global WAR barrier's call sites."""


def run_costs(
    python_dir: str, version: str, device: str, forward_us: tuple[float, ...], repeats: int, workload: dict[str, Any]
) -> dict[str, Any]:
    """One version's `racefuzz.engines.sglang.costs` subprocess -> its JSON (an `error` status if it
    printed none)."""
    command = [sys.executable, "-m", "racefuzz.engines.sglang.costs", "--python-dir", python_dir]
    command += ["--sglang-version", version, "--device", device, "--repeats", str(repeats)]
    command += ["--workload", json.dumps(workload)]
    for us in forward_us:
        command += ["--forward-us", str(us)]
    env = dict(os.environ, PYTHONWARNINGS="ignore", TRITON_INTERPRET="0")
    if device == "cpu":  # as the harness's CPU runs: sglang's is_cuda() False on a GPU host too
        env["CUDA_VISIBLE_DEVICES"] = ""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        return {"status": "error", "error": f"ran past {TIMEOUT_S:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"status": "error", "error": f"exited {done.returncode}: {tail}"}
    return json.loads(lines[-1])


def _site_sum(by_site: dict[str, float], match: Any) -> float:
    return round(sum(us for site, us in by_site.items() if match(site)), 1)


def run(
    versions: tuple[str, ...] = DEFAULT_VERSIONS,
    device: str = "cpu",
    forward_us: tuple[float, ...] | None = None,
    repeats: int | None = None,
    plan_stream: bool = False,
) -> dict[str, Any]:
    """The raw figures (JSON-able): per version and forward time, the summary of its measured runs, and
    each version's whole result (every run's figures)."""
    from racefuzz.engines.sglang import sources
    from racefuzz.engines.sglang.costs import COST_WORKLOAD
    from racefuzz.errors import InvalidArgument

    if forward_us is None:
        forward_us = FORWARD_US_CUDA if device == "cuda" else (0.0,)
    if device == "cpu" and any(forward_us):
        raise InvalidArgument("--forward-us is a GPU spin: on the CPU it must be 0")
    repeats = repeats or (REPEATS_CUDA if device == "cuda" else REPEATS_CPU)
    workload = dict(COST_WORKLOAD, plan_stream=plan_stream)
    figures: dict[str, Any] = {
        "benchmark": "sglang_sync_cost",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "device": device,
        "repeats": repeats,
        "workload": workload,
        "rows": [],
        "results": {},
    }
    for version in versions:
        path = str(sources.locate(version=version))
        began = time.perf_counter()
        result = run_costs(path, version, device, forward_us, repeats, workload)
        wall = round(time.perf_counter() - began, 3)
        result["wall_s"] = wall
        figures["results"][version] = result
        if result.get("status") != "ok":
            figures["rows"].append({"version": version, "status": result.get("status"), "error": result.get("error")})
            continue
        figures["workload_described"] = result.get("workload")
        for setting in result["settings"]:
            summary = setting["summary"]
            by_site = summary["blocked_us_per_iteration_by_site"]
            figures["rows"].append(
                {
                    "version": version,
                    "status": "ok",
                    "forward_us": setting["forward_us"],
                    **summary,
                    "self_event_us_per_iteration": _site_sum(by_site, lambda s: s.startswith(SELF_EVENT_SITE)),
                    "barrier_us_per_iteration": _site_sum(by_site, lambda s: s.endswith(BARRIER_FUNCTION)),
                    "import_s": result.get("import_seconds"),
                    "warmup_loop_s": setting["warmup"]["loop_s"],
                    "wall_s": wall,
                }
            )
    return figures


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def render(figures: dict[str, Any]) -> str:
    """The table of `run`'s figures, then each row's host blocking by call site."""
    gpu = figures["device"] == "cuda"
    lines = [
        f"# sglang's own loop, plain (no recorder): device {figures['device']}, DFLASH workload "
        f"{figures.get('workload_described', '?')}; medians of {figures['repeats'] - 1} measured runs after a "
        f"warm-up; {figures['date']}, python {figures['python']}",
    ]
    if not gpu:
        lines.append(
            "# CPU: virtual streams, no waits: a blocked time is the sync call's own Python, not a GPU time; "
            "no GPU idle"
        )
    lines += [
        "",
        "| version | forward us | iterations | forwards | iterations/s | us/iteration | host blocked us/iter | "
        "verify_done.synchronize us/iter | barrier us/iter | GPU idle us between forwards | GPU us/forward | "
        "forward stream busy |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in figures["rows"]:
        if row["status"] != "ok":
            lines.append(f"| {row['version']} | {row['status']}: {row.get('error')} |" + " |" * 10)
            continue
        lines.append(
            f"| {row['version']} | {row['forward_us']:g} | {row['iterations']} | {row['forwards']} | "
            f"{row['iterations_per_s']} | {row['iteration_us']} | {row['blocked_us_per_iteration']} | "
            f"{row['self_event_us_per_iteration']} | {row['barrier_us_per_iteration']} | "
            f"{_cell(row.get('gpu_idle_us_between_forwards'))} | {_cell(row.get('gpu_busy_us_per_forward'))} | "
            f"{_cell(row.get('forward_stream_busy_share'))} |"
        )
    lines += ["", "host blocked per iteration by sglang call site (us, median; calls per run):"]
    for row in figures["rows"]:
        if row["status"] != "ok":
            continue
        lines.append(f"  {row['version']}, forward {row['forward_us']:g} us:")
        for site, us in row["blocked_us_per_iteration_by_site"].items():
            lines.append(f"    {us:>9} us  x{row['calls_per_run_by_site'][site]:<4} {site}")
    same = {(row["forward_us"], row["iterations"], row["forwards"]) for row in figures["rows"] if row["status"] == "ok"}
    if len({key[0] for key in same}) != len(same):
        lines.append("note: the versions ran different iteration or forward counts on the same workload")
    return "\n".join(lines)
