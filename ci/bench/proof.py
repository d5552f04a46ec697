"""The GPU proof of `racefuzz.trace` on sglang's real code, and recording costs (`python -m ci.bench proof`).

Run from the repository root (`ci` is not part of the installed package): `python -m ci.bench proof
proof|csan|cost|micro [options]`, or `python -m ci.bench.proof ...` as the fresh processes below do.

`proof`: for each design of `racefuzz.scenarios.sglang.real_kernels`, the happens-before verdict of the recorded
trace and the delay search's verdict (the control `none` first, then the others beside it), the cost of
each design's step, recording cost per op against PyTorch's CUDA sanitizer (CSAN) on the same ops, and
what CSAN reports on each design's step (each CSAN run in its own process: CSAN cannot be turned off once
enabled). The recording costs (`cost` per design, `micro`) run in fresh processes too, each
timing unrecorded runs with torch's own `torch.cuda` methods (`racefuzz.trace.cuda_api.unpatched`)
back to back with recorded ones.
Prints everything; the raw output is committed under docs/results/sglang-step-proof-h200/ (`proof`) and
docs/results/sglang-step-cost-h200/ (`cost`).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from racefuzz.scenarios.sglang.real_kernels import DESIGNS
from racefuzz.trace.recorder import Recorder
from racefuzz.trace.search import run_once

ROOT = Path(__file__).resolve().parents[2]
"""The repository root: the fresh processes run `python -m ci.bench.proof` there."""

CSAN_STEPS = (*DESIGNS, "example-racy", "example-synced", "csan-control")
"""Steps run under CSAN: sglang's designs, the torch-only example, and a race CSAN does see (its control:
a whole-tensor write at the table's base address against a read of the table on another stream)."""


def csan_control_step(env: Any) -> dict[str, Any]:
    """A torch-only race CSAN's model covers: both accesses start at the table's base address."""
    import torch

    table = torch.zeros(4, 64, dtype=torch.int32, device=env.device)
    schedule, forward = env.stream("schedule"), env.stream("forward")
    forward.wait_stream(env.current_stream())
    schedule.wait_stream(env.current_stream())
    with env.use(forward):
        total = table.sum()
    with env.use(schedule):
        table.fill_(-1)
    env.synchronize()
    return {"total": total}


def _plain_env(device: str = "cuda") -> Any:
    from racefuzz.trace.env import TraceEnv

    # A recorder that is never activated: on the GPU its streams only get names; on the CPU its virtual
    # streams append their records and waits to its trace (no dispatch mode, no launches recorded).
    return TraceEnv(Recorder(device), device)


def _step_cost(step: Any, rounds: int, device: str = "cuda", run_kernels: bool = True) -> dict[str, float]:
    """The recording cost of `step` in µs, as `_overheads` measures the micro workload's: after one run
    unrecorded (it compiles the step's kernels) and 10 untimed rounds, `rounds` rounds back to back, each: the
    step unrecorded with torch's own `torch.cuda` methods (`cuda_api_unpatched`: the baseline), under an empty
    dispatch mode (`dispatch_floor_us`: the median difference to the baseline), unrecorded with racefuzz's
    patches installed, and recorded as a trace. Pairing each figure with its round's baseline keeps a host
    whose speed drifts between rounds out of the differences.

    On the GPU each run is timed by the wall clock (it ends with a device sync: the host waits for the
    kernels). On the CPU by this thread's CPU time (`time.thread_time`): every op runs on the calling
    thread there (the caller sets torch to one thread), so time the host spends on other processes is not
    counted, on a shared machine. `run_kernels=False` (the CPU's sglang step: Triton needs a GPU) records
    kernel launches from their annotations without running them (`Recorder.run_kernels`); the caller runs
    the unrecorded ones without their kernels too (`_skip_triton_kernels`)."""
    from racefuzz.trace.cuda_api import unpatched as cuda_api_unpatched

    env = _plain_env(device)
    step(env)
    empty_mode = _empty_mode_class()
    clock = time.perf_counter if device.startswith("cuda") else time.thread_time

    def timed(run: Any) -> float:
        start = clock()
        run()
        return (clock() - start) * 1e6

    def unpatched(run: Any) -> Any:
        def inside() -> None:
            with cuda_api_unpatched():
                run()

        return inside

    def under_empty_mode() -> None:
        with empty_mode():
            step(env)

    def recorded() -> None:
        run_once(step, device, evaluate_annotations=False, snapshot_plan={}, run_kernels=run_kernels)

    samples: dict[str, list[float]] = {"plain_us_per_op": [], "plain_installed_us_per_op": [], "trace_us_per_op": []}
    floor = []
    for i in range(rounds + 10):
        plain = timed(unpatched(lambda: step(env)))
        empty = timed(unpatched(under_empty_mode))
        installed = timed(lambda: step(env))
        traced = timed(recorded)
        if i >= 10:
            samples["plain_us_per_op"].append(plain)
            samples["plain_installed_us_per_op"].append(installed)
            samples["trace_us_per_op"].append(traced)
            floor.append(empty - plain)
    overheads = _overheads(samples, statistics.median)
    return {
        "step_median_us": statistics.median(samples["plain_us_per_op"]),
        "step_installed_median_us": statistics.median(samples["plain_installed_us_per_op"]),
        "recorded_step_median_us": statistics.median(samples["trace_us_per_op"]),
        "installed_us": overheads["installed_minus_plain_us_per_op"],
        "recording_us": overheads["recording_overhead_us_per_op"],
        "dispatch_floor_us": statistics.median(floor),
    }


CPU_MODEL_MATMUL = 256
"""The sglang step's model matmul on the CPU (`real_kernels.MODEL_MATMUL`, 2048 on the GPU): the same
launches, an eighth of the size (a 2048-square matmul takes the CPU tens of ms, whose noise would swamp the
recording's cost; no figure here depends on the matmul's size)."""


def _skip_triton_kernels() -> None:
    """From now on, in this process, a Triton launch runs no kernel (`JITFunction.run` returns None): the
    CPU's unrecorded runs of the sglang step, which cannot run Triton kernels, skip them as its recorded
    runs (`run_kernels=False`) do. Before racefuzz's first recording, which wraps `JITFunction.run`
    (`racefuzz.trace.triton_launches.patch`) and so records the launches over it as usual."""
    from triton.runtime.jit import JITFunction

    from racefuzz.trace import triton_launches

    if triton_launches.patched():
        raise RuntimeError("Triton's launches are skipped only before racefuzz's first recording (a fresh process)")

    def skipped(self: Any, *args: Any, grid: Any, warmup: Any, **kwargs: Any) -> None:
        return None

    JITFunction.run = skipped


def _empty_mode_class() -> type:
    """A `TorchDispatchMode` that only calls each op, keeping Dynamo out as `TraceMode` does: the cost any
    Python dispatch mode adds before recording anything (the floor of racefuzz's design)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    set_eval_frame = torch._C._dynamo.eval_frame.set_eval_frame

    class EmptyMode(TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            return False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            prior = set_eval_frame(None)
            try:
                return func(*args, **(kwargs or {}))
            finally:
                set_eval_frame(prior)

    return EmptyMode


def cost_main(design: str, rounds: int, device: str = "cuda") -> int:
    """Print the `COST` line of sglang design `design` (`_step_cost`, in this process: run it fresh).

    `device="cpu"`: the step's torch ops on CPU tensors, its Triton launches recorded from their
    annotations and not run (`run_kernels=False`; the unrecorded runs skip them: `_skip_triton_kernels`),
    torch on one thread, the model's matmul `CPU_MODEL_MATMUL` square, CPU time (`_step_cost`)."""
    from racefuzz.scenarios.sglang import real_kernels

    run_kernels = device != "cpu"
    if not run_kernels:
        import torch

        torch.set_num_threads(1)
        real_kernels.MODEL_MATMUL = CPU_MODEL_MATMUL
        _skip_triton_kernels()
    step = real_kernels.step_for(design)
    figures = _step_cost(step, rounds, device, run_kernels)
    record = run_once(step, device, evaluate_annotations=False, snapshot_plan={}, run_kernels=run_kernels)
    launches, events = len(record.launch_ops), len(record.builder.ops)
    print(
        f"COST design={design} step_median_us={figures['step_median_us']:.1f} "
        f"step_installed_median_us={figures['step_installed_median_us']:.1f} "
        f"recorded_step_median_us={figures['recorded_step_median_us']:.1f} launches={launches} "
        f"installed_us_per_step={figures['installed_us']:.1f} "
        f"recording_us_per_launch={figures['recording_us'] / launches:.1f} "
        f"recorded_events={events} recording_us_per_event={figures['recording_us'] / events:.1f} "
        f"empty_mode_us_per_launch={figures['dispatch_floor_us'] / launches:.1f} device={device}"
    )
    return 0


def _fresh(*arguments: str) -> None:
    """Run `python -m ci.bench.proof ARGUMENTS` in a fresh process (racefuzz's patches not installed
    until its own first recorder) and print its output."""
    out = subprocess.run(
        [sys.executable, "-m", "ci.bench.proof", *arguments], capture_output=True, text=True, timeout=600, cwd=ROOT
    )
    print(out.stdout.strip())
    if out.returncode:
        print(f"{' '.join(arguments)} process failed: {out.stderr.strip()[-2000:]}")


def micro_step(env: Any, ops: int = 2000) -> dict[str, Any]:
    """`ops` small torch ops alternating between two streams with waits: the recording-cost workload."""
    import torch

    a, b = env.stream("a"), env.stream("b")
    x = torch.zeros(1024, device=env.device)
    y = torch.zeros(1024, device=env.device)
    a.wait_stream(env.current_stream())
    b.wait_stream(env.current_stream())
    for _ in range(ops // 2):
        with env.use(a):
            x.add_(1)
        b.wait_stream(a)
        with env.use(b):
            y.add_(x)
        a.wait_stream(b)
    env.synchronize()
    return {"y": y}


def out_of_place_step(env: Any, ops: int = 2000) -> dict[str, Any]:
    """`ops` out-of-place adds on one stream, `c = a + b`: a fresh tensor each, the one before freed (its
    block reused). The workload of CSAN's ~110 us/op figure (trace-notes.md); each op is a launch and an
    allocation, recorded below torch's dispatcher, and a free, recorded in Python."""
    import torch

    a = torch.ones(1024, device=env.device)
    b = torch.ones(1024, device=env.device)
    c = a
    for _ in range(ops):
        c = a + b
    env.synchronize()
    return {"c": c}


WORKLOADS = {"micro": micro_step, "out-of-place": out_of_place_step}
"""`proof micro --workload`: the in-place micro workload (the goal's) and the out-of-place one."""


def recording_cost(ops: int = 2000, runs: int = 5, device: str = "cuda") -> dict[str, float]:
    """µs per op (median of `runs`): plain (torch's own `torch.cuda` methods, no recorder), plain with
    racefuzz's patches installed, recorded (trace only: no snapshots, no serialization), recorded as a
    reference run (a snapshot of every write); and the overheads `_overheads` derives from them.
    `device="cpu"`: CPU tensors through the dispatch mode with virtual streams (the unit tests' path), to
    profile the recorder where there is no GPU."""
    samples = _recording_samples(ops, runs, device)
    return {**{k: statistics.median(v) for k, v in samples.items()}, **_overheads(samples, statistic=statistics.median)}


def _overheads(samples: dict[str, list[float]], statistic: Any, paired: bool = True) -> dict[str, float]:
    """The overheads per op (the same `statistic` over rounds, median or min). Each round of `samples` ran
    its figures back to back, so a host whose speed drifts between rounds (the H200 hosts swing by 30-50%
    over a minute) moves them alike; the paired figures take each round's difference to its own plain run
    (`paired=False`: `statistic` of the figure minus `statistic` of the plain runs, as for the fastest runs,
    where the smallest difference would pick the round whose plain run was slowed down):

    * `trace_minus_plain`: `statistic` of the recorded runs minus `statistic` of the plain ones (unpaired);
    * `installed_minus_plain`: paired, what racefuzz's installed `torch.cuda` patches cost unrecorded code
      (negative where they make it faster: the pooled `wait_stream` makes no event per call);
    * `recording_overhead`: paired, a recorded run against the plain run of a user who never ran racefuzz.
      This is the figure the goal is judged on.
    """

    def against_plain(figure: str) -> float:
        if not paired:
            return statistic(samples[figure]) - statistic(samples["plain_us_per_op"])
        rounds = zip(samples[figure], samples["plain_us_per_op"], strict=True)
        return statistic([measured - plain for measured, plain in rounds])

    plain = statistic(samples["plain_us_per_op"])
    figures = {"trace_minus_plain_us_per_op": statistic(samples["trace_us_per_op"]) - plain}
    if "trace_with_snapshots_us_per_op" in samples:  # the micro workload's; `_step_cost` has none
        figures["snapshots_minus_plain_us_per_op"] = statistic(samples["trace_with_snapshots_us_per_op"]) - plain
    figures["installed_minus_plain_us_per_op"] = against_plain("plain_installed_us_per_op")
    figures["recording_overhead_us_per_op"] = against_plain("trace_us_per_op")
    return figures


def _recording_samples(ops: int, runs: int, device: str, step: Any = micro_step) -> dict[str, list[float]]:
    """`recording_cost`'s samples: µs per op of each of `runs` runs of each figure.

    An untimed plain run and an untimed recorded one first: the first compiles and caches the step's
    kernels, the second warms the recorder's per-op caches (op schemas, source lines) and, on the GPU,
    installs racefuzz's `torch.cuda` patches. Then `runs` rounds, each back to back: plain (the patches taken
    out: `cuda_api_unpatched`), plain with the patches, recorded, recorded with snapshots. A full garbage
    collection before every timed run keeps one left over by an earlier run out of the timed window.
    """
    import gc

    from racefuzz.trace.capture import recording
    from racefuzz.trace.cuda_api import unpatched as cuda_api_unpatched
    from racefuzz.trace.env import TraceEnv

    def timed(make: Any, patched: bool = True) -> float:
        gc.collect()
        recorder = make()
        if recorder is None:
            env = _plain_env(device)
            with contextlib.nullcontext() if patched else cuda_api_unpatched():
                start = time.perf_counter()
                step(env, ops)
                end = time.perf_counter()
        else:
            env = TraceEnv(recorder, device)
            start = time.perf_counter()
            with recording(recorder):
                step(env, ops)
            end = time.perf_counter()
        return (end - start) / ops * 1e6

    samples: dict[str, list[float]] = {
        "plain_us_per_op": [],
        "plain_installed_us_per_op": [],
        "trace_us_per_op": [],
        "trace_with_snapshots_us_per_op": [],
    }
    timed(lambda: None)
    timed(lambda: Recorder(device, snapshot_plan={}))
    for _ in range(runs):
        samples["plain_us_per_op"].append(timed(lambda: None, patched=False))
        samples["plain_installed_us_per_op"].append(timed(lambda: None))
        samples["trace_us_per_op"].append(timed(lambda: Recorder(device, snapshot_plan={})))
        samples["trace_with_snapshots_us_per_op"].append(timed(lambda: Recorder(device)))
    return samples


def micro_main(device: str, ops: int, runs: int, profile: bool, workload: str = "micro") -> int:
    """Print the `RECORDING <workload>` line on `device` (medians, as `proof` does) and its overheads
    (`_overheads`, paired by round), and the same from the fastest run of each (`FASTEST`, unpaired)."""
    step = WORKLOADS[workload]
    if profile:
        import cProfile
        import pstats

        from racefuzz.trace.capture import recording
        from racefuzz.trace.env import TraceEnv

        recorder = Recorder(device, snapshot_plan={})
        with recording(recorder):
            step(TraceEnv(recorder, device), 200)
        recorder = Recorder(device, snapshot_plan={})
        profiler = cProfile.Profile()
        with recording(recorder):
            profiler.runcall(step, TraceEnv(recorder, device), ops)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
        return 0
    samples = _recording_samples(ops, runs, device, step)
    for label, statistic, paired in (("RECORDING", statistics.median, True), ("FASTEST", min, False)):
        figures = {k: statistic(v) for k, v in samples.items()}
        print(f"{label} {workload} device={device} ops={ops} runs={runs} " + _figures(figures))
        print(f"{label}-OVERHEAD " + _figures(_overheads(samples, statistic, paired)))
    return 0


def _figures(figures: dict[str, float]) -> str:
    return " ".join(f"{k}={v:.2f}" for k, v in figures.items())


def csan_main(design: str) -> int:
    """Run under CSAN: the design's step (prints what CSAN reports), then the micro workload (µs/op), then,
    if CSAN reported nothing, the step timed (`CSAN STEP`: its median under CSAN against its median before
    CSAN was imported in this same process, per launch: CSAN's recording cost on the step, beside
    racefuzz's `COST`).

    The unrecorded figures are taken before `torch.cuda._sanitizer` is imported: importing it makes its
    `CUDASanitizer()`, whose dispatch mode's constructor turns torch's GPU-trace callbacks on with CSAN's
    handlers (a stack trace per allocation among them) before `enable_cuda_sanitizer()` is called; figures
    taken after the import already carry that part of CSAN's cost (5-47 ms "unrecorded" steps in an earlier run).

    `design` may also be `example-racy` / `example-synced` (`racefuzz.trace.example`: a torch-only step
    whose racing write is a view not starting at the table's base)."""
    import torch

    from racefuzz.scenarios.sglang import real_kernels
    from racefuzz.trace import example

    steps = {
        "example-racy": example.racy_step,
        "example-synced": example.synced_step,
        "csan-control": csan_control_step,
    }
    step = steps[design] if design in steps else real_kernels.step_for(design)
    step(_plain_env())  # compile the Triton kernels before CSAN is on
    # Counted before either timing, so that both run with racefuzz's torch.cuda patches installed.
    launches = len(run_once(step, "cuda", evaluate_annotations=False, snapshot_plan={}).launch_ops)
    plain = _micro_us(ops=2000)
    plain_step = _step_us(step, STEP_RUNS)
    import torch.cuda._sanitizer as csan  # turns CSAN's callbacks on (see above)

    csan.enable_cuda_sanitizer()
    reported = False
    try:
        step(_plain_env())
        torch.cuda.synchronize()
        print(f"CSAN {design}: no error reported")
    except Exception as exc:  # CSAN raises CUDASanitizerErrors
        reported = True
        text = [line.strip() for line in str(exc).splitlines() if line.strip() and not line.startswith("  File")]
        print(f"CSAN {design}: {type(exc).__name__}: " + " | ".join(text[:16]))
    torch.cuda.synchronize()
    print(f"CSAN micro {design}: plain {plain:.1f} us/op, CSAN {_micro_us(ops=2000):.1f} us/op")
    if not reported:  # a step CSAN stops with an error cannot be timed whole
        under = _step_us(step, STEP_RUNS)
        print(
            f"CSAN STEP design={design} plain_step_median_us={plain_step:.1f} csan_step_median_us={under:.1f} "
            f"launches={launches} csan_us_per_launch={(under - plain_step) / launches:.1f}"
        )
    return 0


STEP_RUNS = 30
"""Runs of a step per median in `csan_main` (CSAN's step takes up to tens of ms)."""


def _step_us(step: Any, runs: int) -> float:
    """Median µs of `runs` unrecorded runs of `step` (CSAN's figure once it is on), after one untimed run."""
    env = _plain_env()
    step(env)
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        step(env)
        samples.append((time.perf_counter() - start) * 1e6)
    return statistics.median(samples)


def _micro_us(ops: int, runs: int = 5) -> float:
    """Median µs per op of `runs` runs of the micro workload, unrecorded (CSAN's figure: whatever is on)."""
    env = _plain_env()
    micro_step(env, 200)
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        micro_step(env, ops)
        samples.append((time.perf_counter() - start) / ops * 1e6)
    return statistics.median(samples)


def proof_main(examples: int, seed: int, designs: list[str], cost: bool, csan: list[str]) -> int:
    from racefuzz.scenarios.sglang import real_kernels
    from racefuzz.trace.report import render
    from racefuzz.trace.search import fuzz

    control_caught = False
    for design in designs:
        step = real_kernels.step_for(design)
        result = fuzz(
            step, device="cuda", watch=("req_to_token",), examples=examples, max_delays=2, confirm=5, seed=seed
        )
        print(render(result))
        rate = result.examples / result.seconds if result.seconds else 0.0
        print(
            f"SUMMARY design={design} hb_races={len(result.races)} manifested={result.manifested} "
            f"delays={len(result.delays)} confirmed={result.confirmed}/{result.confirm_runs} "
            f"examples={result.examples} "
            f"seconds={result.seconds:.2f} examples_per_s={rate:.1f} launches={len(result.reference.launch_ops)}"
        )
        if design == real_kernels.CONTROL:
            control_caught = bool(result.races) and result.manifested
            print(f"CONTROL none caught by hb and manifested: {control_caught}")
    for design in real_kernels.DESIGNS if cost else ():
        _fresh("cost", "--design", design)
    from racefuzz.trace import example

    for name, step in (("example-racy", example.racy_step), ("example-synced", example.synced_step)):
        result = fuzz(step, device="cuda", examples=min(examples, 300), max_delays=2, confirm=5, seed=seed)
        print(render(result))
        print(
            f"SUMMARY step={name} hb_races={len(result.races)} manifested={result.manifested} "
            f"delays={len(result.delays)} confirmed={result.confirmed}/{result.confirm_runs} examples={result.examples}"
        )
    if cost:
        _fresh("micro", "--runs", "9")
    for design in csan:
        out = subprocess.run(
            [sys.executable, "-m", "ci.bench.proof", "csan", "--design", design],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=ROOT,
        )
        print(out.stdout.strip())
        if out.returncode:
            print(f"CSAN {design} process failed: {out.stderr.strip()[-2000:]}")
    return 0 if control_caught else 3


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m ci.bench proof")
    commands = parser.add_subparsers(dest="command", required=True)
    proof = commands.add_parser("proof")
    proof.add_argument("--examples", type=int, default=1000)
    proof.add_argument("--seed", type=int, default=0)
    proof.add_argument("--designs", default=",".join(DESIGNS), help="comma-separated sglang designs to fuzz")
    proof.add_argument("--no-cost", dest="cost", action="store_false", help="skip the cost measurements")
    proof.add_argument("--csan", default=",".join(CSAN_STEPS), help="comma-separated steps to run under CSAN")
    csan = commands.add_parser("csan")
    csan.add_argument("--design", required=True)
    cost = commands.add_parser("cost", help="the recording cost of one sglang design's step (a fresh process)")
    cost.add_argument("--design", required=True, choices=DESIGNS)
    cost.add_argument("--rounds", type=int, default=100)
    cost.add_argument(
        "--device",
        default="cuda",
        choices=("cuda", "cpu"),
        help="cpu: CPU tensors, the Triton launches recorded from their annotations and not run (CPU time)",
    )
    micro = commands.add_parser("micro", help="the recording cost per op of the micro workload")
    micro.add_argument("--device", default="cuda", help="cuda or cpu (CPU tensors, virtual streams)")
    micro.add_argument("--ops", type=int, default=2000)
    micro.add_argument("--runs", type=int, default=5)
    micro.add_argument("--profile", action="store_true", help="cProfile one traced run instead")
    micro.add_argument(
        "--workload",
        choices=list(WORKLOADS),
        default="micro",
        help="micro: in-place ops on two streams (the goal's); out-of-place: `c = a + b` (CSAN's figure's)",
    )
    args = parser.parse_args(argv)
    if args.command == "csan":
        return csan_main(args.design)
    if args.command == "cost":
        return cost_main(args.design, args.rounds, args.device)
    if args.command == "micro":
        return micro_main(args.device, args.ops, args.runs, args.profile, args.workload)
    designs = [d for d in args.designs.split(",") if d]
    return proof_main(args.examples, args.seed, designs, args.cost, [d for d in args.csan.split(",") if d])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
