"""GPU examples per second on the overlap scenario, and racefuzz's overhead over a plain replay.

`racefuzz bench gpu` (needs a CUDA GPU; `BackendUnavailable`, exit 2, without one).

Examples per second: `search` on the CUDA backend, as `racefuzz run --backend cuda` runs an example:
Hypothesis draws a workload and a schedule from the default distributions (up to 8 requests, up to 4
delays of 0 to 5.1 ms), the scenario builds the program, the backend stages, uploads, issues and reads
back, and both oracles judge. Design `war-after-launch` under all hazards: race-free, so every example
runs to the end instead of stopping at a race (k=5 as on the CLI; nothing re-runs since nothing
corrupts), no shrinking. Rows for 1-8 iterations (`racefuzz run`'s default) and exactly 8 (the
scenario benchmark's "default workload"), each the median of REPEATS runs of EXAMPLES examples.

Overhead: every (program, schedule) that `execute` ran during a timed search is recorded and then, in
the same process, replayed without racefuzz: a hand-written loop of pre-bound calls
(`functools.partial`s of the same CuPy kernels, `rf_spin` delays and launch costs, torch records, waits
and syncs, `busy_wait_us` host delays) on tables, descriptors and values pre-allocated on the device
before the clock starts, fresh never-recorded events per example, one fixed set of streams, and a device
synchronize after each example. The replay does no staging, no upload, no readback and no judging: it is
the floor any harness running these kernel sequences with these delays must pay. After the timed replay,
every replayed example's loads are read back and checked against the sequential reference (untimed), so
the replay demonstrably ran the same kernels to completion.

Two ratios, both over that replay's wall time:
* end-to-end: the search's wall time (Hypothesis, program build, the backend, both oracles);
* backend: the time spent inside `racefuzz.backends.cuda.execute` (stage, upload, issue, sync, readback).
A per-example breakdown of the median run is re-measured afterwards on its recorded programs: staging,
the sequential-reference oracle and the happens-before oracle (every example of a race-free design runs
both), and what remains (Hypothesis's draw and decode, the program build). Goals: >= 100 examples/s and
end-to-end overhead <= 1.5x.
"""

from __future__ import annotations

import functools
import platform
import statistics
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from racefuzz.designs import load_design
from racefuzz.errors import BackendUnavailable
from racefuzz.hb import find_races
from racefuzz.oracle import find_corruptions, sequential_replay
from racefuzz.program import (
    DeviceSync,
    EventSync,
    HostDelay,
    Launch,
    Program,
    Record,
    StreamSync,
    WaitEvent,
    WaitStream,
)
from racefuzz.schedule import Schedule
from racefuzz.search import search
from racefuzz.sim import Execution
from racefuzz.strategies import HAZARDS

GOAL_EXAMPLES_PER_S = 100
GOAL_OVERHEAD = 1.5
EXAMPLES = 1000
REPEATS = 3
DESIGN = "war-after-launch"
K = 5

Recorded = list[tuple[Program, Schedule]]


def _versions() -> dict[str, str]:
    import cupy
    import numpy
    import torch

    return {
        "python": platform.python_version(),
        "torch": f"{torch.__version__} (CUDA {torch.version.cuda})",
        "cupy": cupy.__version__,
        "numpy": numpy.__version__,
        "device": torch.cuda.get_device_name(0),
    }


class PlainReplay:
    """The recorded kernel sequences, bound ahead of time, replayed by a hand-written loop (see module doc)."""

    def __init__(self, recorded: Recorded) -> None:
        import cupy
        import torch

        from racefuzz.backends import cuda

        self.torch = torch
        self.recorded = recorded
        runtime = cuda._runtime(torch, cupy, 0)
        spin = runtime.kernels[runtime.catalog.spin]
        streams_needed = max((len(p.streams) for p, _ in recorded), default=0)
        taken = {torch.cuda.current_stream().cuda_stream}
        streams = cuda.draw_distinct_streams(streams_needed, torch.cuda.Stream, lambda s: s.cuda_stream, taken)
        ext = [cuda._external_stream(cupy, s.cuda_stream, 0) for s in streams]
        block, one = (cuda.THREADS_PER_BLOCK,), (1,)
        self.scripts: list[list[Callable[[], object]]] = []
        self.memory: list[tuple[Any, Any]] = []  # (staging, device array) per example, for the check
        for program, schedule in recorded:
            staging = cuda.stage(program, schedule, runtime.catalog)
            staged, _, launch_calls, spins, costs = cuda._bind_memory(torch, runtime, program, schedule, staging, 0)
            events = [torch.cuda.Event() for _ in program.events]
            steps: list[Callable[[], object]] = []
            for op in program.ops:
                i = op.index
                if i in schedule.host_delays:
                    steps.append(functools.partial(cuda.busy_wait_us, schedule.host_delays[i]))
                if isinstance(op, (Launch, Record, WaitEvent, WaitStream)):
                    s = op.stream.id
                    if i in spins:
                        steps.append(functools.partial(spin, one, one, spins[i], stream=ext[s]))
                    if isinstance(op, Launch):
                        if i in costs:
                            steps.append(functools.partial(spin, one, one, costs[i], stream=ext[s]))
                        for kernel, grid, args in launch_calls[i]:
                            steps.append(functools.partial(kernel, grid, block, args, stream=ext[s]))
                    elif isinstance(op, Record):
                        steps.append(functools.partial(events[op.event.id].record, streams[s]))
                    elif isinstance(op, WaitEvent):
                        steps.append(functools.partial(streams[s].wait_event, events[op.event.id]))
                    else:
                        steps.append(functools.partial(streams[s].wait_stream, streams[op.other.id]))
                elif isinstance(op, HostDelay):
                    steps.append(functools.partial(cuda.busy_wait_us, op.us))
                elif isinstance(op, EventSync):
                    steps.append(events[op.event.id].synchronize)
                elif isinstance(op, StreamSync):
                    steps.append(streams[op.stream.id].synchronize)
                else:
                    assert isinstance(op, DeviceSync)
                    steps.append(torch.cuda.synchronize)
            self.scripts.append(steps)
            self.memory.append((staging, staged))
        torch.cuda.synchronize()

    def run(self) -> float:
        """Replay every example once, a device synchronize after each; wall seconds."""
        synchronize = self.torch.cuda.synchronize
        start = time.perf_counter()
        for steps in self.scripts:
            for step in steps:
                step()
            synchronize()
        return time.perf_counter() - start

    def corrupted_examples(self) -> int:
        """How many replayed examples loaded anything but the sequential reference (0 for a race-free design)."""
        from racefuzz.backends import cuda

        bad = 0
        for (program, _), (staging, staged) in zip(self.recorded, self.memory, strict=True):
            base = staging.observed_base
            observed = staged[base : base + staging.observed_size].cpu().numpy()
            bad += bool(find_corruptions(program, cuda.collect_observations(program, staging, observed)))
        return bad


def _per_example_us(fn: Callable[[Program, Schedule], object], recorded: Recorded) -> float:
    start = time.perf_counter()
    for program, schedule in recorded:
        fn(program, schedule)
    return (time.perf_counter() - start) / max(1, len(recorded)) * 1e6


def _one_run(examples: int, seed: int, fixed: bool) -> tuple[dict[str, Any], Recorded]:
    """One timed search, then the plain replay of what it ran; (figures, recorded programs)."""
    from racefuzz.backends import cuda

    recorded: Recorded = []
    in_execute = [0.0]

    def run_recorded(program: Program, schedule: Schedule) -> Execution:
        start = time.perf_counter()
        execution = cuda.execute(program, schedule)
        in_execute[0] += time.perf_counter() - start
        recorded.append((program, schedule))
        return execution

    cuda.forget_cached_run()
    start = time.perf_counter()
    result = search(
        load_design(DESIGN),
        run_recorded,
        backend="cuda",
        examples=examples,
        seed=seed,
        hazards=HAZARDS,
        fixed_iterations=fixed,
        repeat=K,
        shrink=False,
    )
    search_s = time.perf_counter() - start
    replay = PlainReplay(recorded)
    replay_s = replay.run()
    delays_us = [
        sum(s.host_delays.values()) + sum(s.device_delays.values()) + sum(s.read_spins.values()) for _, s in recorded
    ]
    figures = {
        "seed": seed,
        "examples": result.examples,
        "executes": len(recorded),
        "found": result.found,
        "flaky": len(result.flaky),
        "search_s": round(search_s, 4),
        "examples_per_s": round(result.examples / search_s, 1),
        "execute_s": round(in_execute[0], 4),
        "replay_s": round(replay_s, 4),
        "overhead_end_to_end": round(search_s / replay_s, 3),
        "overhead_backend": round(in_execute[0] / replay_s, 3),
        "replay_corrupted_examples": replay.corrupted_examples(),
        "mean_ops": round(statistics.mean(len(p.ops) for p, _ in recorded), 1),
        "mean_scheduled_delay_us": round(statistics.mean(delays_us), 1),
    }
    return figures, recorded


def _breakdown(recorded: Recorded, figures: dict[str, Any]) -> dict[str, float]:
    """Per-example µs of the search's parts, re-measured on the recorded programs (see the module doc)."""
    import cupy
    import torch

    from racefuzz.backends import cuda

    catalog = cuda._runtime(torch, cupy, 0).catalog
    stage_us = _per_example_us(lambda p, s: cuda.stage(p, s, catalog), recorded)
    reference_us = _per_example_us(lambda p, s: sequential_replay(p), recorded)
    hb_us = _per_example_us(lambda p, s: find_races(p), recorded)
    search_us = figures["search_s"] / figures["examples"] * 1e6
    execute_us = figures["execute_s"] / figures["examples"] * 1e6
    replay_us = figures["replay_s"] / figures["examples"] * 1e6
    return {
        "search_us": round(search_us, 1),
        "execute_us": round(execute_us, 1),
        "of_which_stage_us": round(stage_us, 1),
        "sequential_reference_oracle_us": round(reference_us, 1),
        "happens_before_oracle_us": round(hb_us, 1),
        "rest_hypothesis_decode_build_us": round(search_us - execute_us - reference_us - hb_us, 1),
        "plain_replay_us": round(replay_us, 1),
    }


def run(examples: int = EXAMPLES, repeats: int = REPEATS) -> dict[str, Any]:
    """Measure (see the module docstring); a JSON-able dict. `BackendUnavailable` without a usable GPU."""
    from racefuzz.backends import cuda

    reason = cuda.cuda_unavailable_reason()
    if reason is not None:
        raise BackendUnavailable(f"racefuzz bench gpu needs a CUDA GPU: {reason}")
    setup_start = time.perf_counter()
    # Warm-up, untimed: Hypothesis's first draws, the kernels' first launches, torch's stream pool.
    search(load_design(DESIGN), cuda.execute, backend="cuda", examples=50, seed=99, repeat=K, shrink=False)
    results: dict[str, Any] = {
        "benchmark": "gpu",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **_versions(),
        "machine": platform.machine(),
        "spin_clock": "%globaltimer (ns)",
        "design": DESIGN,
        "hazards": "all",
        "repeat_k": K,
        "examples_per_run": examples,
        "goal_examples_per_s": GOAL_EXAMPLES_PER_S,
        "goal_overhead": GOAL_OVERHEAD,
        "setup_s": round(time.perf_counter() - setup_start, 3),
        "rows": [],
    }
    for fixed in (False, True):
        measured = []
        for seed in range(repeats):
            measured.append(_one_run(examples, seed, fixed))
            # Progress on stderr, so that a run cut short still leaves its figures in the log.
            print(f"iterations {'8' if fixed else '1-8'}: {measured[-1][0]}", file=sys.stderr, flush=True)
        runs = [figures for figures, _ in measured]
        by_ratio = sorted(measured, key=lambda m: m[0]["overhead_end_to_end"])
        median_figures, median_recorded = by_ratio[len(by_ratio) // 2]
        results["rows"].append(
            {
                "iterations": "8" if fixed else "1-8",
                "examples_per_s": statistics.median(r["examples_per_s"] for r in runs),
                "overhead_end_to_end": statistics.median(r["overhead_end_to_end"] for r in runs),
                "overhead_backend": statistics.median(r["overhead_backend"] for r in runs),
                "breakdown_of_median_run": {
                    "seed": median_figures["seed"],
                    **_breakdown(median_recorded, median_figures),
                },
                "runs": runs,
            }
        )
    return results


def render(results: dict[str, Any]) -> str:
    """The figures as a text table, with the goals' verdicts and the per-example breakdown."""
    lines = [
        f"racefuzz GPU benchmark  {results['date']}  {results['device']}  torch {results['torch']}  "
        f"cupy {results['cupy']}  python {results['python']}",
        f"design {results['design']}, hazards {results['hazards']}, k={results['repeat_k']}, "
        f"spins on {results.get('spin_clock', 'clock64')}; goals >= {GOAL_EXAMPLES_PER_S} examples/s, "
        f"end-to-end overhead <= {GOAL_OVERHEAD}x a plain replay of the same kernel sequences",
        f"{'iters':>5} {'seed':>4} {'examples':>8} {'search s':>9} {'ex/s':>7} {'execute s':>9} {'replay s':>9} "
        f"{'e2e x':>6} {'backend x':>9} {'delay us':>9} {'ops':>5} replay-check",
    ]
    for row in results["rows"]:
        for r in row["runs"]:
            lines.append(
                f"{row['iterations']:>5} {r['seed']:>4} {r['examples']:>8} {r['search_s']:>9.3f} "
                f"{r['examples_per_s']:>7.1f} {r['execute_s']:>9.3f} {r['replay_s']:>9.3f} "
                f"{r['overhead_end_to_end']:>6.2f} {r['overhead_backend']:>9.2f} {r['mean_scheduled_delay_us']:>9.1f} "
                f"{r['mean_ops']:>5.1f} {'ok' if r['replay_corrupted_examples'] == 0 else 'CORRUPTED'}"
                + ("  (stopped at a race)" if r["found"] else "")
            )
    lines.append("median per row:")
    for row in results["rows"]:
        eps, e2e = row["examples_per_s"], row["overhead_end_to_end"]
        lines.append(
            f"  iterations {row['iterations']:>3}: {eps:7.1f} examples/s "
            f"({'meets' if eps >= GOAL_EXAMPLES_PER_S else 'MISSES'} {GOAL_EXAMPLES_PER_S}/s); "
            f"end-to-end overhead x{e2e:.2f} ({'meets' if e2e <= GOAL_OVERHEAD else 'MISSES'} x{GOAL_OVERHEAD}); "
            f"backend overhead x{row['overhead_backend']:.2f}"
        )
        b = row["breakdown_of_median_run"]
        lines.append(
            f"    per example (seed {b['seed']}): search {b['search_us']:.0f} us = execute {b['execute_us']:.0f} us "
            f"(staging alone {b['of_which_stage_us']:.0f}) + sequential-reference oracle "
            f"{b['sequential_reference_oracle_us']:.0f} + happens-before oracle {b['happens_before_oracle_us']:.0f} "
            f"+ rest (Hypothesis draw and decode, program build) {b['rest_hypothesis_decode_build_us']:.0f}; "
            f"plain replay {b['plain_replay_us']:.0f} us"
        )
    return "\n".join(lines)
