"""GPU examples per second on the overlap scenario, and racefuzz's overhead over a plain replay.

`racefuzz bench gpu` (needs a CUDA GPU; `BackendUnavailable`, exit 2, without one).

Examples per second: `search` on the CUDA backend, as `racefuzz run --backend cuda` runs an example:
Hypothesis draws workloads and schedules from the default distributions (up to 8 requests, up to 4
delays of 0.3 to 5.4 ms), DEFAULT_GPU_BATCH examples per Hypothesis example (`search`'s `batch`), the
scenario builds each program, the backend stages, uploads, issues and reads back, and both oracles judge;
example i+1 is drawn, built, judged ahead and prepared while the GPU runs example i. Design
`war-after-launch` under all hazards: race-free, so every example runs to the end instead of stopping at
a race (k=5 as on the CLI; nothing re-runs since nothing corrupts), no shrinking. Rows for 1-8
iterations (`racefuzz run`'s default) and exactly 8 (the scenario benchmark's "default workload"), each
the median of REPEATS runs of EXAMPLES examples, and an ablation row: 1-8 iterations with one example per
Hypothesis example and no overlap (`batch=1` and a plain executor), which is how searches ran before.

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
* backend: the host time spent inside the CUDA backend (`prepare`: stage and upload; `start`: issue, with
  the program's own host delays and syncs; `done`: the non-blocking polls of a running run; `finish`: wait
  for the GPU and read back; `execute` for k/k re-runs).
The per-example breakdown of the median run: the backend's parts, of which the wait in `finish` (the GPU
still running after the last issue: the time the overlap can use), and the host work outside the
backend (Hypothesis's draw, decode, program build, both oracles), with the oracles and staging
re-measured afterwards on the recorded programs. Goals: >= 100 examples/s and end-to-end overhead
<= 1.5x.
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

from racefuzz.backends import Execution, cuda
from racefuzz.designs import load_design
from racefuzz.errors import BackendUnavailable
from racefuzz.hb import find_races
from racefuzz.oracle import find_corruptions, sequential_replay
from racefuzz.program import (
    DeviceSync,
    EventSync,
    HostDelay,
    Launch,
    OpVisitor,
    Program,
    Record,
    StreamSync,
    WaitEvent,
    WaitStream,
)
from racefuzz.scenarios.sglang import HAZARDS
from racefuzz.schedule import Schedule
from racefuzz.search import DEFAULT_GPU_BATCH, search

GOAL_EXAMPLES_PER_S = 100
GOAL_OVERHEAD = 1.5
GOAL_GATES_EXAMPLES_PER_S = 1000
GOAL_GATES_OVERHEAD = 1.3
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


class _Script(OpVisitor[None]):
    """Appends, per op, the pre-bound calls a hand-written replay makes for it (see the module doc)."""

    def __init__(
        self,
        torch: Any,
        spin: Any,
        memory: cuda.BoundMemory,
        streams: list[Any],
        ext: list[Any],
        events: list[Any],
        gates: tuple[Any, Any] = (None, None),
    ) -> None:
        self.torch, self.spin, self.memory = torch, spin, memory
        self.gate_wait, self.gate_signal = gates
        self.streams, self.ext, self.events = streams, ext, events
        self.block, self.one = (cuda.THREADS_PER_BLOCK,), (1,)
        self.steps: list[Callable[[], object]] = []

    def _spin_before(self, i: int, s: int) -> None:
        if i in self.memory.spins:
            spin = functools.partial(self.spin, self.one, self.one, self.memory.spins[i], stream=self.ext[s])
            self.steps.append(spin)

    def visit_launch(self, op: Launch) -> None:
        i, s, steps = op.index, op.stream.id, self.steps
        self._spin_before(i, s)
        for args in self.memory.waits.get(i, ()):
            steps.append(functools.partial(self.gate_wait, self.one, self.one, args, stream=self.ext[s]))
        if i in self.memory.costs:
            steps.append(functools.partial(self.spin, self.one, self.one, self.memory.costs[i], stream=self.ext[s]))
        for kernel, grid, args in self.memory.launch_calls[i]:
            steps.append(functools.partial(kernel, grid, self.block, args, stream=self.ext[s]))
        for args in self.memory.signals.get(i, ()):
            steps.append(functools.partial(self.gate_signal, self.one, self.one, args, stream=self.ext[s]))

    def visit_record(self, op: Record) -> None:
        self._spin_before(op.index, op.stream.id)
        self.steps.append(functools.partial(self.events[op.event.id].record, self.streams[op.stream.id]))

    def visit_wait_event(self, op: WaitEvent) -> None:
        self._spin_before(op.index, op.stream.id)
        self.steps.append(functools.partial(self.streams[op.stream.id].wait_event, self.events[op.event.id]))

    def visit_wait_stream(self, op: WaitStream) -> None:
        self._spin_before(op.index, op.stream.id)
        self.steps.append(functools.partial(self.streams[op.stream.id].wait_stream, self.streams[op.other.id]))

    def visit_host_delay(self, op: HostDelay) -> None:
        self.steps.append(functools.partial(cuda.busy_wait_us, op.us))

    def visit_event_sync(self, op: EventSync) -> None:
        self.steps.append(self.events[op.event.id].synchronize)

    def visit_stream_sync(self, op: StreamSync) -> None:
        self.steps.append(self.streams[op.stream.id].synchronize)

    def visit_device_sync(self, op: DeviceSync) -> None:
        self.steps.append(self.torch.cuda.synchronize)


class PlainReplay:
    """The recorded kernel sequences, bound ahead of time, replayed by a hand-written loop (see module doc)."""

    def __init__(self, recorded: Recorded) -> None:
        import cupy
        import torch

        self.torch = torch
        self.recorded = recorded
        runtime = cuda.get_runtime(torch, cupy, 0)
        streams_needed = max((len(p.streams) for p, _ in recorded), default=0)
        taken = {torch.cuda.current_stream().cuda_stream}
        streams = cuda.draw_distinct_streams(streams_needed, torch.cuda.Stream, lambda s: s.cuda_stream, taken)
        ext = [runtime.external_stream(s.cuda_stream) for s in streams]
        self.scripts: list[list[Callable[[], object]]] = []
        self.memory: list[tuple[Any, Any]] = []  # (staging, device array) per example, for the check
        for program, schedule in recorded:
            staging = cuda.stage(program, schedule, runtime.catalog)
            memory = runtime.bind_memory(program, schedule, staging)
            events = [torch.cuda.Event() for _ in program.events]
            script = _Script(torch, runtime.spin_kernel, memory, streams, ext, events, runtime.gate_kernels)
            for op in program.ops:
                i = op.index
                if i in schedule.host_delays:
                    script.steps.append(functools.partial(cuda.busy_wait_us, schedule.host_delays[i]))
                script.visit(op)
            steps = script.steps
            self.scripts.append(steps)
            self.memory.append((staging, memory.staged))
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
        bad = 0
        for (program, _), (staging, staged) in zip(self.recorded, self.memory, strict=True):
            base = staging.observed_base
            observed = staged[base : base + staging.observed_size].cpu().numpy()
            bad += bool(find_corruptions(program, cuda.collect_observations(staging, observed)))
        return bad


def _per_example_us(fn: Callable[[Program, Schedule], object], recorded: Recorded) -> float:
    start = time.perf_counter()
    for program, schedule in recorded:
        fn(program, schedule)
    return (time.perf_counter() - start) / max(1, len(recorded)) * 1e6


class RecordingExecutor:
    """The CUDA executor, recording every (program, schedule) it runs and the host seconds spent in it.

    With `overlap` it is a `PreparingExecutor` (as `executor("cuda")` is); without, a plain executor, so
    that `search` runs every example to the end before building the next.
    """

    def __init__(self, overlap: bool) -> None:
        self._executor = cuda.CudaExecutor()  # fresh: its re-run reuse starts empty, as each run's should
        self.recorded: Recorded = []
        self.seconds = {"prepare": 0.0, "start": 0.0, "done": 0.0, "finish": 0.0, "execute": 0.0}
        if overlap:
            self.prepare = self._prepare

    def __call__(self, program: Program, schedule: Schedule) -> Execution:
        start = time.perf_counter()
        execution = self._executor(program, schedule)
        self.seconds["execute"] += time.perf_counter() - start
        self.recorded.append((program, schedule))
        return execution

    def _prepare(self, program: Program, schedule: Schedule) -> _TimedPrepared:
        start = time.perf_counter()
        prepared = self._executor.prepare(program, schedule)
        self.seconds["prepare"] += time.perf_counter() - start
        return _TimedPrepared(self, prepared)


class _TimedPrepared:
    def __init__(self, owner: RecordingExecutor, prepared: Any) -> None:
        self.owner, self.prepared = owner, prepared

    def start(self) -> _TimedStarted:
        start = time.perf_counter()
        started = self.prepared.start()
        self.owner.seconds["start"] += time.perf_counter() - start
        self.owner.recorded.append((self.prepared.program, self.prepared.schedule))
        return _TimedStarted(self.owner, started)


class _TimedStarted:
    def __init__(self, owner: RecordingExecutor, started: Any) -> None:
        self.owner, self.started = owner, started

    def done(self) -> bool:
        start = time.perf_counter()
        done = self.started.done()
        self.owner.seconds["done"] += time.perf_counter() - start
        return done

    def finish(self) -> Execution:
        start = time.perf_counter()
        execution = self.started.finish()
        self.owner.seconds["finish"] += time.perf_counter() - start
        return execution


def _one_run(
    examples: int, seed: int, fixed: bool, batch: int, overlap: bool, strategy: str = "random"
) -> tuple[dict[str, Any], Recorded]:
    """One timed search, then the plain replay of what it ran; (figures, recorded programs)."""
    run = RecordingExecutor(overlap)
    start = time.perf_counter()
    result = search(
        load_design(DESIGN),
        run,
        backend="cuda",
        examples=examples,
        seed=seed,
        hazards=HAZARDS,
        fixed_iterations=fixed,
        repeat=K,
        shrink=False,
        batch=batch,
        strategy=strategy,
    )
    search_s = time.perf_counter() - start
    recorded = run.recorded
    replay = PlainReplay(recorded)
    replay_s = replay.run()
    delays_us = [
        sum(s.host_delays.values()) + sum(s.device_delays.values()) + sum(s.read_spins.values()) for _, s in recorded
    ]
    backend_s = sum(run.seconds.values())
    figures = {
        "seed": seed,
        "strategy": strategy,
        "mean_gates": round(statistics.mean(len(s.orders) for _, s in recorded), 2),
        "batch": batch,
        "overlap": overlap,
        "examples": result.examples,
        "executes": len(recorded),
        "found": result.found,
        "flaky": len(result.flaky),
        "search_s": round(search_s, 4),
        "examples_per_s": round(result.examples / search_s, 1),
        "backend_s": round(backend_s, 4),
        "backend_parts_s": {part: round(seconds, 4) for part, seconds in run.seconds.items()},
        "replay_s": round(replay_s, 4),
        "overhead_end_to_end": round(search_s / replay_s, 3),
        "overhead_backend": round(backend_s / replay_s, 3),
        "replay_corrupted_examples": replay.corrupted_examples(),
        "mean_ops": round(statistics.mean(len(p.ops) for p, _ in recorded), 1),
        "mean_scheduled_delay_us": round(statistics.mean(delays_us), 1),
    }
    return figures, recorded


def _breakdown(recorded: Recorded, figures: dict[str, Any]) -> dict[str, float]:
    """Per-example µs of the search's parts (see the module doc)."""
    import cupy
    import torch

    catalog = cuda.get_runtime(torch, cupy, 0).catalog
    n = figures["examples"]

    def per_example(seconds: float) -> float:
        return round(seconds / n * 1e6, 1)

    parts = figures["backend_parts_s"]
    return {
        "search_us": per_example(figures["search_s"]),
        "backend_us": per_example(figures["backend_s"]),
        "backend_prepare_us": per_example(parts["prepare"]),
        "backend_start_us": per_example(parts["start"]),
        "backend_done_us": per_example(parts["done"]),
        "backend_finish_us": per_example(parts["finish"]),
        "backend_execute_us": per_example(parts["execute"]),
        "of_which_stage_us": round(_per_example_us(lambda p, s: cuda.stage(p, s, catalog), recorded), 1),
        "outside_backend_us": per_example(figures["search_s"] - figures["backend_s"]),
        "sequential_reference_oracle_us": round(_per_example_us(lambda p, s: sequential_replay(p), recorded), 1),
        "happens_before_oracle_us": round(_per_example_us(lambda p, s: find_races(p), recorded), 1),
        "plain_replay_us": per_example(figures["replay_s"]),
    }


ROWS = (
    # (label, exactly 8 iterations, batch, overlap, strategy, goals that apply: None, "spin" or "gates")
    ("1-8", False, DEFAULT_GPU_BATCH, True, "random", "spin"),
    ("8", True, DEFAULT_GPU_BATCH, True, "random", "spin"),
    ("8 gates", True, DEFAULT_GPU_BATCH, True, "interleave", "gates"),
    ("1-8 gates", False, DEFAULT_GPU_BATCH, True, "interleave", "gates"),
    ("1-8 batch 1, no overlap (ablation)", False, 1, False, "random", None),
)
"""The spin rows search with the default random delays; the gate rows with `interleave` (forced orders
among all unordered launch pairs: `war-after-launch` has no race, so `orders` would force nothing, while
`interleave` puts up to 4 gates on every example, each of which must change no load)."""

GOALS = {"spin": (GOAL_EXAMPLES_PER_S, GOAL_OVERHEAD), "gates": (GOAL_GATES_EXAMPLES_PER_S, GOAL_GATES_OVERHEAD)}


def run(
    examples: int = EXAMPLES,
    repeats: int = REPEATS,
    rows: tuple[str, ...] | None = None,
    seeds: tuple[int, ...] | None = None,
) -> dict[str, Any]:
    """Measure (see the module docstring); a JSON-able dict. `BackendUnavailable` without a usable GPU."""
    reason = cuda.cuda_unavailable_reason()
    if reason is not None:
        raise BackendUnavailable(f"racefuzz bench gpu needs a CUDA GPU: {reason}")
    setup_start = time.perf_counter()
    # Warm-up, untimed: Hypothesis's first draws, the kernels' first launches, torch's stream pool.
    search(load_design(DESIGN), cuda.CudaExecutor(), backend="cuda", examples=50, seed=99, repeat=K, shrink=False)
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
    for label, fixed, batch, overlap, strategy, goal in ROWS:
        if rows is not None and label not in rows:
            continue
        measured = []
        for seed in seeds if seeds is not None else range(repeats):
            measured.append(_one_run(examples, seed, fixed, batch, overlap, strategy))
            # Progress on stderr, so that a run cut short still leaves its figures in the log.
            print(f"iterations {label}: {measured[-1][0]}", file=sys.stderr, flush=True)
        runs = [figures for figures, _ in measured]
        by_ratio = sorted(measured, key=lambda m: m[0]["overhead_end_to_end"])
        median_figures, median_recorded = by_ratio[len(by_ratio) // 2]
        results["rows"].append(
            {
                "iterations": label,
                "batch": batch,
                "overlap": overlap,
                "strategy": strategy,
                "counts_toward_goals": goal is not None,
                "goals": goal,
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
        f"{'iters':>5} {'strat':>6} {'batch':>5} {'seed':>4} {'examples':>8} {'search s':>9} {'ex/s':>7} "
        f"{'backend s':>9} "
        f"{'replay s':>9} {'e2e x':>6} {'backend x':>9} {'delay us':>9} {'ops':>5} replay-check",
    ]
    for row in results["rows"]:
        for r in row["runs"]:
            lines.append(
                f"{row['iterations'].split()[0]:>5} {r.get('strategy', 'random')[:6]:>6} {r['batch']:>5} "
                f"{r['seed']:>4} {r['examples']:>8} "
                f"{r['search_s']:>9.3f} {r['examples_per_s']:>7.1f} {r['backend_s']:>9.3f} {r['replay_s']:>9.3f} "
                f"{r['overhead_end_to_end']:>6.2f} {r['overhead_backend']:>9.2f} {r['mean_scheduled_delay_us']:>9.1f} "
                f"{r['mean_ops']:>5.1f} {'ok' if r['replay_corrupted_examples'] == 0 else 'CORRUPTED'}"
                + ("" if r["overlap"] else "  (no overlap)")
                + ("  (stopped at a race)" if r["found"] else "")
            )
    lines.append("median per row:")
    for row in results["rows"]:
        eps, e2e = row["examples_per_s"], row["overhead_end_to_end"]
        if row.get("counts_toward_goals", True):
            goal_eps, goal_overhead = GOALS[row.get("goals") or "spin"]
            verdicts = (
                f"({'meets' if eps >= goal_eps else 'MISSES'} {goal_eps}/s)",
                f"({'meets' if e2e <= goal_overhead else 'MISSES'} x{goal_overhead})",
            )
        else:
            verdicts = ("", "(ablation, not a goal row)")
        lines.append(
            f"  iterations {row['iterations']} ({row.get('strategy', 'random')}, "
            f"{statistics.mean(r.get('mean_gates', 0) for r in row['runs']):.1f} gates/example): "
            f"{eps:7.1f} examples/s {verdicts[0]}; "
            f"end-to-end overhead x{e2e:.2f} {verdicts[1]}; backend overhead x{row['overhead_backend']:.2f}"
        )
        b = row["breakdown_of_median_run"]
        lines.append(
            f"    per example (seed {b['seed']}): search {b['search_us']:.0f} us = backend {b['backend_us']:.0f} "
            f"(prepare {b['backend_prepare_us']:.0f}, start {b['backend_start_us']:.0f}, done? "
            f"{b.get('backend_done_us', 0):.0f}, finish "
            f"{b['backend_finish_us']:.0f}, execute {b['backend_execute_us']:.0f}; staging alone "
            f"{b['of_which_stage_us']:.0f}) + outside the backend {b['outside_backend_us']:.0f} (Hypothesis, decode, "
            f"build, sequential-reference oracle {b['sequential_reference_oracle_us']:.0f}, happens-before oracle "
            f"{b['happens_before_oracle_us']:.0f}); plain replay {b['plain_replay_us']:.0f} us"
        )
    return "\n".join(lines)


def mutant_with_gates(name: str, examples: int = 300, seed: int = 0) -> dict[str, Any]:
    """One mutant searched on the GPU with forced orders alone (strategy `orders`, no spin, k=K), as
    `racefuzz bench mutants --backend cuda` searches it with delays; then its counterexample replayed in
    fresh runs, once (1/1) and K times (K/K). A JSON-able row."""
    from racefuzz.scenarios import get_scenario
    from racefuzz.search import judge, reproduces

    mutant = get_scenario().mutants()[name]
    design = load_design(name)
    hazards = tuple(getattr(mutant, "hazards", HAZARDS))
    options = {} if getattr(mutant, "plan_stream", None) is None else {"plan_stream": mutant.plan_stream}
    run_program = cuda.CudaExecutor()
    result = search(
        design,
        run_program,
        backend="cuda",
        examples=examples,
        seed=seed,
        hazards=hazards,
        strategy="orders",
        repeat=K,
        **options,
    )
    row: dict[str, Any] = {
        "mutant": name,
        "equivalent": getattr(mutant, "equivalent", None),
        "caught": result.found,
        "oracle": result.counterexample.oracle if result.counterexample else None,
        "examples_to_detect": result.first_detection_example,
        "seconds_to_detect": result.first_detection_seconds,
        "examples_to_manifest": result.first_manifested_example,
        "seconds_to_manifest": result.first_manifested_seconds,
        "search_s": result.seconds,
    }
    c = result.counterexample
    if c is not None and c.oracle == "corruption":
        row["schedule"] = c.schedule.to_json()
        row["workload"] = c.workload.to_json()  # type: ignore[attr-defined]
        row["inverted_orders"] = sum(a > b for a, b in c.schedule.orders)
        row["delays"] = c.schedule.nonzero_delays
        row["replayed_1_of_1"] = bool(judge(c.workload, design, c.schedule, cuda.CudaExecutor()).corruptions)
        row[f"replayed_{K}_of_{K}"] = reproduces(
            judge(c.workload, design, c.schedule, cuda.CudaExecutor()), run_program, K
        )
    return row
