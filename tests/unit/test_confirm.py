"""Confirmation, one rule for every caller: a manifestation counts only when it shows in all k runs;
anything less is flaky (its rate recorded), never a verdict. Happens-before verdicts need no runs.

Each test here runs a caller of the rule -- the search's final re-check (`reproduces`), the minimizer, the
trace's confirmation of a divergence -- with a run that manifests in only some of k runs, and checks the
caller does not count it.
"""

from __future__ import annotations

import pytest

from racefuzz import Schedule, find_races, simulate
from racefuzz.designs import load_design
from racefuzz.phases import TRACE_PHASES, StopReason
from racefuzz.scenarios.sglang import RequestSpec, Workload, build_program
from racefuzz.schedule import NO_DELAYS
from racefuzz.search.finish import finish_manifested
from racefuzz.search.minimize import minimize
from racefuzz.search.outcome import judge, reproduces

GLOBAL_WAR = load_design("global-war")
# A post-launch-rewrite race (the reader's spin lets the rewrite clobber it) among other requests.
WORKLOAD = Workload(
    requests=(RequestSpec(0, 4, 64, (1, 1, 1), rewrite_at=(0,)), RequestSpec(2, 3, 64, (1, 1))),
    iterations=4,
    rows=2,
)


def _reader_spin(workload: Workload) -> Schedule:
    (race, *_) = find_races(build_program(workload, GLOBAL_WAR.hooks))
    return Schedule(read_spins={race.first.index: 3000.0})


class EveryOtherRun:
    """The simulator as an executor that honours the schedule on every other run only (the rest run
    undelayed, clean): whatever it runs k >= 2 times manifests in some of the k runs but not all."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, program, schedule):
        self.calls += 1
        return simulate(program, schedule if self.calls % 2 else NO_DELAYS, record_timeline=False)


def test_the_final_recheck_needs_the_corruption_in_every_fresh_run() -> None:
    outcome = judge(WORKLOAD, GLOBAL_WAR, _reader_spin(WORKLOAD), simulate)
    assert outcome.corruptions, "the schedule must manifest the race"
    assert reproduces(outcome, simulate, 3), "a deterministic corruption reproduces 3 of 3"
    flaky = EveryOtherRun()
    assert not reproduces(outcome, flaky, 3), "manifested in 1-2 of 3 fresh runs: not reproduced"
    assert flaky.calls >= 2


def test_the_minimizer_keeps_no_candidate_that_fails_in_only_some_of_k_runs() -> None:
    schedule = _reader_spin(WORKLOAD)
    # Non-vacuous: with a run that manifests every time, the minimizer does simplify this failure.
    small, shorter = minimize(WORKLOAD, schedule, GLOBAL_WAR, simulate, repeat=3)
    assert (small, shorter) != (WORKLOAD, schedule)
    # Every candidate now manifests in 1 or 2 of its 3 runs: none is a failure k of k, none is kept.
    assert minimize(WORKLOAD, schedule, GLOBAL_WAR, EveryOtherRun(), repeat=3) == (WORKLOAD, schedule)


class DelaysBelow:
    """The simulator as an executor on which a delay shorter than `threshold_us` has no effect (it runs as
    if absent), as on a GPU where a spin shorter than the window does not open it."""

    def __init__(self, threshold_us: float) -> None:
        self.threshold_us = threshold_us

    def __call__(self, program, schedule):
        def kept(delays):
            return {point: us for point, us in delays.items() if us >= self.threshold_us}

        effective = Schedule(
            kept(schedule.device_delays), kept(schedule.read_spins), kept(schedule.host_delays), schedule.orders
        )
        return simulate(program, effective, record_timeline=False)


def test_a_shrunk_gpu_counterexample_keeps_twice_the_shortest_delay_that_manifests() -> None:
    run = DelaysBelow(600.0)
    failure = judge(WORKLOAD, GLOBAL_WAR, _reader_spin(WORKLOAD), run)
    assert failure.corruptions, "a 3000 us spin is past the threshold: it must manifest"
    found = finish_manifested(failure, GLOBAL_WAR, run, "cuda", shrink=True, repeat=3, min_delay_us=0.0)
    spins = list(found.schedule.read_spins.values())
    assert spins and all(us >= 2 * run.threshold_us for us in spins), spins
    assert spins != list(failure.schedule.read_spins.values()), "non-vacuous: the minimizer did shorten it"
    assert reproduces(found, run, 3)
    # Every delay halved still manifests: the reported delays are not at the edge of the window.
    assert judge(found.workload, GLOBAL_WAR, found.schedule.scaled(0.5), run).corruptions


def test_on_the_simulator_the_shrunk_delay_is_the_shortest_that_manifests() -> None:
    run = DelaysBelow(600.0)
    failure = judge(WORKLOAD, GLOBAL_WAR, _reader_spin(WORKLOAD), run)
    found = finish_manifested(failure, GLOBAL_WAR, run, "sim", shrink=True, repeat=1, min_delay_us=0.0)
    assert not judge(found.workload, GLOBAL_WAR, found.schedule.scaled(0.5), run).corruptions


# -- the trace: a divergence counts only confirmed k of k ------------------------------------------------


@pytest.fixture
def scripted_trace(monkeypatch):
    """`racefuzz.trace.search.fuzz` as on a GPU, recorded on the CPU: the delay search makes one attempt at
    the first launch, and the n-th attempt diverges as `script[n]` says (attempt 0 is the search's, the
    rest are the confirmation's re-runs); `judged` lists the attempts made."""
    pytest.importorskip("torch")
    from racefuzz.schedule import Schedule
    from racefuzz.trace import search as trace_search
    from racefuzz.trace.oracle import Divergence

    record_on_cpu = trace_search.run_once
    script: list[bool] = []
    judged: list[bool] = []
    divergence = Divergence("value", None, "launch 3 stored other values (scripted)")

    def judge_run(reference, run, ordinals):
        diverged = script[len(judged)]
        judged.append(diverged)
        return divergence if diverged else None

    def found_at_once(points, attempt, **_):
        schedule = Schedule(device_delays={points[0]: 5000.0})
        found = attempt(schedule)
        return (schedule, found, 1) if found is not None else (Schedule(), None, 1)

    monkeypatch.setattr(trace_search, "resolve_device", lambda device: "cuda")
    monkeypatch.setattr(trace_search, "run_once", lambda step, device, **options: record_on_cpu(step, "cpu", **options))
    monkeypatch.setattr(trace_search, "judge_run", judge_run)
    monkeypatch.setattr(trace_search, "search_schedules", found_at_once)
    return script, judged


@pytest.mark.parametrize("script", [[False, False, False], [True, False, True], [True, True, False]])
def test_a_trace_divergence_confirmed_fewer_than_k_of_k_is_flaky_not_a_race(scripted_trace, script) -> None:
    from racefuzz.trace.example import synced_step
    from racefuzz.trace.report import render
    from racefuzz.trace.search import fuzz

    scripted, judged = scripted_trace
    scripted[:] = [True, *script]  # the search's attempt diverges, then the three re-runs as `script`
    result = fuzz(synced_step, confirm=3)
    assert len(judged) == 4, "one search attempt and three confirmation runs"
    assert result.races == [] and result.divergence is not None
    assert (result.confirmed, result.confirm_runs) == (sum(script), 3)
    assert not result.racy, f"a divergence confirmed {sum(script)} of 3 is not a race"
    text = render(result)
    assert "no race" in text and f"confirmed in {sum(script)}/3 re-run(s)" in text and "flaky" in text


def test_a_trace_divergence_confirmed_k_of_k_is_a_race(scripted_trace) -> None:
    from racefuzz.trace.example import synced_step
    from racefuzz.trace.search import fuzz

    scripted, _ = scripted_trace
    scripted[:] = [True, True, True, True]
    result = fuzz(synced_step, confirm=3)
    assert result.races == [] and (result.confirmed, result.confirm_runs) == (3, 3) and result.racy


def test_the_trace_command_exits_0_not_1_on_a_divergence_confirmed_0_of_3(scripted_trace, tmp_path, capsys) -> None:
    import argparse

    from racefuzz.commands.trace import add_parser, trace_command

    parser = argparse.ArgumentParser(prog="racefuzz")
    add_parser(lambda name, help: parser.add_subparsers(dest="command").add_parser(name, help=help))
    scripted, _ = scripted_trace
    scripted[:] = [True, False, False, False]
    code = trace_command(
        parser.parse_args(["trace", "racefuzz.trace.example:synced_step", "--report-dir", str(tmp_path)])
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "no race" in out and "confirmed in 0/3 re-run(s)" in out


# -- the rule itself -------------------------------------------------------------------------------------


def test_confirm_counts_a_manifestation_only_k_of_k() -> None:
    from racefuzz.confirm import Confirmation, confirm

    outcomes = iter([True, False, True, True])
    flaky = confirm(lambda: next(outcomes), 4)
    assert flaky == Confirmation(3, 4) and not flaky.confirmed and str(flaky) == "3/4"
    assert confirm(lambda: True, 3) == Confirmation(3, 3) and confirm(lambda: True, 3).confirmed
    never = confirm(lambda: False, 3)
    assert never == Confirmation(0, 3) and not never.confirmed


def test_confirm_counts_runs_already_seen_and_may_stop_at_the_first_miss() -> None:
    from racefuzz.confirm import Confirmation, confirm

    made: list[int] = []

    def run() -> bool:
        made.append(1)
        return len(made) != 2  # the second fresh run misses

    assert confirm(run, 5, seen=1) == Confirmation(4, 5) and len(made) == 4  # 1 seen + 4 made
    made.clear()
    stopped = confirm(run, 5, stop_at_miss=True)
    assert stopped == Confirmation(1, 2) and not stopped.confirmed and len(made) == 2
    assert confirm(lambda: False, 1, seen=1).confirmed  # k = 1: the run that manifested is the verdict


@pytest.mark.parametrize("k, seen", [(0, 0), (3, 4), (3, -1)])
def test_confirm_refuses_a_k_or_seen_out_of_range(k: int, seen: int) -> None:
    from racefuzz.confirm import confirm

    with pytest.raises(ValueError):
        confirm(lambda: True, k, seen=seen)


# -- the trace's value search: why it stopped, what each phase cost -------------------------------------


def test_a_trace_divergence_found_says_so_with_its_runs_by_phase(scripted_trace) -> None:
    from racefuzz.trace.example import synced_step
    from racefuzz.trace.search import fuzz

    scripted, judged = scripted_trace
    scripted[:] = [True, True, True, True]
    result = fuzz(synced_step, confirm=3)
    assert result.stop_reason is StopReason.FOUND
    runs = {p.phase: p.runs for p in result.phases}
    assert list(runs) == list(TRACE_PHASES)
    # the reference and the serialized runs that learn what varies; the search's attempt; the k re-runs
    assert runs == {"reference": result.serialized_runs, "replay": 0, "generate": 1, "shrink": 0, "confirm": 3}
    assert runs["generate"] + runs["confirm"] == len(judged)
    assert result.statistics_line().startswith("stopped: found a counterexample; phases: reference ")


def test_a_trace_search_that_hypothesis_ends_early_is_exhausted_not_spent(scripted_trace) -> None:
    from racefuzz.trace.example import synced_step
    from racefuzz.trace.report import render
    from racefuzz.trace.search import fuzz

    scripted, _ = scripted_trace
    scripted[:] = [False]
    result = fuzz(synced_step, confirm=3, examples=200)  # the scripted search draws one schedule only
    assert result.divergence is None and result.examples == 1
    assert result.stop_reason is StopReason.EXHAUSTED
    assert "value search stopped: Hypothesis drew no more after 1 of 200 examples" in render(result)


def test_a_trace_on_the_cpu_says_its_value_search_did_not_run() -> None:
    pytest.importorskip("torch")
    from racefuzz.trace.example import synced_step
    from racefuzz.trace.search import fuzz

    result = fuzz(synced_step, device="cpu")
    assert result.stop_reason is StopReason.SKIPPED
    assert {p.phase: p.runs for p in result.phases}["reference"] == 1
