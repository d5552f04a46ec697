"""Failures a search found are kept in a Hypothesis example database and tried first on the next run."""

from __future__ import annotations

from hypothesis.database import DirectoryBasedExampleDatabase, InMemoryExampleDatabase

from racefuzz.backends import executor
from racefuzz.cli import main
from racefuzz.designs import load_design
from racefuzz.exitcodes import ExitCode
from racefuzz.search import search
from racefuzz.search.corpus import Corpus, corpus_key


def test_a_race_found_once_is_tried_first_on_the_next_run() -> None:
    database = InMemoryExampleDatabase()
    design = load_design("global-war")
    first = search(design, executor("sim"), examples=2000, seed=0, database=database)
    assert first.found and first.replayed == 0 and first.first_detection_example > 1
    # Another seed draws other examples; the saved failure is run before any of them.
    again = search(design, executor("sim"), examples=2000, seed=5, database=database)
    assert again.found and again.replayed == 1 and again.first_detection_example == 1
    assert again.counterexample.workload == first.counterexample.workload
    # The key names what gives the bytes their meaning: another design does not replay it.
    other = search(load_design("war-after-launch"), executor("sim"), examples=50, seed=0, database=database)
    assert other.replayed == 0 and not other.found


def test_a_saved_entry_that_no_longer_fails_is_forgotten() -> None:
    database = InMemoryExampleDatabase()
    design = load_design("war-after-launch")
    key = corpus_key(
        scenario="sglang-overlap",
        design="war-after-launch",
        hazards=frozenset(design.scenario.hazards),
        options={},
        strategy="random",
        max_delays=4,
        pct_depth=None,
        min_delay_us=0.0,
    )
    Corpus(database, key).save((bytes(11), b""))
    assert Corpus(database, key).saved() == [(bytes(11), b"")]
    result = search(design, executor("sim"), examples=20, seed=0, database=database)
    assert result.replayed == 1 and not result.found
    assert Corpus(database, key).saved() == []


def test_racefuzz_run_keeps_failures_in_the_database_directory(tmp_path, capsys) -> None:
    argv = ["run", "--backend", "sim", "--no-control", "--quiet", "--report-dir", str(tmp_path / "rf")]
    argv += ["--database", str(tmp_path / "db")]
    assert main(argv) == ExitCode.RACE
    first = capsys.readouterr().out
    assert main([*argv, "--seed", "3"]) == ExitCode.RACE
    second = capsys.readouterr().out
    assert "after 1 example(s)" in second and "after 1 example(s)" not in first
    assert DirectoryBasedExampleDatabase(str(tmp_path / "db")).fetch  # a directory database was written
    assert any((tmp_path / "db").iterdir())


def test_a_bad_database_is_a_one_line_usage_error(tmp_path, capsys) -> None:
    afile = tmp_path / "f"
    afile.write_text("x")
    assert main(["run", "--backend", "sim", "--database", str(afile)]) == ExitCode.USAGE
    assert "not a directory" in capsys.readouterr().err
    assert main(["run", "--backend", "sim", "--database", "no_such_module:db"]) == ExitCode.USAGE
    assert "--database no_such_module:db" in capsys.readouterr().err
