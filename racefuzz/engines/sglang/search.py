"""`racefuzz sglang --workload search`: search sglang's own overlap loop over workloads Hypothesis draws,
in one harness process per version (sglang is imported once), through the trace's one workload search
(`racefuzz.trace.search.fuzz(step, workloads=...)`).

Hypothesis draws up to `--examples` request streams (`workload.workloads()`); each runs sglang's loop with
the WAR barrier as the version has it and is judged by happens-before. The first racy one is shrunk by
Hypothesis (fewer requests, shorter prompts and outputs, earlier arrivals, fewer pool rows) to the smallest
stream that still races the same way (the same race kind and sglang source lines), re-recorded k times
(k of k), saved in the failure database (`--database`, as `racefuzz run`'s and `racefuzz trace`'s) and
tried first on the next run, and written as a replay file that `racefuzz sglang --workload FILE` runs
again. The negative control searches the same strategy from the same seed with the barrier off: it must
race on some drawn workload, else a clean search is inconclusive.

    python -m racefuzz.engines.sglang.search --python-dir DIR --examples N [--seed S] [--database SPEC]

prints one JSON object (the parent, `search_command`, formats it and sets the exit code).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from racefuzz.errors import InvalidArgument
from racefuzz.exitcodes import ExitCode

SHRINK_RUNS = 100
"""Harness runs a shrink may make by default (0.2-0.5 s each on the CPU)."""
SHRINK_SECONDS = 120.0
"""The shrink's time budget by default; whichever of the two is reached first stops it."""
CONFIRM = 3
"""Re-recordings of the shrunk workload, each of which must race the same way (k of k)."""
REPLAY_KIND = "sglang"
"""The replay file's `kind` (`racefuzz.report.FORMAT`'s files are told apart by it)."""


def strategy(
    spec: str = "none",
    plan_stream: bool = False,
    attention: str = "flashinfer",
    radix_cache: bool = True,
    max_output: int = 6,
    page_sizes: tuple[int, ...] = (1,),
    cuda_graphs: tuple[bool, ...] = (False,),
) -> Any:
    """`workload.workloads(max_output=..., page_sizes=...)`, each workload under the run's speculative
    decoding, read extent and radix cache (`racefuzz sglang --spec/--plan-stream/--attention/--no-radix-cache/
    --max-output/--page-size/--cuda-graph`)."""
    from racefuzz.engines.sglang.workload import workloads

    drawn = workloads(max_output=max_output, page_sizes=page_sizes, cuda_graphs=cuda_graphs)
    if spec == "none" and attention == "flashinfer" and radix_cache:
        return drawn
    return drawn.map(lambda w: w.with_spec(spec, plan_stream, attention, radix_cache))


def loop_step(python_dir: str, sgl: Any, adapter: Any, barrier: bool, read_done: str) -> Any:
    """A step over a workload: one run of sglang's overlap loop on it (`scheduler.build_and_run`), with the
    barrier as the version has it or, `barrier` False, off. Named by what it runs (its reports, its key)."""
    from racefuzz.engines.sglang import scheduler as harness_scheduler
    from racefuzz.engines.sglang.stubs import LAUNCH_SITES

    def step(env: Any, workload: Any) -> None:
        harness_scheduler.configure(sgl, adapter, workload)  # a fresh config per run, as run_version makes
        LAUNCH_SITES.clear()
        start_profile, stop_profile = harness_scheduler.profile_functions(python_dir, None)
        try:
            harness_scheduler.build_and_run(env, sgl, adapter, workload, barrier, start_profile, read_done)
        finally:
            stop_profile()

    step.__module__ = "sglang"
    step.__qualname__ = f"overlap-loop[barrier {'on' if barrier else 'off'}, read-done {read_done}]"
    return step


def search_json(result: Any, started: float) -> dict[str, Any]:
    """A workload search's findings (`TraceResult` with `workloads`) as the parent reads them."""
    from racefuzz.engines.sglang.harness import short_source

    search = result.workloads
    found: dict[str, Any] = {
        "racy": bool(result.racy),
        "examples": search.examples,
        "replayed": search.replayed,
        "seconds": round(time.perf_counter() - started, 3),
    }
    if search.workload is not None:
        found.update(
            workload=search.workload.to_json(),
            described=search.workload.describe(),
            drawn=search.drawn.to_json() if search.drawn is not None else None,
            drawn_described=search.drawn.describe() if search.drawn is not None else None,
            shrink_runs=search.shrink_runs,
            shrink_capped=search.shrink_capped,
            confirmed=search.confirmed,
            confirm_runs=search.confirm_runs,
            race_key=[search.race[0], *(short_source(source) for source in search.race[1:])],
        )
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="racefuzz.engines.sglang.search")
    parser.add_argument("--python-dir", required=True)
    parser.add_argument("--examples", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--database", default=None, help="as racefuzz run's --database (default: its default)")
    parser.add_argument("--shrink-runs", type=int, default=SHRINK_RUNS)
    parser.add_argument("--shrink-seconds", type=float, default=SHRINK_SECONDS)
    parser.add_argument("--confirm", type=int, default=CONFIRM)
    parser.add_argument("--read-done", choices=("none", "after", "before"), default="none")
    parser.add_argument("--spec", choices=("none", "dflash"), default="none")
    parser.add_argument("--plan-stream", action="store_true")
    parser.add_argument("--attention", choices=("flashinfer", "fa3"), default="flashinfer")
    parser.add_argument("--no-radix-cache", dest="radix_cache", action="store_false")
    parser.add_argument("--max-output", type=int, default=6)
    parser.add_argument("--page-size", dest="page_sizes", type=int, action="append", default=[])
    parser.add_argument("--cuda-graph", choices=("off", "on", "drawn"), default="off")
    parser.add_argument("--no-control", dest="control", action="store_false")
    parser.add_argument("--sglang-version", help="the version of a checkout without _version.py")
    parser.add_argument("--traceback", action="store_true")
    args = parser.parse_args(argv)
    out: dict[str, Any] = {"python_dir": args.python_dir, "mode": "search"}
    began = time.perf_counter()
    try:
        from racefuzz.commands.run import example_database
        from racefuzz.engines.harness_process import Unsupported
        from racefuzz.engines.sglang import stubs
        from racefuzz.engines.sglang.harness import load_version, run_version
        from racefuzz.search.corpus import WorkloadCorpus, workload_corpus_key
        from racefuzz.trace.search import fuzz

        out["stubbed"] = stubs.install()
        out["device"] = "cpu"
        adapter = load_version(args.python_dir, args.sglang_version, out)
        version = out["version"]
        out["read_done"] = args.read_done
        sgl = SimpleNamespace(server_args=None, device_module=None)  # the config: per run (scheduler.configure)
        page_sizes = tuple(args.page_sizes or (1,))
        from racefuzz.engines.sglang.workload import CUDA_GRAPHS

        drawn = strategy(
            args.spec,
            args.plan_stream,
            args.attention,
            args.radix_cache,
            args.max_output,
            page_sizes,
            CUDA_GRAPHS[args.cuda_graph],
        )
        options = dict(device="cpu", examples=args.examples, seed=args.seed, confirm=args.confirm)
        step = loop_step(args.python_dir, sgl, adapter, True, args.read_done)
        database = example_database(args.database)
        what = f"sglang {version} {args.python_dir}: spec {args.spec}, plan {args.plan_stream}, {args.attention}"
        key = workload_corpus_key(f"{what}, radix {args.radix_cache}, {step.__qualname__}", "cpu", [], drawn)
        search_began = time.perf_counter()
        result = fuzz(
            step,
            workloads=drawn,
            saved_workloads=WorkloadCorpus(database, key),
            shrink_runs=args.shrink_runs,
            shrink_seconds=args.shrink_seconds,
            **options,
        )
        out["search"] = search_json(result, search_began)
        if result.workloads.workload is not None:  # the report's race: the shrunk stream's, as the harness says
            run = run_version(args.python_dir, result.workloads.workload, True, sgl, adapter, args.read_done)
            key_text = out["search"]["race_key"]
            out["search"]["races"] = run["races"]
            out["search"]["race"] = next(
                (
                    race
                    for race in run["races"]
                    if [race["kind"], race["first"]["source"], race["second"]["source"]] == key_text
                ),
                None,
            )
        if args.control:
            control_began = time.perf_counter()
            control = fuzz(
                loop_step(args.python_dir, sgl, adapter, False, args.read_done),
                workloads=drawn,
                shrink_runs=0,  # the control needs to race, not to be small
                **{**options, "confirm": 1},  # nor to be reported: a recorded race is a fact, one run says it
            )
            out["control"] = search_json(control, control_began)
            out["control_switch"] = "SGLANG_ENABLE_WAR_BARRIER=0"
        out["status"] = "ok"
    except Unsupported as exc:
        out["status"] = "unsupported"
        out["error"] = str(exc)
    except Exception as exc:  # reported as one line by the parent; the traceback with --traceback
        out["status"] = "error"
        out["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
        if args.traceback:
            out["traceback"] = traceback.format_exc()
    out["seconds"] = round(time.perf_counter() - began, 3)
    sys.stdout.write("\n" + json.dumps(out) + "\n")
    return 0


def run_search(
    python_dir: Path,
    *,
    examples: int,
    seed: int = 0,
    control: bool = True,
    version: str | None = None,
    database: str | None = None,
    shrink_runs: int = SHRINK_RUNS,
    shrink_seconds: float = SHRINK_SECONDS,
    read_done: str = "none",
    spec: str = "none",
    plan_stream: bool = False,
    attention: str = "flashinfer",
    radix_cache: bool = True,
    max_output: int = 6,
    page_sizes: tuple[int, ...] = (1,),
    cuda_graph: str = "off",
    timeout: float = 900.0,
) -> dict[str, Any]:
    """One version's search subprocess (`main`) -> its JSON result."""
    options = ["--examples", str(examples), "--seed", str(seed), "--read-done", read_done, "--spec", spec]
    options += ["--shrink-runs", str(shrink_runs), "--shrink-seconds", str(shrink_seconds), "--attention", attention]
    options += ["--max-output", str(max_output)]
    for page_size in page_sizes if page_sizes != (1,) else ():
        options += ["--page-size", str(page_size)]
    options += ["--cuda-graph", cuda_graph]
    if database is not None:
        options += ["--database", database]
    if plan_stream:
        options.append("--plan-stream")
    if not radix_cache:
        options.append("--no-radix-cache")
    if not control:
        options.append("--no-control")
    if version:
        options += ["--sglang-version", version]
    # As the harness's CPU runs: the same on every host (sglang's is_cuda() False; commands/sglang.py).
    from racefuzz.engines.harness_process import run_json_process
    from racefuzz.engines.sglang import bytecode

    env = bytecode.subprocess_env(
        dict(os.environ, PYTHONWARNINGS="ignore", TRITON_INTERPRET="0", CUDA_VISIBLE_DEVICES="")
    )
    module = "racefuzz.engines.sglang.search"
    return run_json_process(module, python_dir, options, timeout=timeout, env=env, what="the search")


def search_verdict(result: dict[str, Any], control: bool) -> ExitCode:
    """1 the shrunk workload races k of k; 0 none and the control caught; 3 none, control not caught."""
    if result.get("status") == "unsupported":
        return ExitCode.USAGE
    if result.get("status") != "ok":
        return ExitCode.INTERNAL
    if result["search"]["racy"]:
        return ExitCode.RACE
    if control and not result.get("control", {}).get("racy"):
        return ExitCode.INCONCLUSIVE
    return ExitCode.CLEAN


def format_search(result: dict[str, Any], replay: Path | None = None) -> str:
    label = result.get("label") or result.get("version")
    if result.get("status") != "ok":
        return f"sglang {label}: {result.get('status', 'error')}: {result.get('error')}"
    found = result["search"]
    lines = [
        f"sglang {label} (version {result.get('version')}, adapter {result.get('adapter')}, read-done "
        f"{result.get('read_done')}): workload search, {found['examples']} workload(s) drawn"
        + (f", {found['replayed']} saved tried first" if found["replayed"] else "")
        + f"; imports {result.get('import_seconds')} s, search {found['seconds']} s, total {result.get('seconds')} s"
    ]
    if found.get("workload") is not None:
        verdict = "RACE" if found["racy"] else "raced, but not k of k (flaky: not a race)"
        shrink = f"{found['shrink_runs']} harness run(s)" + (
            " (stopped at its budget: the smallest found)" if found["shrink_capped"] else ""
        )
        lines.append(
            f"  {verdict}: {found['race_key'][0]} with the WAR barrier as the version has it, re-recorded "
            f"{found['confirmed']}/{found['confirm_runs']}"
        )
        lines.append(f"  shrunk to {found['described']}  (shrinking: {shrink})")
        if found.get("drawn_described") and found["drawn"] != found["workload"]:
            lines.append(f"  as drawn: {found['drawn_described']}")
        race = found.get("race")
        if race is not None:
            lines.append(f"  {race['kind']} on {', '.join(race['bytes'][:3])}: {race['missing_edge']}")
            for end in ("first", "second"):
                access = race[end]
                lines.append(f"    {end:6}: {access['kernel']} on {access['stream']}  {access['source']}")
                for chain in access.get("called_from", [])[:2]:
                    lines.append(f"            called from {chain}")
        lines.append(f"  workload: {json.dumps(found['workload'])}")
        if replay is not None:
            lines.append(f"  replay: racefuzz sglang --version {result.get('version')} --workload {replay}")
    else:
        lines.append(
            f"  clean: no happens-before race on {found['examples']} drawn workload(s) with the WAR barrier as the "
            "version has it"
        )
    control = result.get("control")
    if control is not None:
        if control["racy"]:
            lines.append(
                f"  control ({result.get('control_switch')}, the barrier off): caught on drawn workload "
                f"{control['examples']} ({control['described']})"
            )
        else:
            lines.append(
                f"  control ({result.get('control_switch')}, the barrier off): NOT caught (inconclusive) on "
                f"{control['examples']} drawn workload(s)"
            )
    return "\n".join(lines)


def replay_json(result: dict[str, Any]) -> dict[str, Any]:
    """The replay file of a racy search: the project's replay format (`kind` sglang) around the shrunk
    workload's own JSON, so `racefuzz sglang --workload FILE` reads it as the workload it is
    (`engine.replay_document`)."""
    from racefuzz.commands import engine

    found = result["search"]
    head = {"sglang_version": result.get("version"), "read_done": result.get("read_done")}
    tail = {"race": found.get("race"), "drawn": found.get("drawn")}
    return engine.replay_document(REPLAY_KIND, head, found["workload"], tail)


def write_replay(result: dict[str, Any], report_dir: Path) -> Path:
    from racefuzz.commands import engine

    found = result["search"]
    name = f"sglang-{result.get('version')}-{found['race_key'][0]}-{len(found['workload']['requests'])}req.json"
    return engine.write_replay(report_dir, name, replay_json(result))


def search_command(args: argparse.Namespace, device: str) -> ExitCode:
    """`racefuzz sglang --workload search`: one search subprocess per target (version or source)."""
    from racefuzz.commands import engine
    from racefuzz.commands.run import example_database
    from racefuzz.engines.sglang import sources

    if device != "cpu":
        raise InvalidArgument("--workload search runs on the CPU (happens-before); on a GPU use --manifest")
    if args.manifest is not None:
        raise InvalidArgument("--manifest applies to fixed, drawn or file workloads, not --workload search")
    if args.jobs != 1:
        raise InvalidArgument("--jobs applies to drawn workloads: a search is one process per version")
    shrink_runs = getattr(args, "shrink_runs", SHRINK_RUNS)
    if shrink_runs < 0 or shrink_runs > 100_000:
        raise InvalidArgument(f"--shrink-runs must be 0 to 100000, got {shrink_runs}")
    database = getattr(args, "database", None)
    example_database(database)  # a bad --database is one line here, not the subprocess's error
    report_dir = Path(getattr(args, "report_dir", None) or ".racefuzz")
    results = []
    for label, python_dir, version_hint in engine.targets(args, sources.locate, args.sglang_version):
        result = run_search(
            python_dir,
            examples=args.examples,
            seed=args.seed,
            control=args.control,
            version=version_hint,
            database=database,
            shrink_runs=shrink_runs,
            read_done=args.read_done,
            spec=args.spec,
            plan_stream=args.plan_stream,
            attention=args.attention,
            radix_cache=args.radix_cache,
            max_output=getattr(args, "max_output", 6),
            page_sizes=tuple(getattr(args, "page_sizes", None) or (1,)),
            cuda_graph=getattr(args, "cuda_graph", "off"),
            timeout=args.timeout,
        )
        result["label"] = label
        replay = None
        if result.get("status") == "ok" and result["search"]["racy"]:
            replay = write_replay(result, report_dir)
            result["replay"] = str(replay)
        results.append(result)
        print(format_search(result, replay))
        sys.stdout.flush()
    engine.write_results(results, args.json)
    return engine.overall_exit(search_verdict(result, args.control) for result in results)


if __name__ == "__main__":
    sys.exit(main())
