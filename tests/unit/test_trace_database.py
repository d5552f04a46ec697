"""`racefuzz trace` keeps a failure database as `racefuzz run` does (issue 26): a failing delay set found
once is saved and tried first on the next run; one that no longer fails is deleted. Runs `fuzz` as on a
GPU, recorded on the CPU (tests/unit/test_trace_nondeterminism.py's `as_on_a_gpu`, whose steps see the
delays their run applies)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from test_trace_nondeterminism import _main, hidden_sync_step, noisy_synced_step, record_as_on_a_gpu

from racefuzz.exitcodes import ExitCode
from racefuzz.search.corpus import TraceCorpus, trace_corpus_key


@pytest.fixture
def as_on_a_gpu(monkeypatch):
    return record_as_on_a_gpu(monkeypatch)


def test_a_failing_delay_set_is_saved_tried_first_and_deleted_once_it_passes(as_on_a_gpu) -> None:
    from hypothesis.database import InMemoryExampleDatabase

    from racefuzz.trace.report import render
    from racefuzz.trace.search import fuzz

    saved = TraceCorpus(InMemoryExampleDatabase(), trace_corpus_key("steps:step", "cuda", []))
    # One fuzzed run does not find it (Hypothesis' first draw is no delay at all) ...
    assert not fuzz(hidden_sync_step, examples=1, seed=0, saved=saved).manifested
    first = fuzz(hidden_sync_step, examples=50, seed=0, saved=saved)
    assert first.manifested and first.delays and saved.saved() == [first.delays]
    # ... but one fuzzed run does, with the saved set, which is tried before anything is drawn.
    as_on_a_gpu.runs = []
    second = fuzz(hidden_sync_step, examples=1, seed=0, saved=saved)
    assert second.manifested and second.delays == first.delays and (second.replayed, second.examples) == (1, 0)
    fuzzed = [delays for serialized, delays in as_on_a_gpu.runs if not serialized]
    assert fuzzed[0] == {(stream, n): us for stream, n, us in first.delays}
    assert "tried first: 1 saved delay set(s) of the failure database, found by one of them" in render(second)
    # Fixed (the same key, a step without the schedule-dependent value): the entry is tried, then deleted.
    third = fuzz(noisy_synced_step, examples=5, seed=0, saved=saved)
    assert not third.racy and third.replayed == 1 and saved.saved() == []


def test_entries_this_racefuzz_cannot_read_are_skipped() -> None:
    from hypothesis.database import InMemoryExampleDatabase

    database = InMemoryExampleDatabase()
    key = trace_corpus_key("steps:step", "cuda", ["req_to_token"])
    for value in (b"not json", b'{"delays": [["forward", true, 5000.0]]}', b'{"delays": 3}', b'{"other": []}'):
        database.save(key, value)
    corpus = TraceCorpus(database, key)
    corpus.save([("forward", 2, 5000.0)])
    assert corpus.saved() == [[("forward", 2, 5000.0)]]
    assert TraceCorpus(database, trace_corpus_key("steps:step", "cpu", ["req_to_token"])).saved() == []
    assert TraceCorpus(None, key).saved() == []


def test_the_trace_command_saves_in_database_and_replays_from_it(as_on_a_gpu, tmp_path, capsys) -> None:
    step = "test_trace_nondeterminism:hidden_sync_step"
    common = ["--seed", "0", "--report-dir", str(tmp_path / "reports"), "--database", str(tmp_path / "db")]
    assert _main(["trace", step, "--examples", "50", *common]) == ExitCode.RACE
    assert (tmp_path / "db").is_dir()
    capsys.readouterr()
    assert _main(["trace", step, "--examples", "1", *common]) == ExitCode.RACE
    assert "tried first: 1 saved delay set(s)" in capsys.readouterr().out
    # --database none keeps nothing: one fuzzed run finds nothing.
    assert _main(["trace", step, "--examples", "1", *common[:-1], "none"]) == ExitCode.CLEAN


def test_a_database_that_is_not_one_is_a_usage_error(tmp_path, capsys) -> None:
    argv = ["trace", "racefuzz.trace.example:racy_step", "--device", "cpu", "--report-dir", str(tmp_path)]
    assert _main([*argv, "--database", "racefuzz.trace:fuzz"]) == ExitCode.USAGE
    assert "not a hypothesis.database.ExampleDatabase" in capsys.readouterr().err
