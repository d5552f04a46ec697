"""The `racefuzz` command end to end on the simulator: exit codes, files on disk, replay round trip."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from racefuzz.cli import main
from racefuzz.exitcodes import ExitCode
from racefuzz.scenarios.sglang.designs import BUILTIN

PACKAGE = Path(__file__).resolve().parents[2] / "racefuzz"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_designs_lists_every_builtin_with_one_line(capsys) -> None:
    code, out, _ = run(capsys, "designs")
    assert code == ExitCode.CLEAN
    lines = out.strip().splitlines()
    assert [line.split()[0] for line in lines] == list(BUILTIN)


def test_none_is_caught_writes_files_and_replays_to_the_same_report(capsys, tmp_path: Path) -> None:
    code, out, _ = run(
        capsys,
        "run",
        "--backend",
        "sim",
        "--design",
        "none",
        "--examples",
        "300",
        "--report-dir",
        str(tmp_path),
        "--json",
        str(tmp_path / "summary.json"),
        "--quiet",
    )
    assert code == ExitCode.RACE
    assert "==== racefuzz: WAR race on req_to_token (design none, backend sim) ====" in out
    (replay_file,) = (p for p in tmp_path.glob("none-*.json") if not p.name.endswith(".trace.json"))
    report = replay_file.with_suffix(".txt").read_text()
    assert "missing edge:" in report and f"racefuzz replay {replay_file}" in report
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["run"]["found"] is True and summary["replay_file"] == str(replay_file)
    assert summary["run"]["stop_reason"] == "found"
    phases = {p["phase"]: p["runs"] for p in summary["run"]["phases"]}
    assert list(phases) == ["replay", "generate", "shrink", "minimize"] and phases["generate"] >= 1
    assert "stopped: found a counterexample; phases: " in out

    code, replay_out, _ = run(capsys, "replay", str(replay_file))
    assert code == ExitCode.RACE
    assert replay_out.startswith(report.rstrip("\n"))
    assert "reproduced the manifested corruption in 1/1 run(s) on sim" in replay_out


def test_clean_design_passes_beside_a_caught_control(capsys, tmp_path: Path) -> None:
    code, out, _ = run(
        capsys,
        "run",
        "--backend",
        "sim",
        "--design",
        "war-after-launch",
        "--examples",
        "200",
        "--report-dir",
        str(tmp_path),
        "--quiet",
    )
    assert code == ExitCode.CLEAN, out
    assert "stopped: all 200 examples ran; phases: generate 200 run(s)" in out
    assert "negative control `none`: caught after" in out
    assert "no race found in design war-after-launch over 200 examples" in out
    assert not list(tmp_path.glob("*.json"))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "--design", "nope"], "unknown design 'nope'"),
        (["run", "--design", "os.path:join"], "is not a design"),
        (["run", "--examples", "0"], "expected a positive integer"),
        (["run", "--examples", "many"], "expected a positive integer"),
        (["run", "--hazards", "everything"], "unknown hazard"),
        (["run", "--backend", "tpu"], "invalid choice"),
        (["replay", "/nonexistent/replay.json"], "cannot read replay file"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, argv: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as exc:  # argparse errors exit; ours return
        raise SystemExit(main(argv))
    assert exc.value.code == ExitCode.USAGE
    err = capsys.readouterr().err
    assert message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def _complete_replay(*, iterations: int = 2, **changes: object) -> str:
    """A replay file stating every field (as racefuzz writes them), with `changes`."""
    from racefuzz.report import ReplayFile
    from racefuzz.scenarios import get_scenario
    from racefuzz.scenarios.sglang.workload import Workload
    from racefuzz.schedule import NO_DELAYS

    data = ReplayFile("none", "sim", 0, Workload(), NO_DELAYS, "corruption", "0.1.0", get_scenario()).to_json()
    data["workload"]["iterations"] = iterations  # type: ignore[index]
    return json.dumps({**data, **changes})


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "malformed JSON"),
        ('{"format": "something-else"}', "not a racefuzz replay file"),
        ('{"format": "racefuzz-replay", "version": 99}', "replay format version 99"),
        (_complete_replay(design="no-such"), "unknown design 'no-such'"),
        (_complete_replay(iterations=-1), "iterations must be in [1, 1024]"),
        (_complete_replay(workload={}), 'missing field(s) "requests", "iterations"'),
        (_complete_replay(schedule={}), 'schedule: missing field(s) "device_delays"'),
    ],
)
def test_bad_replay_files(capsys, tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    code, _, err = run(capsys, "replay", str(path))
    assert code == ExitCode.USAGE
    assert message in err and len(err.strip().splitlines()) == 1


def test_cuda_backend_without_a_gpu_is_a_one_line_error(capsys) -> None:
    from racefuzz.backends import cuda_unavailable_reason

    if cuda_unavailable_reason() is None:
        pytest.skip("a GPU is usable here")
    code, _, err = run(capsys, "run", "--backend", "cuda")
    assert code == ExitCode.USAGE and err.startswith("racefuzz: error: --backend cuda:")


def test_designs_mutants_lists_the_catalogue(capsys) -> None:
    from racefuzz.scenarios.sglang.mutants import MUTANTS

    code, out, _ = run(capsys, "designs", "--mutants")
    assert code == ExitCode.CLEAN
    assert [line.split()[0] for line in out.strip().splitlines()] == list(MUTANTS)
    assert len(MUTANTS) >= 12


def test_run_with_the_pct_strategy_catches_a_mutant(capsys, tmp_path: Path) -> None:
    code, out, _ = run(
        capsys,
        "run",
        "--backend",
        "sim",
        "--design",
        "mutant-read-done-early",
        "--strategy",
        "pct",
        "--examples",
        "500",
        "--report-dir",
        str(tmp_path),
        "--quiet",
    )
    assert code == ExitCode.RACE, out
    assert "negative control `none`: caught" in out


def test_exit_codes_are_the_documented_integers() -> None:
    assert {code.name: int(code) for code in ExitCode} == {
        "CLEAN": 0,
        "RACE": 1,
        "USAGE": 2,
        "INCONCLUSIVE": 3,
        "USER_CODE": 4,
        "INTERNAL": 5,
        "TIMEOUT": 6,
        "INTERRUPTED": 130,
    }
    import racefuzz.exitcodes

    doc = racefuzz.exitcodes.__doc__ or ""
    assert all(f"| {int(code)} | `{code.name}` |" in doc for code in ExitCode), "the docstring table lists every code"


def _imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_no_module_of_the_package_imports_the_cli() -> None:
    # The console entry point (racefuzz/__main__.py) is the only way in: subcommands take exit codes from
    # racefuzz.exitcodes.
    importers = sorted(
        str(path.relative_to(PACKAGE.parent))
        for path in PACKAGE.rglob("*.py")
        if path.name not in ("cli.py", "__main__.py") and "racefuzz.cli" in _imported_modules(path)
    )
    assert importers == []


def test_a_design_typo_and_the_first_line_come_before_hypothesis_and_torch_are_imported(tmp_path):
    """A fast start: `racefuzz run` reports a mistyped design, and prints its first line, having imported
    neither Hypothesis nor torch (together ~2.5 s on a CPU machine; Hypothesis alone ~0.25 s)."""
    import subprocess
    import sys

    probe = (
        "import sys\n"
        "from racefuzz.cli import main\n"
        "import racefuzz.commands.run as run\n"
        "def stop(spec):\n"  # where the search would import Hypothesis: report what is loaded, then stop
        "    print('loaded', 'hypothesis' in sys.modules, 'torch' in sys.modules, flush=True)\n"
        "    raise SystemExit(0)\n"
        "run.example_database = stop\n"
        "code = main(sys.argv[1:])\n"
        "print('loaded', 'hypothesis' in sys.modules, 'torch' in sys.modules)\n"
        "raise SystemExit(code)\n"
    )
    typo = subprocess.run(
        [sys.executable, "-c", probe, "run", "--design", "no-such-design"], capture_output=True, text=True, cwd=tmp_path
    )
    assert typo.returncode == ExitCode.USAGE, typo.stderr
    assert "unknown design 'no-such-design'" in typo.stderr
    assert typo.stdout.strip() == "loaded False False"
    first = subprocess.run(
        [sys.executable, "-c", probe, "run", "--backend", "auto"], capture_output=True, text=True, cwd=tmp_path
    )
    lines = first.stdout.splitlines()
    assert lines[0].startswith("racefuzz ") and "design global-war on " in lines[0], first.stdout + first.stderr
    on_cpu = " on sim," in lines[0]  # `auto` picked the simulator: no GPU here, found without torch
    assert lines[1] == ("loaded False False" if on_cpu else "loaded False True")
