"""Every bad input a user can give, through the real CLI (in-process, `racefuzz.cli.main`): each exits with
its documented code (`racefuzz.exitcodes`), says so in one line on stderr without a traceback, and leaves
the files already in the report directory byte-identical. The pytest plugin's are in
tests/plugin/test_plugin_bad_inputs.py; the watchdog's and Ctrl-C's need a process of their own
(tests/unit/test_stopping.py)."""

from __future__ import annotations

import json
import os
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from racefuzz.cli import main
from racefuzz.exitcodes import ExitCode

USER_DESIGNS = """
class Raises:
    name = "raises"

    def after_reads(self, ctx):
        table = {}
        return table["read_done"]


class WrongSignature:
    name = "wrong-signature"

    def after_reads(self):
        pass


class NotADesign:
    pass


class MisspeltHook:
    name = "misspelt"

    def after_read(self, ctx):
        pass


class SelfWait:
    name = "self-wait"

    def loop_top(self, ctx):
        ctx.schedule_stream.wait_stream(ctx.schedule_stream)


class MisusesTheDevice:
    name = "misuses"

    def loop_top(self, ctx):
        ctx.schedule_stream.wait_event("read_done")


class RaisesOnce:
    # Race-free (the README's barrier), but its hook raises on its 300th call only: inside the search,
    # where Hypothesis' re-run of the example does not raise again.

    name = "raises-once"
    calls = 0

    def after_reads(self, ctx):
        RaisesOnce.calls += 1
        if RaisesOnce.calls == 300:
            raise ValueError("once")
        ctx.state["read_done"] = ctx.forward_stream.record_event("read_done")

    def after_launch(self, ctx):
        read_done = ctx.state.pop("read_done", None)
        if read_done is not None:
            ctx.schedule_stream.wait_event(read_done)
        else:
            ctx.schedule_stream.wait_stream(ctx.forward_stream)


class Exits:
    # sys.exit() in a hook: an error in the user's code, never racefuzz's exit code (0 read as "no race").
    name = "exits"

    def after_reads(self, ctx):
        import sys

        sys.exit(0)


class RaisesSystemExit:
    name = "raises-system-exit"

    def after_launch(self, ctx):
        raise SystemExit("done")


raises = Raises()
exits = Exits()
raises_system_exit = RaisesSystemExit()
raises_once = RaisesOnce()
wrong_signature = WrongSignature()
not_a_design = NotADesign()
misspelt = MisspeltHook()
self_wait = SelfWait()
misuses = MisusesTheDevice()
"""

EARLIER = {"earlier.json": '{"kept": true}\n', "earlier.txt": "a report from an earlier run\n"}
"""Files an earlier run left in the report directory: every case checks they are unchanged."""


def _full_workload(**fields: object) -> dict[str, object]:
    """A workload's JSON with every field stated, as racefuzz writes it (a replay file must state them all)."""
    from racefuzz.scenarios.sglang.workload import RequestSpec, Workload

    workload = Workload(requests=(RequestSpec(),), iterations=2).to_json()
    workload["requests"] = [dict(r) for r in workload["requests"]]  # type: ignore[union-attr]
    return json.loads(json.dumps({**workload, **fields}))


def _replay(**changes: object) -> str:
    data: dict[str, object] = {
        "format": "racefuzz-replay",
        "version": 1,
        "racefuzz": "0.1.0",
        "scenario": "sglang-overlap",
        "design": "none",
        "backend": "sim",
        "seed": 0,
        "oracle": "corruption",
        "workload": _full_workload(),
        "schedule": {"device_delays": {}, "read_spins": {}, "host_delays": {}},
    }
    workload = changes.pop("workload", None)
    if isinstance(workload, dict):
        data["workload"] = {**data["workload"], **workload}  # type: ignore[dict-item]
    data.update(changes)
    return json.dumps(data)


def _without_iterations() -> str:
    data = json.loads(_replay())
    del data["workload"]["iterations"]
    return json.dumps(data)


def _request(**fields: object) -> dict[str, object]:
    return {**_full_workload()["requests"][0], **fields}  # type: ignore[index]


# (id, argv, exit code, a part of the one-line message)
CASES: list[tuple[str, list[str], int, str]] = [
    # -- designs
    ("unknown design", ["run", "--design", "nope"], ExitCode.USAGE, "unknown design 'nope'"),
    ("design typo", ["run", "--design", "global-wra"], ExitCode.USAGE, "did you mean 'global-war'?"),
    ("module missing", ["run", "--design", "nosuch.mod:design"], ExitCode.USAGE, "cannot import design module"),
    ("attribute missing", ["run", "--design", "designs.py:missin"], ExitCode.USAGE, "has no attribute 'missin'"),
    ("file missing", ["run", "--design", "missing.py:design"], ExitCode.USAGE, "no such file"),
    ("not a .py file", ["run", "--design", "./notes.txt:design"], ExitCode.USAGE, "is not a .py file"),
    ("not a design", ["run", "--design", "designs.py:not_a_design"], ExitCode.USAGE, "is not a design"),
    ("misspelt hook", ["run", "--design", "designs.py:misspelt"], ExitCode.USAGE, "did you mean 'after_reads'?"),
    ("hook raises", ["run", "--design", "designs.py:raises"], ExitCode.USER_CODE, "hook after_reads raised KeyError"),
    (
        "hook signature",
        ["run", "--design", "designs.py:wrong_signature"],
        ExitCode.USER_CODE,
        "hook after_reads cannot be called with 1 argument(s)",
    ),
    (
        "hook raises once in the search",
        ["run", "--design", "designs.py:raises_once", "--no-control", "--examples", "400", "--database", "none"],
        ExitCode.USER_CODE,
        "hook after_reads raised ValueError: once (at designs.py:",
    ),
    ("module raises", ["run", "--design", "boom.py:design"], ExitCode.USER_CODE, "RuntimeError: boom (at boom.py:1"),
    ("device misuse", ["run", "--design", "designs.py:misuses"], ExitCode.USER_CODE, "is not an event of this device"),
    (
        "lint --strict",
        ["run", "--design", "designs.py:self_wait", "--strict"],
        ExitCode.USER_CODE,
        "fails the lint (--strict): hook loop_top: schedule_stream.wait_stream(schedule_stream)",
    ),
    # -- output paths, checked before any search
    ("report dir under a file", ["run", "--report-dir", "notes.txt/out"], ExitCode.USAGE, "is not a directory"),
    ("report dir is a file", ["run", "--report-dir", "notes.txt"], ExitCode.USAGE, "exists and is not a directory"),
    ("json is a directory", ["run", "--json", ".racefuzz"], ExitCode.USAGE, "is a directory, not a file"),
    ("json under a file", ["run", "--json", "notes.txt/summary.json"], ExitCode.USAGE, "is not a directory"),
    ("database is a file", ["run", "--database", "notes.txt"], ExitCode.USAGE, "exists and is not a directory"),
    ("database object missing", ["run", "--database", "nosuch_mod:db"], ExitCode.USAGE, "--database nosuch_mod:db"),
    ("database no module", ["run", "--database", ":memory:"], ExitCode.USAGE, "--database :memory:"),
    # -- option ranges
    ("examples 0", ["run", "--examples", "0"], ExitCode.USAGE, "argument --examples"),
    ("examples text", ["run", "--examples", "many"], ExitCode.USAGE, "argument --examples"),
    ("examples huge", ["run", "--examples", str(10**9)], ExitCode.USAGE, "up to 100000000"),
    ("seed negative", ["run", "--seed", "-1"], ExitCode.USAGE, "argument --seed"),
    ("repeat 0", ["run", "--repeat", "0"], ExitCode.USAGE, "argument --repeat"),
    ("max delays huge", ["run", "--max-delays", "1000"], ExitCode.USAGE, "argument --max-delays"),
    ("unknown hazard", ["run", "--hazards", "bogus"], ExitCode.USAGE, "unknown hazard(s)"),
    ("empty hazards", ["run", "--hazards", ","], ExitCode.USAGE, "unknown hazard(s)"),
    ("unknown strategy", ["run", "--strategy", "bogus"], ExitCode.USAGE, "argument --strategy"),
    ("unknown backend", ["run", "--backend", "tpu"], ExitCode.USAGE, "argument --backend"),
    ("timeout 0", ["run", "--example-timeout", "0"], ExitCode.USAGE, "argument --example-timeout"),
    ("timeout inf", ["run", "--example-timeout", "inf"], ExitCode.USAGE, "argument --example-timeout"),
    ("plan stream both", ["run", "--plan-stream", "--no-plan-stream"], ExitCode.USAGE, "not allowed with"),
    ("unknown option", ["run", "--exmaples", "5"], ExitCode.USAGE, "unrecognized arguments"),
    ("no command", [], ExitCode.USAGE, "the following arguments are required"),
    ("unknown command", ["fuzz"], ExitCode.USAGE, "invalid choice"),
    # -- compare
    ("host-us inf", ["compare", "--host-us", "inf"], ExitCode.USAGE, "argument --host-us"),
    ("forward-us nan", ["compare", "--forward-us", "nan"], ExitCode.USAGE, "argument --forward-us"),
    ("prep-us negative", ["compare", "--prep-us", "-5"], ExitCode.USAGE, "argument --prep-us"),
    ("one design", ["compare", "--designs", "global-war"], ExitCode.USAGE, "at least two designs"),
    ("same design twice", ["compare", "--designs", "none,none"], ExitCode.USAGE, "names a design twice"),
    ("compare json dir", ["compare", "--json", ".racefuzz"], ExitCode.USAGE, "is a directory, not a file"),
    ("compare plot under file", ["compare", "--plot", "notes.txt/p.png"], ExitCode.USAGE, "is not a directory"),
    ("workloads 0", ["compare", "--workloads", "0"], ExitCode.USAGE, "argument --workloads"),
    # -- replay
    ("replay missing file", ["replay", "missing.json"], ExitCode.USAGE, "cannot read replay file"),
    ("replay not json", ["replay", "notes.txt"], ExitCode.USAGE, "malformed JSON"),
    ("replay version string", ["replay", "version-string.json"], ExitCode.USAGE, "(a str, not an integer)"),
    ("replay iterations 1e9", ["replay", "iterations.json"], ExitCode.USAGE, "iterations must be in [1, 1024]"),
    ("replay prompt 1e9", ["replay", "prompt.json"], ExitCode.USAGE, "prompt_len must be in [1, 4096]"),
    ("replay cost inf", ["replay", "cost.json"], ExitCode.USAGE, "forward_cost_us must be microseconds"),
    ("replay backend", ["replay", "backend.json"], ExitCode.USAGE, '"backend" must be one of sim, cuda'),
    ("replay seed", ["replay", "seed.json"], ExitCode.USAGE, '"seed" must be an integer'),
    ("replay delay", ["replay", "delay.json"], ExitCode.USAGE, "delay must be >= 0 microseconds"),
    ("replay --report-dir", ["replay", "seed.json", "--report-dir", "x"], ExitCode.USAGE, "unrecognized arguments"),
    ("replay hook raises", ["replay", "hook.json"], ExitCode.USER_CODE, "hook after_reads raised KeyError"),
    # -- replay files validated strictly: every field, types, ranges, the file bounded before it is read
    ("replay no prompt_len", ["replay", "no-prompt.json"], ExitCode.USAGE, 'missing field(s) "prompt_len"'),
    ("replay no iterations", ["replay", "no-iterations.json"], ExitCode.USAGE, 'missing field(s) "iterations"'),
    ("replay no schedule", ["replay", "no-schedule.json"], ExitCode.USAGE, 'missing field "schedule"'),
    ("replay no version string", ["replay", "no-racefuzz.json"], ExitCode.USAGE, '"racefuzz" must be the version'),
    ("replay float iterations", ["replay", "float.json"], ExitCode.USAGE, "iterations must be an integer"),
    ("replay /dev/zero", ["replay", "/dev/zero"], ExitCode.USAGE, "/dev/zero: not a regular file"),
    ("replay a directory", ["replay", "."], ExitCode.USAGE, "not a regular file"),
    ("replay a FIFO", ["replay", "fifo.json"], ExitCode.USAGE, "not a regular file"),
    ("replay huge", ["replay", "huge.json"], ExitCode.USAGE, "more than a replay file holds"),
    ("replay not UTF-8", ["replay", "latin1.json"], ExitCode.USAGE, "not UTF-8 text"),
    ("replay nested deeply", ["replay", "deep.json"], ExitCode.USAGE, "nested too deeply"),
    ("replay huge integer", ["replay", "digits.json"], ExitCode.USAGE, "malformed JSON"),
    ("replay design exits", ["replay", "exits.json"], ExitCode.USER_CODE, "hook after_reads raised SystemExit"),
    # -- sys.exit / raise SystemExit in the user's code: exit 4 naming the hook, never racefuzz's exit code
    (
        "hook sys.exit",
        ["run", "--design", "designs.py:exits"],
        ExitCode.USER_CODE,
        "hook after_reads raised SystemExit",
    ),
    (
        "hook raise SystemExit",
        ["run", "--design", "designs.py:raises_system_exit"],
        ExitCode.USER_CODE,
        "hook after_launch raised SystemExit",
    ),
    (
        "module sys.exit",
        ["run", "--design", "exits.py:design"],
        ExitCode.USER_CODE,
        "SystemExit: sys.exit(0) was called",
    ),
    (
        "module sys.exit by name",
        ["run", "--design", "exits_mod:design"],
        ExitCode.USER_CODE,
        "importing design module 'exits_mod' failed: SystemExit",
    ),
    (
        "compare hook sys.exit",
        ["compare", "--designs", "designs.py:exits,none", "--workloads", "2"],
        ExitCode.USER_CODE,
        "hook after_reads raised SystemExit",
    ),
    (
        "prove hook sys.exit",
        ["prove", "--design", "designs.py:exits", "--max-bytes", "4", "--iterations", "1", "--quiet"],
        ExitCode.USER_CODE,
        "hook after_reads raised SystemExit",
    ),
    # -- outputs that cannot be written: refused before the work
    ("report dir name too long", ["run", "--report-dir", "d" * 300], ExitCode.USAGE, "File name too long"),
    ("report dir empty", ["run", "--report-dir", ""], ExitCode.USAGE, "expected a path, got an empty string"),
    ("database empty", ["run", "--database", ""], ExitCode.USAGE, "--database: an empty value names no directory"),
    ("run json /dev/full", ["run", "--json", "/dev/full"], ExitCode.USAGE, "--json /dev/full: not a regular file"),
    ("compare json /dev/full", ["compare", "--json", "/dev/full"], ExitCode.USAGE, "--json /dev/full: not a regular"),
    ("compare plot /dev/full", ["compare", "--plot", "/dev/full"], ExitCode.USAGE, "--plot /dev/full: not a regular"),
    ("prove json /dev/full", ["prove", "--json", "/dev/full"], ExitCode.USAGE, "--json /dev/full: not a regular"),
    ("prove report dir", ["prove", "--report-dir", "notes.txt"], ExitCode.USAGE, "exists and is not a directory"),
    # -- the benchmarks are `python -m ci.bench` (tests/unit/test_ci_bench.py), not a racefuzz command
    ("bench", ["bench", "engine"], ExitCode.USAGE, "invalid choice: 'bench'"),
]


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user's directory: designs, replay files, a plain file, and a report directory with earlier files."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "designs.py").write_text(textwrap.dedent(USER_DESIGNS))
    (tmp_path / "boom.py").write_text("raise RuntimeError('boom')\n")
    (tmp_path / "notes.txt").write_text("not json, not a directory\n")
    replays = {
        "version-string.json": _replay(version="1"),
        "iterations.json": _replay(workload={"iterations": 10**9}),
        "prompt.json": _replay(workload={"requests": [_request(prompt_len=10**9)]}),
        "cost.json": _replay(workload={"forward_cost_us": float("inf")}),
        "backend.json": _replay(backend="tpu"),
        "seed.json": _replay(seed=-1),
        "delay.json": _replay(schedule={"device_delays": {"3": -5.0}}),
        "hook.json": _replay(design="designs.py:raises"),
        "exits.json": _replay(design="designs.py:exits"),
        "no-prompt.json": _replay(workload={"requests": [{k: v for k, v in _request().items() if k != "prompt_len"}]}),
        "no-iterations.json": _without_iterations(),
        "no-schedule.json": json.dumps({k: v for k, v in json.loads(_replay()).items() if k != "schedule"}),
        "no-racefuzz.json": json.dumps({k: v for k, v in json.loads(_replay()).items() if k != "racefuzz"}),
        "float.json": _replay(workload={"iterations": 2.0}),
        "deep.json": "[" * 100_000 + "]" * 100_000,
        "digits.json": '{"format": "racefuzz-replay", "seed": ' + "9" * 5000 + "}",
    }
    for name, text in replays.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "latin1.json").write_bytes(_replay(design="d\xe9sign").replace("\\u00e9", "\xe9").encode("latin-1"))
    with open(tmp_path / "huge.json", "wb") as huge:  # sparse: bigger than a replay file, nothing to read
        huge.truncate(64 * 1024 * 1024)
    os.mkfifo(tmp_path / "fifo.json")  # opening it to read would block for ever
    (tmp_path / "exits.py").write_text("import sys\n\nsys.exit(0)\n")
    (tmp_path / "exits_mod.py").write_text("raise SystemExit(3)\n")
    report_dir = tmp_path / ".racefuzz"
    report_dir.mkdir()
    for name, text in EARLIER.items():
        (report_dir / name).write_text(text)
    return tmp_path


def _one_line_error(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize(("argv", "code", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input(workdir: Path, capsys: pytest.CaptureFixture[str], argv: list[str], code: int, message: str) -> None:
    # --quiet and a tiny budget: a case that wrongly got as far as a search still ends fast.
    if argv[:1] == ["run"]:
        argv = [*argv, "--quiet", "--examples", "5"] if "--examples" not in argv else [*argv, "--quiet"]
    returned = run(argv)
    out, err = capsys.readouterr()
    line = _one_line_error(err)
    assert returned == code, (returned, err)
    assert message in line
    assert line.startswith("racefuzz: ")
    assert "Traceback" not in out
    for name, text in EARLIER.items():
        assert (workdir / ".racefuzz" / name).read_text() == text
    assert sorted(p.name for p in (workdir / ".racefuzz").iterdir()) == sorted(EARLIER)


def run(argv: list[str]) -> int:
    """`racefuzz ARGV` as the console script runs it: argparse's own errors end in SystemExit(2)."""
    try:
        return main(argv)
    except SystemExit as exit:
        return int(exit.code or 0)


def test_at_least_forty_cases_each_documented_code_used() -> None:
    assert len(CASES) >= 40
    assert {ExitCode.USAGE, ExitCode.USER_CODE} <= {code for _, _, code, _ in CASES}


def test_a_verbose_user_code_error_has_the_users_frame(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["run", "--design", "designs.py:raises", "--quiet", "-v"]) == ExitCode.USER_CODE
    err = capsys.readouterr().err
    assert "Traceback" in err and 'table["read_done"]' in err  # with -v, the user's own line


def test_an_internal_error_is_one_line_and_exit_5(
    workdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import racefuzz.lint

    def broken(*args: object, **kwargs: object) -> list[object]:
        raise RuntimeError("a bug\nover two lines")

    monkeypatch.setattr(racefuzz.lint, "preflight", broken)
    assert run(["run", "--quiet", "--examples", "5"]) == ExitCode.INTERNAL
    line = _one_line_error(capsys.readouterr().err)
    assert "internal error: RuntimeError: a bug | over two lines" in line and "-v prints the traceback" in line


def test_a_race_is_kept_when_the_report_dir_fails_after_the_check(
    workdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The report dir is checked first; here the check is skipped, as if the directory broke during the search.
    import racefuzz.commands.run as run_module

    monkeypatch.setattr(run_module, "check_outputs", lambda args: None)
    argv = ["run", "--design", "none", "--no-control", "--examples", "200", "--quiet", "--database", "none"]
    assert run([*argv, "--report-dir", "notes.txt/out"]) == ExitCode.RACE
    out, err = capsys.readouterr()
    assert "==== racefuzz:" in out and "RACE FOUND" in out  # the report is printed
    line = _one_line_error(err)
    fallback = Path(line.rsplit("the counterexample goes to ", 1)[1])
    assert list(fallback.glob("none-*.json")), "the replay file is in the temporary directory"


def test_a_clean_run_with_an_unwritable_json_is_a_usage_error_not_a_race(
    workdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import racefuzz.commands.run as run_module

    monkeypatch.setattr(run_module, "check_outputs", lambda args: None)
    argv = ["run", "--design", "war-after-launch", "--examples", "30", "--quiet", "--database", "none"]
    assert run([*argv, "--json", "notes.txt/summary.json"]) in (ExitCode.USAGE, ExitCode.INCONCLUSIVE)
    assert "cannot write --json" in capsys.readouterr().err


def test_replaying_a_cuda_file_without_a_gpu_suggests_the_simulator(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from racefuzz.backends import cuda_unavailable_reason

    if cuda_unavailable_reason() is None:
        pytest.skip("a GPU is usable here")
    (workdir / "cuda.json").write_text(_replay(backend="cuda"))
    assert run(["replay", "cuda.json"]) == ExitCode.USAGE
    assert "replay it on the simulator with --backend sim" in _one_line_error(capsys.readouterr().err)


def test_a_design_file_imports_the_packages_beside_the_user(workdir: Path) -> None:
    from racefuzz.designs import load_design

    (workdir / "helper_pkg").mkdir()
    (workdir / "helper_pkg" / "__init__.py").write_text("NAME = 'from-a-package'\n")
    design = "import helper_pkg\n\n\nclass D:\n    name = helper_pkg.NAME\n\n\ndesign = D()\n"
    (workdir / "uses_pkg.py").write_text(design)
    assert load_design("uses_pkg.py:design").name == "from-a-package"


# -- a race found is never lost to a crash ----------------------------------------------------------------


def test_a_rare_happens_before_race_is_reported_not_lost_in_shrinking(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # self-event races on the plan stream in about one workload of 700 here: the short search for a smaller
    # racy workload meets none, and the witness itself is the counterexample (once an AssertionError, exit 5).
    argv = ["run", "--backend", "sim", "--design", "self-event", "--hazards", "plan-stream", "--examples", "2000"]
    assert run([*argv, "--seed", "12", "--database", "none", "--no-control", "--quiet"]) == ExitCode.RACE
    out = capsys.readouterr().out
    assert "RACE FOUND in design self-event" in out and "replay: racefuzz replay" in out


def test_shrink_unordered_falls_back_to_the_witness_when_its_search_meets_no_race() -> None:
    from hypothesis import strategies as st

    from racefuzz.designs import load_design
    from racefuzz.scenarios.sglang.workload import RequestSpec, Workload
    from racefuzz.search.finish import shrink_unordered
    from racefuzz.search.outcome import judge

    design = load_design("none")
    # A workload `prove` finds racing for the design without a fence (the rewrite of its prefill result).
    witness = Workload(
        requests=(RequestSpec(prompt_len=1, chunk=1, rewrite_at=(0,)),), iterations=2, block_size=1, rows=1
    )
    clean = Workload(requests=(), iterations=1)
    assert judge(witness, design, None, None).races and not judge(clean, design, None, None).races
    assert shrink_unordered(design, witness, st.just(clean), seed=0).workload == witness


# -- racefuzz trace: the user's step, and only it, is user code ---------------------------------------------

STEPS = """
import sys

from racefuzz.trace.example import racy_step


def exits(env):
    sys.exit(0)


def raises_exit(env):
    raise SystemExit("stop")


def shape_error(env):
    import torch

    return {"sum": torch.ones(2, device=env.device) + torch.ones(3, device=env.device)}


def hangs(env):
    while True:
        pass


def racy(env):
    return racy_step(env)
"""


@pytest.fixture
def steps(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A package of steps beside the user, imported as `mysteps.steps` or by path (fresh in each test)."""
    import sys

    pytest.importorskip("torch")
    (workdir / "mysteps").mkdir()
    (workdir / "mysteps" / "__init__.py").write_text("")
    (workdir / "mysteps" / "steps.py").write_text(STEPS)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield workdir
    for name in ("mysteps.steps", "mysteps"):
        sys.modules.pop(name, None)


def _trace(*argv: str) -> int:
    return run(["trace", *argv, "--device", "cpu", "--report-dir", "reports"])


@pytest.mark.parametrize(
    ("step", "message"),
    [
        ("mysteps.steps:exits", "the step mysteps.steps:exits failed in its reference run: SystemExit: sys.exit(0)"),
        ("mysteps.steps:raises_exit", "SystemExit: sys.exit('stop') was called (at mysteps/steps.py:"),
        ("mysteps/steps.py:exits", "the step mysteps/steps.py:exits failed in its reference run: SystemExit"),
        ("mysteps.steps:shape_error", "RuntimeError: The size of tensor a (2) must match"),
    ],
    ids=["sys.exit", "raise SystemExit", "sys.exit, by path", "a torch error of the step"],
)
def test_a_step_that_exits_or_raises_is_an_error_in_user_code(
    steps: Path, capsys: pytest.CaptureFixture[str], step: str, message: str
) -> None:
    assert _trace(step) == ExitCode.USER_CODE
    assert message in _one_line_error(capsys.readouterr().err)


def test_a_step_is_found_in_the_working_directory_and_by_path_and_its_race_is_replayable(
    steps: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for spec in ("mysteps.steps:racy", "mysteps/steps.py:racy", "./mysteps/steps.py:racy"):
        assert _trace(spec) == ExitCode.RACE, capsys.readouterr()
    capsys.readouterr()
    written = sorted(p.name for p in (steps / "reports").iterdir())
    assert all(not name.startswith(".") for name in written), written
    by_path = steps / "reports" / "trace-mysteps_steps.py.racy.json"
    assert json.loads(by_path.read_text())["step"] == f"{steps / 'mysteps' / 'steps.py'}:racy"
    # A happens-before race on the CPU writes its replay file too, and it replays as that race.
    assert run(["trace", "--replay", str(by_path)]) == ExitCode.RACE
    assert "reproduced as 1 happens-before race(s)" in capsys.readouterr().out
    assert run(["trace", "mysteps.steps:exits", "--replay", str(by_path)]) == ExitCode.USAGE
    assert "the file replays the step" in _one_line_error(capsys.readouterr().err)


def test_trace_without_torch_is_a_usage_error_with_the_install_hint(
    steps: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    assert _trace("mysteps.steps:racy") == ExitCode.USAGE
    line = _one_line_error(capsys.readouterr().err)
    assert "racefuzz trace records torch code and needs torch" in line and "pip install torch" in line


def _racefuzz_bug(monkeypatch: pytest.MonkeyPatch, owner: object, method: str) -> None:
    """Replace `owner.method` by one that fails as racefuzz's own Python code would (its frame in the package)."""
    import racefuzz.trace.recorder as recorder_module

    namespace: dict[str, object] = {}
    source = "def broken(*args, **kwargs):\n    raise AssertionError('a bug in the recorder')\n"
    exec(compile(source, recorder_module.__file__, "exec"), namespace)
    monkeypatch.setattr(owner, method, namespace["broken"])


@pytest.mark.parametrize("method", ["on_wait", "finish"], ids=["inside the step's call", "after the step"])
def test_a_bug_in_the_recorder_is_an_internal_error_not_the_steps(
    steps: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, method: str
) -> None:
    from racefuzz.trace.recorder import Recorder

    _racefuzz_bug(monkeypatch, Recorder, method)
    assert _trace("racefuzz.trace.example:racy_step") == ExitCode.INTERNAL  # not 4: the step did nothing wrong
    assert "internal error: AssertionError: a bug in the recorder" in _one_line_error(capsys.readouterr().err)


def test_a_fuzzed_run_that_racefuzz_fails_in_is_no_manifestation(steps: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(steps))
    import mysteps.steps as user_steps  # type: ignore[import-not-found]

    from racefuzz.trace.oracle import Divergence
    from racefuzz.trace.recorder import Recorder
    from racefuzz.trace.search import StepFailed, run_once, run_with_delays, search_schedules

    reference = run_once(user_steps.racy, "cpu", serialize=True)
    # The step's own exception under a schedule is a candidate manifestation, returned ...
    assert isinstance(run_with_delays(user_steps.raises_exit, "cpu", reference, []), SystemExit)
    with pytest.raises(StepFailed):
        run_once(user_steps.exits, "cpu")
    # ... racefuzz's own failure is raised, not returned as one.
    _racefuzz_bug(monkeypatch, Recorder, "on_wait")
    with pytest.raises(AssertionError, match="a bug in the recorder"):
        run_with_delays(user_steps.racy, "cpu", reference, [])
    # In the search: a first run that diverges, then racefuzz fails: the failure is raised, not a race.
    calls = []

    def attempt(schedule: object) -> Divergence | None:
        calls.append(schedule)
        if len(calls) == 1:
            return Divergence("exception", None, "diverged")
        raise RuntimeError("racefuzz failed in a fuzzed run")

    with pytest.raises(BaseException) as raised:
        search_schedules([("forward", 0), ("schedule", 0)], attempt, examples=20, max_delays=2, seed=0)
    assert "racefuzz failed in a fuzzed run" in repr(raised.value) or any(
        "racefuzz failed" in repr(e) for e in getattr(raised.value, "exceptions", ())
    )


def test_a_step_that_never_returns_ends_with_exit_6_naming_it(steps: Path) -> None:
    import subprocess
    import sys

    argv = ["trace", "mysteps.steps:hangs", "--device", "cpu", "--report-dir", "reports", "--example-timeout", "1"]
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from racefuzz.cli import main; sys.exit(main(sys.argv[1:]))", *argv],
        cwd=steps,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == ExitCode.TIMEOUT, done.stderr
    line = _one_line_error(done.stderr)
    assert "mysteps.steps:hangs" in line and "took more than 1 s (--example-timeout)" in line


TRACE_REPLAY = {"format": "racefuzz-trace-replay", "version": 1, "step": "mysteps.steps:racy", "device": "cpu"}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"watch": [], "delays": [{"stream": "nosuch", "launch": 0, "us": 10.0}]}, "delay on stream 'nosuch'"),
        ({"watch": [], "delays": [{"stream": "forward", "launch": 99, "us": 10.0}]}, "before launch 99 on 'forward'"),
        ({"watch": []}, 'missing field "delays"'),
        ({"watch": "req_to_token", "delays": []}, '"watch" must be a list of tensor names'),
        ({"watch": [], "delays": [{"stream": "forward", "launch": True, "us": 1.0}]}, "launch must be an integer"),
        ({"watch": [], "delays": [{"stream": "forward", "launch": 0}]}, 'delay point 0 must be {"stream"'),
    ],
    ids=["unknown stream", "launch past the step's", "no delays", "watch a string", "launch a bool", "no us"],
)
def test_a_bad_trace_replay_file_is_one_usage_line(
    steps: Path, capsys: pytest.CaptureFixture[str], fields: dict[str, object], message: str
) -> None:
    (steps / "r.json").write_text(json.dumps({**TRACE_REPLAY, **fields}))
    for argv in (["trace", "--replay", "r.json"], ["replay", "r.json"]):
        assert run(argv) == ExitCode.USAGE
        line = _one_line_error(capsys.readouterr().err)
        assert message in line and "r.json" in line


def test_the_fixture_takes_one_watch_name_as_a_name_not_its_letters(steps: Path) -> None:
    from racefuzz.trace.example import racy_step
    from racefuzz.trace.fixture import RaceInTrace, TraceFixture

    with pytest.raises(RaceInTrace):  # before: "unknown watch name(s) _, e, k, n, o, q, r, t"
        TraceFixture("sim", 5, None, None).fuzz(racy_step, watch="req_to_token")


def test_compare_whose_output_cannot_be_written_after_all_says_so_in_one_line(
    workdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from racefuzz.scenarios import get_scenario

    def full_disk(designs: object, backend: str, args: object) -> int:
        raise OSError(28, "No space left on device", "out.png")

    monkeypatch.setattr(type(get_scenario()), "compare_command", lambda self, *a: full_disk(*a))
    assert run(["compare", "--plot", "out.png", "--workloads", "2"]) == ExitCode.USAGE
    line = _one_line_error(capsys.readouterr().err)
    assert "cannot write out.png: No space left on device" in line


def test_a_design_from_a_parent_directory_writes_no_hidden_files(
    workdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (workdir / "x").mkdir()
    (workdir / "x" / "d.py").write_text("class Bare:\n    name = 'bare'\n\n\ndesign = Bare()\n")  # no fence: races
    (workdir / "here").mkdir()
    monkeypatch.chdir(workdir / "here")
    argv = ["run", "--design", "../x/d.py:design", "--no-control", "--examples", "200", "--quiet", "--database", "none"]
    assert run([*argv, "--report-dir", "out"]) == ExitCode.RACE
    out = capsys.readouterr().out
    names = sorted(p.name for p in (workdir / "here" / "out").iterdir())
    assert names and not [n for n in names if n.startswith(".")], names  # was .._x_d.py.design-*.json
    header, last = out.splitlines()[0], out.strip().splitlines()[-1]
    assert "design ../x/d.py:design" in header and "RACE FOUND in design ../x/d.py:design" in last


def test_prove_says_what_it_proves_and_a_racing_workload_gets_a_replay_file(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["prove", "--design", "self-event", "--max-bytes", "12", "--iterations", "2", "--report-dir", "out"]
    assert run(argv) == ExitCode.RACE
    captured = capsys.readouterr()
    assert "racefuzz: proving self-event: every workload of up to 12 bytes below 2" in captured.err  # not silent
    replay = captured.out.rsplit("replay the first: racefuzz replay ", 1)[1].split()[0]
    assert run(["replay", replay]) == ExitCode.RACE  # the exit-code table's promise: exit 1 leaves a replay file
    assert "happens-before" in capsys.readouterr().out
