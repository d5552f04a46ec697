"""`python -m ci.bench NAME`, the benchmark runner (not in the wheel): each benchmark's own options, bad input as
one line and exit 2, files written only where asked; and `racefuzz bench` is gone from the product."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ci.bench.__main__ import BENCHMARKS, main
from racefuzz.exitcodes import ExitCode

ROOT = Path(__file__).resolve().parents[2]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse's own errors exit
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def test_every_benchmark_of_the_runner_is_a_module_of_ci_bench() -> None:
    assert set(BENCHMARKS) == {
        "mutants",
        "engine",
        "scenario",
        "matrix",
        "gpu",
        "trace",
        "selfcheck",
        "proof",
        "sglang_loop",
        "sglang_sync_cost",
    }
    for name in set(BENCHMARKS) - {"selfcheck"}:
        assert (ROOT / "ci" / "bench" / f"{name}.py").is_file(), name


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["engine", "--out", "d"], "unrecognized arguments: --out d"),
        (["matrix", "--backend", "cuda"], "unrecognized arguments: --backend cuda"),
        (["scenario", "--quick"], "unrecognized arguments: --quick"),
        (["engine", "--processes", "2"], "unrecognized arguments: --processes 2"),
        (["mutants", "--strategy", "bogus"], "argument --strategy: invalid choice"),
        (["sglang_loop", "--device", "tpu"], "argument --device: invalid choice"),
        (["sglang_loop", "--version", "0.0.1"], "0.0.1"),
        (["fuzz"], "invalid choice: 'fuzz'"),
        ([], "the following arguments are required: NAME"),
    ],
)
def test_an_option_of_another_benchmark_or_out_of_range_is_one_line_and_exit_2(capsys, argv, message) -> None:
    code, out, err = run(capsys, *argv)
    assert code == ExitCode.USAGE and out == ""
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("python -m ci.bench")


def test_output_paths_are_checked_before_any_work(capsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ci.bench import engine

    monkeypatch.setattr(engine, "run", lambda: pytest.fail("the benchmark ran before its --json was checked"))
    code, out, err = run(capsys, "engine", "--json", str(tmp_path))
    assert code == ExitCode.USAGE and out == "" and "is a directory, not a file" in err
    (tmp_path / "file").write_text("")
    code, _, err = run(capsys, "matrix", "--out", str(tmp_path / "file"))
    assert code == ExitCode.USAGE and "exists and is not a directory" in err
    code, _, err = run(capsys, "mutants", "--rates", "2", "many", str(tmp_path / "rates.json"))
    assert code == ExitCode.USAGE and "SEEDS and BUDGET are integers" in err


def test_a_bug_in_a_benchmark_is_one_line_and_exit_5(capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    from ci.bench import engine

    def broken() -> None:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(engine, "run", broken)
    code, out, err = run(capsys, "engine")
    assert code == ExitCode.INTERNAL and out == ""
    assert err.strip() == "python -m ci.bench engine: internal error: ZeroDivisionError: a bug"
    code, _, err = run(capsys, "engine", "-v")
    assert code == ExitCode.INTERNAL and "Traceback" in err


def test_matrix_writes_files_only_where_asked(capsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ci.bench import matrix

    monkeypatch.setattr(matrix, "EXAMPLES", 20)
    monkeypatch.chdir(tmp_path)
    code, out, _ = run(capsys, "matrix")
    assert code == ExitCode.CLEAN and "| `none` |" in out
    assert list(tmp_path.iterdir()) == [], "without --out or --json nothing is written (no ./docs/results/)"

    code, out, _ = run(capsys, "matrix", "--out", "results", "--json", "matrix.json")
    assert code == ExitCode.CLEAN
    cells = json.loads((tmp_path / "matrix.json").read_text())["cells"]
    written = [Path(c["replay_file"]) for c in cells if c.get("replay_file")]
    assert written and all(path.parts[:2] == ("results", "counterexamples") for path in written)
    assert all(path.exists() and path.with_suffix(".txt").exists() for path in written)
    assert all(f"`{path}`" in out for path in written), "the table names the files it wrote"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["matrix.json", "results"]


def test_engine_prints_its_table_and_writes_its_figures(capsys, tmp_path: Path, monkeypatch) -> None:
    from ci.bench import engine

    small = engine.run(n_ops=500, repeats=1)  # the runner calls run() with the benchmark's defaults
    monkeypatch.setattr(engine, "run", lambda: small)
    code, out, _ = run(capsys, "engine", "--json", str(tmp_path / "engine" / "figures.json"))
    assert code == ExitCode.CLEAN and out.startswith("racefuzz engine benchmark")
    assert json.loads((tmp_path / "engine" / "figures.json").read_text()) == small


def test_racefuzz_has_no_bench_command_and_ships_selfcheck(capsys) -> None:
    from racefuzz.cli import main as racefuzz_main

    with pytest.raises(SystemExit) as exc:
        racefuzz_main(["bench", "engine"])
    assert exc.value.code == ExitCode.USAGE
    assert "invalid choice: 'bench'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        racefuzz_main(["--help"])
    assert exc.value.code == 0
    (commands,) = re.findall(r"\{([a-z,]+)\}", capsys.readouterr().out.split("\n\n")[0])  # usage: ... {run,...}
    assert "selfcheck" in commands.split(",") and "bench" not in commands.split(",")
    with pytest.raises(SystemExit) as exc:
        racefuzz_main(["selfcheck", "--help"])
    assert exc.value.code == 0 and "usage: racefuzz selfcheck" in capsys.readouterr().out


def test_the_runner_runs_from_the_repository_root() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ci.bench", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert all(name in result.stdout for name in BENCHMARKS)
