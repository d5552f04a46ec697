"""GPU examples per second on the overlap scenario, and racefuzz's overhead over a plain replay.

`python -m ci.bench gpu` (needs a CUDA GPU; `BackendUnavailable`, exit 2, without one); raw output in
docs/results/search-gpu-h200/ (one process) and docs/results/search-gpu-4-processes-h200/.

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

Processes (`python -m ci.bench gpu --processes N`, default 1: all of the above, in one process). The search
is host-bound, so one process leaves the GPU mostly idle; GPU CI runs racefuzz under pytest-xdist with
several workers on one GPU. With N > 1, N worker processes (`spawn`ed: CUDA breaks under fork) share the
GPU. Each sets up once, outside every timed window (imports, CUDA context, the warm-up; reported as each
worker's set-up seconds and the pool's), then, for each row and seed, every worker runs the single-process
row's measurement (`_one_run`) with its own seed (seed * 1000 + worker) in two phases behind a barrier: the
timed searches start together, and the timed plain replays start together once every search is done (the
replays' set-up runs between the two, untimed), so the searches overlap one another and so do the replays,
and no replay runs beside a search. Per row and seed (`aggregate`): examples/s per GPU = every worker's
examples over the wall time from the first worker's start to the last one's end (`time.monotonic()`, one
clock for the host's processes); the plain replay's examples/s per GPU likewise; the end-to-end overhead =
the replay's over the search's; with each worker's own figures beside (its examples/s is its share while
sharing the GPU). The rows' medians and the goals' verdicts are then examples/s per GPU with N processes,
never one process's throughput. No per-example breakdown (the single-process run gives it). A worker that
raises, dies or gives no result within WORKER_TIMEOUT_S stops the benchmark with an error naming it.
"""

from __future__ import annotations

import contextlib
import functools
import math
import multiprocessing
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as connection_wait
from typing import Any

from racefuzz.backends import Execution, cuda
from racefuzz.designs import load_design
from racefuzz.errors import BackendUnavailable, InvalidArgument, RacefuzzError
from racefuzz.exitcodes import ExitCode
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


class PhaseClock:
    """Stamps the start and end of each timed phase of a measurement (`search`, `replay`) with
    `time.monotonic()`, one clock for every process of the host (CLOCK_MONOTONIC on Linux).

    With a barrier (`python -m ci.bench gpu --processes N`), every worker waits for all the others before it
    stamps a phase's start, and after stamping its end waits for all the others to finish the phase: the
    workers' searches overlap, then their replays do, and no worker's replay runs beside another's search.
    Without one (a single process) it only stamps.
    """

    def __init__(self, barrier: Any = None, timeout_s: float | None = None) -> None:
        self.barrier, self.timeout_s = barrier, timeout_s
        self.stamps: dict[str, list[float]] = {}

    def start(self, phase: str) -> None:
        if self.barrier is not None:
            self.barrier.wait(self.timeout_s)
        self.stamps[phase] = [time.monotonic(), math.nan]

    def end(self, phase: str) -> None:
        self.stamps[phase][1] = time.monotonic()
        if self.barrier is not None:
            self.barrier.wait(self.timeout_s)


def _one_run(
    examples: int,
    seed: int,
    fixed: bool,
    batch: int,
    overlap: bool,
    strategy: str = "random",
    clock: PhaseClock | None = None,
) -> tuple[dict[str, Any], Recorded]:
    """One timed search, then the plain replay of what it ran; (figures, recorded programs).

    `clock` brackets the timed search and the timed replay (the replay's set-up, untimed, runs between the
    two); with `--processes N` its barrier lines the workers' phases up (see `PhaseClock`)."""
    clock = clock if clock is not None else PhaseClock()
    run = RecordingExecutor(overlap)
    clock.start("search")
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
    clock.end("search")
    recorded = run.recorded
    replay = PlainReplay(recorded)
    clock.start("replay")
    replay_s = replay.run()
    clock.end("replay")
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


def _header(examples: int, versions: dict[str, str], setup_s: float, processes: int) -> dict[str, Any]:
    return {
        "benchmark": "gpu",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **versions,
        "machine": platform.machine(),
        "spin_clock": "%globaltimer (ns)",
        "design": DESIGN,
        "hazards": "all",
        "repeat_k": K,
        "examples_per_run": examples,
        "goal_examples_per_s": GOAL_EXAMPLES_PER_S,
        "goal_overhead": GOAL_OVERHEAD,
        "processes": processes,
        "setup_s": round(setup_s, 3),
        "rows": [],
    }


def _warm_up() -> None:
    """Untimed: Hypothesis's first draws, the kernels' first launches, torch's stream pool."""
    search(load_design(DESIGN), cuda.CudaExecutor(), backend="cuda", examples=50, seed=99, repeat=K, shrink=False)


def run(
    examples: int = EXAMPLES,
    repeats: int = REPEATS,
    rows: tuple[str, ...] | None = None,
    seeds: tuple[int, ...] | None = None,
    processes: int = 1,
) -> dict[str, Any]:
    """Measure (see the module docstring); a JSON-able dict. `BackendUnavailable` without a usable GPU.

    `processes` > 1: N worker processes share the GPU (`run_processes`)."""
    reason = cuda.cuda_unavailable_reason()
    if reason is not None:
        raise BackendUnavailable(f"the gpu benchmark needs a CUDA GPU: {reason}")
    if not 1 <= processes <= MAX_PROCESSES:
        raise InvalidArgument(f"--processes: expected 1 to {MAX_PROCESSES}, got {processes}")
    if processes > 1:
        return run_processes(processes, examples, repeats, rows, seeds)
    setup_start = time.perf_counter()
    _warm_up()
    results = _header(examples, _versions(), time.perf_counter() - setup_start, 1)
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


# --- `python -m ci.bench gpu --processes N`: N search processes sharing one GPU ----------------------------

MAX_PROCESSES = 64
"""The largest --processes accepted: a bound, so that a typo does not start thousands of CUDA contexts."""
WORKER_TIMEOUT_S = 600.0
"""How long a worker waits at a barrier for the others, and the parent (plus RESULT_MARGIN_S) for a worker's
set-up or task."""
RESULT_MARGIN_S = 60.0
"""Beyond the timeout, how long the parent waits for a set-up or a task before naming every worker still
pending. It only bounds a hang: a hung worker is normally named sooner, when its partners' barrier timeouts
report, and the margin must outlast how late those reports arrive on a loaded machine (a short margin named the
first pending worker, not the hung one)."""
GRACE_S = 15.0
"""After one worker failed, how long the parent waits for the others to report before stopping them."""

CLOSE_GRACE_S = 5.0
"""When the pool closes, how long the workers have to exit before they are terminated."""

Stamps = dict[str, list[float]]


class WorkerFailed(RacefuzzError):
    """A worker of `--processes N` raised, died or gave no result in time; the message names it and why.

    The exit code is the worker's own error's where that was a `RacefuzzError` (a worker that finds no GPU:
    2), else 5 (internal error)."""

    def __init__(self, message: str, exit_code: ExitCode = ExitCode.INTERNAL) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _describe(exc: BaseException) -> tuple[str, int]:
    """One line for a worker's exception: type, message and the innermost frame; and the exit code it maps to."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    message = " | ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    code = int(exc.exit_code) if isinstance(exc, RacefuzzError) else int(ExitCode.INTERNAL)
    return f"{type(exc).__name__}: {message}{where}", code


def _worker(
    index: int,
    setup: Callable[[int], dict[str, Any]],
    measure: Callable[[Any, int, PhaseClock], dict[str, Any]],
    conn: Connection,
    barrier: Any,
    timeout_s: float,
) -> None:
    """A worker process's entry point (top level: `spawn` pickles it by name).

    Sends ("ready", set-up seconds, setup's dict), then for each task the parent sends ("done", measure's
    figures, the PhaseClock's stamps), until it receives None. On any exception it breaks the barrier (so
    that the other workers stop waiting for it), sends ("error", description, exit code) and exits."""
    try:
        start = time.perf_counter()
        info = setup(index)
        conn.send(("ready", time.perf_counter() - start, info))
        while (task := conn.recv()) is not None:
            clock = PhaseClock(barrier, timeout_s)
            figures = measure(task, index, clock)
            conn.send(("done", figures, clock.stamps))
    except EOFError:  # the parent went away
        barrier.abort()
    except BaseException as exc:  # KeyboardInterrupt too: the parent must hear of it rather than wait
        barrier.abort()
        with contextlib.suppress(OSError):  # the parent may be gone
            conn.send(("error", *_describe(exc)))
    finally:
        conn.close()


def _rank(error: str) -> int:
    """Which of several workers' errors to report: the cause, not the workers it stopped. A worker's own
    exception first, then a worker that gave no result in time, then one stopped after another failed, and
    last a BrokenBarrierError (a worker released from the barrier because another failed or hung)."""
    if "BrokenBarrierError" in error:
        return 3
    if error.startswith("was stopped"):
        return 2
    if error.startswith("gave no result"):
        return 1
    return 0


class WorkerPool:
    """N `spawn`ed worker processes sharing a barrier; `run(task)` gives every worker the same task at once.

    Each worker calls `setup(index)` once (imports, CUDA context, warm-up: outside every timed window; its
    seconds are `setup_s`), then `measure(task, index, clock)` per task, where `clock` is a `PhaseClock` on the
    shared barrier. A worker that raises, dies or overruns `timeout_s` stops the pool: `WorkerFailed`, naming
    it, and every worker is stopped (no hang: barrier waits and the parent's waits all have timeouts)."""

    def __init__(
        self,
        processes: int,
        setup: Callable[[int], dict[str, Any]],
        measure: Callable[[Any, int, PhaseClock], dict[str, Any]],
        timeout_s: float = WORKER_TIMEOUT_S,
    ) -> None:
        context = multiprocessing.get_context("spawn")  # CUDA: a fork after CUDA is initialised is broken
        self.processes, self.timeout_s = processes, timeout_s
        self.barrier = context.Barrier(processes)
        self.conns: list[Connection] = []
        self.workers: list[Any] = []
        self._child_conns: list[Connection] = []
        for index in range(processes):
            parent_end, child_end = context.Pipe()
            self.conns.append(parent_end)
            self._child_conns.append(child_end)
            self.workers.append(
                context.Process(
                    target=_worker,
                    args=(index, setup, measure, child_end, self.barrier, timeout_s),
                    name=f"racefuzz-bench-worker-{index}",
                    daemon=True,
                )
            )
        self.setup_s: list[float] = []
        self.setup_info: list[dict[str, Any]] = []
        self._closed = False

    def __enter__(self) -> WorkerPool:
        try:
            for worker, child_end in zip(self.workers, self._child_conns, strict=True):
                worker.start()
                child_end.close()  # the worker holds it now; closed here, a dead worker reads as EOF
            replies = self._collect("while setting up (imports, CUDA context, warm-up)")
        except BaseException:
            self.close()
            raise
        self.setup_s = [reply[1] for reply in replies]
        self.setup_info = [reply[2] for reply in replies]
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def run(self, task: Any, what: str = "") -> list[tuple[dict[str, Any], Stamps]]:
        """Every worker measures `task` together; [(figures, stamps)] in worker order."""
        for conn in self.conns:
            with contextlib.suppress(OSError):  # a worker that died since: `_collect` names it
                conn.send(task)
        replies = self._collect(what or f"measuring {task!r}")
        return [(reply[1], reply[2]) for reply in replies]

    def _collect(self, what: str) -> list[tuple[Any, ...]]:
        replies: list[tuple[Any, ...] | None] = [None] * self.processes
        errors: dict[int, tuple[str, int]] = {}
        pending = set(range(self.processes))
        # Longer than a worker waits at the barrier: a worker that hangs early in a task is named (its partners
        # time out at the barrier and report first). One that hangs in a later phase of the task (after the
        # searches, say) may outlast this deadline before its partners' barrier timeouts: then every pending
        # worker is reported as giving no result, and the lowest-numbered one is named.
        deadline = time.monotonic() + self.timeout_s + RESULT_MARGIN_S
        while pending and (remaining := deadline - time.monotonic()) > 0:
            watched = [self.conns[i] for i in pending] + [self.workers[i].sentinel for i in pending]
            ready = set(connection_wait(watched, remaining))
            for i in sorted(pending):
                if self.conns[i] in ready or self.conns[i].poll():
                    try:
                        reply = self.conns[i].recv()
                    except (EOFError, OSError):
                        reply = self._died(i)
                elif self.workers[i].sentinel in ready:
                    reply = self._died(i)
                else:
                    continue
                pending.discard(i)
                if reply[0] == "error":
                    errors[i] = (reply[1], reply[2])
                    if len(errors) == 1:  # wake the others at the barrier, give them a moment to report
                        self.barrier.abort()
                        deadline = min(deadline, time.monotonic() + GRACE_S)
                else:
                    replies[i] = reply
        # Still running: busy when another worker failed; else hung (the others, at the barrier, timed out).
        if any(_rank(message) == 0 for message, _ in errors.values()):
            why = "was stopped, still running after another worker failed"
        else:
            why = f"gave no result within {self.timeout_s:g} s"
        errors.update({i: (why, int(ExitCode.INTERNAL)) for i in pending})
        if errors:
            self.close()
            first = min(errors, key=lambda i: (_rank(errors[i][0]), i))
            also = f" ({len(errors) - 1} other worker(s) stopped with it)" if len(errors) > 1 else ""
            raise WorkerFailed(
                f"worker {first} of {self.processes} failed {what}: {errors[first][0]}{also}",
                ExitCode(errors[first][1]),
            )
        return [reply for reply in replies if reply is not None]

    def _died(self, i: int) -> tuple[str, str, int]:
        self.workers[i].join(1.0)
        return ("error", f"exited with code {self.workers[i].exitcode} without a result", int(ExitCode.INTERNAL))

    def close(self) -> None:
        """Ask every worker to exit, then stop whichever has not within a few seconds. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for conn in self.conns:
            with contextlib.suppress(OSError):  # that worker has exited already
                conn.send(None)
        deadline = time.monotonic() + CLOSE_GRACE_S
        for worker in self.workers:
            if worker.pid is not None:
                worker.join(max(0.0, deadline - time.monotonic()))
        for worker in self.workers:
            if worker.pid is not None and worker.is_alive():
                worker.terminate()
                worker.join(2.0)
            if worker.pid is not None and worker.is_alive():
                worker.kill()
                worker.join(2.0)
        for conn in self.conns:
            conn.close()


def aggregate(workers: Sequence[tuple[int, Sequence[float], Sequence[float]]]) -> dict[str, float]:
    """The figures of one GPU shared by N processes, from each worker's (examples, search window, replay window).

    A window is (start, end) on `time.monotonic()`. Each phase's wall time runs from the first worker's start
    (they start together, behind a barrier) to the last worker's end; examples/s is every worker's examples
    over that wall time, for the search and for the plain replay, and the end-to-end overhead is the replay's
    examples/s over the search's (= search wall / replay wall). `start_skew_s` (the latest start minus the
    first) says how well the barrier lined the workers up, `end_spread_s` how long the last worker ran after
    the first had finished.
    """
    if not workers:
        raise ValueError("aggregate needs at least one worker")
    for examples, *windows in workers:
        if examples < 0 or any(not end >= start for start, end in windows):
            raise ValueError(f"a worker's windows must end after they start, and examples be >= 0: {workers}")
    total = sum(examples for examples, _, _ in workers)

    def wall(phase: int) -> float:
        return max(w[phase][1] for w in workers) - min(w[phase][0] for w in workers)

    search_wall, replay_wall = wall(1), wall(2)
    search_eps = total / search_wall if search_wall > 0 else math.inf
    replay_eps = total / replay_wall if replay_wall > 0 else math.inf
    return {
        "processes": len(workers),
        "examples": total,
        "search_wall_s": round(search_wall, 4),
        "examples_per_s": round(search_eps, 1),
        "replay_wall_s": round(replay_wall, 4),
        "replay_examples_per_s": round(replay_eps, 1),
        "overhead_end_to_end": round(search_wall / replay_wall, 3) if replay_wall > 0 else math.inf,
        "start_skew_s": round(max(w[1][0] for w in workers) - min(w[1][0] for w in workers), 4),
        "end_spread_s": round(max(w[1][1] for w in workers) - min(w[1][1] for w in workers), 4),
    }


def worker_seed(seed: int, index: int) -> int:
    """The Hypothesis seed of worker `index` in the run of `seed`: distinct across workers and seeds."""
    return seed * 1000 + index


def _gpu_setup(index: int) -> dict[str, Any]:
    """A worker's set-up: the GPU check, imports and CUDA context, the warm-up; the versions (untimed)."""
    reason = cuda.cuda_unavailable_reason()
    if reason is not None:
        raise BackendUnavailable(f"the gpu benchmark needs a CUDA GPU: {reason}")
    _warm_up()
    return _versions()


def _gpu_measure(task: tuple[int, int, bool, int, bool, str], index: int, clock: PhaseClock) -> dict[str, Any]:
    """A worker's measurement: the single-process row's `_one_run`, its phases on the shared barrier."""
    examples, seed, fixed, batch, overlap, strategy = task
    figures, _ = _one_run(examples, worker_seed(seed, index), fixed, batch, overlap, strategy, clock)
    return {"worker": index, **figures}


def run_processes(
    processes: int,
    examples: int = EXAMPLES,
    repeats: int = REPEATS,
    rows: tuple[str, ...] | None = None,
    seeds: tuple[int, ...] | None = None,
    setup: Callable[[int], dict[str, Any]] = _gpu_setup,
    measure: Callable[[Any, int, PhaseClock], dict[str, Any]] = _gpu_measure,
) -> dict[str, Any]:
    """`run` with N worker processes sharing the GPU (see the module docstring); a JSON-able dict.

    `setup` and `measure` are the workers' (top-level functions: `spawn` pickles them by name); the tests
    pass stand-ins for the GPU's to run this on the CPU."""
    setup_start = time.perf_counter()
    with WorkerPool(processes, setup, measure) as pool:
        results = _header(examples, pool.setup_info[0], time.perf_counter() - setup_start, processes)
        results["worker_setup_s"] = [round(s, 3) for s in pool.setup_s]
        results["worker_seeds"] = "seed * 1000 + worker"
        for label, fixed, batch, overlap, strategy, goal in ROWS:
            if rows is not None and label not in rows:
                continue
            runs = []
            for seed in seeds if seeds is not None else range(repeats):
                task = (examples, seed, fixed, batch, overlap, strategy)
                measured = pool.run(task, f"in row {label!r}, seed {seed}")
                workers = [{**figures, "stamps": stamps} for figures, stamps in measured]
                windows = [(w["examples"], w["stamps"]["search"], w["stamps"]["replay"]) for w in workers]
                runs.append({"seed": seed, **aggregate(windows), "workers": workers})
                print(f"iterations {label}, {processes} processes: {runs[-1]}", file=sys.stderr, flush=True)
            results["rows"].append(
                {
                    "iterations": label,
                    "batch": batch,
                    "overlap": overlap,
                    "strategy": strategy,
                    "counts_toward_goals": goal is not None,
                    "goals": goal,
                    "processes": processes,
                    "examples_per_s": statistics.median(r["examples_per_s"] for r in runs),
                    "replay_examples_per_s": statistics.median(r["replay_examples_per_s"] for r in runs),
                    "overhead_end_to_end": statistics.median(r["overhead_end_to_end"] for r in runs),
                    "overhead_backend_median_worker": statistics.median(
                        w["overhead_backend"] for r in runs for w in r["workers"]
                    ),
                    "runs": runs,
                }
            )
    return results


def _verdicts(row: dict[str, Any], per: str = "") -> tuple[str, str]:
    if not row.get("counts_toward_goals", True):
        return "", "(ablation, not a goal row)"
    goal_eps, goal_overhead = GOALS[row.get("goals") or "spin"]
    eps, e2e = row["examples_per_s"], row["overhead_end_to_end"]
    return (
        f"({'meets' if eps >= goal_eps else 'MISSES'} {goal_eps}/s{per})",
        f"({'meets' if e2e <= goal_overhead else 'MISSES'} x{goal_overhead})",
    )


def _render_processes(results: dict[str, Any]) -> str:
    """`render` for `--processes N` > 1: every worker's run, each concurrent run's aggregate, the medians."""
    n = results["processes"]
    per_gpu = f" per GPU with {n} processes"
    lines = [
        f"racefuzz GPU benchmark  {results['date']}  {results['device']}  torch {results['torch']}  "
        f"cupy {results['cupy']}  python {results['python']}",
        f"design {results['design']}, hazards {results['hazards']}, k={results['repeat_k']}, "
        f"spins on {results.get('spin_clock', 'clock64')}; goals >= {GOAL_EXAMPLES_PER_S} examples/s, "
        f"end-to-end overhead <= {GOAL_OVERHEAD}x a plain replay of the same kernel sequences",
        f"processes: {n} -- {n} search processes share one GPU: their timed searches start together behind a "
        f"barrier, then their plain replays do; every figure below marked 'all' is examples/s{per_gpu} (every "
        f"worker's examples over the wall time from the first start to the last end), NOT one process's throughput",
        f"set-up per worker (imports, CUDA context, warm-up; untimed): "
        f"{', '.join(f'{s:.1f}' for s in results['worker_setup_s'])} s; pool ready after {results['setup_s']:.1f} s",
        f"{'iters':>5} {'strat':>6} {'batch':>5} {'seed':>4} {'worker':>6} {'examples':>8} {'search s':>9} "
        f"{'ex/s':>7} {'backend s':>9} {'replay s':>9} {'e2e x':>6} {'backend x':>9} replay-check",
    ]
    for row in results["rows"]:
        label, strategy = row["iterations"].split()[0], row.get("strategy", "random")[:6]
        for r in row["runs"]:
            for w in r["workers"]:
                lines.append(
                    f"{label:>5} {strategy:>6} {w['batch']:>5} {r['seed']:>4} {w['worker']:>6} {w['examples']:>8} "
                    f"{w['search_s']:>9.3f} {w['examples_per_s']:>7.1f} {w['backend_s']:>9.3f} "
                    f"{w['replay_s']:>9.3f} {w['overhead_end_to_end']:>6.2f} {w['overhead_backend']:>9.2f} "
                    f"{'ok' if w['replay_corrupted_examples'] == 0 else 'CORRUPTED'}"
                    + ("" if w["overlap"] else "  (no overlap)")
                    + ("  (stopped at a race)" if w["found"] else "")
                )
            lines.append(
                f"{label:>5} {strategy:>6} {row['batch']:>5} {r['seed']:>4} {'all':>6} {r['examples']:>8} "
                f"{r['search_wall_s']:>9.3f} {r['examples_per_s']:>7.1f} {'':>9} {r['replay_wall_s']:>9.3f} "
                f"{r['overhead_end_to_end']:>6.2f} {'':>9} examples/s{per_gpu}; replay {r['replay_examples_per_s']:.1f}"
                f"/s; starts within {r['start_skew_s'] * 1e3:.1f} ms, ends within {r['end_spread_s'] * 1e3:.0f} ms"
            )
    lines.append(f"median per row (examples/s{per_gpu}, not per process):")
    for row in results["rows"]:
        speed = _verdicts(row, per_gpu)[0]
        gates = statistics.mean(w.get("mean_gates", 0) for r in row["runs"] for w in r["workers"])
        lines.append(
            f"  iterations {row['iterations']} ({row.get('strategy', 'random')}, {gates:.1f} gates/example): "
            f"{row['examples_per_s']:7.1f} examples/s{per_gpu}{' ' + speed if speed else ''}; plain replay "
            f"{row['replay_examples_per_s']:.1f} examples/s{per_gpu}; end-to-end overhead "
            f"x{row['overhead_end_to_end']:.2f} over those replays; backend overhead x"
            f"{row['overhead_backend_median_worker']:.2f} (median worker)"
        )
    lines.append(
        f"no overhead verdict with {n} processes: the {n} concurrent plain replays share the GPU too (its "
        "contexts are time-sliced), so they run slower than one process's replay and the ratio flatters the "
        "search; the overhead goal is judged by --processes 1"
    )
    return "\n".join(lines)


def render(results: dict[str, Any]) -> str:
    """The figures as a text table, with the goals' verdicts and the per-example breakdown."""
    if results.get("processes", 1) > 1:
        return _render_processes(results)
    lines = [
        f"racefuzz GPU benchmark  {results['date']}  {results['device']}  torch {results['torch']}  "
        f"cupy {results['cupy']}  python {results['python']}",
        f"design {results['design']}, hazards {results['hazards']}, k={results['repeat_k']}, "
        f"spins on {results.get('spin_clock', 'clock64')}; goals >= {GOAL_EXAMPLES_PER_S} examples/s, "
        f"end-to-end overhead <= {GOAL_OVERHEAD}x a plain replay of the same kernel sequences; "
        f"processes: {results.get('processes', 1)}",
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
        verdicts = _verdicts(row)
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
    `python -m ci.bench mutants --backend cuda` searches it with delays; then its counterexample replayed in
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
