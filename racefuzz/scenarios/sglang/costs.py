"""What a sync design costs, read off a run's timeline: host time blocked, GPU idle between forwards.

On the simulator the timeline is modelled (launch cost, kernel costs, host work); on the GPU it is
measured: kernel spans from CUDA events on the streams, host syncs from host clocks around the blocking
calls. The same function reads both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise

from racefuzz.execution import HOST, Execution
from racefuzz.program import Launch, Program
from racefuzz.scenarios.sglang.loop import FORWARD_STREAM


@dataclass(frozen=True)
class Costs:
    """Per-run costs.

    Args:
        iterations: overlap iterations in the run.
        host_blocked_us: total host time spent in blocking syncs (event, stream, device).
        gpu_idle_us: total idle time on the forward stream between consecutive forwards (from the end of
            one forward's last kernel to the start of the next forward's first kernel).
        forwards: forwards in the run.
        wall_us: host time from the first op to the end of the run.
        blocked_on: host blocked time by what it waited for (`verify_done`, `copy_done`, a stream, ...).
    """

    iterations: int
    host_blocked_us: float
    gpu_idle_us: float
    forwards: int
    wall_us: float
    blocked_on: dict[str, float] = field(default_factory=dict)

    @property
    def host_blocked_us_per_iteration(self) -> float:
        return self.host_blocked_us / max(self.iterations, 1)

    @property
    def gpu_idle_us_per_forward_gap(self) -> float:
        return self.gpu_idle_us / max(self.forwards - 1, 1)

    @property
    def iterations_per_s(self) -> float:
        return self.iterations / self.wall_us * 1e6 if self.wall_us > 0 else 0.0


def measure(program: Program, execution: Execution, iterations: int) -> Costs:
    """The costs of one run of `program` (its timeline must have been recorded)."""
    if not execution.timeline:
        raise ValueError("measure() needs a run with its timeline recorded")
    blocked_on: dict[str, float] = {}
    for span in execution.timeline:
        if span.track == HOST and span.kind == "sync":
            # Labels read "verify_done#12.synchronize()": group by the event (or stream) name.
            what = span.label.split(".synchronize")[0].split("#")[0]
            blocked_on[what] = blocked_on.get(what, 0.0) + span.end_us - span.start_us
    blocked = sum(blocked_on.values())
    # Forward k = the forward-stream kernels of iteration k (injected spins excluded).
    windows: dict[int, list[float]] = {}
    for span in execution.timeline:
        if span.track != FORWARD_STREAM or span.kind != "kernel":
            continue
        launch = program.ops[span.op_index]
        assert isinstance(launch, Launch)
        iteration = int(launch.info["iteration"])  # type: ignore[arg-type]
        window = windows.setdefault(iteration, [span.start_us, span.end_us])
        window[0], window[1] = min(window[0], span.start_us), max(window[1], span.end_us)
    ordered = [windows[k] for k in sorted(windows)]
    idle = sum(max(0.0, later[0] - earlier[1]) for earlier, later in pairwise(ordered))
    return Costs(iterations, blocked, idle, len(ordered), execution.host_end_us, blocked_on)
