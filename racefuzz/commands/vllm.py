"""`racefuzz vllm`: run vLLM's own `GPUModelRunner` (its input preparation, async output path and
`prepare_inputs_event`) on a fake model under `racefuzz.trace`, on the CPU or a GPU, version by version,
and judge it by happens-before (`racefuzz.engines.vllm`, docs/vllm.md).

    racefuzz vllm --version 0.33.0                 # a fetched version (`racefuzz vllm fetch`)
    racefuzz vllm --version 0.33.0 --device cuda   # on a GPU: torch.cuda's streams, real pinned memory
    racefuzz vllm --source ~/vllm                  # a checkout (the directory holding vllm/)
    racefuzz vllm fetch --version 0.33.0           # pip download the wheel, unpack its sources
    racefuzz vllm pack --version 0.33.0 --out v.tar.gz          # a slim archive (for an offline GPU host)
    racefuzz vllm fetch --version 0.33.0 --archive v.tar.gz     # unpack such an archive into the cache

Each version runs in its own subprocess, per workload twice: with the runner's events as the version has
them, and the negative control (async scheduling, the synchronize of `prepare_inputs_event` and, with
speculative decoding, of the counts' events a no-op: `runner.CONTROL_EVENTS`). A racy workload's replay
file goes to `--report-dir`. Exit codes as the rest of racefuzz: 1 a race in some version, 0 none and every
control caught, 3 none but some control not caught, 2 a bad argument or missing sources (one line), 5 the
harness failed on a version.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from racefuzz.commands import engine
from racefuzz.commands.engine import fetch_action, pack_action
from racefuzz.engines.device_choice import resolve_device
from racefuzz.errors import InvalidArgument
from racefuzz.exitcodes import ExitCode

DEFAULT_TIMEOUT_S = 900.0


def add_parser(command: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """Add the `vllm` subcommand through the CLI's subcommand factory."""
    parser = command("vllm", "run vLLM's own GPUModelRunner (a fake model) under racefuzz.trace")
    parser.add_argument("action", nargs="?", choices=("run", "fetch", "pack"), default="run", help="default: run")
    parser.add_argument(
        "--version", dest="versions", action="append", default=[], metavar="X", help="a vLLM version (repeatable)"
    )
    parser.add_argument("--source", type=Path, help="a vLLM checkout (the directory holding vllm/)")
    parser.add_argument("--vllm-version", help="with --source: the tree's version when it has no vllm/_version.py")
    parser.add_argument(
        "--workload",
        default="fixed",
        help="fixed (3 requests, a preemption, async scheduling), spec (speculative decoding on a hybrid model, "
        "the batch unchanged: vLLM #36013), spec-condense (the same with a row moved by condense: #51571, "
        "#53613), multimodal (a multimodal model, an image per request: #31841), drawn (Hypothesis, --examples "
        "of them), or a JSON file of one workload (a replay file too)",
    )
    parser.add_argument("--examples", type=int, default=10, help="with --workload drawn: how many (default 10)")
    parser.add_argument("--seed", type=int, default=0, help="with --workload drawn: the draw's seed (default 0)")
    parser.add_argument("--no-control", dest="control", action="store_false", help="skip the negative control")
    parser.add_argument("--json", type=Path, help="write every version's result as JSON here")
    parser.add_argument(
        "--report-dir",
        type=Path,
        default=Path(".racefuzz"),
        help="where a racy workload's replay file goes (default .racefuzz; racefuzz replay FILE re-runs it)",
    )
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda", "auto"),
        default="cpu",
        help="cpu (virtual streams), cuda (torch.cuda's streams and events, real pinned memory), auto (cuda if "
        "torch sees one)",
    )
    parser.add_argument(
        "--slot-mapping",
        choices=("torch", "vllm"),
        default="torch",
        help="torch: the slot-mapping kernel restated in torch ops (default; the only one on the CPU); vllm: the "
        "version's own Triton kernel (--device cuda)",
    )
    parser.add_argument(
        "--uva-ring",
        action="store_true",
        help="also model-runner v2's round-robin pinned buffers (vLLM's UvaBufferPool in MRV2's step order, UVA "
        "modelled; CPU; reported, not part of the exit code)",
    )
    parser.add_argument("--archive", type=Path, help="fetch: unpack this `vllm pack` archive instead of pip")
    parser.add_argument("--out", type=Path, help="pack: the .tar.gz to write")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per version (default 900)")


def vllm_command(args: argparse.Namespace) -> ExitCode:
    from racefuzz.engines.vllm import sources

    for version in args.versions:
        sources.check_version(version)
    if args.action == "fetch":
        return fetch_action(args, sources.VLLM)
    if args.action == "pack":
        return pack_action(args, sources.VLLM, sources.pack)
    device = resolve_device(args.device)
    if args.slot_mapping == "vllm" and device != "cuda":
        raise InvalidArgument("--slot-mapping vllm needs --device cuda (Triton does not run on the CPU)")
    if not args.versions and args.source is None:
        raise InvalidArgument("racefuzz vllm needs --version X (repeatable) or --source DIR")
    if args.examples < 1 or args.examples > 10_000:
        raise InvalidArgument(f"--examples must be 1 to 10000, got {args.examples}")
    workloads = workloads_for(args.workload, args.examples, args.seed)
    results = []
    for label, python_dir, version_hint in engine.targets(args, sources.locate, args.vllm_version):
        result = run_harness(
            python_dir, workloads, args.control, version_hint, args.timeout, device, args.slot_mapping, args.uva_ring
        )
        result["label"] = label
        results.append(result)
        print(format_result(result))
        for path in write_replays(result, args.report_dir):
            print(
                f"  replay: racefuzz replay {path}  (racefuzz vllm --version {result.get('version')} --workload {path})"
            )
        sys.stdout.flush()
    engine.write_results(results, args.json)
    return overall_exit(results, args.control)


def workloads_for(workload: str, examples: int = 10, seed: int = 0) -> list[dict[str, Any]]:
    """`--workload`'s value as the harness's workload list: a fixed one by name (`workload.NAMED`), `drawn`
    (`examples` of them from `seed`), or a JSON file of one workload; an `InvalidArgument` otherwise."""
    from racefuzz.engines.vllm.workload import NAMED, Workload

    if workload in NAMED:
        return [NAMED[workload].to_json()]
    if workload == "drawn":
        return [w.to_json() for w in draw_workloads(examples, seed)]
    path = Path(workload)
    if not path.is_file():
        raise InvalidArgument(f"--workload: expected {', '.join(NAMED)}, drawn or a JSON file, got {workload!r}")
    try:
        return [Workload.from_json(json.loads(path.read_text())).to_json()]
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise InvalidArgument(f"--workload {path}: not a workload ({type(exc).__name__}: {exc})") from None


def draw_workloads(count: int, seed: int) -> list[Any]:
    """`count` distinct workloads drawn by `workload.workloads()` with Hypothesis, reproducibly from `seed`
    (`racefuzz.commands.engine.draw_distinct`)."""
    from racefuzz.commands.engine import draw_distinct
    from racefuzz.engines.vllm.workload import workloads

    return draw_distinct(workloads(), count, seed)


def run_harness(
    python_dir: Path,
    workloads: list[dict[str, Any]],
    control: bool,
    version: str | None,
    timeout: float,
    device: str = "cpu",
    slot_mapping: str = "torch",
    uva_ring: bool = False,
) -> dict[str, Any]:
    """One version's harness subprocess (`racefuzz.engines.vllm.harness`) on `device` -> its JSON result
    (`uva_ring`: with model-runner v2's ring, `racefuzz.engines.vllm.uva_ring`)."""
    from racefuzz.engines.harness_process import run_json_process

    options = ["--device", device, "--slot-mapping", slot_mapping] + (["--uva-ring"] if uva_ring else [])
    for workload in workloads:
        options += ["--workload", json.dumps(workload)]
    if not control:
        options.append("--no-control")
    if version:
        options += ["--vllm-version", version]
    env = dict(os.environ, PYTHONWARNINGS="ignore", VLLM_LOGGING_LEVEL="ERROR")
    return run_json_process("racefuzz.engines.vllm.harness", python_dir, options, timeout=timeout, env=env)


REPLAY_KIND = "vllm"


def replay_json(result: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """The replay file of a racy run: the project's replay format (`kind` vllm) around the workload's own
    JSON (`engine.replay_document`), the version (and for a checkout its `source` directory) and the first
    race."""
    head = {"vllm_version": result.get("version"), "device": result.get("device", "cpu")}
    data = engine.replay_document(REPLAY_KIND, head, run["workload_json"], {"race": run["races"][0]})
    if str(result.get("label", "")).startswith("source "):
        data["source"] = str(Path(result["python_dir"]).resolve())
    return data


def write_replays(result: dict[str, Any], report_dir: Path) -> list[Path]:
    """One replay file per workload whose run (the runner's events as the version has them) raced, named by
    the version (`source-` for a checkout), the first race's kind and a digest of the workload."""
    import hashlib

    if result.get("status") != "ok":
        return []
    paths = []
    for run in (r for r in result["runs"] if not r["control"] and r["races"]):
        data = replay_json(result, run)
        digest = hashlib.sha1(json.dumps(run["workload_json"], sort_keys=True).encode()).hexdigest()[:8]
        where = "source-" if "source" in data else ""
        name = f"vllm-{where}{result.get('version')}-{run['races'][0]['kind']}-{digest}.json"
        paths.append(engine.write_replay(report_dir, name, data))
    return paths


def version_verdict(result: dict[str, Any], control: bool) -> ExitCode:
    """`engine.version_verdict`: the control is the run marked `control` (the runner's events no-ops)."""
    return engine.version_verdict(result, control, lambda run: run["control"])


def overall_exit(results: list[dict[str, Any]], control: bool) -> ExitCode:
    return engine.overall_exit(version_verdict(result, control) for result in results)


def format_result(result: dict[str, Any]) -> str:
    label = result.get("label") or result.get("version")
    if result.get("status") != "ok":
        return f"vllm {label}: {result.get('status', 'error')}: {result.get('error')}"
    runs = result["runs"]
    checked = [run for run in runs if not run["control"]]
    controls = [run for run in runs if run["control"]]
    races = [race for run in checked for race in run["races"]]
    lines = [
        f"vllm {label} (version {result.get('version')}, {result.get('device', 'cpu')}"
        f"{', ' + result['gpu'] if result.get('gpu') else ''}, slot mapping {result.get('slot_mapping', 'torch')}): "
        f"{len(checked)} workload(s), "
        f"{sum(r['steps'] for r in checked)} engine steps, {sum(r['forwards'] for r in checked)} forwards, "
        f"{sum(r['host_accesses'] for r in checked)} host accesses recorded; imports {result.get('import_seconds')} s, "
        f"total {result.get('seconds')} s",
    ]
    if races:
        lines.append(f"  RACE: {len(races)} happens-before race(s) with the runner's events as the version has them")
        lines += _race_lines(races)
    else:
        lines.append("  clean: no happens-before race with the runner's events as the version has them")
    if controls:
        events = sorted({e for run in controls for e in run.get("control_events", ["prepare_inputs_event"])})
        condition = f"async scheduling, {', '.join(e + '.synchronize' for e in events)} a no-op"
        lines.append(engine.control_line(condition, controls))
        lines += _race_lines([race for run in controls for race in run["races"]], limit=2)
    ring = result.get("uva_ring")
    if isinstance(ring, str):
        lines.append(f"  model-runner v2 pinned ring: not run: {ring}")
    elif ring:
        lines.append("  model-runner v2 pinned ring (UvaBufferPool, 2 slots, UVA modelled, CPU):")
        for run in ring:
            verdict = f"{len(run['races'])} race(s)" if run["races"] else "clean"
            lines.append(f"    {run['case']}: {verdict}")
            lines += ["  " + line for line in _race_lines(run["races"], limit=1)]
    return "\n".join(lines)


def _race_lines(races: list[dict[str, Any]], limit: int = 6) -> list[str]:
    lines, seen = [], set()
    for race in races:
        key = (race["kind"], race["first"]["source"], race["second"]["source"])
        if key in seen:
            continue
        seen.add(key)
        if len(seen) > limit:
            lines.append(f"  ... {len(races)} in all")
            break
        lines += engine.race_lines(race, byte_names=2)
    return lines
