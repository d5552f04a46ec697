"""The harness's subprocess: load one sglang version's sources, run its real overlap loop on a workload
under `racefuzz.trace` (CPU, happens-before), with the WAR barrier as the version has it and, as the
negative control, with it off; print one JSON object.

    python -m racefuzz.engines.sglang.harness --python-dir DIR [--workload JSON] [--no-control]

One version per process: sglang's modules are imported by their own names, and two versions cannot share
a process. Stubs for the server's dependencies are installed first (`stubs.install`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from types import SimpleNamespace
from typing import Any


def short_source(source: str) -> str:
    """`file:line (function)` with the file shortened to its path from `sglang/` (or `racefuzz/`)."""
    text = os.sep + source
    at = text.find(f"{os.sep}racefuzz{os.sep}engines{os.sep}")
    if at < 0:
        at = text.rfind(f"{os.sep}sglang{os.sep}")
    return text[at + 1 :] if at >= 0 else source


def race_json(
    race: Any, calls: list[tuple[int, str]], forward_callers: set[str], read_sites: list[tuple[int, str]]
) -> dict[str, Any]:
    from racefuzz.engines.sglang.scheduler import caller_chain
    from racefuzz.engines.sglang.stubs import CPU_EQUIVALENTS, LAUNCH_SITES
    from racefuzz.trace.builder import launch_source

    a, b = race.first, race.second

    def access(launch: Any) -> dict[str, Any]:
        source = short_source(launch_source(launch))
        described = {"kernel": launch.kernel, "stream": launch.stream.name, "source": source}
        if launch.kernel == "attention_kv_indices":
            site = caller_chain(read_sites, launch.index)
            described["called_from"] = [site] if site else sorted(forward_callers)
        elif launch.kernel in CPU_EQUIVALENTS:  # a DFLASH Triton kernel's torch equivalent (stubs.py)
            site = caller_chain(LAUNCH_SITES, launch.index)
            if site:
                described["called_from"] = [site]
        elif source.endswith("(write)"):
            chain = caller_chain(calls, launch.index)
            if chain:
                described["called_from"] = [chain]
        return described

    return {
        "kind": race.race.kind,
        "first": access(a),
        "second": access(b),
        "bytes": list(race.where),
        "missing_edge": race.race.missing_edge(),
    }


def freed_in_use(program: Any, judgement: Any) -> list[Any]:
    """The pairs of a use on one stream and a free on another that nothing orders at the free itself, whose
    block's reuse is ordered after the use (neither a race nor latent in `judgement`): sglang #34076's
    "wait_stream orders execution but does not protect deallocation". Under torch's native caching
    allocator the bytes change only at the reuse (`racefuzz.trace.lifetime`), so these are said, not counted;
    they are the pairs an allocator that hands a freed block on before it is reused on its own stream would
    corrupt, which racefuzz does not model."""
    from racefuzz.trace.builder import launch_kind
    from racefuzz.trace.judge import unmoved_races

    judged = {(r.first.index, r.second.index) for r in judgement.races + judgement.latent}
    return [
        race
        for race in unmoved_races(program)
        if launch_kind(race.second) == "free"
        and race.first.stream != race.second.stream
        and (race.first.index, race.second.index) not in judged
    ]


def run_version(
    python_dir: str,
    workload: Any,
    barrier: bool,
    sgl: Any,
    adapter: Any,
    read_done: str = "none",
    device: str = "cpu",
    profile: bool = True,
) -> dict[str, Any]:
    """One recorded run of sglang's loop on `workload`, judged by happens-before. `profile` False leaves out
    the profiler that names the sglang functions run, the writers' caller chains and the sync call counts
    (`sglang_functions`, the races' `chain`, `syncs` are then empty): the benchmark's measure of what the
    recorder alone costs (`ci.bench sglang_loop`), not a verdict's run."""
    from racefuzz.engines.sglang import scheduler as harness_scheduler
    from racefuzz.trace.judge import judge
    from racefuzz.trace.search import run_once

    holder: dict[str, Any] = {}
    syncs: dict[str, int] = {}
    if profile:
        start_profile, stop_profile = harness_scheduler.profile_functions(python_dir, syncs)
    else:
        start_profile, stop_profile = (lambda: None), (lambda: (set(), []))
    harness_scheduler.configure(sgl, adapter, workload, device)

    def on_loop() -> None:  # sglang's run_event_loop starts next: the loop's clock starts here
        holder["loop_began"] = time.perf_counter()
        start_profile()

    def step(env: Any) -> None:
        try:
            holder["run"] = harness_scheduler.build_and_run(env, sgl, adapter, workload, barrier, on_loop, read_done)
            holder["loop_s"] = time.perf_counter() - holder["loop_began"]
        finally:
            holder["functions"], holder["chains"] = stop_profile()

    from racefuzz.engines.sglang.stubs import LAUNCH_SITES

    LAUNCH_SITES.clear()
    began = time.perf_counter()
    record = run_once(step, device)
    judgement = judge(record.program)
    races = judgement.races
    run = holder["run"]
    from racefuzz.engines.sglang.fake_model import FakeModelConfig, FakeModelRunner

    return {
        "defaulted_to_none": sorted(
            [f"model_config.{n}" for n in FakeModelConfig.asked] + [f"model_runner.{n}" for n in FakeModelRunner.asked]
        ),
        "barrier": barrier,
        "spec": workload.spec,
        "plan_stream": workload.plan_stream,
        "iterations": run.iterations,
        "forwards": run.forwards,
        "draft_forwards": run.draft_forwards,
        "syncs": dict(sorted(syncs.items())),
        "launches": len(record.launch_ops),
        "races": [race_json(r, holder["chains"], run.forward_callers, run.read_sites) for r in races],
        "latent": [race_json(r, holder["chains"], run.forward_callers, run.read_sites) for r in judgement.latent],
        "freed_in_use": [
            race_json(r, holder["chains"], run.forward_callers, run.read_sites)
            for r in freed_in_use(record.program, judgement)
        ],
        "sglang_functions": sorted(holder["functions"]),
        "seconds": round(time.perf_counter() - began, 3),
        "loop_seconds": round(holder["loop_s"], 6),
    }


def load_version(python_dir: str, sglang_version: str | None, out: dict[str, Any]) -> Any:
    """Import the sources at `python_dir` (stubs installed first) and return the version's adapter; the
    version, the adapter's name and the import time go into `out`. `Unsupported` for a version the harness
    cannot drive."""
    from racefuzz.engines.sglang.adapters import adapter_for

    sys.path.insert(0, python_dir)
    os.environ.setdefault("SGLANG_ENABLE_WAR_BARRIER", "1")
    version = source_version(python_dir)
    if version == "unknown" and sglang_version:
        version = sglang_version
    out["version"] = version
    adapter = adapter_for(version, python_dir)
    out["adapter"] = adapter.name
    import_began = time.perf_counter()
    adapter.check(None)
    out["import_seconds"] = round(time.perf_counter() - import_began, 3)
    return adapter


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="racefuzz.engines.sglang.harness")
    parser.add_argument("--python-dir", required=True)
    parser.add_argument(
        "--workload", action="append", default=[], help="a Workload as JSON, repeatable (default: the fixed one)"
    )
    parser.add_argument(
        "--workloads-stdin", action="store_true", help="read a JSON list of workloads from stdin (as many as wanted)"
    )
    parser.add_argument("--no-control", action="store_true")
    parser.add_argument("--traceback", action="store_true")
    parser.add_argument(
        "--no-profile",
        action="store_true",
        help="leave out the function profiler (no sglang_functions, chains or syncs): the benchmark's runs",
    )
    parser.add_argument("--read-done", choices=("none", "after", "before"), default="none")
    parser.add_argument("--sglang-version", help="the version of a checkout without _version.py")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: real streams (gpu.py)")
    parser.add_argument(
        "--manifest",
        type=int,
        metavar="EXAMPLES",
        help="cuda: after the happens-before runs, fuzz each workload's delays (aimed at each race first, then "
        "up to EXAMPLES drawn) for a wrong page-table read (manifest.py)",
    )
    args = parser.parse_args(argv)
    out: dict[str, Any] = {"python_dir": args.python_dir}
    began = time.perf_counter()
    try:
        from racefuzz.engines.harness_process import Unsupported
        from racefuzz.engines.sglang import stubs
        from racefuzz.engines.sglang.workload import FIXED, Workload

        texts = [json.loads(text) for text in args.workload]
        if args.workloads_stdin:
            texts += json.load(sys.stdin)
        workloads = [Workload.from_json(data) for data in texts] or [FIXED]
        # On a GPU Triton is real (sglang's kernels run); on the CPU it is always stubbed.
        out["stubbed"] = stubs.install() if args.device == "cpu" else stubs.install(force=())
        out["device"] = args.device
        if args.device == "cuda":
            from racefuzz.engines.device_choice import resolve_device

            resolve_device("cuda")  # NoGpu in one line if torch sees none
            out["control_switch"] = "_apply_war_barrier's flag off (is_cuda() is True)"
        adapter = load_version(args.python_dir, args.sglang_version, out)
        sgl = SimpleNamespace(server_args=None, device_module=None)  # the config: per workload (scheduler.configure)
        if any(workload.spec == "dflash" for workload in workloads):
            out["control_switch"] = (
                out.get("control_switch", "SGLANG_ENABLE_WAR_BARRIER=0")
                + "; verify_done dropped before prepare_for_decode reads it"
            )

        out["read_done"] = args.read_done
        out["runs"] = []
        for workload in workloads:
            for barrier in (True, False) if not args.no_control else (True,):
                run = run_version(
                    args.python_dir, workload, barrier, sgl, adapter, args.read_done, args.device, not args.no_profile
                )
                run["workload"] = workload.describe()
                out["runs"].append(run)
        if args.manifest is not None:  # after the happens-before runs: the same workloads, fuzzed for values
            from racefuzz.engines.sglang.manifest import manifest_workload

            out["manifest"] = [
                manifest_workload(workload, sgl, adapter, args.read_done, args.device, args.manifest)
                for workload in workloads
            ]
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


def source_version(python_dir: str) -> str:
    """The sources' version: `sglang/_version.py` (a wheel's, generated at build), else `unknown` (a
    checkout: the parent passes `--sglang-version`)."""
    import re

    try:
        with open(os.path.join(python_dir, "sglang", "_version.py")) as file:
            text = file.read()
    except OSError:
        return "unknown"
    found = re.search(r"^__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"]+)", text, re.M)
    return found.group(1) if found else "unknown"


if __name__ == "__main__":
    sys.exit(main())
