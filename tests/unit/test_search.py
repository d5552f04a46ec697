"""The search loop: k-of-k reproduction, flaky examples, detection bookkeeping."""

from __future__ import annotations

import pytest

from racefuzz import InvalidArgument
from racefuzz.backends import executor
from racefuzz.designs import load_design
from racefuzz.phases import SEARCH_PHASES, StopReason
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


# -- why a search stopped, and what each phase cost ----------------------------------------------------------


class CountingRun:
    """The simulator, counting the programs it runs."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, program, schedule):
        self.calls += 1
        return simulate(program, schedule, record_timeline=False)


def test_a_clean_search_stops_at_its_budget_with_every_run_in_the_generate_phase() -> None:
    run = CountingRun()
    result = search(load_design("war-after-launch"), run, examples=120, seed=0)
    assert result.stop_reason is StopReason.EXAMPLES
    assert [p.phase for p in result.phases] == list(SEARCH_PHASES)
    runs = {p.phase: p.runs for p in result.phases}
    assert runs == {"replay": 0, "generate": 120, "shrink": 0, "minimize": 0}
    assert sum(runs.values()) == run.calls
    assert 0 < sum(p.seconds for p in result.phases) <= result.seconds
    assert result.statistics_line() == (
        f"stopped: all 120 examples ran; phases: generate 120 run(s) {result.phases[1].seconds:.2f} s"
    )


def test_a_found_race_counts_its_runs_by_phase() -> None:
    run = CountingRun()
    result = search(load_design("global-war"), run, examples=500, seed=0, batch=1)
    assert result.found and result.stop_reason is StopReason.FOUND
    runs = {p.phase: p.runs for p in result.phases}
    assert runs["replay"] == 0
    assert runs["generate"] == result.first_manifested_example  # a run per example, the failing one included
    assert runs["shrink"] > 0 and runs["minimize"] > 0
    assert sum(runs.values()) == run.calls, "every run of the backend is counted in one phase"
    assert "stopped: found a counterexample; phases: generate" in result.statistics_line()


def test_a_search_whose_hypothesis_stops_drawing_early_says_so(monkeypatch) -> None:
    from racefuzz.search import driver

    real = driver.search_settings
    # Hypothesis given fewer examples than the budget: it stops drawing first, as on a small space.
    monkeypatch.setattr(driver, "search_settings", lambda n, **kw: real(max(1, n // 10), **kw))
    result = search(load_design("war-after-launch"), simulate, examples=400, seed=0, batch=1)
    assert result.examples < 400
    assert result.stop_reason is StopReason.EXHAUSTED
    assert result.statistics_line().startswith(f"stopped: Hypothesis drew no more after {result.examples} of 400")


def test_an_interrupted_search_says_so_with_its_phases_so_far() -> None:
    def stop_at(n: int) -> None:
        if n == 50:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt) as stopped:
        search(load_design("war-after-launch"), simulate, examples=400, seed=0, on_example=stop_at)
    partial = stopped.value.partial  # type: ignore[attr-defined]
    assert partial.stop_reason is StopReason.INTERRUPTED
    assert {p.phase: p.runs for p in partial.phases}["generate"] == 50
