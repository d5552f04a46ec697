"""Batched searches and the asynchronous executor protocol (`PreparingExecutor`), on the simulator.

On the GPU `search` runs `DEFAULT_GPU_BATCH` examples per Hypothesis example and builds example i+1 while
the device runs example i. These tests drive that path with a simulator that speaks the same protocol
and logs every call, so the ordering contract and the verdicts are checked without a GPU.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from racefuzz import InvalidArgument
from racefuzz.backends import Execution, executor
from racefuzz.designs import load_design
from racefuzz.program import Program
from racefuzz.schedule import Schedule
from racefuzz.search import LOOKAHEAD, search
from racefuzz.sim import simulate


class LoggingSim:
    """The simulator as a `PreparingExecutor`; `log` records (call, run number) in call order.

    A started run reports itself busy (`done()` False) for `busy_polls(run number)` polls, standing in for
    a device that is still running it: long runs let the search work ahead, short ones spend that work.
    """

    def __init__(self, busy_polls: Callable[[int], int] = lambda number: 2) -> None:
        self.log: list[tuple[str, int]] = []
        self.runs = 0
        self.busy_polls = busy_polls

    def __call__(self, program: Program, schedule: Schedule) -> Execution:
        self.log.append(("run", -1))
        return simulate(program, schedule, record_timeline=False)

    def prepare(self, program: Program, schedule: Schedule) -> Prepared:
        self.runs += 1
        self.log.append(("prepare", self.runs))
        return Prepared(self, self.runs, program, schedule)


class Prepared:
    def __init__(self, owner: LoggingSim, number: int, program: Program, schedule: Schedule) -> None:
        self.owner, self.number, self.program, self.schedule = owner, number, program, schedule

    def start(self) -> Started:
        self.owner.log.append(("start", self.number))
        execution = simulate(self.program, self.schedule, record_timeline=False)
        return Started(self.owner, self.number, execution, self.owner.busy_polls(self.number))


class Started:
    def __init__(self, owner: LoggingSim, number: int, execution: Execution, busy_polls: int) -> None:
        self.owner, self.number, self.execution, self.busy_polls = owner, number, execution, busy_polls

    def done(self) -> bool:
        self.busy_polls -= 1
        return self.busy_polls < 0

    def finish(self) -> Execution:
        self.owner.log.append(("finish", self.number))
        return self.execution


def _check_contract(log: list[tuple[str, int]]) -> list[int]:
    """Assert the PreparingExecutor contract on a log; return, for each prepare made while a run was on
    the device, how many members ahead of that run it was."""
    steps = [step for step in log if step[0] != "run"]
    started = [n for call, n in steps if call == "start"]
    finished = [n for call, n in steps if call == "finish"]
    # Prepared members are numbered in order; those prepared after a failure are never started.
    assert started == finished == sorted(set(started)), "each run starts and finishes once, in order"
    running, ahead = None, []
    for call, n in steps:
        if call == "start":
            assert running is None, f"run {n} started while run {running} was unfinished"
            running = n
        elif call == "finish":
            assert running == n
            running = None
        elif call == "prepare" and running is not None:
            assert running < n <= running + LOOKAHEAD, "the search works at most LOOKAHEAD members ahead"
            ahead.append(n - running)
    return ahead


def test_a_batched_search_works_ahead_while_a_run_is_on_the_device_and_keeps_the_budget() -> None:
    sim = LoggingSim(busy_polls=lambda number: 8 if number % 5 == 0 else 2)  # long runs, and runs just long enough
    result = search(load_design("war-after-launch"), sim, examples=37, batch=8, shrink=False)
    assert not result.found and result.examples == 37  # the last batch stops at the budget
    ahead = _check_contract(sim.log)
    # 6 batches: the all-zeros one (one example), then five; every member but a batch's first overlaps a run.
    assert len(ahead) >= 37 - 6, "every member but a batch's first is prepared while another member runs"
    assert max(ahead) == LOOKAHEAD, "a long run lets the search prepare LOOKAHEAD members ahead"


def test_what_a_batched_search_draws_does_not_depend_on_how_long_runs_take() -> None:
    # Draws must be a function of Hypothesis' choices alone; only the host's working ahead may vary.
    def summary(busy: Callable[[int], int]) -> tuple[object, ...]:
        sim = LoggingSim(busy_polls=busy)
        result = search(load_design("global-war"), sim, examples=300, seed=5, batch=16)
        _check_contract(sim.log)
        c = result.counterexample
        return (result.examples, result.first_manifested_example, c.workload, c.schedule)

    assert summary(lambda n: 0) == summary(lambda n: 50) == summary(lambda n: n % 7)


@pytest.mark.parametrize("design", ["none", "global-war"])
def test_a_batched_search_finds_the_race_the_unbatched_one_finds(design: str) -> None:
    one = search(load_design(design), executor("sim"), examples=300, seed=3)
    batched = search(load_design(design), LoggingSim(), examples=300, seed=3, batch=8)
    assert one.found and batched.found
    assert batched.counterexample.oracle == one.counterexample.oracle == "corruption"
    # Hypothesis shrank the failing member alone, racefuzz.minimize the structure: as small as unbatched.
    for result in (one, batched):
        c = result.counterexample
        assert len(c.workload.requests) <= 2 and c.workload.iterations <= 3
        assert len(c.schedule.device_delays) + len(c.schedule.read_spins) + len(c.schedule.host_delays) <= 1
    assert batched.manifested_examples == 1 and batched.first_manifested_example is not None


def test_a_batched_search_reproduces_k_of_k_through_the_synchronous_call() -> None:
    sim = LoggingSim()
    result = search(load_design("none"), sim, examples=100, repeat=3, batch=4, shrink=False)
    assert result.found and result.counterexample.oracle == "corruption"
    # The first manifested run was re-run twice, synchronously, before anything else started.
    first_finish = next(i for i, (call, n) in enumerate(sim.log) if call == "finish" and n == result.examples)
    assert sim.log[first_finish + 1 : first_finish + 3] == [("run", -1), ("run", -1)]


def test_batch_must_be_positive() -> None:
    with pytest.raises(InvalidArgument, match="batch"):
        search(load_design("none"), executor("sim"), batch=0)


def test_a_failing_member_is_shrunk_alone_by_hypothesis_from_its_bytes() -> None:
    # The failing member of a batch is handed to Hypothesis through its example database; if a Hypothesis
    # upgrade changed that format, nothing would be shrunk and this would fail.
    from hypothesis import strategies as st

    from racefuzz.scenarios.sglang import workload_bytes
    from racefuzz.schedulers.random import schedule_bytes
    from racefuzz.search.finish import shrink_alone

    seen: list[tuple[bytes, bytes]] = []

    def fails(drawn: tuple[bytes, bytes]) -> bool:
        workload, schedule = drawn
        failing = len(workload) >= 20 and sum(schedule) >= 9
        if failing:
            seen.append(drawn)
        return failing

    start = (bytes(range(40, 90)), bytes([200] * 12))
    shrink_alone(fails, start, st.tuples(workload_bytes(), schedule_bytes(4)), constant_schedule=False)
    assert seen[0] == start, "Hypothesis replays the failing member first"
    assert seen[-1] == (bytes(20), bytes([9])), f"shrunk to {seen[-1]!r}, not the minimal failing pair"


def test_the_budget_cut_batch_draws_what_a_full_batch_draws() -> None:
    # Hypothesis requires the same draws from the same choices: a last batch that stopped drawing at the
    # example budget made it raise FlakyStrategyDefinition (seen with these very arguments, on the H200).
    result = search(
        load_design("war-after-launch"), LoggingSim(), examples=1000, seed=0, repeat=5, shrink=False, batch=16
    )
    assert result.examples == 1000 and not result.found


@pytest.mark.parametrize(("batch", "times"), [(1, 1), (8, 1), (8, 2)])
def test_a_failure_that_does_not_replay_leaves_the_failure_first_found(batch: int, times: int) -> None:
    # GPU timing on the edge: a run corrupts the first `times` times its (program, schedule) runs and never
    # again. Hypothesis' replay then calls the test flaky; the search reports the failure it found, not an
    # error. Twice: the batch member's shrink (under `hypothesis.find`) replays it once more, failing, and
    # Hypothesis' final replay does not -- a flaky `Found`, which once left the search as an internal error.
    seen: dict[int, int] = {}

    def first_times_only(program: Program, schedule: Schedule) -> Execution:
        key = hash((repr(program.ops), repr(schedule)))
        seen[key] = seen.get(key, 0) + 1
        honoured = seen[key] <= times
        return simulate(program, schedule if honoured else Schedule(), record_timeline=False)

    result = search(load_design("none"), first_times_only, examples=200, seed=2, repeat=1, batch=batch)
    assert result.found and result.manifested_examples == 1
    assert result.counterexample.oracle in ("corruption", "happens-before")


class DrawBudgetExhausted(Exception):
    """Stands in for Hypothesis' StopTest: a draw past the test case's budget, raised from `draw()`."""


@pytest.mark.parametrize("fail_on_draw", [LOOKAHEAD + 1, LOOKAHEAD + 3])
def test_a_batch_ended_by_an_exception_finishes_the_run_on_the_device(fail_on_draw):
    """A run already started when the batch ends early (here a draw raising, as Hypothesis does past a test
    case's budget) is finished before the exception leaves the batch: on the GPU its device array would
    otherwise be freed, and handed to the next upload, while its kernels still read it."""
    from racefuzz.search.pipeline import Batch, Example

    sim = LoggingSim(busy_polls=lambda number: 1000)  # the device never reports done by itself
    finished: list[int] = []
    draws = iter(range(10_000))

    def draw() -> tuple[bytes, bytes]:
        k = next(draws)
        if k == fail_on_draw:
            raise DrawBudgetExhausted
        return (bytes([k % 256, k // 256]), b"")

    program = Program.__new__(Program)  # never run: Prepared only hands it back to its (fake) start

    def build(workload: bytes, schedule: bytes) -> Example:
        return Example((workload, schedule), None, program, Schedule.__new__(Schedule), {}, False)

    def prepare(program: Program, schedule: Schedule) -> object:
        sim.runs += 1
        number = sim.runs

        class _Started:
            def done(self) -> bool:
                return False

            def finish(self) -> None:
                finished.append(number)

        class _Prepared:
            def start(self) -> _Started:
                sim.log.append(("start", number))
                return _Started()

        return _Prepared()

    def settle(example: Example, started: object) -> None:
        started.finish()

    batch = Batch(8, 8, build, settle, prepare)
    with pytest.raises(DrawBudgetExhausted):
        batch.run(draw)
    started = [number for call, number in sim.log if call == "start"]
    assert started, "the test must end the batch with a run on the device"
    assert started[-1] in finished, (started, finished)
