"""Batched searches and the asynchronous executor protocol (`PreparingExecutor`), on the simulator.

On the GPU `search` runs `DEFAULT_GPU_BATCH` examples per Hypothesis example and builds example i+1 while
the device runs example i. These tests drive that path with a simulator that speaks the same protocol
and logs every call, so the ordering contract and the verdicts are checked without a GPU.
"""

from __future__ import annotations

import itertools

import pytest

from racefuzz import InvalidArgument
from racefuzz.backend import executor
from racefuzz.designs import load_design
from racefuzz.program import Program
from racefuzz.schedule import Schedule
from racefuzz.search import search
from racefuzz.sim import Execution, simulate


class LoggingSim:
    """The simulator as a `PreparingExecutor`; `log` records (call, run number) in call order."""

    def __init__(self) -> None:
        self.log: list[tuple[str, int]] = []
        self.runs = 0

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
        return Started(self.owner, self.number, simulate(self.program, self.schedule, record_timeline=False))

    # The search must not finish a run twice or start one twice; nothing else is needed here.


class Started:
    def __init__(self, owner: LoggingSim, number: int, execution: Execution) -> None:
        self.owner, self.number, self.execution = owner, number, execution

    def finish(self) -> Execution:
        self.owner.log.append(("finish", self.number))
        return self.execution


def test_batched_search_prepares_the_next_example_before_finishing_the_running_one() -> None:
    sim = LoggingSim()
    result = search(load_design("war-after-launch"), sim, examples=37, batch=8, shrink=False)
    assert not result.found and result.examples == 37  # the last batch stops at the budget
    steps = [step for step in sim.log if step[0] != "run"]
    started = [n for call, n in steps if call == "start"]
    finished = [n for call, n in steps if call == "finish"]
    assert started == finished == list(range(1, 38)), "every run starts and finishes exactly once, in order"
    running = None
    for call, n in steps:
        if call == "start":
            assert running is None, f"run {n} started while run {running} was unfinished"
            running = n
        elif call == "finish":
            assert running == n
            running = None
        elif call == "prepare" and running is not None:
            assert n == running + 1  # the overlap: the next example is prepared while this one runs
    overlapped = sum(1 for (a, _), (b, _) in itertools.pairwise(steps) if a == "start" and b == "prepare")
    assert overlapped >= 37 - 5, "within a batch every example but the first is prepared during the previous run"


@pytest.mark.parametrize("design", ["none", "global-war"])
def test_a_batched_search_finds_the_race_the_unbatched_one_finds(design: str) -> None:
    one = search(load_design(design), executor("sim"), examples=300, seed=3)
    batched = search(load_design(design), LoggingSim(), examples=300, seed=3, batch=8)
    assert one.found and batched.found
    assert batched.counterexample.oracle == one.counterexample.oracle == "corruption"
    # Hypothesis shrank the batch and racefuzz.minimize the structure: as small as the unbatched result.
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

    from racefuzz.search import _shrink_alone
    from racefuzz.strategies import schedule_bytes, workload_bytes

    seen: list[tuple[bytes, bytes]] = []

    def fails(drawn: tuple[bytes, bytes]) -> bool:
        workload, schedule = drawn
        failing = len(workload) >= 20 and sum(schedule) >= 9
        if failing:
            seen.append(drawn)
        return failing

    start = (bytes(range(40, 90)), bytes([200] * 12))
    _shrink_alone(fails, start, st.tuples(workload_bytes(), schedule_bytes(4)), "random")
    assert seen[0] == start, "Hypothesis replays the failing member first"
    assert seen[-1] == (bytes(20), bytes([9])), f"shrunk to {seen[-1]!r}, not the minimal failing pair"


def test_the_budget_cut_batch_draws_what_a_full_batch_draws() -> None:
    # Hypothesis requires the same draws from the same choices: a last batch that stopped drawing at the
    # example budget made it raise FlakyStrategyDefinition (seen with these very arguments, on the H200).
    result = search(
        load_design("war-after-launch"), LoggingSim(), examples=1000, seed=0, repeat=5, shrink=False, batch=16
    )
    assert result.examples == 1000 and not result.found
