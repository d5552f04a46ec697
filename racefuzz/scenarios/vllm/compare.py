"""`racefuzz compare --scenario vllm-kv-reuse`: verdicts and costs of the designs on the same workloads.

Every design runs the same drawn workloads under the same delay schedules (delays attach to launches, which
designs share). Per design: workloads with an unordered conflicting pair (happens-before), workloads whose
used loads were corrupted under the drawn schedule, and the costs of an undelayed run (`costs.measure`):
host time blocked per step, compute-stream idle time between steps, blocks whose return was deferred and the
steps requests waited for blocks. The simulator models the costs; this comparison runs on it only (the
scenario's programs run on the GPU through `racefuzz run --backend cuda`). `--forward-us` is the attention
kernel's cost and `--host-us` the host's scheduling work per step; `--prep-us` and `--plan-stream` are
sglang's and do not apply.
"""

from __future__ import annotations

import argparse
import random
from dataclasses import replace

from racefuzz import __version__
from racefuzz.designs import Design
from racefuzz.errors import InvalidArgument
from racefuzz.exitcodes import ExitCode
from racefuzz.hb import find_races
from racefuzz.scenarios import comparison
from racefuzz.scenarios.vllm.costs import Costs, measure
from racefuzz.scenarios.vllm.loop import EngineLoop
from racefuzz.scenarios.vllm.strategies import HAZARDS, OPT_IN_HAZARDS, decode_workload
from racefuzz.schedulers.random import decode_schedule
from racefuzz.sim import simulate


def compare(
    designs: list[Design],
    *,
    workloads: int,
    seed: int,
    hazards,
    forward_us: float,
    host_us: float,
    max_delays: int = 4,
) -> dict[str, object]:
    """Run the comparison on the simulator; returns the JSON-able result."""
    allowed = frozenset(hazards)
    unknown = sorted(allowed - {*HAZARDS, *OPT_IN_HAZARDS})
    if unknown:
        raise InvalidArgument(f"unknown hazard(s) {unknown}")
    rng = random.Random(seed)
    rows = {d.name: comparison.new_row() for d in designs}
    for _ in range(workloads):
        workload = decode_workload(rng.randbytes(rng.randint(9, 34)), hazards=allowed)
        workload = replace(workload, forward_cost_us=forward_us, host_work_us=host_us)
        delays = rng.randbytes(4 * rng.randint(0, max_delays))
        for design in designs:
            row = rows[design.name]
            loop = EngineLoop(workload, design.hooks)
            program = loop.build()
            delayed = simulate(program, decode_schedule(delays, program), record_timeline=False)
            comparison.tally(row, program, find_races(program), delayed)
            row["costs"].append(measure(loop, program, simulate(program)))
    summary = {}
    for design in designs:
        row = rows[design.name]
        costs: list[Costs] = row.pop("costs")
        steps = sum(c.steps for c in costs)
        blocked_on = comparison.blocked_on(costs)
        summary[design.name] = {
            **row,
            "spec": design.spec,
            "host_blocked_us_per_step": round(sum(c.host_blocked_us for c in costs) / steps, 1),
            "host_blocked_us_per_step_on": {k: round(v / steps, 1) for k, v in sorted(blocked_on.items())},
            "gpu_idle_us_per_step_gap": round(
                sum(c.gpu_idle_us for c in costs) / max(sum(c.forwards - 1 for c in costs if c.forwards), 1), 1
            ),
            "deferred_blocks": sum(c.deferred_blocks for c in costs),
            "admission_wait_steps": sum(c.admission_wait_steps for c in costs),
        }
    return {
        "racefuzz": __version__,
        "scenario": "vllm-kv-reuse",
        "backend": "sim",
        "costs": "modelled (simulator)",
        "workloads": workloads,
        "seed": seed,
        "hazards": sorted(allowed),
        "forward_us": forward_us,
        "host_work_us": host_us,
        "designs": summary,
    }


def render(result: dict[str, object]) -> str:
    designs = result["designs"]
    assert isinstance(designs, dict)
    lines = [
        f"racefuzz compare (vllm-kv-reuse) on sim: {result['workloads']} workloads, seed {result['seed']}, hazards "
        f"{','.join(result['hazards'])}, attention {result['forward_us']:g} us, host work {result['host_work_us']:g} "
        "us per step; costs modelled (simulator)",
        f"{'design':16} {'unordered':>9} {'corrupted':>9} {'host blocked/step':>18} {'GPU idle/gap':>13} "
        f"{'deferred blocks':>15} {'admission wait':>14}",
    ]
    for name, row in designs.items():
        lines.append(
            f"{name:16} {row['unordered']:>9} {row['corrupted']:>9} {row['host_blocked_us_per_step']:>15.1f} us "
            f"{row['gpu_idle_us_per_step_gap']:>10.1f} us {row['deferred_blocks']:>15} "
            f"{row['admission_wait_steps']:>8} steps"
        )
    lines.append(
        "(unordered / corrupted: workloads out of the total with a happens-before race / a corruption under the "
        "drawn delays; deferred blocks: blocks whose return the deferral held back; admission wait: steps "
        "requests waited for blocks after arriving, summed)"
    )
    lines += comparison.blocked_lines(designs, "host_blocked_us_per_step_on", "step")
    lines += comparison.race_kind_lines(designs)
    return "\n".join(lines)


def compare_command(designs: list[Design], backend: str, args: argparse.Namespace) -> int:
    """`racefuzz compare` on designs of this scenario (loaded) and a resolved backend."""
    if backend != "sim":
        raise InvalidArgument("the vllm-kv-reuse comparison runs on the simulator: pass --backend sim")
    if args.plot is not None:
        raise InvalidArgument("the vllm-kv-reuse comparison draws no plot: leave out --plot")
    if args.plan_stream is not None:
        raise InvalidArgument("--plan-stream is sglang's option; the vllm-kv-reuse scenario has no plan stream")
    result = compare(
        designs,
        workloads=args.workloads,
        seed=args.seed,
        hazards=args.hazards,
        forward_us=args.forward_us,
        host_us=args.host_us,
    )
    print(render(result))
    comparison.write_json(result, args.json)
    return ExitCode.CLEAN
