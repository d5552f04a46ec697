"""The model checked against sglang: the model's happens-before verdict on a workload beside sglang's own
loop's (`racefuzz sglang`), version by version (docs/model-fidelity.md).

    python -m ci.bench.model_vs_sglang --version 0.5.15 --version 0.5.23 --examples 50 --seed 0 --json PATH

For each version: `--examples` harness workloads drawn by Hypothesis (`racefuzz.engines.sglang.workload.
workloads()`, from `--seed`), one harness subprocess running them all with the WAR barrier as the version
has it and with it off; each workload mapped to a model workload (`to_model_workload`) and built under the
version's model design (`VERSION_DESIGNS`) and under `none` (the barrier off); both judged by
happens-before. A workload agrees when the verdicts (race or none) and the race rows (`RaceRow`: kind,
writer, table row) are equal. A design deliberately wrong for the version (`WRONG_DESIGNS`) is judged
against the same runs: it must disagree somewhere, or the comparison could not fail. Exit 0: every verdict
agrees, the control raced and the wrong design disagreed; 1: some verdict disagrees; 3: the control never
raced or the wrong design agreed everywhere (inconclusive); 5: a harness failed.

Lives in `ci/` because it imports both the scenario (`racefuzz.scenarios.sglang`) and the engine
(`racefuzz.engines.sglang`), which no generic module of the package may join (tests/unit/test_architecture.py).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from racefuzz.engines.sglang.workload import Request
from racefuzz.engines.sglang.workload import Workload as HarnessWorkload
from racefuzz.errors import InvalidArgument, RacefuzzError
from racefuzz.exitcodes import ExitCode
from racefuzz.scenarios.sglang.workload import RequestSpec
from racefuzz.scenarios.sglang.workload import Workload as ModelWorkload

VERSION_DESIGNS = {
    "0.5.14": "global-war",
    "0.5.15": "global-war",
    "0.5.16": "war-after-launch",
    "0.5.17": "war-after-launch",
    "0.5.18": "war-after-launch",
    "0.5.19": "war-after-launch",
    "0.5.20": "war-after-launch",
    "0.5.21": "war-after-launch",
    "0.5.22": "record-stream",
    "0.5.23": "record-stream",
}
"""The model design that claims each version's non-speculative loop (the only path the harness drives):
0.5.14 calls `_apply_war_barrier` at the loop top for every non-DFLASH batch (scheduler.py:1556; its
DFLASH-only self-event `verify_done`, the model's `self-event`, is not drivable: the harness runs
`spec_algorithm=None`); 0.5.15 at the loop top (scheduler.py:1584, #29556); from 0.5.16 right after
`run_batch` (0.5.16 scheduler.py:1601-1603, #31687; 0.5.23 :2109-2111); from 0.5.22 with #34076's
`record_stream`s in overlap_utils.py, which the model's `record-stream` carries. The designs' read-done
fast paths and `record_stream` change nothing the harness's workloads reach (no read-done is published, no
mixed chunk is formed), so on them `war-after-launch` and `record-stream` build the same program."""

LIFO_ROWS_FROM = (0, 5, 18)
"""From this version `ReqToTokenPool.alloc` takes rows from the free list's tail (`Workload.lifo_rows`)."""

SKIP_FINISHING_DECODE_FROM = (0, 5, 22)
"""From this version the overlap loop leaves a request whose in-flight result finishes it out of the next
decode batch (`Workload.skip_finishing_decode`; 0.5.22 scheduler.py:1977)."""

FILTER_EACH_STEP_FROM = (0, 5, 23)
"""From this version the running batch drops its finished requests at every step, before the prefill
(`Workload.filter_finished_each_step`)."""

CONTROL_DESIGN = "none"
"""The model design of the harness's control (`SGLANG_ENABLE_WAR_BARRIER=0`: `_apply_war_barrier` returns
at once)."""

WRONG_DESIGNS = {"global-war": "war-after-launch", "war-after-launch": "mutant-31687-loop-top-barrier"}
"""The negative control of the comparison: per version, a model design deliberately wrong for it, judged
against the same runs, which must disagree with the real loop on some workload of the run (else the
comparison could not have failed). A loop-top version is judged against `war-after-launch` (the barrier
after `run_batch`); a version with the barrier after `run_batch` against `mutant-31687-loop-top-barrier`
(`war-after-launch` with the barrier back at the loop top, the mutant re-creating #31687's race)."""


def wrong_design(version: str) -> str:
    design = VERSION_DESIGNS[version]
    return WRONG_DESIGNS.get(design, WRONG_DESIGNS["war-after-launch"])


class RaceRow(NamedTuple):
    """A race as both sides can name it: its kind, the writer (`prefill_write`, `decode_alloc`,
    `post_launch_rewrite`, `stash_rewrite`, or `other:<site>`) and the `req_to_token` row it is on."""

    kind: str
    writer: str
    row: int

    def __str__(self) -> str:
        return f"{self.kind} {self.writer} row {self.row}"


MODEL_WRITERS = {
    "prefill_write": "prefill_write",
    "overalloc_write": "decode_alloc",
    "post_launch_rewrite": "post_launch_rewrite",
    "stash_rewrite": "stash_rewrite",
}
"""The model's writer kernels -> `RaceRow.writer`."""

REAL_WRITERS = (
    ("cache_unfinished_req", "post_launch_rewrite"),  # 0.5.14-0.5.21: radix_cache.py RadixCache.cache_unfinished_req
    ("(checkpoint)", "post_launch_rewrite"),  # 0.5.22+: radix_cache.py RadixCache.checkpoint
    ("alloc_for_extend", "prefill_write"),
    ("prepare_for_extend", "prefill_write"),
    ("alloc_for_decode", "decode_alloc"),
    ("prepare_for_decode", "decode_alloc"),
)
"""The sglang function in a real write's caller chain -> `RaceRow.writer` (first match wins)."""

_TABLE_ROW = re.compile(r"req_to_token\[(\d+),")


def version_key(version: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in version.split("."))
    except ValueError:
        raise InvalidArgument(f"not a release version: {version!r}") from None


def to_model_workload(workload: HarnessWorkload, version: str) -> ModelWorkload:
    """The model workload of a harness workload. Mapped: each request's arrival iteration, prompt length
    (one chunk: the harness runs `chunked_prefill_size=-1`) and output length (the prefill's token, then
    `output_len - 1` decode forwards of one token each: block size 1, accept length 1); the rows (`pool_rows`,
    which is also the harness's `max_running_requests`); the iteration budget. Every unfinished request is
    re-cached after its prefill (`rewrite_at=(0,)` when it decodes), as sglang's
    `maybe_cache_unfinished_req` does. The rest is the model's simplest: no plan stream, page size 1, exact
    reads (the fake forward reads each row's `0:seq_len`), no replay reads, SWA table or mixed chunks.
    Four model options follow sglang's code: its admission (`Workload.sglang_admission`, every version),
    from 0.5.18 its row order (`Workload.lifo_rows`), from 0.5.22 no decode over-scheduled with a finished
    request (`Workload.skip_finishing_decode`), from 0.5.23 finished requests filtered at every step
    (`Workload.filter_finished_each_step`). A speculative workload is refused (`InvalidArgument`)."""
    spec = getattr(workload, "spec", "none")
    if spec != "none":
        raise InvalidArgument(f"no model mapping for a harness workload with spec {spec!r} (non-speculative only)")
    requests = tuple(
        RequestSpec(
            arrival=r.arrival,
            prompt_len=r.prompt_len,
            chunk=r.prompt_len,
            accepts=(1,) * (r.output_len - 1),
            rewrite_at=(0,) if r.output_len > 1 else (),
        )
        for r in sorted(workload.requests, key=lambda r: r.arrival)
    )
    return ModelWorkload(
        requests=requests,
        iterations=workload.max_iterations,
        block_size=1,
        rows=workload.pool_rows,
        sglang_admission=True,
        lifo_rows=version_key(version) >= LIFO_ROWS_FROM,
        skip_finishing_decode=version_key(version) >= SKIP_FINISHING_DECODE_FROM,
        filter_finished_each_step=version_key(version) >= FILTER_EACH_STEP_FROM,
    )


def to_harness_workload(workload: ModelWorkload) -> HarnessWorkload:
    """The harness workload of a model workload in the subset both express (the inverse of
    `to_model_workload`; `lifo_rows` is the version's, not the workload's); `InvalidArgument` naming the
    first field the harness cannot run."""
    unsupported = {
        "block_size": workload.block_size != 1,
        "plan_stream": workload.plan_stream,
        "page_size": workload.page_size != 1,
        "read_extent": workload.read_extent != "exact",
        "cpu_seq_lens": workload.cpu_seq_lens,
        "replay_reads": workload.replay_reads,
        "swa_window": workload.swa_window != 0,
        "filter_batch_sync": workload.filter_batch_sync,
        "mixed_chunk": workload.mixed_chunk,
        "post_launch_rewrites": not workload.post_launch_rewrites,
        "sglang_admission": not workload.sglang_admission,
    }
    for name, bad in unsupported.items():
        if bad:
            raise InvalidArgument(f"the harness cannot run a model workload with {name}={getattr(workload, name)!r}")
    requests = []
    for i, r in enumerate(workload.requests):
        if r.chunk < r.prompt_len:
            raise InvalidArgument(f"the harness cannot run request {i}: chunked prefill (chunk {r.chunk})")
        if r.swa_recovery:
            raise InvalidArgument(f"the harness cannot run request {i}: swa_recovery")
        if r.rewrite_at != ((0,) if r.accepts else ()):
            raise InvalidArgument(f"the harness cannot run request {i}: sglang re-caches every unfinished request")
        requests.append(Request(f"r{i}", r.arrival, r.prompt_len, len(r.accepts) + 1))
    return HarnessWorkload(tuple(requests), max_iterations=workload.iterations, pool_rows=workload.rows)


def model_rows(workload: ModelWorkload, design: str) -> set[RaceRow]:
    """The race rows of the model's program of `workload` under `design`, by happens-before."""
    from racefuzz import find_races
    from racefuzz.designs import load_design
    from racefuzz.scenarios.sglang import build_program

    rows = set()
    for race in find_races(build_program(workload, load_design(design).hooks)):
        writer = MODEL_WRITERS.get(race.second.kernel, f"other:{race.second.kernel}")
        for cells in race.cells:
            table_row = cells.row0 if cells.buffer.name == "req_to_token" else -1
            rows.add(RaceRow(race.kind.value, writer, table_row))
    return rows


def real_rows(run: dict[str, Any]) -> set[RaceRow]:
    """The race rows of one harness run (`run["races"]`, the harness's JSON)."""
    rows = set()
    for race in run["races"]:
        second = race["second"]
        chain = " <- ".join([second["source"], *second.get("called_from", [])])
        writer = next((name for site, name in REAL_WRITERS if site in chain), f"other:{second['source']}")
        for where in race["bytes"]:
            found = _TABLE_ROW.match(where)
            rows.add(RaceRow(race["kind"], writer, int(found.group(1)) if found else -1))
    return rows


@dataclass
class Comparison:
    """One workload under one (version, design) pair: the real loop's race rows beside the model's."""

    workload: HarnessWorkload
    barrier: bool
    design: str
    real: set[RaceRow]
    model: set[RaceRow]

    @property
    def verdicts_agree(self) -> bool:
        return bool(self.real) == bool(self.model)

    @property
    def agrees(self) -> bool:
        return self.real == self.model

    def to_json(self) -> dict[str, Any]:
        return {
            "workload": self.workload.to_json(),
            "described": self.workload.describe(),
            "barrier": self.barrier,
            "design": self.design,
            "real": sorted(str(r) for r in self.real),
            "model": sorted(str(r) for r in self.model),
            "verdicts_agree": self.verdicts_agree,
            "agrees": self.agrees,
        }


def compare_result(
    result: dict[str, Any],
    workloads: Sequence[HarnessWorkload],
    version: str,
    design: str | None = None,
    wrong: str | None = None,
) -> list[Comparison]:
    """Each run of a harness `result` for sglang `version` (the barrier's under `design`, by default the
    version's `VERSION_DESIGNS` entry; the control's under `none`; with `wrong` the barrier's again under
    that design) beside the model's verdict on the same workload."""
    design = design or VERSION_DESIGNS[version]
    if result.get("status") != "ok":
        raise RuntimeError(f"the harness failed: {result.get('status')}: {result.get('error')}")
    by_name = {w.describe(): w for w in workloads}
    comparisons = []
    for run in result["runs"]:
        workload = by_name[run["workload"]]
        model = to_model_workload(workload, version)
        real = real_rows(run)
        designs = [design, *([wrong] if wrong else [])] if run["barrier"] else [CONTROL_DESIGN]
        for name in designs:
            comparisons.append(Comparison(workload, run["barrier"], name, real, model_rows(model, name)))
    return comparisons


def draw(count: int, seed: int) -> list[HarnessWorkload]:
    """`count` distinct harness workloads drawn by Hypothesis from `seed` (what `racefuzz sglang --workload
    drawn` runs)."""
    from racefuzz.commands.sglang import draw_workloads

    return draw_workloads(count, seed)


def run_version(version: str, workloads: Sequence[HarnessWorkload], timeout: float = 900.0) -> dict[str, Any]:
    """sglang `version`'s own loop on `workloads`, barrier and control: one harness subprocess per pool size
    among them, the runs merged into one result. Why per pool size: within one harness process every
    workload's `Scheduler.__init__` sets `pp_max_micro_batch_size` (the admission bound, from
    `max_running_requests = pool_rows`) only while it is unset (0.5.16 scheduler.py:893-899; 0.5.23
    :1237-1242), and the harness keeps one server-args object for the process, so a workload after one of
    another pool size would run under that one's bound."""
    from racefuzz.commands.sglang import run_harness
    from racefuzz.engines.sglang import sources

    path = sources.locate(version=version)
    merged: dict[str, Any] | None = None
    for rows in sorted({w.pool_rows for w in workloads}):
        group = [w.to_json() for w in workloads if w.pool_rows == rows]
        result = run_harness(path, group, True, version, timeout)
        if result.get("status") != "ok":
            return result
        if merged is None:
            merged = result
        else:
            merged["runs"].extend(result["runs"])
            merged["seconds"] = round(merged["seconds"] + result["seconds"], 3)
            merged["import_seconds"] = round(merged["import_seconds"] + result["import_seconds"], 3)
    if merged is None:
        raise InvalidArgument("no workload to run")
    return merged


def tally(comparisons: Iterable[Comparison]) -> dict[tuple[bool, str], dict[str, int]]:
    """(barrier, design) -> workloads, real racy, model racy, verdict agreements, full agreements (verdict and
    race rows)."""
    table: dict[tuple[bool, str], dict[str, int]] = {}
    for c in comparisons:
        cell = table.setdefault(
            (c.barrier, c.design), {"workloads": 0, "racy": 0, "model_racy": 0, "verdicts_agree": 0, "agree": 0}
        )
        cell["workloads"] += 1
        cell["model_racy"] += bool(c.model)
        cell["verdicts_agree"] += c.verdicts_agree
        cell["agree"] += c.agrees
        cell["racy"] += bool(c.real)
    return table


def render(figures: dict[str, Any]) -> str:
    lines = [
        f"model vs sglang's own loop: {figures['examples']} drawn workloads per version, seed {figures['seed']}",
        "",
        "| version | real loop | model design | workloads | real racy | model racy | verdicts agree | rows agree |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for version in figures["versions"]:
        entry = figures["results"][version]
        if "error" in entry:
            lines.append(f"| {version} | {entry['error']} | | | | | | |")
            continue
        for cell in entry["table"]:
            loop = "barrier as the version has it" if cell["barrier"] else "barrier off (control)"
            wrong = " (wrong on purpose)" if cell["design"] == entry["wrong_design"] else ""
            lines.append(
                f"| {version} | {loop} | `{cell['design']}`{wrong} | {cell['workloads']} | {cell['racy']} | "
                f"{cell['model_racy']} | {cell['verdicts_agree']} | {cell['agree']} |"
            )
    lines.append("")
    for version in figures["versions"]:
        entry = figures["results"][version]
        for c in entry.get("comparisons", []):
            if not c["agrees"] and c["design"] != entry["wrong_design"]:
                lines.append(
                    f"disagreement: {version} `{c['design']}` ({'barrier' if c['barrier'] else 'control'}) "
                    f"{c['described']}: real {', '.join(c['real']) or 'none'}; model {', '.join(c['model']) or 'none'}"
                )
    lines.append(f"verdict: {figures['verdict']}")
    return "\n".join(lines)


def run(versions: Sequence[str], examples: int, seed: int) -> dict[str, Any]:
    """The figures of `main`: per version, the table of `tally` and every comparison."""
    workloads = draw(examples, seed)
    figures: dict[str, Any] = {"examples": len(workloads), "seed": seed, "versions": list(versions), "results": {}}
    verdicts = []
    for version in versions:
        result = run_version(version, workloads)
        wrong = wrong_design(version)
        try:
            comparisons = compare_result(result, workloads, version, wrong=wrong)
        except RuntimeError as exc:
            figures["results"][version] = {"error": str(exc)}
            verdicts.append(f"{version}: harness failed")
            continue
        table = [
            {"barrier": barrier, "design": design, **cell}
            for (barrier, design), cell in sorted(tally(comparisons).items(), key=lambda kv: (not kv[0][0], kv[0][1]))
        ]
        right = [c for c in comparisons if c.design != wrong]
        if not any(c.real for c in comparisons if not c.barrier):
            verdicts.append(f"{version}: inconclusive (the control never raced)")
        elif all(c.agrees for c in comparisons if c.design == wrong):
            verdicts.append(f"{version}: inconclusive (the wrong design `{wrong}` agreed everywhere)")
        elif all(c.verdicts_agree for c in right):
            verdicts.append(f"{version}: verdicts agree ({sum(c.agrees for c in right)}/{len(right)} rows agree)")
        else:
            verdicts.append(f"{version}: {sum(not c.verdicts_agree for c in right)} verdict disagreement(s)")
        figures["results"][version] = {
            "sglang": {k: result.get(k) for k in ("version", "adapter", "import_seconds", "seconds")},
            "design": VERSION_DESIGNS[version],
            "wrong_design": wrong,
            "table": table,
            "comparisons": [c.to_json() for c in comparisons],
        }
    figures["verdict"] = "; ".join(verdicts)
    return figures


MODEL_OPTIONS = ("sglang_admission", "lifo_rows", "skip_finishing_decode", "filter_finished_each_step")
"""The model's `Workload` fields that follow sglang's code (docs/model-fidelity.md, "Disagreements found")."""


def ablation(figures: dict[str, Any]) -> dict[str, dict[str, int | None]]:
    """From a run's figures (`run`): per model option and version, how many of the control's comparisons
    would disagree with that option alone turned off (model only: the real runs are the recorded ones);
    None where the version's mapping has it off already."""
    from dataclasses import replace

    table: dict[str, dict[str, int | None]] = {}
    for option in MODEL_OPTIONS:
        for version in figures["versions"]:
            entry = figures["results"][version]
            count: int | None = 0
            for c in entry.get("comparisons", []):
                mapped = to_model_workload(HarnessWorkload.from_json(c["workload"]), version)
                if not getattr(mapped, option):
                    count = None
                    break
                if not c["barrier"]:
                    rows = model_rows(replace(mapped, **{option: False}), CONTROL_DESIGN)
                    count += {str(row) for row in rows} != set(c["real"])
            table.setdefault(option, {})[version] = count
    return table


def render_ablation(table: dict[str, dict[str, int | None]]) -> str:
    versions = list(next(iter(table.values())))
    lines = [
        "control comparisons that disagree with one model option turned off (the others as mapped; off: the"
        " version's mapping has it off)",
        "",
        "| option off | " + " | ".join(versions) + " |",
        "|---|" + "---|" * len(versions),
    ]
    lines += [
        f"| `{option}` | " + " | ".join("off" if row[v] is None else str(row[v]) for v in versions) + " |"
        for option, row in table.items()
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ci.bench.model_vs_sglang", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--version", dest="versions", action="append", default=[], choices=sorted(VERSION_DESIGNS, key=version_key)
    )
    parser.add_argument("--examples", type=int, default=50, help="drawn workloads per version (default 50)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="write the raw figures here")
    parser.add_argument(
        "--ablate", type=Path, metavar="JSON", help="instead: the ablation table of a run's --json (no sglang runs)"
    )
    args = parser.parse_args(argv)
    try:
        if args.ablate is not None:
            try:
                figures = json.loads(args.ablate.read_text())
            except (OSError, ValueError) as exc:
                raise InvalidArgument(f"--ablate {args.ablate}: {exc}") from None
            print(render_ablation(ablation(figures)))
            return ExitCode.CLEAN
        if not 1 <= args.examples <= 10_000:
            raise InvalidArgument(f"--examples must be 1 to 10000, got {args.examples}")
        if not args.versions:
            raise InvalidArgument("name at least one --version (its sources fetched: racefuzz sglang fetch)")
        figures = run(args.versions, args.examples, args.seed)
    except RacefuzzError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(render(figures))
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    if "inconclusive" in figures["verdict"] or "failed" in figures["verdict"]:
        return ExitCode.INCONCLUSIVE if "failed" not in figures["verdict"] else ExitCode.INTERNAL
    return ExitCode.RACE if "disagreement" in figures["verdict"] else ExitCode.CLEAN


if __name__ == "__main__":
    sys.exit(main())
