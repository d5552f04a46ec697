"""Fuzzing a traced step: record the serialized reference run, judge it with happens-before, then search
schedules -- delay points and forced orders -- with Hypothesis for a run whose values differ, shrink it,
and confirm it k times of k.

A manifestation is a divergence the schedule causes. Before the search the step is run serialized again,
without any delay (`SERIALIZED_REPEATS` more times): what differs between those runs (a nondeterministic
kernel's stores, and what depends on them) is not compared (`racefuzz.trace.oracle.masked`) and is named
once in the report. A divergence the search finds then counts only if `confirm` more serialized runs
without the schedule agree with the reference where it is compared (else what differed there is learned
too and the search goes on) and the schedule reproduces it k of k (`racefuzz.confirm`). A step whose launch
sequence differs between serialized runs cannot be judged by values at all: the report says so.

A schedule is the core's `racefuzz.schedule.Schedule` keyed by launch points (stream, n-th launch on that
stream). A delay point (stream, n, microseconds) is a spin enqueued on that stream just before that
launch; a forced order (first, then) holds `then` back on its stream until `first` has completed
(`racefuzz.trace.orders`: the CUDA backend's gates). Delay points are drawn among the reference run's
launches, orders among the candidates its races give (`candidate_orders`), kept only where they cannot
deadlock (`OrderFacts`); Hypothesis shrinks a failing schedule to fewer and earlier points and orders. On
the CPU the step executes eagerly and neither changes anything, so there the verdict is the
happens-before one alone (the search is skipped and says so, with the candidate orders it would force).
"""

from __future__ import annotations

import importlib
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from racefuzz.confirm import Confirmation
from racefuzz.confirm import confirm as confirm_k_of_k
from racefuzz.errors import BackendUnavailable, InvalidArgument, UserCodeError
from racefuzz.phases import TRACE_PHASES, PhaseClock, PhaseStatistics, StopReason, stop_line
from racefuzz.program import Launch
from racefuzz.schedule import NO_DELAYS, Schedule, ScheduleInfeasible
from racefuzz.trace.builder import launch_source
from racefuzz.trace.judge import TraceRace, judge
from racefuzz.trace.oracle import Divergence, Nondeterminism, compare, masked, nondeterminism
from racefuzz.trace.orders import (
    GATE_TIMEOUT_US,
    Gates,
    OrderFacts,
    PointOrder,
    candidate_orders,
    describe_order,
    gate_kernels,
    gates_unavailable,
    launch_points,
    real_code_schedule,
)
from racefuzz.trace.orders import (
    launch_points_by_op as launch_points_by_op,  # re-exported: where the search counts its points
)
from racefuzz.trace.recorder import Recorder, RunRecord

Step = Callable[[Any], Mapping[str, Any] | None]
"""A step: takes a `TraceEnv`, runs real code, returns the tensors the value oracle compares (or None)."""

DelayPoint = tuple[str, int, float]
"""(stream, n-th launch on it (0-based), microseconds of spin before it)."""

DELAYS_US = (5000.0, 1000.0, 200.0, 20.0)
"""Spin lengths a delay point draws from; Hypothesis shrinks towards the first (the longest, which
manifests most reliably: shrinking is for fewer delay points, not shorter ones)."""

SERIALIZED_REPEATS = 2
"""Serialized runs without any delay made after the reference run, before the search: what differs among
these three runs is nondeterministic, not the schedule's doing."""


class SavedFailures(Protocol):
    """Where failing delay sets are kept between runs and tried first (`racefuzz.search.corpus.TraceCorpus`:
    the example database of `racefuzz run`)."""

    def saved(self) -> list[list[DelayPoint]]: ...

    def save(self, delays: Sequence[DelayPoint]) -> None: ...

    def delete(self, delays: Sequence[DelayPoint]) -> None: ...


Choices = tuple[Any, ...]
"""A drawn workload's Hypothesis choice sequence: replayed through the same strategy, it draws it again."""


class SavedWorkloads(Protocol):
    """Where a step's failing workloads are kept between runs and tried first (`racefuzz.search.corpus.
    WorkloadCorpus`), as their choice sequences under the strategy they were drawn from."""

    def saved(self) -> list[Choices]: ...

    def save(self, choices: Choices, workload: Any) -> None: ...

    def delete(self, choices: Choices) -> None: ...


SHRINK_RUNS = 200
"""Runs of the step a workload search's shrinking may make by default (each is one recording)."""

RaceKey = tuple[str, ...]
"""What makes a workload fail "the same way" while it is shrunk: a race's kind and both accesses' source
lines, or (`value`, the divergence's kind, its launch's source) for a value-only manifestation."""


@dataclass
class WorkloadSearch:
    """How the workloads of a step that takes one (`fuzz(step, workloads=...)`) were searched.

    Args:
        workload: the shrunk failing workload (None: no drawn workload failed).
        drawn: that failure's workload as first drawn, before shrinking.
        choices: `workload`'s Hypothesis choice sequence (what the failure database keeps).
        race: the failure's key (`RaceKey`): every shrunk candidate had to fail with it.
        examples: workloads drawn and run before the first failure (or all of them: none failed).
        shrink_runs: runs of the step the shrinking made (candidates already judged are not run again);
            `shrink_capped`: it stopped at its budget, so `workload` is the smallest found, not a minimum.
        confirmed / confirm_runs: re-recordings of `workload` that failed with `race` (k of k counts).
        replayed: saved failing workloads tried before drawing any.
        stop_reason / phases: why the workload search stopped and what each phase cost (`racefuzz.phases`;
            a run is a judgement of one workload: its recording and, on a GPU, its delay search).
    """

    workload: Any = None
    drawn: Any = None
    choices: Choices = ()
    race: RaceKey = ()
    examples: int = 0
    shrink_runs: int = 0
    shrink_capped: bool = False
    confirmed: int = 0
    confirm_runs: int = 0
    replayed: int = 0
    stop_reason: StopReason = StopReason.EXAMPLES
    phases: tuple[PhaseStatistics, ...] = ()
    budget: int = 0

    @property
    def confirmation(self) -> Confirmation | None:
        return None if self.workload is None else Confirmation(self.confirmed, self.confirm_runs)

    def statistics_line(self) -> str:
        """`stopped: ...; phases: ...` of the workload search (`racefuzz.phases.stop_line`)."""
        return "workloads " + stop_line(self.stop_reason, self.phases, self.examples, self.budget)


@dataclass
class TraceResult:
    """What fuzzing one step found.

    Args:
        step: `module:function` (or the function's qualified name when not importable by that).
        device: `cuda` or `cpu`.
        reference: the serialized reference run.
        races: the happens-before races of the reference trace.
        divergence: the value oracle's finding under `schedule`, or None.
        schedule: the shrunk schedule that made it manifest (launch points: its `delays` and `orders`).
        confirmed: how many of `confirm_runs` re-runs of `schedule` manifested; the divergence counts only
            when all did (`racefuzz.confirm`: k of k), else it is flaky, reported with its rate.
        examples: fuzzed runs made; seconds: the search's wall time.
        nondeterministic: what differed between serialized runs without any delay (not compared).
        serialized_runs: the serialized runs without delays compared, the reference run included.
        skipped: why the value search did not run, as the report words it ("": it ran).
        replayed: saved failing delay sets (`SavedFailures`) tried before the search.
        latent: latent lifetime hazards of the reference trace (`racefuzz.trace.judge.judge`): uses
            pending at a free that no later allocation in the trace reuses; said, not counted as races.
        workloads: for a step over drawn workloads, how they were searched; the rest of the result is then
            the judgement of its shrunk failing workload (or, none failing, of the last one run).
        candidate_orders: the forced orders the reference run's races give (`candidate_orders`), searched
            on a GPU, reported on the CPU (where they cannot be forced).
        orders_unsearched: why the search drew no forced order though there are candidates ("": it did,
            or it did not run at all: `skipped`).
        infeasible: fuzzed runs whose gate timed out (an order the run could not keep): not judged.
        stop_reason / phases / budget: why the value search stopped, what each of `TRACE_PHASES` cost
            (runs of the step), and the fuzzed runs asked for (`racefuzz.phases`).
    """

    step: str
    device: str
    reference: RunRecord
    races: list[TraceRace]
    divergence: Divergence | None = None
    schedule: Schedule = NO_DELAYS
    confirmed: int = 0
    confirm_runs: int = 0
    examples: int = 0
    seconds: float = 0.0
    nondeterministic: Nondeterminism = field(default_factory=Nondeterminism)
    serialized_runs: int = 1
    skipped: str = ""
    replayed: int = 0
    latent: list[TraceRace] = field(default_factory=list)
    workloads: WorkloadSearch | None = None
    candidate_orders: list[PointOrder] = field(default_factory=list)
    orders_unsearched: str = ""
    infeasible: int = 0
    stop_reason: StopReason = StopReason.SKIPPED
    phases: tuple[PhaseStatistics, ...] = ()
    budget: int = 0

    def statistics_line(self) -> str:
        """`stopped: ...; phases: ...` of the value search (`racefuzz.phases.stop_line`)."""
        return stop_line(self.stop_reason, self.phases, self.examples, self.budget)

    @property
    def delays(self) -> list[DelayPoint]:
        """The schedule's delay points, (stream, n, microseconds), in point order."""
        return [(stream, n, us) for (stream, n), us in self.schedule.device_delays.items()]

    @property
    def orders(self) -> list[PointOrder]:
        """The schedule's forced orders, (first, then) launch points."""
        return list(self.schedule.orders)

    @property
    def searched(self) -> bool:
        """Whether the value search ran."""
        return not self.skipped

    @property
    def confirmation(self) -> Confirmation | None:
        """The divergence's confirmation (None: nothing diverged)."""
        return None if self.divergence is None else Confirmation(self.confirmed, self.confirm_runs)

    @property
    def manifested(self) -> bool:
        """Whether the divergence counts: it showed again in every one of the k re-runs."""
        confirmation = self.confirmation
        return confirmation is not None and confirmation.confirmed

    @property
    def racy(self) -> bool:
        """A race: happens-before's (it does not depend on the schedule), or a divergence confirmed k of k. A
        divergence confirmed fewer times is flaky: reported, not a race. Over drawn workloads, the shrunk
        workload must also have failed the same way in each of its k re-recordings."""
        found = bool(self.races) or self.manifested
        if self.workloads is None or not found:
            return found
        confirmation = self.workloads.confirmation
        return confirmation is not None and confirmation.confirmed

    @property
    def value_only(self) -> bool:
        """A race the values show and happens-before does not (see the report for why it can be)."""
        return self.manifested and not self.races


def step_name(step: Step) -> str:
    module, name = getattr(step, "__module__", None), getattr(step, "__qualname__", repr(step))
    return f"{module}:{name}" if module else name


def load_step(spec: str) -> Step:
    """`package.module:function` -> the function."""
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ValueError(f"expected module:function, got {spec!r}")
    target: Any = importlib.import_module(module)
    for part in attr.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise ValueError(f"{spec} is not callable")
    return target


class StepFailed(UserCodeError):
    """The user's step raised (or called `sys.exit`): an error in user code (exit 4) naming the step and the
    step's own frame; `exception` is what it raised."""

    def __init__(self, step: str, exception: BaseException) -> None:
        import traceback

        from racefuzz.designs import one_line, user_frame

        self.step = step
        self.exception = exception
        self.summary = f"{type(exception).__name__}: {one_line(exception)}{user_frame(exception)}"
        super().__init__(f"the step {step} raised {self.summary}", "".join(traceback.format_exception(exception)))


def raised_by_racefuzz(exc: BaseException) -> bool:
    """Whether `exc` was raised by racefuzz's own Python code (a bug in the recorder), not by the step nor by
    what racefuzz called on the step's behalf.

    The innermost frame of its traceback decides: outside the package, the step's (or a library's) own;
    inside it, racefuzz's own unless that frame was calling into C when the exception arose -- a torch op
    the recorder forwards for the step (a shape error is the step's), whose failure has no Python frame of
    its own."""
    import dis

    from racefuzz.designs import PACKAGE_DIR

    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    if not tb.tb_frame.f_code.co_filename.startswith(PACKAGE_DIR):
        return False
    at = next((i for i in dis.get_instructions(tb.tb_frame.f_code) if i.offset == tb.tb_lasti), None)
    return at is None or not at.opname.startswith("CALL")


def _only_manifestations(exc: BaseException, manifested: type[BaseException]) -> bool:
    """Whether `exc` (what a Hypothesis test raised) is made of `manifested` failures only: the failure
    itself, or Hypothesis' `FlakyFailure` group of them."""
    if isinstance(exc, manifested):
        return True
    inner = getattr(exc, "exceptions", None)
    return bool(inner) and all(_only_manifestations(e, manifested) for e in inner)


def resolve_device(device: str) -> str:
    """`auto` -> `cuda` if usable, else `cpu`; `cuda` that is not usable here -> `BackendUnavailable` (exit 2),
    before any of the user's code runs."""
    if device == "auto":
        try:
            import torch
        except ImportError:
            return "cpu"
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        try:
            import torch
        except ImportError:
            raise BackendUnavailable(f"device {device!r} needs torch with CUDA, and torch is not installed") from None
        if not torch.cuda.is_available():
            raise BackendUnavailable(
                f"device {device!r} is not usable here (torch {torch.__version__}: torch.cuda.is_available() is "
                "False); record on the CPU instead (--device cpu)"
            )
    return device


def run_once(step: Step, device: str, **recorder_options: Any) -> RunRecord:
    """Run `step` once under a fresh recorder (see `Recorder` for the options)."""
    from racefuzz.errors import RacefuzzError
    from racefuzz.trace.capture import recording
    from racefuzz.trace.env import TraceEnv

    recorder = Recorder(device, **recorder_options)
    env = TraceEnv(recorder, device)
    with recording(recorder):
        try:
            returned = step(env)
        except RacefuzzError:  # a misused TraceEnv, a bad watch name: their own kind, as they are
            raise
        except (Exception, SystemExit) as exc:  # sys.exit() in a step is the step's failure, not an exit code
            if raised_by_racefuzz(exc):
                raise  # a bug in the recorder, reached through the step's own call: an internal error
            raise StepFailed(step_name(step), exc) from exc
    if returned is None:
        returned = {}
    elif not isinstance(returned, Mapping):
        raise UserCodeError(
            f"the step {step_name(step)} returned a {type(returned).__name__}: a step returns a dict of name -> "
            'tensor (what the value oracle compares), e.g. `return {"out": out}`, or None'
        )
    return recorder.finish(returned)


def watched_ordinals(reference: RunRecord, watch: Sequence[str]) -> set[int] | None:
    """The launches that read or write a storage named in `watch` (None: no filter); a name that no storage
    of the reference run has is an `InvalidArgument` (it would silently turn the value checks off)."""
    if not watch:
        return None
    buffers = reference.builder.buffers
    names = {buffer.name for buffer in buffers}
    unknown = sorted(set(watch) - names)
    if unknown:
        given = sorted(name for name in names if not _AUTO_NAME.match(name))
        known = ", ".join(given) if given else "none (name a tensor with env.name(tensor, name))"
        raise InvalidArgument(
            f"unknown watch name(s) {', '.join(unknown)}: no storage of the step is called that; named: {known}"
        )
    keys = {buffer.id for buffer in buffers if buffer.name in watch}
    ops = reference.builder.ops
    chosen = set()
    for ordinal, index in enumerate(reference.launch_ops):
        launch = ops[index]
        if type(launch) is Launch and any(c.buffer.id in keys for c in (*launch.reads, *launch.writes)):
            chosen.add(ordinal)
    return chosen


_AUTO_NAME = re.compile(r"tmp\d+ \(")
"""The name the recorder gives a storage the step did not name (`tmp3 (aten.zeros.default)`)."""


def run_with_delays(
    step: Step,
    device: str,
    reference: RunRecord,
    schedule: Schedule | Sequence[DelayPoint],
    ordinals: set[int] | None = None,
    *,
    serialize: bool = False,
) -> RunRecord | BaseException:
    """A fuzzed run of `step` under `schedule` (a real-code `Schedule`, or a list of delay points: a schedule
    of delays alone), snapshotting what the reference run snapshotted after the launches in `ordinals`
    (None: after every launch); an exception the step raised is returned (a manifestation). `serialize`:
    synchronize after every launch, as the reference run does (a run without the schedule, to learn what
    varies without it).

    The schedule's forced orders are gates (`racefuzz.trace.orders.Gates`, through `gate_kernels`: the GPU's,
    and on the CPU an `InvalidArgument`); they are not checked here -- the search draws only consistent
    ones and a replay checks its file's (`OrderFacts`) -- so an order that deadlocks ends by its gate's
    timeout: a run in which one timed out did not keep its orders and is `ScheduleInfeasible`, raised, not
    judged. `ordinals` is `watched_ordinals`: the value oracle compares
    only those launches' stores, so a snapshot after any other launch (a model's 16 MB matmul output, say)
    would be copied to the host and dropped."""
    if not isinstance(schedule, Schedule):
        schedule = real_code_schedule(schedule)
    plan = reference.snapshots
    if ordinals is not None:
        plan = {ordinal: snaps for ordinal, snaps in plan.items() if ordinal in ordinals}
    gates = Gates(schedule.orders, gate_kernels(device, len(schedule.orders))) if schedule.orders else None
    try:
        run: RunRecord | BaseException = run_once(
            step,
            device,
            evaluate_annotations=False,
            serialize=serialize,
            delays=dict(schedule.device_delays),
            snapshot_plan=plan,
            gates=gates,
        )
    except StepFailed as failed:  # the user's code failed under a schedule: a candidate, not an error
        run = failed.exception
    stuck = gates.timed_out() if gates is not None else []
    if stuck:
        raise ScheduleInfeasible(
            f"the forced order(s) {', '.join(describe_order(order) for order in stuck)} could not be realized: the "
            f"gate's wait timed out after {GATE_TIMEOUT_US / 1e6:g} s (the host waited for the held stream in a way "
            "the reference run did not record, or the first launch never came)"
        )
    return run


def judge_run(reference: RunRecord, run: RunRecord | BaseException, ordinals: set[int] | None) -> Divergence | None:
    if isinstance(run, BaseException):
        return Divergence("exception", None, f"the step raised {type(run).__name__}: {run}")
    return compare(reference, run, ordinals)


def search_schedules(
    points: Sequence[tuple[str, int]],
    attempt: Callable[[Schedule], Divergence | None],
    *,
    examples: int,
    max_delays: int,
    delays_us: Sequence[float] = DELAYS_US,
    seed: int | None = None,
    orders: Sequence[PointOrder] = (),
    facts: OrderFacts | None = None,
) -> tuple[Schedule, Divergence | None, int]:
    """Hypothesis over real-code schedules: up to `max_delays` delay points among `points` and up to
    `max_delays` forced orders among `orders` (the candidates), those drawn kept by `facts` only where they
    cannot deadlock (`OrderFacts.consistent`; `facts` is needed when `orders` is given); returns (the
    shrunk schedule, its divergence, examples run)."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed
    from hypothesis import strategies as st

    if not points and not orders:
        return NO_DELAYS, None, 0
    if orders and facts is None:
        raise ValueError("search_schedules: forced orders are drawn only with the reference run's OrderFacts")
    ran = 0
    failures: list[tuple[Schedule, Divergence]] = []

    class _Manifested(Exception):
        pass

    no_draw: st.SearchStrategy[list[Any]] = st.just([])
    draw = st.tuples(
        st.lists(
            st.tuples(st.integers(0, len(points) - 1), st.sampled_from(list(delays_us))),
            max_size=max_delays,
            unique_by=lambda point: point[0],
        )
        if points
        else no_draw,
        st.lists(st.integers(0, len(orders) - 1), max_size=max_delays, unique=True) if orders else no_draw,
    )

    @settings(
        max_examples=examples,
        database=None,
        deadline=None,
        phases=(Phase.generate, Phase.shrink),
        suppress_health_check=list(HealthCheck),
        derandomize=seed is None,
    )
    @given(draw)
    def example(chosen: tuple[list[tuple[int, float]], list[int]]) -> None:
        nonlocal ran
        ran += 1
        spins, forced = chosen
        delays = [(points[i][0], points[i][1], us) for i, us in sorted(spins)]
        kept = facts.consistent([orders[i] for i in forced]) if forced and facts is not None else []
        schedule = real_code_schedule(delays, kept)
        divergence = attempt(schedule)
        if divergence is not None:
            failures.append((schedule, divergence))
            raise _Manifested

    if seed is not None:
        example = hypothesis_seed(seed)(example)
    try:
        example()
    except Exception as exc:
        # `_Manifested`, or Hypothesis' `FlakyFailure` when a GPU run did not manifest again on replay:
        # either way the runs that did are recorded, and the k-of-k confirmation says how reliable it is.
        # Anything else (racefuzz's own error inside a run, a bad argument) is not a manifestation.
        if not failures or not _only_manifestations(exc, _Manifested):
            raise
        fewest = min(_size(schedule) for schedule, _ in failures)
        schedule, divergence = [f for f in failures if _size(f[0]) == fewest][-1]
        return schedule, divergence, ran
    return NO_DELAYS, None, ran


def _size(schedule: Schedule) -> int:
    """How many delay points and forced orders `schedule` has (what shrinking makes fewer)."""
    return len(schedule.device_delays) + len(schedule.orders)


def fuzz(
    step: Step,
    *,
    device: str = "auto",
    watch: Sequence[str] = (),
    examples: int = 200,
    max_delays: int = 2,
    confirm: int = 3,
    seed: int | None = None,
    delays_us: Sequence[float] = DELAYS_US,
    run_kernels: bool = True,
    saved: SavedFailures | None = None,
    workloads: Any = None,
    saved_workloads: SavedWorkloads | None = None,
    shrink_runs: int = SHRINK_RUNS,
    shrink_seconds: float | None = None,
    forced_orders: bool = True,
) -> TraceResult:
    """Record `step`, judge it with happens-before, search schedules for a manifestation (GPU), confirm it.

    `examples=0` records the step once and judges it by happens-before only, on any device.
    `run_kernels=False` (CPU only) records Triton / CuPy launches from their annotations without running
    them: the happens-before verdict of GPU code on a machine without a GPU. `saved`: failing delay sets
    kept from earlier runs, tried before the search; a manifestation found is saved there (if it forces no
    order: the database keeps delay sets), one that no longer fails is deleted. `forced_orders=False`
    searches delays alone (the candidate orders are still reported).

    `workloads`: a Hypothesis strategy the step draws its workload from; the step is then called as
    `step(env, workload)` and `fuzz_workloads` searches the workloads (the other options judge each one).
    """
    if workloads is not None:
        if saved is not None:
            raise ValueError("saved delay sets name one workload's launches: over drawn workloads use saved_workloads")
        return fuzz_workloads(
            step,
            workloads,
            device=device,
            watch=watch,
            examples=examples,
            max_delays=max_delays,
            confirm=confirm,
            seed=seed,
            delays_us=delays_us,
            run_kernels=run_kernels,
            saved=saved_workloads,
            shrink_runs=shrink_runs,
            shrink_seconds=shrink_seconds,
            forced_orders=forced_orders,
        )
    device = resolve_device(device)
    if not run_kernels and device != "cpu":
        raise ValueError("run_kernels=False is for CPU recording: on a GPU the kernels run")
    clock = PhaseClock(TRACE_PHASES)
    clock.count_run()
    reference = run_once(step, device, serialize=True, run_kernels=run_kernels)
    judgement = judge(reference.program)
    result = TraceResult(step_name(step), device, reference, judgement.races, latent=judgement.latent)
    result.candidate_orders = candidate_orders(reference, judgement.races)
    result.budget = examples
    ordinals = watched_ordinals(reference, watch)  # an unknown name is an error on the CPU too
    if examples == 0:
        result.skipped = "with --examples 0 (happens-before only: the step was recorded once)"
        result.phases = clock.statistics()
        return result
    if device == "cpu":
        result.skipped = (
            "on the CPU (it executes eagerly: a delay cannot reorder anything there, nor can a forced order hold a "
            "launch back; forced orders need a GPU)"
        )
        result.phases = clock.statistics()
        return result
    facts = None
    if forced_orders and result.candidate_orders:
        result.orders_unsearched = gates_unavailable(device)
        facts = None if result.orders_unsearched else OrderFacts(reference)
    elif result.candidate_orders:
        result.orders_unsearched = "forced_orders=False"

    def serialized_runs(runs: int) -> Nondeterminism:
        back = clock.phase
        clock.enter("reference")
        result.serialized_runs += runs
        clock.count_run(runs)
        learned = without_the_schedule(step, device, reference, ordinals, runs)
        clock.enter(back)
        return learned

    started = time.perf_counter()
    learned = serialized_runs(SERIALIZED_REPEATS)
    candidates = saved.saved() if saved is not None else []
    while not learned.unstable:
        compared = masked(reference, learned)

        def attempt(schedule: Schedule, compared: RunRecord = compared) -> Divergence | None:
            clock.count_run()
            try:
                run = run_with_delays(step, device, compared, schedule, ordinals)
            except ScheduleInfeasible:  # a gate timed out: the run did not keep its orders, it is not judged
                result.infeasible += 1
                return None
            divergence = judge_run(compared, run, ordinals)
            if divergence is not None and clock.phase == "generate":
                clock.enter("shrink")  # Hypothesis shrinks from the first divergence on
            return divergence

        clock.enter("replay")
        schedule, divergence = _first_saved_failure(candidates, attempt, saved, result)
        candidates = []
        if divergence is None and result.examples < examples:
            clock.enter("generate")
            schedule, divergence, ran = search_schedules(
                launch_points(reference),
                attempt,
                examples=examples - result.examples,
                max_delays=max_delays,
                delays_us=delays_us,
                seed=seed,
                orders=result.candidate_orders if facts is not None else (),
                facts=facts,
            )
            result.examples += ran
        if divergence is None:
            break
        # The schedule's doing only if the step without it agrees with the reference where it is compared;
        # if not, what differed is nondeterministic too, and the search goes on without comparing it.
        grown = learned | serialized_runs(confirm)
        if grown == learned:
            result.schedule, result.divergence = schedule, divergence
            clock.enter("confirm")
            confirmation = confirm_k_of_k(lambda found=schedule: attempt(found) is not None, confirm)
            result.confirmed, result.confirm_runs = confirmation.reproduced, confirmation.runs
            if confirmation.confirmed and saved is not None and not schedule.orders:
                saved.save(result.delays)
            break
        learned = grown
    result.nondeterministic = learned
    if learned.unstable:
        result.skipped = f"(it cannot judge this step: {learned.unstable})"
    if result.skipped:
        result.stop_reason = StopReason.SKIPPED
    elif result.divergence is not None:
        result.stop_reason = StopReason.FOUND
    elif result.examples < examples:  # Hypothesis stopped drawing first (few launch points, say)
        result.stop_reason = StopReason.EXHAUSTED
    else:
        result.stop_reason = StopReason.EXAMPLES
    result.phases = clock.statistics()
    result.seconds = time.perf_counter() - started
    return result


def race_keys(result: TraceResult) -> list[RaceKey]:
    """The keys (`RaceKey`) of what `result` found, its happens-before races first; [] when clean. A
    divergence counts only confirmed k of k (`TraceResult.manifested`)."""
    keys: list[RaceKey] = [(r.race.kind, launch_source(r.first), launch_source(r.second)) for r in result.races]
    if result.manifested and result.divergence is not None:
        launch = result.divergence.launch
        keys.append(("value", result.divergence.kind, launch_source(launch) if launch is not None else ""))
    return keys


def bound_step(step: Callable[[Any, Any], Any], workload: Any) -> Step:
    """`step` with its workload given: a step of the env alone, named as `step` (its reports, its errors)."""

    def run(env: Any) -> Any:
        return step(env, workload)

    run.__module__, run.__qualname__ = getattr(step, "__module__", None), getattr(step, "__qualname__", repr(step))
    return run


def fuzz_workloads(
    step: Callable[[Any, Any], Any],
    strategy: Any,
    *,
    device: str = "auto",
    watch: Sequence[str] = (),
    examples: int = 200,
    confirm: int = 3,
    seed: int | None = None,
    saved: SavedWorkloads | None = None,
    shrink_runs: int = SHRINK_RUNS,
    shrink_seconds: float | None = None,
    delay_examples: int | None = None,
    **judge_options: Any,
) -> TraceResult:
    """Search the workloads of a step that takes one: Hypothesis draws up to `examples` workloads from
    `strategy`; each is recorded and judged by `fuzz` (happens-before, and on a GPU the delay search with
    `judge_options`); the first that fails is shrunk by Hypothesis (the strategy's own simplification) to
    the smallest workload that still fails with the same race (`RaceKey`: kind and both source lines),
    re-recorded `confirm` times (k of k, `racefuzz.confirm`), and saved in `saved` as its choice sequence.

    Saved workloads are tried first, in order; one that fails is the result (it was shrunk when saved,
    and is confirmed again), one that no longer fails is deleted. A workload is judged once per search
    (a recorded race of a deterministic host program is a fact; the k-of-k re-recordings say so).
    Shrinking stops after `shrink_runs` runs of the step or `shrink_seconds` (Hypothesis's shrinker is
    then told every unjudged candidate passes): the result says so. The step raising on a workload is
    the step's error (`StepFailed`, not shrunk), as without workloads. On a GPU each workload's delay
    search draws up to `delay_examples` delay sets (None: `examples`)."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed
    from hypothesis.control import current_build_context

    device = resolve_device(device)
    if examples < 1:
        raise ValueError(f"a workload search draws at least one workload, not {examples}")
    judge_options["examples"] = examples if delay_examples is None else delay_examples
    search = WorkloadSearch(budget=examples)
    started = time.perf_counter()
    clock = PhaseClock(TRACE_PHASES)
    clock.enter("replay")
    judged: dict[str, TraceResult] = {}
    last: list[TraceResult] = []

    def judge(workload: Any) -> TraceResult:
        key = repr(workload)
        if key not in judged:
            clock.count_run()
            judged[key] = fuzz(bound_step(step, workload), device=device, watch=watch, confirm=confirm, **judge_options)
        last[:] = [judged[key]]
        return judged[key]

    found: tuple[Any, Choices] | None = None
    for choices in saved.saved() if saved is not None else []:
        search.replayed += 1
        workload = replayed_workload(strategy, choices)
        keys = race_keys(judge(workload)) if workload is not None else []
        if keys:
            search.race, found = keys[0], (workload, choices)
            break
        if saved is not None:
            saved.delete(choices)

    if found is None:
        clock.enter("generate")
        failures: list[tuple[Any, Choices]] = []
        error: list[BaseException] = []
        shrink_began: list[float] = []

        class _Failed(Exception):
            pass

        @settings(
            max_examples=examples,
            database=None,
            deadline=None,
            phases=(Phase.generate, Phase.shrink),
            suppress_health_check=list(HealthCheck),
            derandomize=seed is None,
            report_multiple_bugs=False,
        )
        @given(strategy)
        def example(workload: Any) -> None:
            if error:
                return  # the step failed: the search is over, its error is raised below
            if failures:  # shrinking: a run the budget has no room for is a candidate that passes
                if repr(workload) not in judged:
                    over_time = shrink_seconds is not None and time.perf_counter() - shrink_began[0] > shrink_seconds
                    if search.shrink_runs >= shrink_runs or over_time:
                        search.shrink_capped = True
                        return
                    search.shrink_runs += 1
            else:
                search.examples += 1
            try:
                keys = race_keys(judge(workload))
            except Exception as exc:  # not shrunk: the step's (or racefuzz's) error, raised as it is
                error.append(exc)
                return
            if keys and not failures:
                search.race, search.drawn = keys[0], workload
                shrink_began.append(time.perf_counter())
                clock.enter("shrink")
            if search.race and search.race in keys:
                failures.append((workload, tuple(current_build_context().data.choices)))
                raise _Failed

        if seed is not None:
            example = hypothesis_seed(seed)(example)
        try:
            example()
        except Exception as exc:
            if not failures or not _only_manifestations(exc, _Failed):
                raise
        if error:
            raise error[0]
        if failures:
            found = failures[-1]  # Hypothesis replays the smallest failing example last
    if found is None:
        result = last[0]  # Hypothesis ran at least one example: `examples` >= 1
        search.stop_reason = StopReason.EXHAUSTED if search.examples < examples else StopReason.EXAMPLES
        search.phases = clock.statistics()
        result.workloads = search
        result.seconds = time.perf_counter() - started
        return result
    workload, search.choices = found
    search.workload = workload
    result = judged[repr(workload)]
    # The shrunk workload re-recorded k times, each a fresh judgement, failing with the same race each time.
    clock.enter("confirm")

    def rerecorded() -> bool:
        clock.count_run()
        fresh = fuzz(bound_step(step, workload), device=device, watch=watch, confirm=confirm, **judge_options)
        return search.race in race_keys(fresh)

    confirmation = confirm_k_of_k(rerecorded, confirm)
    search.confirmed, search.confirm_runs = confirmation.reproduced, confirmation.runs
    if confirmation.confirmed and saved is not None:
        saved.save(search.choices, workload)
    search.stop_reason, search.phases = StopReason.FOUND, clock.statistics()
    result.workloads = search
    result.seconds = time.perf_counter() - started
    return result


def replayed_workload(strategy: Any, choices: Choices) -> Any:
    """The workload `choices` draws from `strategy` (None: it draws none now, the strategy changed).

    Hypothesis keeps no public way to replay a choice sequence outside its own database, which a seeded
    search does not use; this is the one place racefuzz reaches into its internals for it."""
    from hypothesis.control import BuildContext
    from hypothesis.errors import StopTest
    from hypothesis.internal.conjecture.data import ConjectureData

    data = ConjectureData.for_choices(choices)
    try:
        with BuildContext(data, is_final=True, wrapped_test=None):  # tuples and lists draw in one, as under @given
            return data.draw(strategy)
    except (Exception, StopTest):  # too few choices (an overrun), a strategy that rejects them: not its sequence
        return None


def without_the_schedule(
    step: Step, device: str, reference: RunRecord, ordinals: set[int] | None, runs: int
) -> Nondeterminism:
    """What differs from `reference` in `runs` more serialized runs of `step` without any delay: what is
    nondeterministic, not the schedule's doing."""
    found = Nondeterminism()
    for _ in range(runs):
        found |= nondeterminism(
            reference, run_with_delays(step, device, reference, [], ordinals, serialize=True), ordinals
        )
    return found


def _first_saved_failure(
    candidates: list[list[DelayPoint]],
    attempt: Callable[[Schedule], Divergence | None],
    saved: SavedFailures | None,
    result: TraceResult,
) -> tuple[Schedule, Divergence | None]:
    """The first saved delay set that still diverges (counted in `result.replayed`); those tried that do
    not are deleted from `saved`, as Hypothesis deletes a saved example that passes."""
    for delays in candidates:
        result.replayed += 1
        schedule = real_code_schedule(delays)
        divergence = attempt(schedule)
        if divergence is not None:
            return schedule, divergence
        if saved is not None:
            saved.delete(delays)
    return NO_DELAYS, None


def build_recorder() -> None:
    """Build (or load) the recorder's C++ fast path now, before the watchdog starts: the first build takes
    10-60 s, more on a loaded machine, and is not an example's run (`--example-timeout` would abandon it)."""
    from racefuzz.trace import fastpath

    fastpath.load()


def watched_step(step: Callable, spec: str) -> Callable:
    """`step`, passing a watchdog checkpoint before and after each run: the per-example timeout and Ctrl-C see
    a run of the step that never returns as this one (`racefuzz.watchdog`)."""
    import functools

    from racefuzz.watchdog import checkpoint

    @functools.wraps(step)
    def run(env: Any) -> Any:
        checkpoint(f"a run of the step {spec}")
        returned = step(env)
        checkpoint(f"judging a run of the step {spec}")
        return returned

    from racefuzz.designs import split_spec

    file_path, _, attr = split_spec(spec)
    if file_path is not None:  # named as given (`steps.py:step`), not by the private module it was loaded as
        run.__module__, run.__qualname__ = str(file_path), attr
    return run
