"""The mutant benchmark: does racefuzz catch every mutant of `racefuzz.designs.mutants`, how fast, by which
oracle, and what do the baselines catch in the same run?

`python -m ci.bench mutants --backend sim|cuda [--json PATH]` (raw output in docs/results/mutants-sim/ and
docs/results/mutants-gpu-h200/). For every mutant, on its hazards:

* **racefuzz** (the default random delay strategy, seed 0): caught or not, by which oracle (the strongest
  that fired: `corruption` = manifested, `happens-before` = an unordered conflicting pair, `allocation` =
  a forward read cells nobody allocated for it), examples and seconds to the first detection by any oracle
  and to the first manifested corruption, and the counterexample's shrunk size;
* **delay strategies** over several seeds: `random` (racefuzz's default), `pct` (PCT-style priorities and
  change points, `racefuzz.schedulers.pct`) and `none`, the **plain stress loop**: the same mutant, the
  same examples budget and workloads, no injected delay, judged as a stress test judges -- by manifested
  corruption only (a stress loop has no happens-before oracle);
* **CSAN** (PyTorch's CUDA Stream Sanitizer): racefuzz's kernels are CuPy kernels (and, on the simulator,
  no kernels at all), which CSAN cannot see. On the CUDA backend the benchmark also runs each mutant's
  programs as torch ops (a `clone` per read range, a `copy_` per write range, torch events and waits)
  under `torch.cuda._sanitizer` in a child process, to show what CSAN would report on the same examples.

Kill rate = caught / mutants that are not equivalent (a mutant whose `equivalent` reason says no schedule
of the scenario can tell it from its base is reported, not counted). Beside the mutants, the false-alarm
check: each correct design searched over the hazards it fences, with both delay strategies, next to the
negative control `none` caught in the same run on the same hazards.

Shrinking: on the simulator the search shrinks as `racefuzz run` does (Hypothesis, then
`racefuzz.minimize`). On the GPU a Hypothesis shrink re-runs every candidate k times, so the detection run
does not shrink and the counterexample is then minimized structurally (`racefuzz.minimize`, k = 5) with a
bounded budget.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from racefuzz import __version__
from racefuzz.backends import Executor, executor
from racefuzz.designs import load_design
from racefuzz.program import (
    DeviceSync,
    EventSync,
    HostDelay,
    Launch,
    OpVisitor,
    Record,
    StreamSync,
    WaitEvent,
    WaitStream,
)
from racefuzz.report import primary_race
from racefuzz.scenarios.sglang import (
    ALL_HAZARDS,
    LATER_HAZARDS,
    LIFETIME_HAZARDS,
    OPT_IN_HAZARDS,
    PRE_LAUNCH_HAZARDS,
    Workload,
    build_program,
)
from racefuzz.scenarios.sglang.mutants import MUTANTS
from racefuzz.search import GPU_MIN_DELAY_US, SearchResult, judge, minimize, reproduces, search

ROOT = Path(__file__).resolve().parents[2]
"""The repository root: the CSAN child runs `python -m ci.bench.mutants` there."""

CLEAN = (
    ("war-after-launch", ALL_HAZARDS),
    ("global-war", PRE_LAUNCH_HAZARDS + OPT_IN_HAZARDS),
    ("read-done", PRE_LAUNCH_HAZARDS + OPT_IN_HAZARDS),
    ("read-done-post-replay", ALL_HAZARDS + LATER_HAZARDS),
    ("record-stream", ALL_HAZARDS + LATER_HAZARDS + LIFETIME_HAZARDS),
)
"""(correct design, the hazards it fences): the false-alarm runs."""
CONTROL = "none"
STRATEGIES = ("random", "pct", "none")

CSAN_NOT_APPLICABLE = "not applicable: racefuzz's kernels are CuPy kernels, not torch ops; CSAN sees none of them"

SETTINGS: dict[str, dict[str, int]] = {
    # examples: budget per search (a search stops at the first manifested corruption); seeds: for the
    # strategy comparison; false_alarm_*: examples per correct design and strategy.
    "sim": {
        "examples": 1000,
        "seeds": 5,
        "false_alarm_random": 10_000,
        "false_alarm_pct": 10_000,
        "repeat": 1,
        "minimize_budget": 400,
        "csan_examples": 0,
    },
    "cuda": {
        "examples": 300,
        "seeds": 1,
        "false_alarm_random": 2_000,
        "false_alarm_pct": 500,
        "repeat": 5,
        "minimize_budget": 60,
        "csan_examples": 12,
    },
}


QUICK: dict[str, int] = {
    "examples": 300,
    "seeds": 2,
    "false_alarm_random": 1000,
    "false_alarm_pct": 1000,
    "minimize_budget": 100,
    "csan_examples": 0,
}
"""`python -m ci.bench mutants --quick`: a smoke run (under 90 s on the simulator): fewer examples and seeds,
smaller false-alarm budgets, no CSAN. Its figures are not the committed ones."""


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _environment(backend: str) -> dict[str, Any]:
    env: dict[str, Any] = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "racefuzz": __version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
    }
    try:
        import hypothesis

        env["hypothesis"] = hypothesis.__version__
    except ImportError:  # pragma: no cover - hypothesis is a dependency
        pass
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5, check=False
        )
        env["commit"] = commit.stdout.strip() or None
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
        env["tree_dirty"] = bool(status.stdout.strip()) if status.returncode == 0 and env["commit"] else None
    except (OSError, subprocess.SubprocessError):
        env["commit"] = env["tree_dirty"] = None
    if backend == "cuda":
        import cupy
        import torch

        env.update(
            torch=f"{torch.__version__} (CUDA {torch.version.cuda})",
            cupy=cupy.__version__,
            device=torch.cuda.get_device_name(0),
        )
    return env


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _detection(result: SearchResult) -> dict[str, Any]:
    """One search's detection figures."""
    c = result.counterexample
    return {
        "examples": result.examples,
        "caught": result.found,
        "oracle": c.oracle if c else None,
        "examples_to_detect": result.first_detection_example,
        "seconds_to_detect": _round(result.first_detection_seconds),
        "manifested": result.first_manifested_example is not None,
        "examples_to_manifest": result.first_manifested_example,
        "seconds_to_manifest": _round(result.first_manifested_seconds),
        "flaky": len(result.flaky),
    }


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Several seeds of one strategy: how many caught/manifested, and the medians of the manifested ones."""
    manifested = [r for r in runs if r["manifested"]]
    return {
        "seeds": len(runs),
        "caught_seeds": sum(r["caught"] for r in runs),
        "manifested_seeds": len(manifested),
        "median_examples_to_manifest": _median([r["examples_to_manifest"] for r in manifested]),
        "median_seconds_to_manifest": _round(_median([r["seconds_to_manifest"] for r in manifested])),
        "runs": runs,
    }


def _shrunk(result: SearchResult, design, run: Executor, backend: str, settings: dict[str, int]) -> dict[str, Any]:
    """The counterexample's size; on the GPU, minimized here (see the module docstring)."""
    c = result.counterexample
    assert c is not None
    start = time.perf_counter()
    workload, schedule = c.workload, c.schedule
    reproduced: bool | None = None
    replayed_once: bool | None = None
    if backend != "sim":
        timed = c.oracle == "corruption"
        workload, schedule = minimize(
            workload,
            schedule,
            design,
            run if timed else None,
            repeat=settings["repeat"],
            budget=settings["minimize_budget"],
            min_delay_us=GPU_MIN_DELAY_US,  # as `search` floors GPU delays: a shorter spin is a coin toss
        )
        if timed:
            # As `search` does: keep the minimized form only if it reproduces k/k in fresh runs.
            reproduced = reproduces(judge(workload, design, schedule, run), run, settings["repeat"])
            if not reproduced:
                workload, schedule = c.workload, c.schedule
            replayed_once = bool(judge(workload, design, schedule, run).corruptions)  # one fresh run: 1/1?
        seconds = time.perf_counter() - start
    else:
        seconds = result.seconds - (result.first_detection_seconds or 0.0)
    outcome = judge(workload, design, None, None)
    race = primary_race(c) if backend == "sim" else (outcome.races[0] if outcome.races else None)
    return {
        "requests": len(workload.requests),
        "iterations": workload.iterations,
        "nonzero_delays": schedule.nonzero_delays,
        "shrink_seconds": _round(seconds, 3),
        "minimized_reproduced_k_of_k": reproduced,
        "replayed_1_of_1": replayed_once,
        "race": None
        if race is None
        else f"{race.kind} {race.first.kernel} ({race.first.stream}) -> {race.second.kernel} ({race.second.stream})",
        "workload": workload.to_json(),
        "schedule": schedule.to_json(),
    }


def _bench_mutant(
    name: str, run: Executor, backend: str, settings: dict[str, int], main_strategy: str = "random"
) -> dict[str, Any]:
    mutant = MUTANTS[name]
    design = load_design(name)
    hazards = tuple(getattr(mutant, "hazards", ALL_HAZARDS))
    plan_stream = getattr(mutant, "plan_stream", None)
    common = {"hazards": hazards, "plan_stream": plan_stream, "repeat": settings["repeat"], "backend": backend}
    main = search(
        design, run, examples=settings["examples"], seed=0, shrink=backend == "sim", strategy=main_strategy, **common
    )
    row: dict[str, Any] = {
        "name": name,
        "description": design.description,
        "base": getattr(mutant, "base", None),
        "hazards": list(hazards),
        "plan_stream": plan_stream,
        "equivalent": getattr(mutant, "equivalent", None),
        **_detection(main),
    }
    row["shrunk"] = _shrunk(main, design, run, backend, settings) if main.found else None
    strategies: dict[str, Any] = {}
    for strategy in STRATEGIES:
        runs = []
        for seed in range(settings["seeds"]):
            if strategy == main_strategy and seed == 0:
                runs.append(_detection(main))  # the main run is this one (shrinking starts after detection)
                continue
            result = search(
                design, run, examples=settings["examples"], seed=seed, shrink=False, strategy=strategy, **common
            )
            runs.append(_detection(result))
        strategies[strategy] = _summary(runs)
    stress = strategies["none"]
    row["baselines"] = {
        "stress": {
            "what": "same mutant, same examples budget and workloads, no injected delay; caught = manifested",
            "caught": stress["runs"][0]["manifested"],
            "examples_to_detect": stress["runs"][0]["examples_to_manifest"],
            "seconds_to_detect": stress["runs"][0]["seconds_to_manifest"],
            "manifested_seeds": stress["manifested_seeds"],
            "seeds": stress["seeds"],
        },
        "csan": {"status": CSAN_NOT_APPLICABLE},
        "strategies": strategies,
    }
    return row


def _false_alarms(run: Executor, backend: str, settings: dict[str, int]) -> list[dict[str, Any]]:
    rows = []
    for name, hazards in CLEAN:
        for strategy in ("random", "pct"):
            examples = settings[f"false_alarm_{strategy}"]
            common = {
                "hazards": hazards,
                "strategy": strategy,
                "repeat": settings["repeat"],
                "backend": backend,
                "shrink": False,
            }
            clean = search(load_design(name), run, examples=examples, seed=1, **common)
            control = search(load_design(CONTROL), run, examples=examples, seed=1, **common)
            rows.append(
                {
                    "design": name,
                    "hazards": list(hazards),
                    "strategy": strategy,
                    "examples": clean.examples,
                    "clean": not clean.found,
                    "oracle": clean.counterexample.oracle if clean.counterexample else None,
                    "flaky": len(clean.flaky),
                    "seconds": _round(clean.seconds, 2),
                    "control": {
                        "design": CONTROL,
                        "caught": control.found,
                        "manifested": control.first_manifested_example is not None,
                        "examples_to_detect": control.first_detection_example,
                        "examples_to_manifest": control.first_manifested_example,
                    },
                    "conclusive": control.found,
                }
            )
    return rows


def run(
    backend: str = "sim",
    *,
    names: list[str] | None = None,
    settings: dict[str, int] | None = None,
    csan: bool = True,
    progress: Callable[[str], None] | None = None,
    strategy: str = "random",
    quick: bool = False,
) -> dict[str, Any]:
    """Benchmark every mutant (or `names`) on `backend` (`sim` or `cuda`); see the module docstring.

    `settings` overrides `SETTINGS[backend]` key by key (tests use small budgets); `quick` applies QUICK
    first. Returns the JSON-able results: `mutants` (one object per mutant), `kill_rate`,
    `median_seconds_to_detect`, `false_alarms`. One progress line per mutant goes to `progress` (stderr).
    """
    chosen = {**SETTINGS[backend], **(QUICK if quick else {}), **(settings or {})}
    say = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    run_program = executor(backend)
    environment = _environment(backend)
    if backend == "cuda":
        start = time.perf_counter()
        _warm_up(run_program)
        environment["warm_up_seconds"] = _round(time.perf_counter() - start, 2)
    rows = []
    for name in names or list(MUTANTS):
        started = time.perf_counter()
        rows.append(_bench_mutant(name, run_program, backend, chosen, strategy))
        say(f"{name}: caught={rows[-1]['caught']} oracle={rows[-1]['oracle']} ({time.perf_counter() - started:.1f} s)")
    started = time.perf_counter()
    false_alarms = _false_alarms(run_program, backend, chosen)
    say(f"false alarms: {time.perf_counter() - started:.1f} s")
    if backend == "cuda" and csan and chosen["csan_examples"] > 0:
        # Last, in a child process with its own time limit: a CSAN failure cannot cost the figures above.
        started = time.perf_counter()
        csan_results = _csan_in_child(rows, chosen["csan_examples"])
        for row in rows:
            row["baselines"]["csan"] = csan_results.get(row["name"], csan_results.get("error", {"status": "no result"}))
        environment["csan_controls"] = csan_results.get("controls")
        say(f"CSAN: {time.perf_counter() - started:.1f} s")
    killable = [r for r in rows if not r["equivalent"]]
    caught = [r for r in killable if r["caught"]]
    return {
        "benchmark": "mutants",
        "backend": backend,
        "command": f"python -m ci.bench mutants --backend {backend}{' --quick' if quick else ''}"
        f"{'' if strategy == 'random' else f' --strategy {strategy}'} --json PATH",
        "strategy": strategy,
        "environment": environment,
        "settings": chosen,
        "mutants": rows,
        "killable": len(killable),
        "caught": len(caught),
        "kill_rate": _round(len(caught) / len(killable), 4) if killable else None,
        "median_seconds_to_detect": _round(_median([r["seconds_to_detect"] for r in caught])),
        "median_examples_to_detect": _median([r["examples_to_detect"] for r in caught]),
        "median_seconds_to_manifest": _round(
            _median([r["seconds_to_manifest"] for r in caught if r["seconds_to_manifest"] is not None])
        ),
        "stress_kill_rate": _round(sum(r["baselines"]["stress"]["caught"] for r in killable) / len(killable), 4)
        if killable
        else None,
        "false_alarms": false_alarms,
    }


def _warm_up(run_program: Executor) -> None:
    """Compile the kernels and calibrate the clock before any detection is timed."""
    from racefuzz.schedule import NO_DELAYS

    run_program(build_program(Workload(), load_design(CONTROL).hooks), NO_DELAYS)


# -- CSAN: the same programs as torch ops under torch.cuda._sanitizer, in a child process -----------------


def _csan_in_child(rows: list[dict[str, Any]], examples: int, timeout_s: float = 60.0) -> dict[str, Any]:
    """Run `_csan_worker` in a fresh interpreter (CSAN stays enabled for the life of a process and would
    see every later torch call of this one). Never raises: a failure becomes the rows' CSAN status."""
    request = {
        "examples": examples,
        "mutants": [
            {
                "name": r["name"],
                "hazards": r["hazards"],
                "plan_stream": r["plan_stream"],
                "counterexample": r["shrunk"] and {"workload": r["shrunk"]["workload"]},
            }
            for r in rows
        ],
    }
    with tempfile.TemporaryDirectory() as tmp:
        inp, out = Path(tmp) / "in.json", Path(tmp) / "out.json"
        inp.write_text(json.dumps(request))
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "ci.bench.mutants", "--csan-worker", str(inp), str(out)],
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return {"error": {"status": f"error: the CSAN run exceeded {timeout_s:.0f} s"}}
        if proc.returncode != 0 or not out.exists():
            tail = (proc.stderr or "").strip().splitlines()[-1:] or ["no output"]
            return {"error": {"status": f"error: the CSAN child exited {proc.returncode}: {tail[0][:200]}"}}
        return json.loads(out.read_text())


class _TorchOps(OpVisitor[None]):
    """Issues each op of a program as plain torch ops (see `torch_ops_execute`); `loads` collects the reads.

    Without `streams` (a CPU dry run on the current stream, in program order) only launches run: there is
    nothing to synchronize. Host delays are not run: CSAN's verdict does not depend on timing.
    """

    def __init__(self, torch: Any, streams: list[Any] | None, tables: dict, values: dict, events: list[Any]) -> None:
        self.torch, self.streams, self.tables, self.values, self.events = torch, streams, tables, values, events
        self.loads: dict[int, tuple[Any, ...]] = {}

    def visit_launch(self, op: Launch) -> None:
        torch, tables = self.torch, self.tables
        with torch.cuda.stream(self.streams[op.stream.id]) if self.streams is not None else contextlib.nullcontext():
            self.loads[op.index] = tuple(
                tables[r.buffer.id][r.row0 : r.row1, r.col0 : r.col1].clone() for r in op.reads
            )
            for k, w in enumerate(op.writes):
                tables[w.buffer.id][w.row0 : w.row1, w.col0 : w.col1].copy_(self.values[(op.index, k)])

    def visit_record(self, op: Record) -> None:
        if self.streams is not None:
            self.events[op.event.id].record(self.streams[op.stream.id])

    def visit_wait_event(self, op: WaitEvent) -> None:
        if self.streams is not None:
            self.streams[op.stream.id].wait_event(self.events[op.event.id])

    def visit_wait_stream(self, op: WaitStream) -> None:
        if self.streams is not None:
            self.streams[op.stream.id].wait_stream(self.streams[op.other.id])

    def visit_event_sync(self, op: EventSync) -> None:
        if self.streams is not None:
            self.events[op.event.id].synchronize()

    def visit_stream_sync(self, op: StreamSync) -> None:
        if self.streams is not None:
            self.streams[op.stream.id].synchronize()

    def visit_device_sync(self, op: DeviceSync) -> None:
        if self.streams is not None:
            self.torch.cuda.synchronize()

    def visit_host_delay(self, op: HostDelay) -> None:
        pass


def torch_ops_execute(program, torch: Any, device: Any, streams: list[Any] | None, sanitizer: Any = None):
    """Run `program` as plain torch ops, the way CSAN can see it: per launch, on its stream, a `clone` of
    every read range then a `copy_` into every write range; torch events, waits and syncs for the rest.

    `streams` None runs everything on the current stream (a CPU dry run). Returns (loads, reports): the
    loaded tensors by launch index, and the ops at which `sanitizer.CUDASanitizerErrors` was raised (CSAN
    raises after the op ran, so the run goes on). Buffers, values and events are set up and synchronized
    before the first op, so the setup itself cannot be reported.
    """
    import numpy as np

    cuda = streams is not None
    tables = {b.id: torch.full((b.rows, b.cols), b.fill, dtype=torch.int32, device=device) for b in program.buffers}
    values = {
        (op.index, k): torch.tensor(np.ascontiguousarray(v), dtype=torch.int32, device=device)
        for op in program.launches
        for k, v in enumerate(op.values)
    }
    events = [torch.cuda.Event() for _ in program.events] if cuda else []
    if cuda:
        torch.cuda.synchronize()
    errors = sanitizer.CUDASanitizerErrors if sanitizer is not None else ()
    ops = _TorchOps(torch, streams, tables, values, events)
    reports: list[str] = []
    for op in program.ops:
        try:
            ops.visit(op)
        except errors as exc:
            reports.append(f"op #{op.index} {getattr(op, 'kernel', type(op).__name__)}: {len(exc.errors)} error(s)")
    if cuda:
        torch.cuda.synchronize()
    return {i: ts for i, ts in ops.loads.items() if ts}, reports


def _csan_worker(request: dict[str, Any]) -> dict[str, Any]:
    """In the child: enable CSAN, then for every mutant run (a) its minimal counterexample and (b) the
    stress loop's examples (strategy `none`, seed 0, stopping at CSAN's first report) as torch ops."""
    import torch
    from torch.cuda import _sanitizer

    from racefuzz.backends import Execution

    _sanitizer.enable_cuda_sanitizer()
    pool = [torch.cuda.Stream() for _ in range(8)]  # created after enabling, so CSAN traces their creation
    device = torch.device("cuda")

    class _Reported(Exception):
        pass

    def under_csan(name: str, hazards: list[str], plan_stream: bool | None) -> dict[str, Any]:
        seen = [0]
        first: list[int] = []
        start = time.perf_counter()

        def csan_run(program, schedule):  # the schedule is ignored: CSAN's verdict does not depend on timing
            seen[0] += 1
            loads, reports = torch_ops_execute(program, torch, device, pool, _sanitizer)
            if reports:
                first[:1] = first[:1] or [seen[0]]
                raise _Reported
            return Execution({i: tuple(t.cpu().numpy() for t in ts) for i, ts in loads.items()}, [], 0.0)

        with contextlib.suppress(_Reported):
            search(
                load_design(name),
                csan_run,
                examples=request["examples"],
                seed=0,
                hazards=tuple(hazards),
                plan_stream=plan_stream,
                strategy="none",
                shrink=False,
                backend="cuda",
            )
        seconds = _round(time.perf_counter() - start)
        if first:
            return {"caught": True, "examples_to_detect": first[0], "seconds_to_detect": seconds}
        return {"caught": False, "examples": seen[0], "seconds": seconds}

    results: dict[str, Any] = {}
    for m in request["mutants"]:
        entry: dict[str, Any] = {"status": "run: the same programs as torch ops under torch.cuda._sanitizer"}
        if m["counterexample"]:
            workload = Workload.from_json(m["counterexample"]["workload"])
            program = build_program(workload, load_design(m["name"]).hooks)
            _, reports = torch_ops_execute(program, torch, device, pool, _sanitizer)
            entry["counterexample_reported"] = bool(reports)
            entry["counterexample_reports"] = reports[:3]
        entry.update(under_csan(m["name"], m["hazards"], m["plan_stream"]))
        results[m["name"]] = entry
    everything = list(ALL_HAZARDS)
    results["controls"] = {
        CONTROL: under_csan(CONTROL, everything, None),
        "war-after-launch": under_csan("war-after-launch", everything, None),
    }
    return results


# -- the text table -----------------------------------------------------------------------------------------


def _cell_strategy(summary: dict[str, Any]) -> str:
    m = summary["median_examples_to_manifest"]
    return f"{summary['manifested_seeds']}/{summary['seeds']}" + (f", {m:g} ex" if m is not None else "")


def _cell_csan(csan: dict[str, Any]) -> str:
    if "caught" not in csan:
        return "n/a" if csan.get("status", "").startswith("not applicable") else csan.get("status", "?")[:60]
    got = f"yes, {csan['examples_to_detect']} ex" if csan["caught"] else f"no ({csan['examples']} ex)"
    if "counterexample_reported" in csan:
        got += "; minimal cx: " + ("reported" if csan["counterexample_reported"] else "silent")
    return got


def render(results: dict[str, Any]) -> str:
    env = results["environment"]
    s = results["settings"]
    dirty = ", tree with uncommitted changes" if env.get("tree_dirty") else ""
    lines = [
        f"# {results['command']}",
        f"racefuzz mutant benchmark  {env['date']}  backend {results['backend']}  racefuzz {env['racefuzz']}"
        f" (commit {env.get('commit')}{dirty})  python {env['python']}  hypothesis {env.get('hypothesis')}",
        f"machine: {env['machine']}, {env['cpu']}, {env['cpus']} CPUs"
        + (f"; GPU {env['device']}, torch {env['torch']}, cupy {env['cupy']}" if "device" in env else ""),
        f"budget: {s['examples']} examples per search (stops at the first manifested corruption), seed 0; "
        f"strategies over {s['seeds']} seed(s); k={s['repeat']}",
        "",
        "| mutant | caught | oracle | ex. to detect | s to detect | ex. / s to manifest | shrunk (req/iter/delays) "
        "| stress loop (no delay) | random: manifested seeds, median ex | PCT: manifested seeds, median ex | CSAN |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results["mutants"]:
        sh = r["shrunk"]
        stress = r["baselines"]["stress"]
        strategies = r["baselines"]["strategies"]
        caught = "equivalent" if r["equivalent"] else ("**yes**" if r["caught"] else "NO")
        if r["equivalent"] and r["caught"]:
            caught = "yes (marked equivalent!)"
        manifest = (
            f"{r['examples_to_manifest']} / {r['seconds_to_manifest']:.3f}" if r["examples_to_manifest"] else "never"
        )
        seconds = "-" if r["seconds_to_detect"] is None else f"{r['seconds_to_detect']:.3f}"
        size = "-" if sh is None else f"{sh['requests']}/{sh['iterations']}/{sh['nonzero_delays']}"
        plain = f"{stress['manifested_seeds']}/{stress['seeds']}" + (
            f", {stress['examples_to_detect']} ex" if stress["caught"] else ""
        )
        lines.append(
            f"| `{r['name']}` | {caught} | {r['oracle'] or '-'} | {r['examples_to_detect'] or '-'} | {seconds} | "
            f"{manifest} | {size} | {plain} | {_cell_strategy(strategies['random'])} | "
            f"{_cell_strategy(strategies['pct'])} | {_cell_csan(r['baselines']['csan'])} |"
        )
    lines += [
        "",
        f"kill rate: {results['caught']}/{results['killable']} = {100 * (results['kill_rate'] or 0):.0f}% of the "
        f"non-equivalent mutants; median seconds to detection {results['median_seconds_to_detect']} "
        f"(median examples {results['median_examples_to_detect']}); median seconds to a manifested corruption "
        f"{results['median_seconds_to_manifest']}; plain stress loop kill rate (manifested): "
        f"{100 * (results['stress_kill_rate'] or 0):.0f}%",
    ]
    for r in results["mutants"]:
        if r["equivalent"]:
            lines.append(f"equivalent: `{r['name']}`: {r['equivalent']}")
    if results["environment"].get("csan_controls"):
        c = results["environment"]["csan_controls"]
        lines.append(
            f"CSAN controls on the same stress examples: none -> {c[CONTROL]}; war-after-launch -> "
            f"{c['war-after-launch']}"
        )
    lines += ["", "False alarms (each beside the negative control `none` on the same hazards and strategy):", ""]
    lines.append("| design | hazards | strategy | examples | verdict | control `none` | conclusive |")
    lines.append("|---|---|---|---|---|---|---|")
    for f in results["false_alarms"]:
        c = f["control"]
        verdict = "clean" if f["clean"] else f"**RACE** ({f['oracle']})"
        control = (
            f"caught at ex. {c['examples_to_detect']}, manifested at ex. {c['examples_to_manifest']}"
            if c["caught"]
            else "NOT caught"
        )
        lines.append(
            f"| `{f['design']}` | {'+'.join(f['hazards'])} | {f['strategy']} | {f['examples']} | {verdict} | "
            f"{control} | {'yes' if f['conclusive'] else 'NO'} |"
        )
    return "\n".join(lines)


def detection_rates(seeds: int = 50, budget: int = 1000, strategy: str = "random") -> dict[str, Any]:
    """Per mutant, over `seeds` seeds on the simulator: the examples to the first detection (any oracle)
    and to the first manifested corruption, each None when not within `budget`. The detection
    probabilities that tests/quality relies on are read off these (`python -m ci.bench mutants --rates SEEDS
    BUDGET OUT.json`; committed as docs/results/mutant-rates-sim/rates.json)."""
    sim = executor("sim")
    out: dict[str, Any] = {
        "benchmark": "mutant detection rates",
        "environment": _environment("sim"),
        "seeds": seeds,
        "budget": budget,
        "strategy": strategy,
        "mutants": {},
    }
    for name, mutant in MUTANTS.items():
        detect, manifest = [], []
        for seed in range(seeds):
            result = search(
                load_design(name),
                sim,
                examples=budget,
                seed=seed,
                hazards=tuple(getattr(mutant, "hazards", ALL_HAZARDS)),
                plan_stream=getattr(mutant, "plan_stream", None),
                strategy=strategy,
                shrink=False,
            )
            detect.append(result.first_detection_example)
            manifest.append(result.first_manifested_example)
        out["mutants"][name] = {"examples_to_detect": detect, "examples_to_manifest": manifest}
    return out


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "--csan-worker":  # `_csan`'s child process
    Path(sys.argv[3]).write_text(json.dumps(_csan_worker(json.loads(Path(sys.argv[2]).read_text()))))
