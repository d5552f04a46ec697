"""A traced step over drawn workloads (`fuzz(step, workloads=strategy)`, issue 26): Hypothesis draws the
workloads, each is recorded and judged by happens-before, the first racy one is shrunk to the smallest that
races the same way, confirmed k of k, kept in the failure database and tried first on the next run."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hypothesis import strategies as st  # noqa: E402
from hypothesis.database import InMemoryExampleDatabase  # noqa: E402

from racefuzz.phases import StopReason  # noqa: E402
from racefuzz.search.corpus import WorkloadCorpus, workload_corpus_key  # noqa: E402
from racefuzz.trace.search import fuzz, step_name  # noqa: E402

ROWS = st.lists(st.integers(0, 3), max_size=6)
"""A workload: the rows a forward reads (the first item) and the scheduler then rewrites (the second)."""
PAIRED_ROWS = st.tuples(st.lists(st.tuples(st.integers(0, 3), st.booleans()), max_size=6), st.booleans()).map(
    lambda drawn: [row for row, _ in drawn[0]]
)
"""The same workloads drawn through tuples (which draw only inside Hypothesis' build context)."""


def read_then_rewrite(env, rows, *, ordered: bool = False):
    """The forward reads row rows[0] of a table; the scheduler stream then rewrites row rows[1], after the
    forward only if `ordered`: a WAR race exactly when the workload has two items naming one row."""
    table = env.name(torch.zeros(4, 8, dtype=torch.int32), "req_to_token")
    forward, schedule = env.stream("forward"), env.stream("schedule")
    forward.wait_stream(env.current_stream())
    schedule.wait_stream(env.current_stream())
    if rows:
        with env.use(forward):
            table[rows[0]].sum()
    if ordered:
        schedule.wait_stream(forward)
    if len(rows) >= 2:
        with env.use(schedule):
            table[rows[1], 2:4] = 7
    env.synchronize()  # the table's free after both streams' use of it


def ordered_rewrite(env, rows):
    read_then_rewrite(env, rows, ordered=True)


def test_a_race_that_needs_two_items_shrinks_to_exactly_the_minimal_workload() -> None:
    result = fuzz(read_then_rewrite, workloads=ROWS, device="cpu", examples=100, seed=0, confirm=3)
    search = result.workloads
    assert search is not None and result.racy
    assert search.workload == [0, 0]  # two items (the race needs both), the smallest rows
    assert search.drawn is not None and search.drawn[0] == search.drawn[1]  # it raced as drawn too
    assert search.race[0] == "WAR" and all("test_trace_workloads.py" in source for source in search.race[1:])
    assert (search.confirmed, search.confirm_runs) == (3, 3)
    assert search.examples >= 1 and search.shrink_runs >= 1 and not search.shrink_capped
    assert [str(r.race.kind) for r in result.races] == ["WAR"]  # the result judges the shrunk workload
    runs = {p.phase: p.runs for p in search.phases}
    assert search.stop_reason is StopReason.FOUND
    assert (runs["generate"], runs["shrink"], runs["confirm"]) == (search.examples, search.shrink_runs, 3)


def test_a_shrunk_workload_that_races_in_only_some_of_its_k_re_recordings_is_not_a_race(monkeypatch) -> None:
    # The shrunk workload's confirmation counts the re-recordings that failed with its race: here the step
    # orders the rewrite after the read in the second of the three, so the race shows 2 of 3 -- flaky, not
    # a race. Counting the k requested instead of the re-recordings seen would call it one.
    from racefuzz.trace import search as trace_search

    re_recording: list[int] = []  # empty while the search runs; then the index of the re-recording made
    confirm_k_of_k = trace_search.confirm_k_of_k

    def numbered(run, k, **options):
        def one_re_recording() -> bool:
            re_recording[:] = [re_recording[0] + 1 if re_recording else 0]
            return run()

        return confirm_k_of_k(one_re_recording, k, **options)

    def ordered_in_the_second_re_recording(env, rows):
        read_then_rewrite(env, rows, ordered=re_recording == [1])

    monkeypatch.setattr(trace_search, "confirm_k_of_k", numbered)
    result = fuzz(ordered_in_the_second_re_recording, workloads=ROWS, device="cpu", examples=100, seed=0, confirm=3)
    search = result.workloads
    assert search is not None and search.workload == [0, 0] and re_recording == [2]
    assert [str(r.race.kind) for r in result.races] == ["WAR"]  # the search's judgement of the shrunk workload
    assert (search.confirmed, search.confirm_runs) == (2, 3)
    assert not result.racy, "a shrunk workload that raced in 2 of its 3 re-recordings is not a race"


def test_shrinking_stops_at_its_budget_and_says_so() -> None:
    result = fuzz(read_then_rewrite, workloads=ROWS, device="cpu", examples=100, seed=0, shrink_runs=0)
    search = result.workloads
    assert result.racy and search.shrink_capped and search.shrink_runs == 0
    assert search.workload == search.drawn  # nothing smaller was run


@pytest.mark.parametrize("strategy", [ROWS, PAIRED_ROWS], ids=["lists", "tuples"])
def test_the_failure_database_keeps_the_shrunk_workload_and_replays_it_first(strategy) -> None:
    database = InMemoryExampleDatabase()
    saved = WorkloadCorpus(database, workload_corpus_key(step_name(read_then_rewrite), "cpu", [], strategy))
    options = dict(workloads=strategy, device="cpu", seed=0, saved_workloads=saved)
    # One drawn workload finds nothing (Hypothesis draws the simplest first: no rows) ...
    assert not fuzz(read_then_rewrite, examples=1, **options).racy
    assert saved.saved() == []
    first = fuzz(read_then_rewrite, examples=100, **options)
    assert first.racy and first.workloads.workload == [0, 0] and len(saved.saved()) == 1
    # ... but with the database it is the first workload run, and no workload is drawn.
    second = fuzz(read_then_rewrite, examples=1, **options)
    assert second.racy and second.workloads.workload == [0, 0]
    assert (second.workloads.replayed, second.workloads.examples, second.workloads.shrink_runs) == (1, 0, 0)
    assert {p.phase: p.runs for p in second.workloads.phases}["replay"] == 1
    # Fixed (the same key, the rewrite ordered after the read): the entry is tried, found clean, deleted.
    third = fuzz(ordered_rewrite, examples=5, **options)
    assert not third.racy and third.workloads.replayed == 1 and saved.saved() == []
    # Another strategy is another key: its sequences would draw other workloads.
    other = workload_corpus_key(step_name(read_then_rewrite), "cpu", [], st.lists(st.integers(0, 2)))
    assert other != saved.key


def test_a_clean_step_over_drawn_workloads_stays_clean_beside_its_racy_control() -> None:
    clean = fuzz(ordered_rewrite, workloads=ROWS, device="cpu", examples=60, seed=1)
    control = fuzz(read_then_rewrite, workloads=ROWS, device="cpu", examples=60, seed=1)
    assert control.racy and control.workloads.workload == [0, 0]  # the same draws race without the order
    assert not clean.racy and clean.workloads.workload is None and clean.workloads.examples == 60
    assert clean.workloads.stop_reason is StopReason.EXAMPLES
    line = clean.workloads.statistics_line()
    assert line.startswith("workloads stopped: all 60 examples ran; phases: generate 60 run(s)")
    assert not clean.races


def test_a_step_that_raises_on_a_workload_is_the_steps_error_not_a_race() -> None:
    from racefuzz.trace.search import StepFailed

    def fails_on_three(env, rows):
        if 3 in rows:
            raise KeyError(3)

    with pytest.raises(StepFailed, match="KeyError"):
        fuzz(fails_on_three, workloads=ROWS, device="cpu", examples=100, seed=0)


def test_saved_delay_sets_do_not_apply_over_workloads() -> None:
    from racefuzz.search.corpus import TraceCorpus

    with pytest.raises(ValueError, match="saved_workloads"):
        fuzz(read_then_rewrite, workloads=ROWS, device="cpu", saved=TraceCorpus(None, b"k"))
