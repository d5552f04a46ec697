"""What a design of the vLLM scenario costs: host time blocked, compute-stream idle time, blocks held back.

Read off a simulator run's timeline (host syncs by what they waited for; the compute stream's kernels by step)
and off the engine loop's own counts: the blocks whose return to the pool #45357's deferral held back and
the steps requests waited for blocks after they arrived. The two fixes pay differently: `deferred-free` in
pool capacity, `step-event` in host stalls.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise

from racefuzz.execution import HOST, Execution
from racefuzz.program import Launch, Program
from racefuzz.scenarios.vllm.loop import COMPUTE_STREAM, EngineLoop


@dataclass(frozen=True)
class Costs:
    """Per-run costs.

    Args:
        steps: engine steps in the run.
        host_blocked_us: host time spent in blocking syncs.
        gpu_idle_us: idle time on the compute stream between consecutive steps' kernels.
        forwards: steps with kernels on the compute stream.
        wall_us: host time from the first op to the end of the run.
        deferred_blocks: blocks whose return to the pool was deferred.
        admission_wait_steps: steps requests waited for blocks after they arrived, summed.
        blocked_on: host blocked time by what it waited for.
    """

    steps: int
    host_blocked_us: float
    gpu_idle_us: float
    forwards: int
    wall_us: float
    deferred_blocks: int
    admission_wait_steps: int
    blocked_on: dict[str, float] = field(default_factory=dict)


def measure(loop: EngineLoop, program: Program, execution: Execution) -> Costs:
    """The costs of one run of `program`, built by `loop` (its timeline must have been recorded)."""
    if not execution.timeline:
        raise ValueError("measure() needs a run with its timeline recorded")
    blocked_on: dict[str, float] = {}
    for span in execution.timeline:
        if span.track == HOST and span.kind == "sync":
            what = span.label.split(".synchronize")[0].split("#")[0]
            blocked_on[what] = blocked_on.get(what, 0.0) + span.end_us - span.start_us
    windows: dict[int, list[float]] = {}
    for span in execution.timeline:
        if span.track != COMPUTE_STREAM or span.kind != "kernel":
            continue
        launch = program.ops[span.op_index]
        assert isinstance(launch, Launch)
        window = windows.setdefault(int(launch.info["step"]), [span.start_us, span.end_us])  # type: ignore[arg-type]
        window[0], window[1] = min(window[0], span.start_us), max(window[1], span.end_us)
    ordered = [windows[k] for k in sorted(windows)]
    idle = sum(max(0.0, later[0] - earlier[1]) for earlier, later in pairwise(ordered))
    return Costs(
        loop.workload.steps,
        sum(blocked_on.values()),
        idle,
        len(ordered),
        execution.host_end_us,
        loop.deferred_blocks,
        loop.admission_wait_steps,
        blocked_on,
    )
