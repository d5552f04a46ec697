"""The search: Hypothesis draws workloads and delay schedules, a backend runs them, two oracles judge.

`Search` runs up to `examples` examples of one design. Each draws a workload (from the design's
scenario) and a delay schedule (from a strategy of `racefuzz.schedulers`), builds the program, runs it,
and judges it (`racefuzz.search.outcome`). Failures saved by earlier runs (`racefuzz.search.corpus`) are
tried first. On the GPU one Hypothesis example is a batch of examples run while the host works ahead
(`racefuzz.search.pipeline`). A manifested corruption fails the Hypothesis test, which shrinks it; a
failure is then finished -- minimized, re-checked k/k, explained -- by `racefuzz.search.finish`.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

from hypothesis import given
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.errors import FlakyFailure

from racefuzz.backends import Executor, StartedRun
from racefuzz.confirm import confirm
from racefuzz.designs import Design
from racefuzz.errors import InvalidArgument
from racefuzz.hb import analysis
from racefuzz.memory import in_order_loads
from racefuzz.oracle import find_corruptions
from racefuzz.phases import SEARCH_PHASES, PhaseClock, StopReason
from racefuzz.results import Flaky, Outcome, SearchResult
from racefuzz.scenarios import Workload, check_hazards
from racefuzz.schedule import ScheduleInfeasible
from racefuzz.schedulers import DEFAULT_STRATEGY, delay_strategy
from racefuzz.search.corpus import Corpus, corpus_key
from racefuzz.search.finish import finish_manifested, finish_unordered, search_settings, shrink_alone
from racefuzz.search.outcome import explain, judge
from racefuzz.search.pipeline import Batch, Draw, Example

if TYPE_CHECKING:
    from hypothesis.database import ExampleDatabase

DEFAULT_GPU_BATCH = 32
"""Examples per Hypothesis example on the GPU, unless `batch` says otherwise (see `search`)."""

MAX_BUILT = 4096
"""Programs a search keeps for workloads it draws again (it forgets them all when it has this many)."""

DEFAULT_SIM_BATCH = 8
"""Examples per Hypothesis example on the simulator: Hypothesis' own cost per example (~1 ms: seeding and
restoring the PRNGs, bookkeeping) is paid once for eight, which more than doubles the examples a second;
a failing member is shrunk alone, as on the GPU."""

DEFAULT_GPU_REPEAT = 5
"""k of k: how many runs a manifested race must reproduce in on the GPU, unless `repeat` says otherwise."""

GPU_MIN_DELAY_US = 300.0
"""The shortest random delay on the GPU: far above real launch (~10 us) and kernel costs, so that a
counterexample's verdict does not hang on them (see `search`)."""

COLLECT_EVERY = 2000
"""The search pauses the cyclic garbage collector and collects every this many examples itself."""


class _Manifested(Exception):
    """Raised inside the Hypothesis test when an example's loads differ from the reference k of k."""


class _BudgetSpent(Exception):
    """Raised inside the Hypothesis test (batches of more than one) by the batch that spent the budget."""


class Search:
    """One search's state, by name: what it counts, what it found, whether it is shrinking.

    Everything that does not depend on the run -- a workload's program, its reference loads and its
    happens-before verdict -- is built once per workload (about 70% of a GPU search's examples repeat one
    under another schedule; designs are deterministic, as replay already requires).
    """

    def __init__(
        self,
        design: Design,
        run: Executor,
        *,
        backend: str,
        examples: int,
        seed: int,
        hazards: frozenset[str],
        workload_options: dict[str, object],
        shrink: bool,
        repeat: int,
        batch: int,
        strategy: str,
        max_delays: int,
        pct_depth: int | None,
        min_delay_us: float,
        on_example: Callable[[int], None] | None,
        database: ExampleDatabase | None,
    ) -> None:
        self.design, self.run_program, self.backend = design, run, backend
        self.examples, self.seed, self.shrink, self.repeat, self.batch = examples, seed, shrink, repeat, batch
        self.strategy, self.min_delay_us, self.on_example = strategy, min_delay_us, on_example
        self.space = design.scenario.workload_space(hazards, **workload_options)
        self.scheduler = delay_strategy(strategy, max_delays=max_delays, pct_depth=pct_depth, min_delay_us=min_delay_us)
        self.pair = st.tuples(self.space.strategy(), self.scheduler.strategy())
        self.corpus = Corpus(
            database,
            corpus_key(
                scenario=design.scenario.name,
                design=design.spec,
                hazards=hazards,
                options=workload_options,
                strategy=strategy,
                max_delays=max_delays,
                pct_depth=pct_depth,
                min_delay_us=min_delay_us,
            ),
        )
        self.prepare = getattr(run, "prepare", None)  # a PreparingExecutor overlaps our host work with the device
        self.programs: dict[Workload, list] = {}  # workload -> [workload, program, reference loads, racy or None]
        self.decoded: dict[bytes, list] = {}  # workload bytes -> the entry of `programs` they decode to
        self.start = time.perf_counter()
        self.counted = 0  # examples judged while exploring (not shrinking)
        self.manifested = 0
        self.racy = 0
        self.replayed = 0
        self.infeasible = 0  # runs whose forced orders could not be realized (not judged)
        self.first_detection: tuple[int, float] | None = None
        self.first_manifested: tuple[int, float] | None = None
        self.flaky: list[Flaky] = []
        self.shrinking = False  # set at the first k/k failure: what runs after is shrinking or a final replay
        self.first_failure: Outcome | None = None  # the failure first found (reproduced k/k)
        self.last_failure: Outcome | None = None  # the latest failure seen: the smallest, once shrinking ends
        self.failing_draw: Draw | None = None  # the draw of `first_failure`
        self.last_failing_draw: Draw | None = None
        self.racy_witness: tuple[Workload, Draw] | None = None
        self.failing_batch_draws = 0  # draws the failing batch made, for Hypothesis' replay of it
        self.clock = PhaseClock(SEARCH_PHASES)  # the phase now running, what each has cost

    # -- runs ----------------------------------------------------------------------------------------------

    def execute(self, program, schedule):
        """One run of `program` by the backend, counted in the phase now running."""
        self.clock.count_run()
        return self.run_program(program, schedule)

    # -- one example -------------------------------------------------------------------------------------

    def build(self, workload_data: bytes, schedule_data: bytes) -> Example:
        """Decode and build one example, with what its verdict needs that does not depend on the run."""
        known = self.decoded.get(workload_data)
        if known is None:
            workload = self.space.decode(workload_data)
            known = self.programs.get(workload)
            if known is None:
                if len(self.programs) >= MAX_BUILT:
                    self.programs.clear()
                program = self.design.scenario.build_program(workload, self.design.hooks)
                known = self.programs[workload] = [workload, program, in_order_loads(program), None]
            if len(self.decoded) >= MAX_BUILT:
                self.decoded.clear()
            self.decoded[workload_data] = known
        workload, program, expected, racy = known
        schedule = self.scheduler.decode(schedule_data, program)
        if racy is None and not self.shrinking:  # the verdict only counts while exploring
            # `analysis` holds the races and the launch ordering the forced-order strategies decode with (and
            # the simulator's shortcut needs): one happens-before pass for all three.
            racy = known[3] = bool(program.violations or analysis(program).races)
        racy = bool(racy) and not self.shrinking
        return Example((workload_data, schedule_data), workload, program, schedule, expected, racy)

    def settle(self, example: Example, started: StartedRun | None) -> None:
        """Finish (or run) `example` and judge it; raises _Manifested on a k-of-k corruption."""
        workload, program, schedule = example.workload, example.program, example.schedule
        try:
            if started is not None:
                self.clock.count_run()
                execution = started.finish()
            else:
                execution = self.execute(program, schedule)
        except ScheduleInfeasible:
            # A forced order the run could not realize (on the GPU: a gate's wait timed out): no run to judge,
            # and not an error of the search; it is counted and reported. Happens-before judges the workload
            # for every schedule, so its verdict still counts.
            self.infeasible += 1
            self._note_racy(example)
            return
        # The simulator returns the very reference object for a run that applied every conflict in issue order.
        observed = execution.observations
        corruptions = (
            []
            if observed is example.expected
            else find_corruptions(program, observed, execution.writers, expected=example.expected)
        )
        if not self.shrinking:
            self.counted += 1
            if self.counted % COLLECT_EVERY == 0:
                gc.collect()
            if self.on_example is not None:
                self.on_example(self.counted)
        if corruptions:
            # This run manifested; k - 1 more must (`racefuzz.confirm`), all of them made for the flaky rate.
            confirmation = confirm(lambda: self._reproduces(example), self.repeat, seen=1)
            if not confirmation.confirmed:
                if not self.shrinking:
                    self.flaky.append(Flaky(workload, schedule, confirmation.reproduced, confirmation.runs))
                corruptions = []
        if corruptions:
            if not self.shrinking:
                self.manifested += 1
                self._detected(manifested=True)
                self.shrinking = True
                self.clock.enter("shrink")
                self.failing_draw = example.key
            self.last_failure = Outcome(workload, schedule, program, execution, corruptions, [])
            self.last_failing_draw = example.key
            if self.first_failure is None:
                self.first_failure = self.last_failure
            raise _Manifested
        self._note_racy(example)

    def _note_racy(self, example: Example) -> None:
        """Count a workload with an unordered conflicting pair (happens-before's verdict, schedule-free)."""
        if example.racy:
            self.racy += 1
            if self.racy_witness is None:
                self.racy_witness = (example.workload, example.key)
            self._detected(manifested=False)

    def _reproduces(self, example: Example) -> bool:
        """One re-run of `example` for the k-of-k check; a re-run whose forced orders could not be realized
        did not reproduce."""
        try:
            execution = self.execute(example.program, example.schedule)
        except ScheduleInfeasible:
            self.infeasible += 1
            return False
        return bool(find_corruptions(example.program, execution.observations, expected=example.expected))

    def _detected(self, *, manifested: bool) -> None:
        now = (self.counted, time.perf_counter() - self.start)
        if self.first_detection is None:
            self.first_detection = now
        if manifested and self.first_manifested is None:
            self.first_manifested = now

    def _batch(self, size: int) -> Batch[Example]:
        runnable = size if self.shrinking else min(size, self.examples - self.counted)  # the budget
        return Batch(size, runnable, self.build, self.settle, self.prepare)

    def fails(self, draw: Draw) -> bool:
        """Whether `draw` fails k of k (for shrinking a single member)."""
        try:
            self.settle(self.build(*draw), None)
        except _Manifested:
            return True
        return False

    # -- the phases --------------------------------------------------------------------------------------

    def replay_saved(self) -> None:
        """Try the failures saved by earlier runs first; forget those that no longer fail."""
        passed = []
        for draw in self.corpus.saved():
            if self.counted >= self.examples:
                break
            self.replayed += 1
            racy_before = self.racy
            try:
                self._batch(1).run(lambda draw=draw: draw)
            except _Manifested:
                return
            if self.racy == racy_before:
                passed.append(draw)
        self.corpus.delete(passed)

    def explore(self) -> None:
        """The Hypothesis search: `examples` examples in batches of `batch`, shrinking a failure of a batch of one."""
        batch, pair = self.batch, self.pair
        if self.counted >= self.examples:
            return
        self.clock.enter("generate")

        # A failing batch is not shrunk as a batch: its other members would cost a replay for every change
        # the shrinker tried on them (10x the runs, measured on the simulator). Its failing member is shrunk
        # alone instead (`finish.shrink_alone`).
        budget = self.examples - self.counted

        hypothesis_examples = -(-budget // batch) + (batch > 1)  # +1: the all-zeros batch

        @hypothesis_seed(self.seed)
        @search_settings(hypothesis_examples, shrink=self.shrink and batch == 1)
        @given(pair if batch == 1 else st.data())
        def manifest(drawn: Draw | st.DataObject) -> None:
            if batch == 1:
                assert isinstance(drawn, tuple)
                self._batch(1).run(lambda: drawn)
                return
            assert isinstance(drawn, st.DataObject)
            if self.shrinking:
                # Hypothesis' replay of the failing batch. Its failure is recorded, k of k; run again on a GPU
                # it could come out otherwise and change the draws, which Hypothesis forbids. So: the same
                # draws, the same verdict, nothing run.
                for _ in range(self.failing_batch_draws):
                    drawn.draw(pair)
                raise _Manifested
            members = self._batch(batch)
            try:
                members.run(_drawer(drawn, pair))
            except _Manifested:
                self.failing_batch_draws = members.draws
                raise
            if self.counted >= self.examples:
                # The budget is spent: end Hypothesis' run here rather than let it go on drawing batches that
                # run nothing until it has `hypothesis_examples` valid ones (a batch with a repeated member
                # overruns and is not valid; Hypothesis' mutations make one in three so, and the batches after
                # the budget cost as much again as the search). Raised after this batch's last draw, so that
                # Hypothesis' final replay of it (the budget still spent) draws the same and raises the same.
                raise _BudgetSpent

        # A shrink candidate (or Hypothesis' final replay) that failed k/k once and then not is GPU timing on
        # the edge: Hypothesis calls it flaky. The failure first found, which reproduced k/k, stands instead.
        with contextlib.suppress(_Manifested, _BudgetSpent):
            try:
                manifest()
            except FlakyFailure as flaky:
                _raise_unless_manifested(flaky)
                self.last_failure = self.first_failure
                self.last_failing_draw = self.failing_draw

    def shrink_member(self) -> None:
        """Shrink a failure that Hypothesis did not shrink in `explore` (a batch's member, a saved failure)."""
        assert self.failing_draw is not None
        import hypothesis.errors

        # `Found` is not public API: a Hypothesis without it excuses nothing more.
        found: tuple[type[BaseException], ...] = tuple(
            cls for cls in (getattr(hypothesis.errors, "Found", None),) if isinstance(cls, type)
        )
        try:
            shrink_alone(self.fails, self.failing_draw, self.pair, constant_schedule=self.strategy == "none")
        except FlakyFailure as flaky:
            # Shrinking runs under `hypothesis.find`, whose own success signal is `Found`: a failure that
            # held once and then not (GPU timing on the edge) comes back as a flaky `Found`.
            _raise_unless_manifested(flaky, also=found)
            self.last_failure = self.first_failure
            self.last_failing_draw = self.failing_draw

    def result(self) -> SearchResult:
        """Run the phases and finish what they found. A stop at a checkpoint (Ctrl-C or the per-example
        watchdog, `racefuzz.watchdog`) propagates with what was found so far on the exception's `partial`."""
        try:
            return self._run_phases()
        except KeyboardInterrupt as stop:
            stop.partial = self.partial(StopReason.INTERRUPTED)  # type: ignore[attr-defined]
            raise

    def partial(self, reason: StopReason) -> SearchResult:
        """What was found so far, not minimized: the latest failure explained, else a racy witness judged;
        `reason`: why the search stopped there."""
        counterexample = None
        if self.last_failure is not None:
            self.corpus.save(self.last_failing_draw or self.failing_draw)  # type: ignore[arg-type]
            counterexample = explain(self.last_failure, self.backend)
        elif self.racy_witness is not None:
            counterexample = judge(self.racy_witness[0], self.design, None, None)
        return self._summary(counterexample, reason)

    def _run_phases(self) -> SearchResult:
        with _fewer_collections():
            self.replay_saved()
            from_corpus = self.first_failure is not None
            if not from_corpus:
                self.explore()
        counterexample = None
        if self.last_failure is not None:
            if self.shrink and (self.batch > 1 or from_corpus):
                self.shrink_member()
            assert self.last_failure is not None
            self.corpus.save(self.last_failing_draw or self.failing_draw)  # type: ignore[arg-type]
            self.clock.enter("minimize")
            counterexample = finish_manifested(
                self.last_failure,
                self.design,
                self.execute,
                self.backend,
                shrink=self.shrink,
                repeat=self.repeat,
                min_delay_us=self.min_delay_us,
            )
        elif self.racy_witness is not None:
            witness, draw = self.racy_witness
            self.corpus.save(draw)
            self.clock.enter("minimize")
            workloads = self.space.strategy().map(self.space.decode)
            counterexample = finish_unordered(witness, self.design, workloads, self.seed, shrink=self.shrink)
        if counterexample is not None:
            reason = StopReason.FOUND
        elif self.counted + self.infeasible < self.examples:  # Hypothesis stopped drawing before the budget
            reason = StopReason.EXHAUSTED
        else:
            reason = StopReason.EXAMPLES
        return self._summary(counterexample, reason)

    def _summary(self, counterexample: Outcome | None, reason: StopReason) -> SearchResult:
        phases = self.clock.statistics()  # before the total, which then includes every phase
        detection, manifested = self.first_detection, self.first_manifested
        return SearchResult(
            design=self.design,
            backend=self.backend,
            examples=self.counted,
            seconds=time.perf_counter() - self.start,
            counterexample=counterexample,
            first_detection_example=detection[0] if detection else None,
            first_detection_seconds=detection[1] if detection else None,
            manifested_examples=self.manifested,
            racy_examples=self.racy,
            flaky=self.flaky,
            repeat=self.repeat,
            strategy=self.strategy,
            first_manifested_example=manifested[0] if manifested else None,
            first_manifested_seconds=manifested[1] if manifested else None,
            replayed=self.replayed,
            infeasible=self.infeasible,
            stop_reason=reason,
            budget=self.examples,
            phases=phases,
        )


def _drawer(drawn: st.DataObject, pair: st.SearchStrategy[Draw]) -> Callable[[], Draw]:
    """`drawn.draw(pair)` as a function of no arguments, drawing the same choices without `DataObject.draw`'s
    per-draw wrapping (it copies the global PRNG's state twice to warn about strategies that use `random`,
    ~20 us a draw, and formats a note for the failure report) when the Hypothesis in use exposes the test
    case's `conjecture_data` (6.x does): the draws are the pipeline's own, never a user's strategy, and a
    failing member is reported by racefuzz, not by Hypothesis' notes."""
    data = getattr(drawn, "conjecture_data", None)
    direct = getattr(data, "draw", None)
    if direct is None:
        return lambda: drawn.draw(pair)
    return lambda: direct(pair)


def _raise_unless_manifested(flaky: FlakyFailure, also: tuple[type[BaseException], ...] = ()) -> None:
    """A flaky failure made only of racefuzz's own k-of-k signal (or of the signals in `also`) is GPU timing
    on the edge (the caller falls back to the failure first found). Anything else inside it -- a backend
    error raised once, a hook that raised -- is a real error: re-raise the first, never let it pass for
    "no race"."""
    for exc in flaky.exceptions:
        if not isinstance(exc, (_Manifested, _BudgetSpent, *also)):
            raise exc


def search(
    design: Design,
    run: Executor,
    *,
    backend: str = "sim",
    examples: int = 200,
    seed: int = 0,
    hazards: Collection[str] | None = None,
    max_delays: int = 4,
    shrink: bool = True,
    repeat: int | None = None,
    on_example: Callable[[int], None] | None = None,
    strategy: str = DEFAULT_STRATEGY,
    pct_depth: int | None = None,
    min_delay_us: float | None = None,
    batch: int | None = None,
    database: ExampleDatabase | None = None,
    **workload_options: object,
) -> SearchResult:
    """Search `examples` examples for a race of `design`; see the module docstring.

    `hazards`: the hazards of the design's scenario to draw (default: the scenario's `hazards`);
    `workload_options` go to the scenario's workload space (for sglang's overlap loop: `plan_stream`,
    `fixed_iterations`, `max_requests`, `max_iterations`); an unknown one is an InvalidArgument.

    `strategy` picks the schedules (`racefuzz.schedulers.STRATEGIES`: `random` with up to `max_delays` delays,
    `pct` of depth `pct_depth`, `orders` and `interleave` (forced orders, up to `max_delays`), `none`).

    `repeat` (k): an example whose loads differ is re-run until it has run k times, and counts as a
    manifested race only when all k runs differ; otherwise it is recorded in `SearchResult.flaky` with its
    rate and the search goes on. Shrinking applies the same rule to every candidate, so it cannot turn a
    k/k failure into a flaky one. The default is DEFAULT_GPU_REPEAT on `cuda` and 1 on the simulator, which
    is deterministic.

    `batch`: racefuzz examples per Hypothesis example (default DEFAULT_GPU_BATCH on `cuda`, DEFAULT_SIM_BATCH
    on the simulator; a batch of one draws exactly what an unbatched search drew). When `run` is a
    `PreparingExecutor` (the CUDA backend is) the search draws, builds, judges ahead and prepares example
    i+1 while the device runs example i. The search stops at the first failing member (even mid-batch),
    which is then shrunk alone; it also stops at `examples` examples, even mid-batch.

    `min_delay_us` is added to every random or PCT delay (default: GPU_MIN_DELAY_US on `cuda`, 0 on `sim`). On
    the GPU a counterexample must stay delay-dominated: shrunk to a 40 us spin, a race sits on the edge of
    the real launch costs and reproduces 3 or 4 times in 5 (seen on an H200). The finished counterexample
    is re-checked k/k in fresh runs; if it no longer reproduces, the least-shrunk failure that does is
    reported instead.

    `database`: a Hypothesis `ExampleDatabase` in which failures are saved and from which they are tried
    first on the next search of the same key (`racefuzz.search.corpus`); None (the default here) keeps
    nothing. The CLI and the pytest plugin pass one.
    """
    if repeat is None:
        repeat = DEFAULT_GPU_REPEAT if backend == "cuda" else 1
    if repeat < 1:
        raise InvalidArgument(f"repeat must be >= 1, got {repeat}")
    if batch is None:
        batch = DEFAULT_GPU_BATCH if backend == "cuda" else DEFAULT_SIM_BATCH
    if batch < 1:
        raise InvalidArgument(f"batch must be >= 1, got {batch}")
    if min_delay_us is None:
        min_delay_us = GPU_MIN_DELAY_US if backend == "cuda" else 0.0
    scenario = design.scenario
    allowed = check_hazards(scenario, scenario.hazards if hazards is None else hazards)
    return Search(
        design,
        run,
        backend=backend,
        examples=examples,
        seed=seed,
        hazards=allowed,
        workload_options=workload_options,
        shrink=shrink,
        repeat=repeat,
        batch=batch,
        strategy=strategy,
        max_delays=max_delays,
        pct_depth=pct_depth,
        min_delay_us=min_delay_us,
        on_example=on_example,
        database=database,
    ).result()


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
