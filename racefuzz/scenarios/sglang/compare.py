"""`racefuzz compare` for the overlap loop: the correctness and the cost of sync designs, side by side.

Every design runs the same drawn workloads under the same delay schedules (delays attach to launches,
which designs share). Per design it reports the verdicts -- workloads with an unordered conflicting pair
(happens-before), those whose only unordered pairs touch masked columns (loaded, never used: an ordering
conflict, no corruption possible), and workloads whose used loads were corrupted under the drawn schedule
-- and the races one design has and another lacks, overall and per read extent (`Workload.read_extent`,
drawn per workload); and, from an undelayed run of each workload with its timeline
recorded, the cost: host time blocked per iteration, GPU idle time between forwards, iterations per
second. On the simulator the costs are modelled; on the GPU they are measured (CUDA events on the
streams, host clocks around blocking calls).

The defaults make forwards resemble a DFLASH decode step as #29556 measured it: 3 ms of forward compute
against 0.6 ms of host scheduling work before decode prep and 0.3 ms of launch preparation after it, so
a host that waits for the previous forward in decode prep (`verify_done.synchronize()`) blocks ~2.1 ms
a step, and the GPU then idles while the host prepares the launch.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from dataclasses import replace
from pathlib import Path

from racefuzz import __version__
from racefuzz.backends import Execution, executor
from racefuzz.designs import Design
from racefuzz.errors import InvalidArgument
from racefuzz.exitcodes import ExitCode
from racefuzz.hb import find_races
from racefuzz.oracle import masked_conflict
from racefuzz.program import Program
from racefuzz.scenarios import comparison
from racefuzz.scenarios.sglang.costs import Costs, measure
from racefuzz.scenarios.sglang.loop import build_program
from racefuzz.scenarios.sglang.strategies import check_hazards, decode_workload
from racefuzz.scenarios.sglang.workload import READ_EXTENTS, RequestSpec, Workload
from racefuzz.schedule import NO_DELAYS
from racefuzz.schedulers.random import decode_schedule
from racefuzz.sim import simulate

STEADY_DECODE = Workload(requests=tuple(RequestSpec(0, 8, 64, (2,) * 12) for _ in range(4)), iterations=10)
"""Four requests decoding (one prefill iteration, then nine decode steps): the steady state in which
#29556's 2.1 ms stall was measured. Its costs are reported beside the drawn workloads' and its timeline
is the one the plot shows."""


def _timed_run(program: Program, backend: str) -> Execution:
    if backend == "cuda":
        from racefuzz.backends.cuda import CudaConfig, execute

        return execute(program, NO_DELAYS, CudaConfig(timeline=True))
    return simulate(program)


HOST_SYNCS_29556 = {"cpu_seq_lens": True, "filter_batch_sync": True}
"""The host waits #29556 moved rather than removed (`Workload.cpu_seq_lens`, `Workload.filter_batch_sync`):
the steady decode is costed with and without them."""


def _steady(
    design: Design, backend: str, forward_us: float, host_us: float, prep_us: float, **flags: bool
) -> dict[str, object]:
    """The costs of `design` on the steady decode workload (with `flags` set on it)."""
    workload = replace(STEADY_DECODE, forward_cost_us=forward_us, host_work_us=host_us, launch_prep_us=prep_us, **flags)
    program = build_program(workload, design.hooks)
    c = measure(program, _timed_run(program, backend), workload.iterations)
    return {
        "host_blocked_us_per_iteration": round(c.host_blocked_us_per_iteration, 1),
        "host_blocked_us_per_iteration_on": {k: round(v / c.iterations, 1) for k, v in sorted(c.blocked_on.items())},
        "gpu_idle_us_per_forward_gap": round(c.gpu_idle_us_per_forward_gap, 1),
        "iterations_per_s": round(c.iterations_per_s, 1),
    }


def compare(
    designs: list[Design],
    *,
    backend: str,
    workloads: int,
    seed: int,
    hazards,
    plan_stream: bool | None,
    forward_us: float,
    host_us: float,
    prep_us: float,
    max_delays: int = 4,
) -> dict[str, object]:
    """Run the comparison; returns the JSON-able result."""
    allowed = check_hazards(hazards)
    rng = random.Random(seed)
    run = executor(backend)
    per_design = {d.name: comparison.new_row("masked_only") for d in designs}
    pair_keys: list[dict[str, set[tuple[object, ...]]]] = []
    masked_keys: list[set[tuple[object, ...]]] = []  # per workload: the races (any design) on masked columns only
    extents: list[str] = []
    for _ in range(workloads):
        workload = decode_workload(
            rng.randbytes(rng.randint(11, 60)), hazards=allowed, max_iterations=8, plan_stream=plan_stream
        )
        workload = replace(workload, forward_cost_us=forward_us, host_work_us=host_us, launch_prep_us=prep_us)
        delays = rng.randbytes(4 * rng.randint(0, max_delays))
        keys: dict[str, set[tuple[object, ...]]] = {}
        masked: set[tuple[object, ...]] = set()
        for design in designs:
            program = build_program(workload, design.hooks)
            row = per_design[design.name]
            races = find_races(program)
            keys[design.name] = {race.across_designs for race in races}
            masked.update(race.across_designs for race in races if masked_conflict(race))
            row["masked_only"] += bool(races) and all(masked_conflict(race) for race in races)
            comparison.tally(row, program, races, run(program, decode_schedule(delays, program)))
            row["costs"].append(measure(program, _timed_run(program, backend), workload.iterations))
        pair_keys.append(keys)
        masked_keys.append(masked)
        extents.append(workload.read_extent)

    steady = {design.name: _steady(design, backend, forward_us, host_us, prep_us) for design in designs}
    steady_host_syncs = {
        design.name: _steady(design, backend, forward_us, host_us, prep_us, **HOST_SYNCS_29556) for design in designs
    }

    names = [d.name for d in designs]
    differences = {}
    differences_masked_only = {}
    by_extent: dict[str, dict[str, int]] = {extent: {} for extent in READ_EXTENTS}
    for a in names:
        for b in names:
            if a != b:
                only = [bool(keys[a] - keys[b]) for keys in pair_keys]
                differences[f"{a} not {b}"] = sum(only)
                differences_masked_only[f"{a} not {b}"] = sum(
                    bool(keys[a] - keys[b]) and keys[a] - keys[b] <= masked
                    for keys, masked in zip(pair_keys, masked_keys, strict=True)
                )
                for extent in READ_EXTENTS:
                    by_extent[extent][f"{a} not {b}"] = sum(
                        o for o, e in zip(only, extents, strict=True) if e == extent
                    )
    summary = {}
    for design in designs:
        row = per_design[design.name]
        costs: list[Costs] = row.pop("costs")
        iterations = sum(c.iterations for c in costs)
        blocked_on = comparison.blocked_on(costs)
        summary[design.name] = {
            **row,
            "spec": design.spec,
            "host_blocked_us_per_iteration": round(sum(c.host_blocked_us for c in costs) / iterations, 1),
            "host_blocked_us_per_iteration_on": {k: round(v / iterations, 1) for k, v in sorted(blocked_on.items())},
            "gpu_idle_us_per_forward_gap": round(
                sum(c.gpu_idle_us for c in costs) / max(sum(c.forwards - 1 for c in costs), 1), 1
            ),
            "iterations_per_s": round(statistics.median(c.iterations_per_s for c in costs), 1),
        }
    return {
        "racefuzz": __version__,
        "backend": backend,
        "costs": "measured (CUDA events, host clocks)" if backend == "cuda" else "modelled (simulator)",
        "workloads": workloads,
        "seed": seed,
        "hazards": sorted(allowed),
        "plan_stream": plan_stream,
        "forward_us": forward_us,
        "host_work_us": host_us,
        "launch_prep_us": prep_us,
        "designs": summary,
        "steady_decode": steady,
        "steady_decode_with_29556_host_syncs": steady_host_syncs,
        "workloads_with_races_only_in": differences,
        "workloads_with_races_only_in_all_on_masked_columns": differences_masked_only,
        "workloads_per_read_extent": {extent: extents.count(extent) for extent in READ_EXTENTS},
        "workloads_with_races_only_in_per_read_extent": by_extent,
    }


def render(result: dict[str, object]) -> str:
    designs = result["designs"]
    assert isinstance(designs, dict)
    lines = [
        f"racefuzz compare on {result['backend']}: {result['workloads']} workloads, seed {result['seed']}, "
        f"forward {result['forward_us']:g} us, host work {result['host_work_us']:g} + launch prep "
        f"{result['launch_prep_us']:g} us per iteration; "
        f"costs {result['costs']}",
        f"{'design':22} {'unordered':>9} {'masked only':>11} {'corrupted':>9} {'host blocked/iter':>18} "
        f"{'GPU idle/gap':>13} {'iter/s':>8}",
    ]
    for name, row in designs.items():
        lines.append(
            f"{name:22} {row['unordered']:>9} {row['masked_only']:>11} {row['corrupted']:>9} "
            f"{row['host_blocked_us_per_iteration']:>15.1f} us "
            f"{row['gpu_idle_us_per_forward_gap']:>10.1f} us {row['iterations_per_s']:>8.1f}"
        )
    lines.append(
        "(unordered / corrupted: workloads out of the total with a happens-before race / a manifested one; "
        "masked only: every unordered pair touches masked columns only -- loaded, not used: an ordering "
        "conflict, no corruption)"
    )
    lines += comparison.blocked_lines(designs, "host_blocked_us_per_iteration_on", "iteration")
    for key, title in (
        (
            "steady_decode",
            "steady decode (4 requests, 1 prefill + 9 decode iterations; the regime of #29556's measurement):",
        ),
        (
            "steady_decode_with_29556_host_syncs",
            "the same with the host waits #29556 moved (D-stream synchronize for CPU seq lens, filter_batch .cpu()):",
        ),
    ):
        lines.append(title)
        for name, row in result[key].items():  # type: ignore[union-attr]
            parts = ", ".join(f"{what} {us:.1f} us" for what, us in row["host_blocked_us_per_iteration_on"].items())
            lines.append(
                f"  {name:22} host blocked {row['host_blocked_us_per_iteration']:.1f} us/iter ({parts or 'nothing'}), "
                f"GPU idle {row['gpu_idle_us_per_forward_gap']:.1f} us/gap, {row['iterations_per_s']:.1f} iter/s"
            )
    per_extent = result["workloads_with_races_only_in_per_read_extent"]
    counts = result["workloads_per_read_extent"]
    assert isinstance(per_extent, dict) and isinstance(counts, dict)
    for pair, count in result["workloads_with_races_only_in"].items():  # type: ignore[union-attr]
        a, b = pair.split(" not ")
        split = ", ".join(f"{extent} {per_extent[extent][pair]}/{counts[extent]}" for extent in per_extent)
        masked_only = result["workloads_with_races_only_in_all_on_masked_columns"][pair]  # type: ignore[index]
        lines.append(
            f"workloads where {a} has a race that {b} does not: {count} (by read extent: {split}; "
            f"in {masked_only} of them every such race is on masked columns only)"
        )
    lines += comparison.race_kind_lines(designs)
    return "\n".join(lines)


def plot(result: dict[str, object], designs: list[Design], backend: str, path: Path) -> Path | None:
    from racefuzz.timeline import draw, pyplot

    plt = pyplot()
    if plt is None:
        return None
    rows = result["steady_decode"]
    assert isinstance(rows, dict)
    fig = plt.figure(figsize=(13, 3.2 + 2.2 * len(designs)))
    grid = fig.add_gridspec(1 + len(designs), 3, height_ratios=[1.4] + [1.0] * len(designs))
    names = list(rows)
    for column, (key, label) in enumerate(
        [
            ("host_blocked_us_per_iteration", "host blocked per iteration (us)"),
            ("gpu_idle_us_per_forward_gap", "GPU idle between forwards (us)"),
            ("iterations_per_s", "iterations per second"),
        ]
    ):
        ax = fig.add_subplot(grid[0, column])
        ax.bar(names, [rows[n][key] for n in names], color=["#4C72B0", "#DD8452", "#55A868", "#C44E52"][: len(names)])
        ax.set_title(f"{label}, steady decode", fontsize=9)
        ax.tick_params(axis="x", labelsize=8)
    showcase = replace(
        STEADY_DECODE,
        forward_cost_us=result["forward_us"],
        host_work_us=result["host_work_us"],
        launch_prep_us=result["launch_prep_us"],
    )
    for i, design in enumerate(designs):
        ax = fig.add_subplot(grid[1 + i, :])
        draw(ax, _timed_run(build_program(showcase, design.hooks), backend))
        ax.set_title(f"{design.name}: steady decode, {backend} timeline", fontsize=9)
    fig.suptitle(f"racefuzz compare ({result['costs']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def compare_command(designs: list[Design], backend: str, args: argparse.Namespace) -> int:
    """`racefuzz compare` on designs of this scenario (loaded) and a resolved backend."""
    if not (args.forward_us >= 0 and args.host_us >= 0 and args.prep_us >= 0):
        raise InvalidArgument("--forward-us, --host-us and --prep-us must be >= 0")
    result = compare(
        designs,
        backend=backend,
        workloads=args.workloads,
        seed=args.seed,
        hazards=args.hazards,
        plan_stream=args.plan_stream,
        forward_us=args.forward_us,
        host_us=args.host_us,
        prep_us=args.prep_us,
    )
    print(render(result))
    comparison.write_json(result, args.json)
    if args.plot is not None:
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        if plot(result, designs, backend, args.plot) is None:
            print("racefuzz compare: matplotlib is not installed; no plot written", file=sys.stderr)
    return ExitCode.CLEAN
