"""`racefuzz selfcheck`: what the CUDA backend measures on this machine.

Prints the software and device, how long spins of requested lengths really last
(also right after the GPU sat idle, when its clock may have dropped), and what one `execute` costs next to a
hand-written replay of the same ops. These are figures for a report, not a test: nothing here asserts.
Without a usable GPU: a `BackendUnavailable` with the reason (one line, exit 2).

The scenario's programs come through the registry (`racefuzz.scenarios.get_scenario`), as every generic
module reaches a scenario: a small workload of sglang's overlap loop, given as its JSON.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import numpy as np

from racefuzz.backends import cuda
from racefuzz.errors import BackendUnavailable
from racefuzz.litmus import all_litmus
from racefuzz.program import (
    DeviceSync,
    EventSync,
    HostDelay,
    Launch,
    OpVisitor,
    Program,
    Record,
    StreamSync,
    WaitEvent,
    WaitStream,
)
from racefuzz.scenarios import get_scenario
from racefuzz.schedule import NO_DELAYS

SCENARIO = "sglang-overlap"
WORKLOAD: dict[str, object] = {
    "requests": [
        {"prompt_len": 8, "accepts": [2, 3, 1, 4], "rewrite_at": [1]},
        {"arrival": 1, "prompt_len": 5, "accepts": [1, 2]},
    ],
    "iterations": 8,
    "plan_stream": True,
}
"""The measured scenario program's workload (its other fields take the scenario's defaults): two requests,
eight iterations, the plan stream on."""


def _per_call_us(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of one call, in µs, over `repeats` calls in batches of ten (after a warm-up)."""
    for _ in range(50):  # also lifts the GPU clock out of any idle state left by the previous measurement
        fn()
    batches = []
    for _ in range(max(1, repeats // 10)):
        start = time.perf_counter()
        for _ in range(10):
            fn()
        batches.append((time.perf_counter() - start) / 10 * 1e6)
    return statistics.median(batches)


def _scenario_program() -> Program:
    """A small sglang overlap-loop program (`WORKLOAD` under the global WAR barrier)."""
    scenario = get_scenario(SCENARIO)
    return scenario.build_program(scenario.workload_from_json(WORKLOAD), scenario.designs()["global-war"])


class _PlainReplay(OpVisitor[None]):
    """A program's ops as a hand-written script would issue them, on already bound memory and streams.

    The same CuPy kernel calls (launch-cost spins included), torch records, waits and syncs, and host
    delays, with `events` fresh per replay. `kernels_only` keeps the kernel calls alone and turns every
    host sync into a device synchronize (no torch event or wait calls, no host delays).
    """

    def __init__(self, torch: Any, bound: cuda.Bound, spin: Any, kernels_only: bool = False) -> None:
        self.torch, self.bound, self.spin, self.kernels_only = torch, bound, spin, kernels_only
        self.block = (cuda.THREADS_PER_BLOCK,)
        self.events: list[Any] = []

    def visit_launch(self, op: Launch) -> None:
        ext = self.bound.ext[op.stream.id]
        if op.index in self.bound.costs:
            self.spin((1,), (1,), self.bound.costs[op.index], stream=ext)
        for kernel, grid, args in self.bound.launch_calls[op.index]:
            kernel(grid, self.block, args, stream=ext)

    def visit_record(self, op: Record) -> None:
        if not self.kernels_only:
            self.events[op.event.id].record(self.bound.streams[op.stream.id])

    def visit_wait_event(self, op: WaitEvent) -> None:
        if not self.kernels_only:
            self.bound.streams[op.stream.id].wait_event(self.events[op.event.id])

    def visit_wait_stream(self, op: WaitStream) -> None:
        if not self.kernels_only:
            self.bound.streams[op.stream.id].wait_stream(self.bound.streams[op.other.id])

    def visit_event_sync(self, op: EventSync) -> None:
        if self.kernels_only:
            self.torch.cuda.synchronize()
        else:
            self.events[op.event.id].synchronize()

    def visit_stream_sync(self, op: StreamSync) -> None:
        if self.kernels_only:
            self.torch.cuda.synchronize()
        else:
            self.bound.streams[op.stream.id].synchronize()

    def visit_device_sync(self, op: DeviceSync) -> None:
        self.torch.cuda.synchronize()

    def visit_host_delay(self, op: HostDelay) -> None:
        if not self.kernels_only:
            cuda.busy_wait_us(op.us)


def _cost_line(torch: Any, cupy: Any, name: str, program: Program) -> str:
    """One program's cost per example: `execute`, its phases, and two hand-written replays to compare with.

    * plain replay: the program's ops as a hand-written script would issue them, on already allocated
      tables with prebuilt kernel arguments: the same CuPy kernel calls (launch-cost spins included),
      torch records, waits and syncs, then a device synchronize (no staging, no readback);
    * kernels only: the kernel calls and host syncs alone, without the torch event and wait calls.
    """
    runtime = cuda.get_runtime(torch, cupy, 0)
    staging = cuda.stage(program, NO_DELAYS, runtime.catalog)
    with torch.cuda.device(0):
        bound = runtime.bind(program, NO_DELAYS, staging)
    torch.cuda.synchronize()
    spin = runtime.spin_kernel
    replay = _PlainReplay(torch, bound, spin)
    replay_kernels = _PlainReplay(torch, bound, spin, kernels_only=True)

    def plain() -> None:
        replay.events = [torch.cuda.Event() for _ in program.events]
        replay.visit_all(program.ops)
        torch.cuda.synchronize()

    def kernels_only() -> None:
        replay_kernels.visit_all(program.ops)
        torch.cuda.synchronize()

    def bind() -> None:
        with torch.cuda.device(0):
            runtime.bind(program, NO_DELAYS, staging)
            torch.cuda.synchronize()

    run = cuda.PreparedRun(program, NO_DELAYS, staging, bound, runtime, cuda.CudaConfig())
    floor = _per_call_us(plain, 300)
    bare = _per_call_us(kernels_only, 300)
    full = _per_call_us(lambda: cuda.execute(program, NO_DELAYS), 300)  # stages afresh every call
    staged = _per_call_us(lambda: cuda.stage(program, NO_DELAYS, runtime.catalog), 300)
    bound_us = _per_call_us(bind, 300)
    issue = _per_call_us(lambda: run.start().finish(), 300)
    return (
        f"  {name:26s} ({len(program.ops):3d} ops): execute {full:7.1f} us ({1e6 / full:6.0f} examples/s) "
        f"= stage {staged:6.1f} + bind&sync {bound_us:6.1f} + issue&readback {issue:6.1f} (+ rest); "
        f"plain replay {floor:7.1f} us, kernels only {bare:7.1f} us; execute/plain x{full / floor:.2f}"
    )


def _short(exc: Exception) -> str:
    return " ".join(str(exc).split())[:300]


def _designs_without_delays() -> None:
    """Per built-in design: GPU runs that corrupted, and whether the GPU loaded what the simulator did."""
    from racefuzz import find_corruptions, simulate

    scenario = get_scenario(SCENARIO)
    workload = scenario.workload_from_json(WORKLOAD)
    for name, design in scenario.designs().items():
        program = scenario.build_program(workload, design)
        sim = simulate(program, NO_DELAYS)
        sim_bad = bool(find_corruptions(program, sim.observations))
        corrupted = equal = 0
        for _ in range(5):
            gpu = cuda.execute(program, NO_DELAYS)
            corrupted += bool(find_corruptions(program, gpu.observations))
            equal += all(
                all(np.array_equal(g, w) for g, w in zip(gpu.observations[i], sim.observations[i], strict=True))
                for i in sim.observations
            )
        print(f"  {name:18s}: GPU corrupted {corrupted}/5, equal to the simulator {equal}/5", end="")
        print(f" (the simulator corrupts: {sim_bad})")


def main() -> int:
    reason = cuda.cuda_unavailable_reason()
    if reason is not None:
        raise BackendUnavailable(f"racefuzz selfcheck needs a CUDA GPU: {reason}")
    import cupy
    import torch

    print(f"date (UTC): {datetime.now(timezone.utc).isoformat(timespec='seconds')}")
    print(f"python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda})", end="")
    print(f", cupy {cupy.__version__}")
    print(f"device 0: {torch.cuda.get_device_name(0)}")

    start = time.perf_counter()
    runtime = cuda.get_runtime(torch, cupy, 0)
    print(f"\ncompile: {(time.perf_counter() - start) * 1e3:.0f} ms (spins wait on %globaltimer: no calibration)")

    spin = runtime.spin_kernel
    stream = torch.cuda.Stream()
    ext = cupy.cuda.ExternalStream(stream.cuda_stream, 0)
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def spin_us(us: float) -> float:
        begin.record(stream)
        spin((1,), (1,), (cuda.spin_ns(us),), stream=ext)
        end.record(stream)
        end.synchronize()
        return begin.elapsed_time(end) * 1000.0

    print("\nspin accuracy (requested -> measured by CUDA events, median of 5):")
    for us in (10.0, 100.0, 1000.0, 2000.0, 10000.0, 50000.0):
        measured = statistics.median(spin_us(us) for _ in range(5))
        print(f"  {us:8.0f} us -> {measured:9.1f} us  (x{measured / us:.3f})")
    for idle_s in (0.2, 1.0, 3.0):
        time.sleep(idle_s)
        first = spin_us(2000.0)
        print(f"  2000 us right after {idle_s:.1f} s idle -> {first:.1f} us (x{first / 2000.0:.3f})")

    print("\ncost of one example (no delays; median per call):")
    litmus = {litmus.name: litmus.program for litmus in all_litmus()}
    for name in ("war_unfenced", "wait_event_after_read", "transitive_three_streams"):
        print(_cost_line(torch, cupy, name, litmus[name]))
    try:
        scenario = _scenario_program()
    except Exception as exc:  # the scenario is another module's; its API may move under this script
        print(f"  sglang scenario: skipped ({type(exc).__name__}: {exc})")
    else:
        print(_cost_line(torch, cupy, "sglang scenario", scenario))
        timed = _per_call_us(lambda: cuda.execute(scenario, NO_DELAYS, cuda.CudaConfig(timeline=True)), 100)
        print(f"  sglang scenario with timeline=True: execute {timed:7.1f} us")
        print("\nsglang scenario per design, no delays, 5 GPU runs each (the GPU spins each Launch.cost_us):")
        try:
            _designs_without_delays()
        except Exception as exc:
            print(f"  skipped ({type(exc).__name__}: {exc})")

    print("\ncupy.cuda.Stream.from_external (ExternalStream's replacement in CuPy 14) on a torch stream:")
    probe = torch.cuda.Stream()
    try:
        wrapped = cupy.cuda.Stream.from_external(probe)
        print(f"  works; same handle: {wrapped.ptr == probe.cuda_stream}")
    except Exception as exc:
        print(f"  fails: {type(exc).__name__}: {_short(exc)}")
    return 0
