"""The search loop: k-of-k reproduction, flaky examples, detection bookkeeping."""

from __future__ import annotations

import pytest

from racefuzz import InvalidArgument
from racefuzz.backends import executor
from racefuzz.designs import load_design
from racefuzz.schedule import NO_DELAYS
from racefuzz.search import search
from racefuzz.sim import simulate


def test_a_race_that_does_not_reproduce_k_of_k_is_flaky_not_a_verdict() -> None:
    # A backend that only honours the schedule on every other run: manifested races reproduce 1-2 of 3.
    calls = [0]

    def unreliable(program, schedule):
        calls[0] += 1
        return simulate(program, schedule if calls[0] % 2 else NO_DELAYS)

    result = search(load_design("none"), unreliable, examples=60, repeat=3, shrink=False)
    assert result.flaky, "the unreliable backend must produce flaky examples"
    assert all(f.reproduced < f.runs == 3 for f in result.flaky)
    assert result.manifested_examples == 0
    # The happens-before oracle does not depend on timing, so the race is still reported.
    assert result.counterexample is not None and result.counterexample.oracle == "happens-before"


def test_a_deterministic_race_reproduces_k_of_k() -> None:
    result = search(load_design("none"), executor("sim"), examples=60, repeat=3)
    assert result.found and result.counterexample.oracle == "corruption"
    assert result.flaky == [] and result.manifested_examples == 1


def test_clean_design_counts_every_example() -> None:
    result = search(load_design("war-after-launch"), executor("sim"), examples=120)
    assert not result.found and result.examples == 120
    assert result.first_detection_example is None and result.racy_examples == 0


def test_repeat_must_be_positive() -> None:
    with pytest.raises(InvalidArgument, match="repeat"):
        search(load_design("none"), executor("sim"), repeat=0)


class FailsOnce:
    """The simulator as an executor whose `at`-th run raises `error` instead (a backend hiccup)."""

    def __init__(self, at: int, error: Exception) -> None:
        self.at, self.error, self.calls = at, error, 0

    def __call__(self, program, schedule):
        self.calls += 1
        if self.calls == self.at:
            raise self.error
        return simulate(program, schedule, record_timeline=False)


def test_a_backend_error_raised_once_is_an_error_not_a_clean_search() -> None:
    """Hypothesis calls a failure that does not happen again flaky; only racefuzz's own k-of-k signal may be
    excused that way. A backend error raised once used to end the search as "no race" after a few examples."""
    run = FailsOnce(25, RuntimeError("device lost"))
    with pytest.raises(RuntimeError, match="device lost"):
        search(load_design("war-after-launch"), run, examples=500, seed=0, shrink=False)


def test_an_infeasible_forced_order_skips_that_run_and_the_search_goes_on() -> None:
    from racefuzz.schedule import ScheduleInfeasible

    run = FailsOnce(25, ScheduleInfeasible("gate timed out"))
    result = search(load_design("war-after-launch"), run, examples=500, seed=0, shrink=False)
    assert not result.found
    assert result.infeasible == 1
    assert result.examples == 500


def test_an_infeasible_run_still_counts_its_workloads_happens_before_verdict() -> None:
    """A racy workload whose run could not be realized is still racy: happens-before needs no run."""
    from racefuzz.schedule import ScheduleInfeasible

    class AlwaysInfeasible:
        def __call__(self, program, schedule):
            raise ScheduleInfeasible("gate timed out")

    result = search(load_design("none"), AlwaysInfeasible(), examples=50, seed=0, shrink=False)
    assert result.infeasible > 0 and result.racy_examples > 0
    assert result.found  # the unordered pair, reported without a manifested run
