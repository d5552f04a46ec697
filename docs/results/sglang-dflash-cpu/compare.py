"""0.5.14 against 0.5.15 on the same workloads, from a `racefuzz sglang --version 0.5.14 --version 0.5.15
--spec dflash --json FILE` result (FILE or FILE.gz): per workload, each version's races (the cells and the
writer's sglang function) with the fences as the version has them, its control, and the sync calls per
step.

    python3 docs/results/sglang-dflash-cpu/compare.py docs/results/sglang-dflash-cpu/drawn.json.gz
"""

from __future__ import annotations

import gzip
import json
import sys
from collections import Counter


def writer(race: dict) -> str:
    """The sglang function that wrote: the innermost sglang caller of the write (or its own line)."""
    chain = (race["second"].get("called_from") or [race["second"]["source"]])[0]
    links = chain.split(" <- ")
    for link in links:
        name = link.rsplit("(", 1)[-1].rstrip(")")
        if name not in ("write", "assign_req_to_token_pool_func"):
            return name
    return links[0].rsplit("(", 1)[-1].rstrip(")")


def keys(run: dict) -> set[tuple[str, str]]:
    return {(", ".join(race["bytes"]), writer(race)) for race in run["races"]}


COSTS = (
    ("host blocks in verify_done.synchronize", "synchronize at", "(prepare_for_decode)"),
    ("plan_stream.wait_event(verify_done)", "wait_event at", "(prepare_for_decode)"),
    ("barrier wait_stream", "wait_stream at", "(_apply_war_barrier)"),
    ("publish_ready.wait", "wait at", "(resolve_seq_lens_cpu)"),
    ("copy_done.synchronize", "synchronize at", "batch_result_processor.py"),
)


def costs(runs: list[dict]) -> dict[str, int]:
    total: Counter[str] = Counter()
    for run in runs:
        for label, method, where in COSTS:
            total[label] += sum(n for site, n in run["syncs"].items() if site.startswith(method) and where in site)
    return dict(total)


def main(path: str) -> int:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as file:
        results = {result["version"]: result for result in json.load(file)}
    old, new = results["0.5.14"], results["0.5.15"]
    pairs = list(zip(old["runs"], new["runs"], strict=True))
    print(f"{path}: {len(pairs) // 2} workload(s)")
    added = removed = 0
    summary: Counter[str] = Counter()
    for index in range(0, len(pairs), 2):
        (old_run, new_run), (old_control, new_control) = pairs[index], pairs[index + 1]
        assert old_run["workload"] == new_run["workload"] and old_run["barrier"] and not old_control["barrier"]
        a, b = keys(old_run), keys(new_run)
        added += len(b - a)
        removed += len(a - b)
        for version, run, control in (("0.5.14", old_run, old_control), ("0.5.15", new_run, new_control)):
            verdict = (
                "race"
                if run["races"]
                else ("clean, control caught" if control["races"] else "clean, control NOT caught")
            )
            summary[f"{version}: {verdict}"] += 1
        print(f"- {old_run['workload']}")
        print(f"    0.5.14: {sorted(a) or 'clean'} (control {len(old_control['races'])} race(s))")
        print(f"    0.5.15: {sorted(b) or 'clean'} (control {len(new_control['races'])} race(s))")
        if b - a:
            print(f"    0.5.15 adds: {sorted(b - a)}")
        if a - b:
            print(f"    0.5.14 only: {sorted(a - b)}")
    print("verdicts:", dict(sorted(summary.items())))
    print(f"race keys (cells, writer) 0.5.15 has and 0.5.14 lacks: {added}; 0.5.14 has and 0.5.15 lacks: {removed}")
    for version, result in (("0.5.14", old), ("0.5.15", new)):
        fenced = [run for run in result["runs"] if run["barrier"]]
        steps = sum(run["forwards"] for run in fenced)
        iterations = sum(run["iterations"] for run in fenced)
        counted = costs(fenced)
        text = ", ".join(f"{label} {n} ({n / steps:.2f}/step)" for label, n in counted.items())
        print(f"{version} costs over {steps} steps, {iterations} loop iterations: {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
