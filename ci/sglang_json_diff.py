"""Whether two `racefuzz sglang --json` outputs of the same runs say the same, clocks aside.

    python -m ci.sglang_json_diff BEFORE.json AFTER.json

For a change to the harness that must not change what it reports (the function profiler's mechanism, say):
run the same `racefuzz sglang ...` from the tree before and the tree after, then this. Every key is compared
except the clocks (keys naming seconds, `*_s`) and `python_dir`; per run (an object with `sglang_functions`)
it names the keys that differ. Exit 0: identical; 1: a difference (printed); 2: a file unreadable or not JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def without_clocks(value: Any) -> Any:
    """`value` with every clock (a key naming seconds or ending in `_s`) and `python_dir` left out."""
    if isinstance(value, dict):
        return {
            key: without_clocks(item)
            for key, item in value.items()
            if "seconds" not in key and not key.endswith("_s") and key != "python_dir"
        }
    if isinstance(value, list):
        return [without_clocks(item) for item in value]
    return value


def harness_runs(value: Any) -> list[dict[str, Any]]:
    """Every harness run in `value` (an object with `sglang_functions`), in document order."""
    found: list[dict[str, Any]] = []
    if isinstance(value, dict):
        if "sglang_functions" in value:
            found.append(value)
        for item in value.values():
            found += harness_runs(item)
    elif isinstance(value, list):
        for item in value:
            found += harness_runs(item)
    return found


def differences(before: Any, after: Any) -> list[str]:
    """What differs between two outputs, clocks aside: one line per differing run key, or for the document."""
    if without_clocks(before) == without_clocks(after):
        return []
    runs_before, runs_after = harness_runs(before), harness_runs(after)
    if len(runs_before) != len(runs_after):
        return [f"{len(runs_before)} runs before, {len(runs_after)} after"]
    lines = []
    for number, (run_before, run_after) in enumerate(zip(runs_before, runs_after, strict=True), 1):
        for key in sorted(set(run_before) | set(run_after)):
            if without_clocks(run_before.get(key)) != without_clocks(run_after.get(key)):
                lines.append(f"run {number} ({run_before.get('workload', '?')}): {key} differs")
    return lines or ["the runs agree; a key outside them differs"]


def summary(runs: list[dict[str, Any]]) -> str:
    """Counts of what the runs report (functions, races, latent pairs, sync calls)."""
    return (
        f"{len(runs)} runs, {sum(len(r['sglang_functions']) for r in runs)} functions, "
        f"{sum(len(r.get('races', [])) for r in runs)} races, {sum(len(r.get('latent', [])) for r in runs)} latent, "
        f"{sum(sum(r.get('syncs', {}).values()) for r in runs)} sync calls"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ci.sglang_json_diff")
    parser.add_argument("before")
    parser.add_argument("after")
    args = parser.parse_args(argv)
    documents = []
    for path in (args.before, args.after):
        try:
            with open(path) as file:
                documents.append(json.load(file))
        except (OSError, ValueError) as error:
            print(f"ci.sglang_json_diff: cannot read {path}: {error}", file=sys.stderr)
            return 2
    before, after = documents
    lines = differences(before, after)
    if lines:
        print("\n".join(lines))
        return 1
    print(f"identical, clocks aside: {summary(harness_runs(before))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
