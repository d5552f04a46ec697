"""The search: Hypothesis draws workloads and delay schedules, a backend runs them, two oracles judge.

For one design, `search` runs up to `examples` examples. Each draws a workload, builds the program
(scenario + design), draws a delay schedule for it, executes it, and checks

* manifested corruption: every load equals the sequential reference (`racefuzz.oracle`);
* happens-before: no conflicting access pair is unordered (`racefuzz.hb`; timing-independent).

The delay schedule comes from one of three strategies: `random` (the default: up to `max_delays` delays,
each on a drawn launch, `racefuzz.strategies.decode_schedule`), `pct` (PCT-style stream priorities and
change points, `racefuzz.schedulers.pct`), or `none` (no injected delay: a plain stress loop, the
baseline that shows what delay injection adds).

On the GPU one Hypothesis example is a batch of examples, and the host draws and builds the next example
while the device runs the current one (see `search`'s `batch`).

A manifested corruption fails the Hypothesis test, which then shrinks the workload and the schedule
together; `racefuzz.minimize` then simplifies the structure further (fewer requests, iterations and
delays). When nothing manifested but the happens-before oracle saw races, a second search shrinks the
workload on that oracle alone, so every race found comes back minimal.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import NamedTuple

from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.errors import FlakyFailure

from racefuzz.backend import Executor, PreparedRun, StartedRun
from racefuzz.designs import Design
from racefuzz.errors import InvalidArgument
from racefuzz.hb import Race, find_races
from racefuzz.memory import Observations
from racefuzz.minimize import minimize
from racefuzz.oracle import Corruption, expected_observations, find_corruptions
from racefuzz.program import Program
from racefuzz.scenarios.sglang import build_program
from racefuzz.scenarios.workload import Workload
from racefuzz.schedule import NO_DELAYS, Schedule
from racefuzz.schedulers.pct import DEFAULT_DEPTH, decode_pct_schedule, pct_bytes
from racefuzz.sim import Execution
from racefuzz.strategies import (
    HAZARDS,
    MAX_ITERATIONS,
    check_hazards,
    decode_schedule,
    decode_workload,
    schedule_bytes,
    workload_bytes,
    workloads,
)


@dataclass
class Outcome:
    """One example judged by both oracles."""

    workload: Workload
    schedule: Schedule
    program: Program
    execution: Execution | None
    corruptions: list[Corruption]
    races: list[Race]

    @property
    def violations(self) -> tuple[str, ...]:
        return self.program.violations

    @property
    def oracle(self) -> str | None:
        """Which oracle flagged it, strongest first: `corruption` (manifested), `happens-before` (an
        unordered conflicting pair), `allocation` (a scenario invariant, see `Program.violations`), or None."""
        if self.corruptions:
            return "corruption"
        if self.races:
            return "happens-before"
        if self.violations:
            return "allocation"
        return None


def judge(workload: Workload, design: Design, schedule: Schedule | None, run: Executor | None) -> Outcome:
    """Build the program of `workload` under `design`, run it under `schedule` (if `run`), check both oracles."""
    program = build_program(workload, design.hooks)
    races = find_races(program)
    if run is None or schedule is None:
        return Outcome(workload, schedule or NO_DELAYS, program, None, [], races)
    execution = run(program, schedule)
    corruptions = find_corruptions(program, execution.observations, execution.writers)
    return Outcome(workload, schedule, program, execution, corruptions, races)


class _Example(NamedTuple):
    """One example built and ready to run: what `search` judges its run against."""

    key: tuple[bytes, bytes]
    workload: Workload
    program: Program
    schedule: Schedule
    expected: Observations
    racy: bool


@dataclass(frozen=True)
class Flaky:
    """An example whose loads differed in only `reproduced` of `runs` runs (GPU timing): not a verdict."""

    workload: Workload
    schedule: Schedule
    reproduced: int
    runs: int


@dataclass
class SearchResult:
    """What a search found. `counterexample` is minimal (shrunk) when present."""

    design: Design
    backend: str
    examples: int
    seconds: float
    counterexample: Outcome | None
    first_detection_example: int | None = None
    first_detection_seconds: float | None = None
    manifested_examples: int = 0
    racy_examples: int = 0
    flaky: list[Flaky] = field(default_factory=list)
    repeat: int = 1
    strategy: str = "random"
    first_manifested_example: int | None = None
    first_manifested_seconds: float | None = None

    @property
    def found(self) -> bool:
        return self.counterexample is not None


class _Manifested(Exception):
    """Raised inside the Hypothesis test when an example's loads differ from the reference."""


class _Unordered(Exception):
    """Raised inside the second search when a workload has an unordered conflicting pair."""


DEFAULT_GPU_BATCH = 32
"""Examples per Hypothesis example on the GPU, unless `batch` says otherwise (see `search`)."""

LOOKAHEAD = 3
"""Members of a batch drawn ahead of the one running: how much host work a search can bank during a long run."""

MAX_BUILT = 4096
"""Programs a search keeps for workloads it draws again (it forgets them all when it has this many)."""

DEFAULT_GPU_REPEAT = 5
"""k of k: how many runs a manifested race must reproduce in on the GPU, unless `repeat` says otherwise."""

STRATEGIES = ("random", "pct", "none")
"""Delay strategies `search` draws schedules from (see the module docstring)."""


def _settings(max_examples: int, *, shrink: bool = True) -> settings:
    return settings(
        max_examples=max_examples,
        database=None,
        deadline=None,
        derandomize=False,
        suppress_health_check=list(HealthCheck),
        # Without shrinking, Hypothesis stops at the first failure instead of re-running variants of it.
        phases=[Phase.generate, Phase.shrink] if shrink else [Phase.generate],
        report_multiple_bugs=False,
        verbosity=Verbosity.quiet,
        print_blob=False,
    )


def search(
    design: Design,
    run: Executor,
    *,
    backend: str = "sim",
    examples: int = 200,
    seed: int = 0,
    hazards: Collection[str] = HAZARDS,
    plan_stream: bool | None = None,
    max_delays: int = 4,
    fixed_iterations: bool = False,
    shrink: bool = True,
    repeat: int | None = None,
    on_example: Callable[[int], None] | None = None,
    strategy: str = "random",
    pct_depth: int = DEFAULT_DEPTH,
    min_delay_us: float | None = None,
    batch: int | None = None,
) -> SearchResult:
    """Search `examples` examples for a race of `design`; see the module docstring.

    `strategy` picks the delay schedules: `random`, `pct` (depth `pct_depth`) or `none`.
    `first_manifested_example/seconds` are kept apart from `first_detection_*` (any oracle), because only
    the manifested oracle depends on the schedule: they are what tells delay strategies apart.

    `repeat` (k): an example whose loads differ is re-run until it has run k times, and counts as a
    manifested race only when all k runs differ; otherwise it is recorded in `SearchResult.flaky` with its
    rate and the search goes on. Shrinking applies the same rule to every candidate, so it cannot turn a
    k/k failure into a flaky one. The default is DEFAULT_GPU_REPEAT on `cuda` and 1 on the simulator, which
    is deterministic.

    `batch`: racefuzz examples per Hypothesis example (default DEFAULT_GPU_BATCH on `cuda`, 1 on the
    simulator, where a batch of one draws exactly what an unbatched search drew). A batch pays Hypothesis'
    per-example cost once, and when `run` is a `PreparingExecutor` (the CUDA backend is) the search draws,
    builds, judges ahead and prepares example i+1 while the device runs example i. The search stops at the
    first failing member (even mid-batch) and Hypothesis then shrinks that member alone, not the batch
    (`_shrink_alone`); it also stops at `examples` examples, even mid-batch.

    `min_delay_us` is added to every random or PCT delay (default: GPU_MIN_DELAY_US on `cuda`, 0 on `sim`). On
    the GPU a counterexample must stay delay-dominated: shrunk to a 40 us spin, a race sits on the edge of
    the real launch costs and reproduces 3 or 4 times in 5 (seen on an H200). The finished counterexample
    is re-checked k/k in fresh runs; if it no longer reproduces, the least-shrunk failure that does is
    reported instead.
    """
    if repeat is None:
        repeat = DEFAULT_GPU_REPEAT if backend == "cuda" else 1
    if repeat < 1:
        raise InvalidArgument(f"repeat must be >= 1, got {repeat}")
    if batch is None:
        batch = DEFAULT_GPU_BATCH if backend == "cuda" else 1
    if batch < 1:
        raise InvalidArgument(f"batch must be >= 1, got {batch}")
    if strategy not in STRATEGIES:
        raise InvalidArgument(f"unknown delay strategy {strategy!r}; choose from {', '.join(STRATEGIES)}")
    allowed = check_hazards(hazards)
    if min_delay_us is None:
        min_delay_us = GPU_MIN_DELAY_US if backend == "cuda" else 0.0
    schedule_strategy, decode = _schedule_source(strategy, max_delays, pct_depth, min_delay_us)
    workload_strategy = workloads(hazards=allowed, plan_stream=plan_stream, fixed_iterations=fixed_iterations)
    start = time.perf_counter()
    counts = {"examples": 0, "manifested": 0, "racy": 0}
    first: dict[str, float] = {}
    last_failure: list[Outcome] = []
    racy_workload: list[Workload] = []
    flaky: list[Flaky] = []
    shrinking = [False]
    failing_key: list[tuple[bytes, bytes]] = []
    first_failure: list[Outcome] = []
    drawn_count = [0]  # members drawn so far in the current batch
    failing_draws = [0]  # members the failing batch drew

    prepare = getattr(run, "prepare", None)  # a PreparingExecutor overlaps our host work with the device

    programs: dict[Workload, list] = {}  # workload -> [program, reference loads, happens-before verdict or None]

    def build(workload_data: bytes, schedule_data: bytes) -> _Example:
        """Decode and build one example, with what its verdict needs that does not depend on the run."""
        workload = decode_workload(
            workload_data,
            hazards=allowed,
            max_iterations=MAX_ITERATIONS,
            plan_stream=plan_stream,
            fixed_iterations=fixed_iterations,
        )
        # Hypothesis draws the same workload again and again (about 70% of a GPU search's examples repeat
        # one, under different schedules); its program, reference loads and happens-before verdict depend
        # on the workload alone (designs are deterministic, as replay already requires), so they are
        # built once.
        known = programs.get(workload)
        if known is None:
            if len(programs) >= MAX_BUILT:
                programs.clear()
            program = build_program(workload, design.hooks)
            known = programs[workload] = [program, expected_observations(program), None]
        program, expected, racy = known
        schedule = decode(schedule_data, program)
        if racy is None and not shrinking[0]:  # the verdict only counts while exploring
            racy = known[2] = bool(program.violations or find_races(program))
        racy = bool(racy) and not shrinking[0]
        return _Example((workload_data, schedule_data), workload, program, schedule, expected, racy)

    def settle(example: _Example, started: StartedRun | None) -> None:
        """Finish (or run) `example` and judge it; raises _Manifested on a k-of-k corruption."""
        workload, program, schedule = example.workload, example.program, example.schedule
        execution = started.finish() if started is not None else run(program, schedule)
        corruptions = find_corruptions(program, execution.observations, execution.writers, expected=example.expected)
        if not shrinking[0]:
            counts["examples"] += 1
            if counts["examples"] % COLLECT_EVERY == 0:
                gc.collect()
            if on_example is not None:
                on_example(counts["examples"])
        if corruptions and repeat > 1:
            reproduced = 1 + sum(
                bool(find_corruptions(program, run(program, schedule).observations, expected=example.expected))
                for _ in range(repeat - 1)
            )
            if reproduced < repeat:
                if not shrinking[0]:
                    flaky.append(Flaky(workload, schedule, reproduced, repeat))
                corruptions = []
        if corruptions:
            if not shrinking[0]:
                counts["manifested"] += 1
                first.setdefault("example", counts["examples"])
                first.setdefault("seconds", time.perf_counter() - start)
                first.setdefault("manifested_example", counts["examples"])
                first.setdefault("manifested_seconds", time.perf_counter() - start)
                shrinking[0] = True  # what runs after this is shrinking or Hypothesis' final replay
                failing_key[:] = [example.key]
            last_failure[:] = [Outcome(workload, schedule, program, execution, corruptions, [])]
            if not first_failure:
                first_failure[:] = last_failure
            raise _Manifested
        if example.racy:
            counts["racy"] += 1
            if not racy_workload:
                racy_workload.append(workload)
            first.setdefault("example", counts["examples"])
            first.setdefault("seconds", time.perf_counter() - start)

    def run_batch(draw: Callable[[], tuple[bytes, bytes]]) -> None:
        """Draw, build and run up to `batch` examples in order, keeping the device busy.

        Members are drawn at fixed points -- LOOKAHEAD up front, one more each time a run starts -- so the
        draws depend on the choices alone, as Hypothesis requires. Building and preparing (host work) go
        on whenever a drawn member waits and the device is still running: the host works ahead during
        long runs and spends that work on short ones. Without a PreparingExecutor, one run at a time.
        """
        runnable = batch if shrinking[0] else min(batch, examples - counts["examples"])  # the budget
        draws_left = 2 * batch  # every member is drawn, even past the budget: the same draws from the same choices
        drawn_count[0] = 0
        drawn: deque[tuple[bytes, bytes]] = deque()
        built: deque[_Example] = deque()
        ready: deque[tuple[_Example, PreparedRun | None]] = deque()
        in_flight: tuple[_Example, StartedRun | None] | None = None

        seen: set[tuple[bytes, bytes]] = set()
        members_left = batch

        def draw_next() -> None:
            # A member equal to an earlier one of the batch is drawn again (at most `batch` extra draws a
            # batch) and not run: Hypothesis' first example is all zeros, one trivial example `batch` times
            # over, and its mutations copy draws within a test case (about one member in nine).
            nonlocal draws_left, members_left
            while draws_left and members_left:
                draws_left -= 1
                drawn_count[0] += 1
                member = draw()
                if member not in seen:
                    seen.add(member)
                    members_left -= 1
                    drawn.append(member)
                    return

        for _ in range(LOOKAHEAD):
            draw_next()
        while True:
            if in_flight is None:
                if ready:
                    example, prepared = ready.popleft()
                    in_flight = (example, prepared.start() if prepared is not None else None)
                    draw_next()
                    continue
            elif not (built or (drawn and runnable)) or _finished(in_flight[1], len(ready)):
                settle(*in_flight)
                in_flight = None
                continue
            if built:  # host work, one step at a time so that a finished run is noticed soon
                example = built.popleft()
                ready.append((example, prepare(example.program, example.schedule) if prepare is not None else None))
            elif drawn and runnable:
                runnable -= 1
                built.append(build(*drawn.popleft()))
            else:
                break
        while draws_left and members_left:
            draw_next()

    # Each example is two byte strings, decoded here: one binary() draw each (a third of the cost of
    # drawing the fields). One Hypothesis example runs `batch` examples: a batch pays Hypothesis' own
    # per-example cost (~0.5-1 ms: PRNG seeding, bookkeeping, done while nothing runs) once, and draws its
    # members through st.data() from inside the test, where the draws overlap the device's run of the
    # previous member. A batch of one draws the pair directly: exactly what searches drew before batches.
    pair = st.tuples(workload_bytes(), schedule_strategy)

    # A failing batch is not shrunk as a batch: its other members would cost a replay for every change
    # the shrinker tried on them (10x the runs, measured on the simulator). Its failing member is shrunk
    # alone instead, by `_shrink_alone`.
    @hypothesis_seed(seed)
    @_settings(-(-examples // batch) + (batch > 1), shrink=shrink and batch == 1)  # +1: the all-zeros batch
    @given(pair if batch == 1 else st.data())
    def manifest(drawn: tuple[bytes, bytes] | st.DataObject) -> None:
        if batch == 1:
            assert isinstance(drawn, tuple)
            run_batch(lambda: drawn)
        else:
            assert isinstance(drawn, st.DataObject)
            if shrinking[0]:
                # Hypothesis' replay of the failing batch. Its failure is recorded, k of k; run again on a
                # GPU it could come out otherwise and change the draws, which Hypothesis forbids. So: the
                # same draws, the same verdict, nothing run.
                for _ in range(failing_draws[0]):
                    drawn.draw(pair)
                raise _Manifested
            try:
                run_batch(lambda: drawn.draw(pair))
            except _Manifested:
                failing_draws[0] = drawn_count[0]
                raise

    # A shrink candidate (or Hypothesis' final replay) that failed k/k once and then not is GPU timing on
    # the edge: Hypothesis calls it flaky. The failure first found, which reproduced k/k, stands instead;
    # racefuzz.minimize and the fresh k/k re-check below still apply to it.
    with _fewer_collections(), contextlib.suppress(_Manifested):
        try:
            manifest()
        except FlakyFailure:
            last_failure[:] = first_failure
    if last_failure and shrink and batch > 1:

        def fails(drawn: tuple[bytes, bytes]) -> bool:
            try:
                settle(build(*drawn), None)
            except _Manifested:
                return True
            return False

        try:
            _shrink_alone(fails, failing_key[0], pair, strategy)
        except FlakyFailure:
            last_failure[:] = first_failure
    counterexample = None
    if last_failure:
        failure = last_failure[0]
        if shrink:  # Hypothesis shrank the bytes; now shrink the structure (see racefuzz.minimize)
            workload, schedule = minimize(
                failure.workload, failure.schedule, design, run, repeat=repeat, min_delay_us=max(min_delay_us, 20.0)
            )
            minimized = judge(workload, design, schedule, run)
            # Guard: keep the minimized form only if it still reproduces k/k in fresh runs.
            if repeat == 1 or _reproduces(minimized, run, repeat):
                failure = minimized
        counterexample = explain(failure, backend)
    elif racy_workload:
        witness = racy_workload[0]
        if shrink:
            witness = _shrink_unordered(design, witness, workload_strategy, seed).workload
            witness, _ = minimize(witness, NO_DELAYS, design, None)
        counterexample = judge(witness, design, None, None)

    return SearchResult(
        design=design,
        backend=backend,
        examples=counts["examples"],
        seconds=time.perf_counter() - start,
        counterexample=counterexample,
        first_detection_example=int(first["example"]) if "example" in first else None,
        first_detection_seconds=first.get("seconds"),
        manifested_examples=counts["manifested"],
        racy_examples=counts["racy"],
        flaky=flaky,
        repeat=repeat,
        strategy=strategy,
        first_manifested_example=int(first["manifested_example"]) if "manifested_example" in first else None,
        first_manifested_seconds=first.get("manifested_seconds"),
    )


@contextlib.contextmanager
def _fewer_collections():
    """Pause the cyclic garbage collector while searching (the search collects every COLLECT_EVERY
    examples itself), restoring it after.

    Every example allocates thousands of short-lived IR tuples and arrays, which reference counting frees;
    the cyclic collector still ran every few hundred allocations and cost ~25% of a simulator search
    (measured on one core: 360 -> 456 examples/s with it off). Collecting explicitly now and then keeps
    memory bounded for the few cycles (Hypothesis' own bookkeeping).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


COLLECT_EVERY = 2000


GPU_MIN_DELAY_US = 300.0
"""The shortest random delay on the GPU: far above real launch (~10 us) and kernel costs, so that a
counterexample's verdict does not hang on them (see `search`)."""


def _finished(started: StartedRun | None, prepared_ahead: int) -> bool:
    """Whether to wait for `started` now: the device has finished it, or -- for a run without `done()`,
    which cannot say -- the next member is already prepared."""
    if started is None:
        return True
    done = getattr(started, "done", None)
    return prepared_ahead > 0 if done is None else bool(done())


def _reproduces(outcome: Outcome, run: Executor, repeat: int) -> bool:
    return bool(outcome.corruptions) and all(
        bool(find_corruptions(outcome.program, run(outcome.program, outcome.schedule).observations))
        for _ in range(repeat)
    )


def _schedule_source(
    strategy: str, max_delays: int, pct_depth: int, min_delay_us: float = 0.0
) -> tuple[st.SearchStrategy[bytes], Callable[[bytes, Program], Schedule]]:
    """The byte strategy a delay strategy draws from, and its decoder onto a program."""
    if strategy == "pct":
        return pct_bytes(pct_depth), lambda data, program: decode_pct_schedule(
            data, program, depth=pct_depth, min_delay_us=min_delay_us
        )
    if strategy == "none":
        return st.just(b""), lambda data, program: NO_DELAYS
    return schedule_bytes(max_delays), lambda data, program: decode_schedule(data, program, min_delay_us=min_delay_us)


def explain(outcome: Outcome, backend: str) -> Outcome:
    """Complete a counterexample for its report: its races, and on the simulator who stored each bad value."""
    races = find_races(outcome.program)
    if backend != "sim":
        return Outcome(
            outcome.workload, outcome.schedule, outcome.program, outcome.execution, outcome.corruptions, races
        )
    from racefuzz.sim import simulate

    execution = simulate(outcome.program, outcome.schedule, track_writers=True)
    corruptions = find_corruptions(outcome.program, execution.observations, execution.writers)
    return Outcome(outcome.workload, outcome.schedule, outcome.program, execution, corruptions, races)


def _shrink_alone(
    fails: Callable[[tuple[bytes, bytes]], bool],
    failing: tuple[bytes, bytes],
    pair: st.SearchStrategy[tuple[bytes, bytes]],
    strategy: str,
) -> None:
    """Let Hypothesis shrink one failing (workload bytes, schedule bytes) pair on its own.

    Hypothesis shrinks a failure it finds in its example database before anything else; the pair is put
    into a private in-memory database, serialized as Hypothesis serializes its own entries (one choice per
    binary() draw; none for the `none` strategy's constant schedule), under the key of the non-minimal
    ("secondary") corpus, which Hypothesis replays and then shrinks. `fails` records each failure it sees,
    so the caller's last recorded failure is the minimal one. If this Hypothesis cannot replay the entry
    (its database format changed) or the pair no longer fails, nothing is shrunk here: `racefuzz.minimize`
    still simplifies the failure found.

    No seed: Hypothesis turns its database off for seeded tests. Its shrinker is deterministic in effect
    (the same failure shrank to the same counterexample in separate processes, checked on the simulator).
    """
    from hypothesis import find
    from hypothesis.database import InMemoryExampleDatabase
    from hypothesis.errors import NoSuchExample

    try:
        from hypothesis.database import choices_to_bytes
    except ImportError:  # not public API: a future Hypothesis may move it
        return
    database = InMemoryExampleDatabase()
    key = b"racefuzz-shrink"
    choices = failing[:1] if strategy == "none" else failing
    database.save(key + b".secondary", choices_to_bytes(choices))
    shrink_settings = settings(_settings(1000, shrink=True), database=database, phases=[Phase.reuse, Phase.shrink])
    with contextlib.suppress(NoSuchExample):
        find(pair, fails, settings=shrink_settings, database_key=key)


def _shrink_unordered(design: Design, witness: Workload, strategy, seed: int) -> Outcome:
    """A minimal workload with an unordered conflicting pair, starting from a known racy `witness`."""
    from hypothesis import example

    found: list[Outcome] = []

    @hypothesis_seed(seed)
    @_settings(200)
    @example(witness)
    @given(strategy)
    def unordered(workload: Workload) -> None:
        outcome = judge(workload, design, None, None)
        if outcome.races or outcome.violations:
            found[:] = [outcome]
            raise _Unordered

    with contextlib.suppress(_Unordered):
        unordered()
    assert found, "the witness workload is racy, so the search must fail"
    return found[0]
