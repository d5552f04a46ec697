"""`racefuzz sglang`: run sglang's own overlap loop (its real `Scheduler`) on a fake model under
`racefuzz.trace` on the CPU, version by version, and judge it by happens-before (`racefuzz.engines.sglang`).

    racefuzz sglang --version 0.5.23 --version 0.5.15      # fetched versions (`racefuzz sglang fetch`)
    racefuzz sglang --source ~/sglang/python               # a checkout (a pull request's tree)
    racefuzz sglang fetch --version 0.5.23                 # pip download the wheel, unpack its sources
    racefuzz sglang pack --version 0.5.23 --out s.tar.gz   # a slim archive of them (for an offline GPU host)
    racefuzz sglang fetch --version 0.5.23 --archive s.tar.gz   # unpack such an archive into the cache

Each version runs in its own subprocess (sglang's modules clash across versions), twice per workload:
with the WAR barrier as the version computes it, and with it off (the negative control). Exit codes as
the rest of racefuzz: 1 a race in some version, 0 none and every version's control caught, 3 none but
some control not caught (inconclusive), 2 a bad argument, missing sources or a version the harness
cannot drive (one line naming what is missing), 5 the harness failed on a version.
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
from racefuzz.errors import InvalidArgument
from racefuzz.exitcodes import ExitCode

DEFAULT_TIMEOUT_S = 900.0
MAX_JOBS = 256


def add_parser(command: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """Add the `sglang` subcommand through the CLI's subcommand factory."""
    parser = command("sglang", "run sglang's own overlap loop (its Scheduler, a fake model) under racefuzz.trace")
    parser.add_argument(
        "action", nargs="?", choices=("run", "fetch", "pack"), default="run", help="default: run the harness"
    )
    parser.add_argument(
        "--version", dest="versions", action="append", default=[], metavar="X", help="an sglang version (repeatable)"
    )
    parser.add_argument("--source", type=Path, help="an sglang checkout's python/ directory (or the checkout)")
    parser.add_argument(
        "--sglang-version",
        help="with --source: the tree's version when it has no sglang/_version.py (a git checkout), e.g. 0.5.23: "
        "reported, and checked against the oldest version the harness drives",
    )
    parser.add_argument(
        "--workload",
        default="fixed",
        help="fixed (2 prefills, decodes, a finish and a row reuse), mixed-chunk (mixed chunked prefill: sglang "
        "#34076's seam, the running batch's indices gathered after their last owner was dropped), drawn "
        "(Hypothesis, --examples of them), "
        "search (Hypothesis draws up to --examples in one process, shrinks the first racy one, saves it in "
        "--database and writes a replay file: engines/sglang/search.py), or a JSON file of one workload",
    )
    parser.add_argument("--database", help="with --workload search: as racefuzz run's --database")
    parser.add_argument("--report-dir", type=Path, help="with --workload search: where replay files go (.racefuzz)")
    parser.add_argument(
        "--shrink-runs", type=int, default=100, help="with --workload search: harness runs a shrink may make"
    )
    parser.add_argument("--examples", type=int, default=10, help="with --workload drawn: how many (default 10)")
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        metavar="N",
        help="run each version's workloads in N harness processes at once (default 1; the verdict is the same)",
    )
    parser.add_argument("--seed", type=int, default=0, help="with --workload drawn: the draw's seed (default 0)")
    parser.add_argument(
        "--mixed-chunk",
        action="store_true",
        help="with --workload drawn: draw mixed chunked prefill workloads (a chunk size, prompts as embeddings or "
        "not: workload.workloads(mixed_chunk=True))",
    )
    parser.add_argument(
        "--max-output",
        type=int,
        default=6,
        help="with --workload drawn: the longest output drawn, in tokens (default 6; DFLASH's over-allocation "
        "needs rows decoding together for several steps)",
    )
    parser.add_argument(
        "--page-size",
        dest="page_sizes",
        type=int,
        action="append",
        default=[],
        metavar="N",
        help="KV pages of N tokens (sglang's page_size; a power of two up to 64; default 1): every workload runs "
        "with it; repeated, with --workload drawn or search, Hypothesis draws one of them per workload",
    )
    parser.add_argument(
        "--cuda-graph",
        choices=("off", "on", "drawn"),
        default="off",
        help="decodes replayed from CUDA graphs through sglang's DecodeCudaGraphRunner.execute (racefuzz's CPU "
        "stand-ins for capture and replay): off (default, eager), on, or drawn per workload (--workload drawn "
        "or search)",
    )
    parser.add_argument(
        "--read-done",
        choices=("none", "after", "before"),
        default="none",
        help="where the fake forward publishes a read-done event into the barrier's fast-path slot: none "
        "(default: sglang's eager forward publishes none, the barrier's coarse path runs), after its reads, or "
        "before them (a wrong publisher, which the fast path must be caught trusting)",
    )
    parser.add_argument(
        "--spec",
        choices=("none", "dflash"),
        default="none",
        help="speculative decoding: none (default), or dflash: sglang's own DFlashWorkerV2 and "
        "DFlashDraftInputV2 over fake target and draft models (0.5.14's verify_done self-event, 0.5.15's barrier)",
    )
    parser.add_argument(
        "--plan-stream",
        action="store_true",
        help="with --spec dflash: prepare_for_decode on sglang's plan stream (SGLANG_ENABLE_OVERLAP_PLAN_STREAM)",
    )
    parser.add_argument(
        "--attention",
        choices=("flashinfer", "fa3"),
        default="flashinfer",
        help="how the fake attention backend reads req_to_token: flashinfer (default: each row to its own "
        "length) or fa3 (FA3's eager page table: every row to the batch's longest)",
    )
    parser.add_argument(
        "--no-radix-cache",
        dest="radix_cache",
        action="store_false",
        help="disable_radix_cache (sglang's ChunkCache: a prefill result rewrites no row)",
    )
    parser.add_argument("--no-control", dest="control", action="store_false", help="skip the negative control")
    parser.add_argument("--json", type=Path, help="write every version's result as JSON here")
    parser.add_argument("--archive", type=Path, help="fetch: unpack this `sglang pack` archive instead of pip")
    parser.add_argument("--out", type=Path, help="pack: the .tar.gz to write")
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda", "auto"),
        default="cpu",
        help="cpu (default: virtual streams), cuda (a real GPU: torch.cuda's streams, sglang's Triton kernels), "
        "auto (cuda if torch sees a CUDA device)",
    )
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per version (default 900)")
    parser.add_argument(
        "--manifest",
        type=int,
        metavar="N",
        help="with --device cuda: also fuzz each workload's delays for a wrong page-table read (a delay aimed "
        "before each race's read first, then N drawn), confirmed k of k; a manifestation is a race (exit 1)",
    )


def sglang_command(args: argparse.Namespace) -> ExitCode:
    from racefuzz.engines.sglang import sources

    for version in args.versions:
        sources.check_version(version)
    if args.action == "fetch":
        return fetch_action(args, sources.SGLANG)
    if args.action == "pack":
        return pack_action(args, sources.SGLANG, sources.pack)
    if not args.versions and args.source is None:
        raise InvalidArgument("racefuzz sglang needs --version X (repeatable) or --source DIR")
    if args.examples < 1 or args.examples > 10_000:
        raise InvalidArgument(f"--examples must be 1 to 10000, got {args.examples}")
    if not 1 <= getattr(args, "max_output", 6) <= 64:
        raise InvalidArgument(f"--max-output must be 1 to 64, got {args.max_output}")
    if args.manifest is not None and (args.manifest < 0 or args.manifest > 10_000):
        raise InvalidArgument(f"--manifest must be 0 to 10000, got {args.manifest}")
    if args.jobs < 1 or args.jobs > MAX_JOBS:
        raise InvalidArgument(f"--jobs must be 1 to {MAX_JOBS}, got {args.jobs}")
    from racefuzz.engines.device_choice import resolve_device

    device = resolve_device(getattr(args, "device", "cpu"))  # NoGpu: one line, exit 2
    if args.manifest is not None and device != "cuda":
        raise InvalidArgument("--manifest needs --device cuda: on the CPU a delay cannot reorder anything")
    spec = getattr(args, "spec", "none")
    plan_stream = bool(getattr(args, "plan_stream", False))
    if plan_stream and spec != "dflash":
        raise InvalidArgument("--plan-stream needs --spec dflash (only DFLASH's prepare_for_decode has a plan stream)")
    page_sizes = tuple(getattr(args, "page_sizes", None) or (1,))
    from racefuzz.engines.sglang.workload import check_page_size

    for page_size in page_sizes:
        try:
            check_page_size(page_size)
        except ValueError as exc:
            raise InvalidArgument(f"--page-size: {exc}") from None
    if len(set(page_sizes)) != len(page_sizes):
        raise InvalidArgument(f"--page-size: each page size once, got {', '.join(map(str, page_sizes))}")
    if len(page_sizes) > 1 and args.workload not in ("drawn", "search"):
        raise InvalidArgument("--page-size more than once needs --workload drawn or search (one page size per run)")
    if page_sizes != (1,) and spec != "none":
        raise InvalidArgument("--page-size above 1 needs --spec none (DFLASH is driven with page size 1 only)")
    from racefuzz.engines.sglang.workload import CUDA_GRAPHS

    cuda_graphs = CUDA_GRAPHS[getattr(args, "cuda_graph", "off")]
    if len(cuda_graphs) > 1 and args.workload not in ("drawn", "search"):
        raise InvalidArgument("--cuda-graph drawn needs --workload drawn or search (one setting per run)")
    if cuda_graphs != (False,):
        if spec != "none":
            raise InvalidArgument("--cuda-graph needs --spec none (decode graphs are replayed only without DFLASH)")
        if args.read_done != "none":
            raise InvalidArgument("--cuda-graph needs --read-done none (sglang's graph runner publishes its own event)")
        if device != "cpu":
            raise InvalidArgument("--cuda-graph runs on the CPU (racefuzz's graph stand-ins; not run on a GPU yet)")
    if args.workload == "search":  # drawn, shrunk, saved in one process per version
        from racefuzz.engines.sglang.search import search_command

        return search_command(args, device)
    mixed_chunk = bool(getattr(args, "mixed_chunk", False))
    if mixed_chunk and args.workload != "drawn":
        raise InvalidArgument("--mixed-chunk applies to --workload drawn (--workload mixed-chunk is its fixed one)")
    if mixed_chunk and spec != "none":
        raise InvalidArgument("--mixed-chunk needs --spec none (the harness mixes chunks without speculative decoding)")
    workloads = with_spec(
        workloads_for(
            args.workload,
            args.examples,
            args.seed,
            getattr(args, "max_output", 6),
            mixed_chunk,
            page_sizes=page_sizes,
            cuda_graphs=cuda_graphs,
        ),
        spec,
        plan_stream,
        getattr(args, "attention", "flashinfer"),
        getattr(args, "radix_cache", True),
    )
    results = []
    for label, python_dir, version_hint in engine.targets(args, sources.locate, args.sglang_version):
        result = run_harness_jobs(
            python_dir,
            workloads,
            args.control,
            version_hint,
            args.timeout,
            args.read_done,
            device,
            args.jobs,
            manifest=args.manifest,
        )
        result["label"] = label
        result["mixed_chunk"] = any(data.get("mixed_chunk") for data in workloads)
        results.append(result)
        print(format_result(result))
        sys.stdout.flush()
    engine.write_results(results, args.json)
    return overall_exit(results, args.control)


def workloads_for(
    workload: str,
    examples: int = 10,
    seed: int = 0,
    max_output: int = 6,
    mixed_chunk: bool = False,
    page_sizes: tuple[int, ...] = (1,),
    cuda_graphs: tuple[bool, ...] = (False,),
) -> list[dict[str, Any]]:
    """`--workload`'s value as the harness's workload list: `fixed`, `mixed-chunk`, `drawn` (`examples` of
    them from `seed`, mixed chunked prefill ones with `mixed_chunk`, their page sizes drawn from
    `page_sizes`), or a JSON file of one workload; a fixed or file workload runs with the one page size of
    `page_sizes` when it is not 1 (else its own), and with its decodes in CUDA graphs when `cuda_graphs` is
    `(True,)`. An `InvalidArgument` otherwise."""
    from racefuzz.engines.sglang.workload import FIXED, MIXED_CHUNK, Workload

    if workload == "drawn":
        drawn = draw_workloads(examples, seed, max_output, mixed_chunk, page_sizes, cuda_graphs)
        return [w.to_json() for w in drawn]
    if workload == "fixed":
        chosen = FIXED
    elif workload == "mixed-chunk":
        chosen = MIXED_CHUNK
    else:
        path = Path(workload)
        if not path.is_file():
            raise InvalidArgument(f"--workload: expected fixed, mixed-chunk, drawn or a JSON file, got {workload!r}")
        try:
            chosen = Workload.from_json(json.loads(path.read_text()))
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidArgument(f"--workload {path}: not a workload ({type(exc).__name__}: {exc})") from None
    if page_sizes != (1,):
        try:
            chosen = chosen.with_page_size(page_sizes[0])
        except ValueError as exc:
            raise InvalidArgument(f"--page-size {page_sizes[0]}: {exc}") from None
    if cuda_graphs == (True,):
        chosen = chosen.with_cuda_graph(True)
    return [chosen.to_json()]


def with_spec(
    workloads: list[dict[str, Any]],
    spec: str,
    plan_stream: bool = False,
    attention: str = "flashinfer",
    radix_cache: bool = True,
) -> list[dict[str, Any]]:
    """The same request streams under `spec`, the read extent `attention` and the radix-cache setting (the
    defaults leave each workload's own)."""
    from racefuzz.engines.sglang.workload import Workload

    if spec == "none" and attention == "flashinfer" and radix_cache:
        return workloads
    changed = []
    for data in workloads:
        workload = Workload.from_json(data)
        changed.append(
            workload.with_spec(
                spec if spec != "none" else workload.spec,
                plan_stream or workload.plan_stream,
                attention if attention != "flashinfer" else None,
                False if not radix_cache else None,
            ).to_json()
        )
    return changed


def sync_counts(runs: list[dict[str, Any]]) -> dict[str, int]:
    """The runs' stream and event calls from sglang's code (`syncs`), summed by call site."""
    total: dict[str, int] = {}
    for run in runs:
        for site, count in run.get("syncs", {}).items():
            total[site] = total.get(site, 0) + count
    return dict(sorted(total.items()))


def draw_workloads(
    count: int,
    seed: int,
    max_output: int = 6,
    mixed_chunk: bool = False,
    page_sizes: tuple[int, ...] = (1,),
    cuda_graphs: tuple[bool, ...] = (False,),
) -> list[Any]:
    """`count` distinct workloads drawn by `workload.workloads()` with Hypothesis, reproducibly from `seed`
    (fewer only if twice as many draws did not find that many); mixed chunked prefill ones with
    `mixed_chunk`; their page sizes drawn from `page_sizes`, their CUDA-graph setting from `cuda_graphs`."""
    from racefuzz.commands.engine import draw_distinct
    from racefuzz.engines.sglang.workload import workloads

    strategy = workloads(max_output=max_output, mixed_chunk=mixed_chunk, page_sizes=page_sizes, cuda_graphs=cuda_graphs)
    return draw_distinct(strategy, count, seed)


def run_harness(
    python_dir: Path,
    workloads: list[dict[str, Any]],
    control: bool,
    version: str | None,
    timeout: float,
    read_done: str = "none",
    device: str = "cpu",
    manifest: int | None = None,
    profile: bool = True,
) -> dict[str, Any]:
    """One version's harness subprocess (`racefuzz.engines.sglang.harness`) -> its JSON result (`profile`
    False: the harness's `--no-profile`, for the benchmark)."""
    options = ["--workloads-stdin"]  # on stdin: 10,000 workloads are past the command line's limit
    if not control:
        options.append("--no-control")
    if not profile:
        options.append("--no-profile")
    options += ["--read-done", read_done]
    if version:
        options += ["--sglang-version", version]
    if device != "cpu":
        options += ["--device", device]
    if manifest is not None:
        options += ["--manifest", str(manifest)]
    from racefuzz.engines.harness_process import run_json_process
    from racefuzz.engines.sglang import bytecode

    env = bytecode.subprocess_env(dict(os.environ, PYTHONWARNINGS="ignore", TRITON_INTERPRET="0"))
    if device == "cpu":
        # The CPU run is the same on every host: on a host with a GPU, sglang's `is_cuda()` would be True and
        # take the GPU's paths (0.5.16's `_war_barrier_enabled = is_cuda() or ...` ignores the control's
        # SGLANG_ENABLE_WAR_BARRIER=0: the control was not caught on an H200 host's CPU).
        env["CUDA_VISIBLE_DEVICES"] = ""
    return run_json_process(
        "racefuzz.engines.sglang.harness", python_dir, options, timeout=timeout, env=env, stdin=json.dumps(workloads)
    )


def run_harness_jobs(
    python_dir: Path,
    workloads: list[dict[str, Any]],
    control: bool,
    version: str | None,
    timeout: float,
    read_done: str = "none",
    device: str = "cpu",
    jobs: int = 1,
    manifest: int | None = None,
) -> dict[str, Any]:
    """`run_harness` over `workloads` split into `jobs` parts (every jobs-th workload), run at once, merged
    into one result: the runs in workload order, the slowest part's import time; the first part that did
    not finish `ok` is the result (its error names what failed)."""
    parts = [workloads[start::jobs] for start in range(min(jobs, len(workloads)))]
    if len(parts) <= 1:
        return run_harness(python_dir, workloads, control, version, timeout, read_done, device, manifest)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(parts)) as pool:
        results = list(
            pool.map(
                lambda part: run_harness(python_dir, part, control, version, timeout, read_done, device, manifest),
                parts,
            )
        )
    for result in results:
        if result.get("status") != "ok":
            return result
    merged = dict(results[0])
    per_workload = 2 if control else 1  # each part's runs: its workloads in order, control after each
    runs: list[dict[str, Any]] = []
    for index in range(len(workloads)):
        part, at = index % len(parts), index // len(parts)
        runs += results[part]["runs"][at * per_workload : (at + 1) * per_workload]
    merged["runs"] = runs
    if manifest is not None:
        merged["manifest"] = [results[i % len(parts)]["manifest"][i // len(parts)] for i in range(len(workloads))]
    merged["jobs"] = len(parts)
    merged["import_seconds"] = max(r.get("import_seconds") or 0.0 for r in results)
    merged["seconds"] = max(r.get("seconds") or 0.0 for r in results)
    return merged


def version_verdict(result: dict[str, Any], control: bool) -> ExitCode:
    """`engine.version_verdict`: the control is the run with the barrier off; a confirmed wrong read
    (`--manifest`) is a race."""
    manifested = any(m["manifested"] for m in result.get("manifest", []))
    return engine.version_verdict(result, control, lambda run: not run["barrier"], manifested)


def overall_exit(results: list[dict[str, Any]], control: bool) -> ExitCode:
    return engine.overall_exit(version_verdict(result, control) for result in results)


def format_result(result: dict[str, Any]) -> str:
    label = result.get("label") or result.get("version")
    if result.get("status") != "ok":
        return f"sglang {label}: {result.get('status', 'error')}: {result.get('error')}"
    runs = result["runs"]
    barrier = [run for run in runs if run["barrier"]]
    controls = [run for run in runs if not run["barrier"]]
    races = [race for run in barrier for race in run["races"]]
    functions = set().union(*(set(run["sglang_functions"]) for run in runs))
    specs = sorted({run.get("spec", "none") for run in runs} - {"none"})
    plan = any(run.get("plan_stream") for run in runs)
    spec_text = f", spec {'/'.join(specs)}{' on the plan stream' if plan else ''}" if specs else ""
    lines = [
        f"sglang {label} (version {result.get('version')}, adapter {result.get('adapter')}, read-done "
        f"{result.get('read_done')}{spec_text}): "
        f"{len(barrier)} workload(s), {sum(r['iterations'] for r in barrier)} loop iterations, "
        f"{sum(r['forwards'] for r in barrier)} forwards, {len(functions)} sglang functions ran in the loop; "
        f"imports {result.get('import_seconds')} s, total {result.get('seconds')} s",
    ]
    if races:
        lines.append(f"  RACE: {len(races)} happens-before race(s) with the WAR barrier as the version has it")
        seen = set()
        for race in races:
            key = (
                race["kind"],
                race["first"]["source"],
                tuple(race["first"].get("called_from", ())),  # DFLASH: the draft's read, the verify's
                race["second"]["source"],
                tuple(race["bytes"]),
            )
            if key in seen:
                continue
            seen.add(key)
            lines += engine.race_lines(race, byte_names=3, called_from=2)
    else:
        lines.append("  clean: no happens-before race with the WAR barrier as the version has it")
    latent = {(r["first"]["source"], r["second"]["source"]): r for run in barrier for r in run.get("latent", ())}
    if latent:  # racefuzz.trace.lifetime: a free nothing reuses in the loop, said once, not counted
        lines.append(
            f"  latent lifetime hazard(s), not counted as races: {len(latent)} use(s) pending at a free that no "
            "later allocation in the loop reuses (a corruption once sglang allocates on that stream again)"
        )
        for race in latent.values():
            lines += engine.race_lines(race, byte_names=3)
    freed = {(r["first"]["source"], r["second"]["source"]): r for run in barrier for r in run.get("freed_in_use", ())}
    if freed:  # harness.freed_in_use: a free nothing orders after a use, its block's reuse ordered: said once
        lines.append(
            f"  freed in use, not counted as races: {len(freed)} use(s) on another stream pending when a block is "
            "freed, its reuse ordered after them (no corruption under torch's caching allocator, which hands the "
            "block on at its reuse on its own stream; an allocator that hands it on sooner is not modelled)"
        )
        for race in freed.values():
            lines.append(f"    {race['kind']} on {', '.join(race['bytes'][:3])}")
            for end, label in (("first", "use "), ("second", "free")):
                access = race[end]
                lines.append(f"      {label}: {access['kernel']} on {access['stream']}  {access['source']}")
    steps = sum(r["forwards"] for r in barrier)  # target forwards: one per step (a DFLASH step drafts too)
    counts = sync_counts(barrier)
    if counts and steps and specs:
        lines.append(f"  stream/event calls from sglang's code (fences as the version has them; {steps} steps):")
        lines += [f"    {count:4d}  {site}" for site, count in counts.items()]
    if controls:
        switch = result.get("control_switch", "SGLANG_ENABLE_WAR_BARRIER=0")
        lines.append(engine.control_line(f"{switch}, the barrier off", controls))
        if result.get("mixed_chunk") or any(lifetime_races(run) for run in controls):
            lines += lifetime_lines(controls, "in the control")
    lines += manifest_lines(result.get("manifest", []))
    return "\n".join(lines)


def lifetime_lines(runs: list[dict[str, Any]], where: str) -> list[str]:
    """The runs' lifetime races (the second access a free, moved to its block's reuse by
    `racefuzz.trace.lifetime`: sglang #34076's kind), each pair of source lines once."""
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for run in runs:
        for race in lifetime_races(run):
            found.setdefault((race["first"]["source"], race["second"]["source"]), race)
    if not found:
        return [f"  no lifetime race {where} (no use pending at a freed block's reuse)"]
    lines = [f"  lifetime race(s) {where}: {len(found)} use(s) pending when a freed block is reused"]
    for race in found.values():
        lines.append(f"    {race['kind']} on {', '.join(race['bytes'][:3])}")
        lines.append(f"      use : {race['first']['kernel']} on {race['first']['stream']}  {race['first']['source']}")
        free, _, reuse = race["second"]["kernel"].partition(", its block reused by ")
        lines.append(f"      free: {free} on {race['second']['stream']}  {race['second']['source']}")
        if reuse:
            lines.append(f"      reuse: {short_reuse(reuse)}")
    return lines


def lifetime_races(run: dict[str, Any]) -> list[dict[str, Any]]:
    """A run's races whose second access is a free (at its block's reuse)."""
    return [race for race in run["races"] if race.get("second", {}).get("kernel", "").startswith("free(")]


def short_reuse(text: str) -> str:
    """A reuse's `kernel (path/sglang/srt/...:line (function))` with the path cut to `sglang/...`."""
    at = text.find("sglang/srt/")
    opening = text.find("(")
    return text[: opening + 1] + text[at:] if 0 <= opening < at else text


def manifest_lines(found: list[dict[str, Any]]) -> list[str]:
    """`--manifest`'s findings: each confirmed wrong read, with its delays; else how much was tried."""
    lines = []
    for m in found:
        if m["manifested"]:
            lines.append(
                f"  MANIFESTED on {m['workload']}: {m['divergence']}; under delays {m['delays']} "
                f"(stream, n-th launch, us), {m['confirmed']} of {m['confirm_runs']} re-runs; {m['seconds']} s"
            )
        else:
            why = f" ({m['skipped'].strip()})" if m.get("skipped") else ""
            flaky = f", seen {m['confirmed']} of {m['confirm_runs']} re-runs (flaky)" if m.get("divergence") else ""
            lines.append(
                f"  no wrong read on {m['workload']}{why}: {m['aimed_tried']} aimed and {m['examples']} drawn delay "
                f"set(s){flaky}; {m['seconds']} s"
            )
    return lines
