"""The cost of a version's sync design, on sglang's own overlap loop run plainly (no recorder).

`racefuzz sglang` judges a version under `racefuzz.trace`'s recorder; its timings are the recorder's. This
module runs the same loop (`scheduler.build_and_run`: sglang's `Scheduler`, the fake model) with nothing
recorded, so that what it times is sglang's code:

* the env is a `TraceEnv` over `PlainRecorder`, a recorder that records nothing, and `capture.recording` is
  never entered (no dispatch mode, no patched torch.cuda): on a GPU sglang's streams and events are plain
  `torch.cuda` ones; on the CPU they are the env's virtual ones, whose calls do nothing;
* `SyncClock` wraps the stream and event methods (`synchronize`, `wait_event`, `wait_stream`, `wait`,
  `query`, and `torch.cuda.synchronize`) and adds the host time of each call that sglang's code makes to
  its call site (`method at sglang/file.py:line (function)`, the keys of the harness's `syncs`). Only these
  explicit calls are timed: a host read of a device value (`.item()`, `.tolist()`, a D2H copy) blocks the
  host too, uncounted here but inside the iteration's time;
* `ForwardClock` times each forward the scheduler launches (`model_worker.forward_batch_generation`, the
  outermost call: DFLASH's worker for a DFLASH run, the fake target otherwise) with CUDA timing events
  recorded on the current stream (the forward stream, after `run_batch`'s `wait_stream`) at its start and
  its end, on a GPU: the GPU idle before a forward is the time from the previous forward's end event to
  its start event on the device's clock. On the CPU only the host time of each forward is taken;
* `forward_us` makes the fake target's forward compute for that long on the GPU (`torch.cuda._sleep`, spun
  on the current stream after the fake's kernels, before anything sglang records after the forward, so
  that 0.5.14's `verify_done` and every version's `copy_done` follow it): a model whose forward outlasts
  the host's scheduling, where a host block shows as GPU idle. On the CPU it must be 0.

    python -m racefuzz.engines.sglang.costs --python-dir DIR [--device cpu|cuda] [--workload JSON]
        [--repeats N] [--forward-us U ...]

prints one JSON object (`ci.bench.sglang_sync_cost` runs one process per version and renders the table).
Run `repeats` times per `forward_us` in one process; the first run of each is a warm-up (on a GPU it
compiles sglang's Triton kernels) and is reported apart from the measured runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
import traceback
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any
from unittest import mock

COST_WORKLOAD: dict[str, Any] = {
    "requests": [["r0", 0, 24, 64], ["r1", 0, 12, 56], ["r2", 1, 30, 48], ["r3", 8, 18, 60]],
    "max_iterations": 200,
    "pool_rows": 3,
    "spec": "dflash",
    "plan_stream": False,
}
"""The benchmark's workload: four DFLASH requests, three rows (the fourth reuses a freed one), decodes of
16-24 tokens (4-6 verify steps each), so that most iterations are steady decodes of 2-3 rows."""
REPEATS = 4
"""Runs per `forward_us` in one process: a warm-up, then three measured."""


class PlainRecorder:
    """`racefuzz.trace.env.StreamRecorder` with nothing recorded: the env of a plain run. Its virtual
    streams and events (CPU) do nothing when recorded, waited on or synchronized: the CPU has done the work
    eagerly."""

    paused = 0

    def __init__(self) -> None:
        from racefuzz.trace.env import VirtualStream

        self._events = 0
        self.virtual_current: Any = VirtualStream(self, "default")

    def new_event_name(self) -> str:
        self._events += 1
        return f"event#{self._events}"

    def given_event_name(self, name: str) -> str:
        return name

    def on_record(self, event: str, stream: str) -> None:
        pass

    def on_wait(self, event: str, stream: str) -> None:
        pass

    def on_stream_sync(self, stream: str) -> None:
        pass

    def on_event_sync(self, event: str) -> None:
        pass

    def on_device_sync(self) -> None:
        pass

    def name_stream(self, handle: int, name: str) -> None:
        pass

    def name_storage(self, tensor: Any, name: str) -> None:
        pass

    def name_virtual_stream(self, stream: Any, name: str) -> None:
        pass

    def name_event(self, event: Any, name: str) -> None:
        pass


class SyncClock:
    """Host seconds and calls of every stream/event sync method sglang's code calls, by call site. A call
    made inside another timed one (torch's `wait_stream` is `wait_event(record_event())`) is part of the
    outer one; a call from outside sglang's sources (the harness's own `env.synchronize()`) is not kept."""

    def __init__(self, python_dir: str) -> None:
        self.prefix = os.path.join(python_dir, "sglang") + os.sep
        self.cut = len(python_dir) + 1
        self.depth = 0
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def reset(self) -> None:
        self.seconds, self.calls = {}, {}

    def _timed(self, method: str, original: Any) -> Any:
        clock = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            if clock.depth:
                return original(*args, **kwargs)
            caller = sys._getframe(1)
            clock.depth += 1
            began = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - began
                clock.depth -= 1
                code = caller.f_code
                if code.co_filename.startswith(clock.prefix):
                    site = f"{method} at {code.co_filename[clock.cut :]}:{caller.f_lineno} ({code.co_name})"
                    clock.seconds[site] = clock.seconds.get(site, 0.0) + elapsed
                    clock.calls[site] = clock.calls.get(site, 0) + 1

        return timed

    @contextlib.contextmanager
    def installed(self, device: str) -> Iterator[None]:
        """The methods wrapped for the block: torch.cuda's on a GPU, the env's virtual ones on the CPU."""
        targets: list[tuple[Any, str]] = []
        if device == "cuda":
            import torch

            for name in ("synchronize", "wait", "query"):
                targets.append((torch.cuda.Event, name))
            for name in ("synchronize", "wait_event", "wait_stream", "query"):
                targets.append((torch.cuda.Stream, name))
            targets.append((torch.cuda, "synchronize"))
        else:
            from racefuzz.trace.env import VirtualEvent, VirtualStream

            for name in ("synchronize", "wait", "query"):
                targets.append((VirtualEvent, name))
            for name in ("synchronize", "wait_event", "wait_stream", "query"):
                targets.append((VirtualStream, name))
        with contextlib.ExitStack() as stack:
            for owner, name in targets:
                stack.enter_context(mock.patch.object(owner, name, self._timed(name, getattr(owner, name))))
            yield


class ForwardClock:
    """Each forward the scheduler launches: its host seconds, and on a GPU its start and end timing events
    on the current stream; with `cycles`, the fake target's forward spins that many GPU cycles."""

    def __init__(self, device: str, cycles: int) -> None:
        self.device = device
        self.cycles = cycles
        self.depth = 0
        self.host: list[float] = []
        self.events: list[tuple[Any, Any]] = []

    def _event(self) -> Any:
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _outermost(self, original: Any) -> Any:
        clock = self

        def forward(*args: Any, **kwargs: Any) -> Any:
            if clock.depth:
                return original(*args, **kwargs)
            clock.depth += 1
            start = clock._event() if clock.device == "cuda" else None
            began = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                clock.host.append(time.perf_counter() - began)
                if start is not None:
                    clock.events.append((start, clock._event()))
                clock.depth -= 1

        return forward

    def _spinning(self, original: Any) -> Any:
        clock = self

        def forward(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            if clock.cycles:
                import torch

                torch.cuda._sleep(clock.cycles)
            return result

        return forward

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        from sglang.srt.speculative import dflash_worker_v2

        from racefuzz.engines.sglang.fake_model import FakeTpWorker

        target = FakeTpWorker.forward_batch_generation
        dflash = dflash_worker_v2.DFlashWorkerV2.forward_batch_generation
        with (
            mock.patch.object(FakeTpWorker, "forward_batch_generation", self._outermost(self._spinning(target))),
            mock.patch.object(dflash_worker_v2.DFlashWorkerV2, "forward_batch_generation", self._outermost(dflash)),
        ):
            yield

    def gpu_figures(self) -> dict[str, Any]:
        """Busy and idle microseconds of the forwards on the device's clock (after a device sync)."""
        import torch

        torch.cuda.synchronize()
        busy = [start.elapsed_time(end) * 1000.0 for start, end in self.events]
        idle = [self.events[i][1].elapsed_time(self.events[i + 1][0]) * 1000.0 for i in range(len(self.events) - 1)]
        span = self.events[0][0].elapsed_time(self.events[-1][1]) * 1000.0 if self.events else 0.0
        return {
            "gpu_busy_us": [round(x, 1) for x in busy],
            "gpu_idle_us": [round(x, 1) for x in idle],
            "gpu_span_us": round(span, 1),
        }


@contextlib.contextmanager
def plain_cpu(env: Any) -> Iterator[None]:
    """What a plain CPU run needs that a recording's patches give it, with nothing recorded:

    * `Tensor.record_stream(s)` of a virtual stream does nothing: sglang's `FutureMap` calls it with the
      device module's current stream, which torch's own refuses (`racefuzz.trace.torch_patches` records it),
      and `torch.cuda.current_stream()` (sglang's `_async_d2h` asks it for a tensor it takes for a device
      one) is the env's current virtual stream, as in a CPU recording;
    * sglang's one query of the device's free memory, at init (`Scheduler.init_model_worker` ->
      `get_available_gpu_memory`), is asked for `cpu` when the fake worker's device is a `cpu:N` stand-in
      (`racefuzz.trace.host_memory.DEVICE`), which it does not know (a startup figure the loop never reads).
    The host/device split of a CPU recording (`host_memory.HostTensors`) is not entered: it is a dispatch
    mode, a cost on every op, and a plain run has no accesses to tell apart."""
    import torch
    from sglang.srt.managers import scheduler

    from racefuzz.trace.env import VirtualStream

    record = torch.Tensor.record_stream
    asked = scheduler.get_available_gpu_memory

    def record_stream(self: Any, stream: Any) -> None:
        if not isinstance(stream, VirtualStream):
            record(self, stream)

    def available_memory(device: Any, *args: Any, **kwargs: Any) -> Any:
        return asked("cpu" if str(device).startswith("cpu") else device, *args, **kwargs)

    def current_stream(device: Any = None) -> Any:
        return env.current_stream()

    with (
        mock.patch.object(torch.cuda, "current_stream", current_stream),
        mock.patch.object(torch.Tensor, "record_stream", record_stream),
        mock.patch.object(scheduler, "get_available_gpu_memory", available_memory),
    ):
        yield


def spin_cycles(forward_us: float) -> tuple[int, float]:
    """GPU cycles that `torch.cuda._sleep` spins for `forward_us`, calibrated here (timing events around a
    long spin), and the measured cycles per microsecond."""
    import torch

    probe = 20_000_000
    torch.cuda._sleep(1000)  # a first launch pays the module's load
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(probe)
    end.record()
    end.synchronize()
    per_us = probe / (start.elapsed_time(end) * 1000.0)
    return int(forward_us * per_us), per_us


def plain_run(
    python_dir: str, sgl: Any, adapter: Any, workload: Any, device: str, forward_us: float, cycles: int
) -> dict[str, Any]:
    """One untimed-by-the-recorder run of sglang's loop on `workload` with the barrier as the version has
    it: its iterations, loop seconds, host seconds blocked per sync call site, forwards and (GPU) idle."""
    from racefuzz.engines.sglang import scheduler as harness_scheduler
    from racefuzz.trace.env import TraceEnv

    harness_scheduler.configure(sgl, adapter, workload, device)
    env = TraceEnv(PlainRecorder(), device)
    syncs = SyncClock(python_dir)
    forwards = ForwardClock(device, cycles)
    loop: dict[str, float] = {}

    def on_loop() -> None:  # sglang's run_event_loop starts next: the loop's clock starts here
        syncs.reset()
        forwards.host.clear()
        forwards.events.clear()
        if device == "cuda":
            import torch

            torch.cuda.synchronize()
        loop["began"] = time.perf_counter()

    cpu_only = plain_cpu(env) if device == "cpu" else contextlib.nullcontext()
    with syncs.installed(device), forwards.installed(), cpu_only:
        run = harness_scheduler.build_and_run(env, sgl, adapter, workload, True, on_loop)
        if device == "cuda":
            import torch

            torch.cuda.synchronize()  # the last forward's work is part of the loop's time
        loop_s = time.perf_counter() - loop["began"]
    figures: dict[str, Any] = {
        "forward_us": forward_us,
        "iterations": run.iterations,
        "forwards": len(forwards.host),
        "stopped_by_budget": run.iterations > workload.max_iterations,
        "loop_s": round(loop_s, 6),
        "iterations_per_s": round(run.iterations / loop_s, 2) if loop_s else None,
        "blocked_s": {site: round(s, 6) for site, s in sorted(syncs.seconds.items())},
        "calls": dict(sorted(syncs.calls.items())),
        "forward_host_us": [round(s * 1e6, 1) for s in forwards.host],
    }
    if device == "cuda":
        figures.update(forwards.gpu_figures())
    return figures


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The measured runs of one `forward_us` in a few figures (medians over the runs): per iteration, host
    microseconds blocked at each call site and in all; iterations/s; GPU idle between forwards."""
    iterations = runs[0]["iterations"]
    sites = sorted({site for run in runs for site in run["blocked_s"]})
    per_site = {
        site: round(statistics.median(run["blocked_s"].get(site, 0.0) for run in runs) * 1e6 / iterations, 1)
        for site in sites
    }
    calls = {site: runs[0]["calls"].get(site, 0) for site in sites}
    total = [sum(run["blocked_s"].values()) * 1e6 / run["iterations"] for run in runs]
    summary: dict[str, Any] = {
        "runs": len(runs),
        "iterations": iterations,
        "forwards": runs[0]["forwards"],
        "same_iterations": all(run["iterations"] == iterations for run in runs),
        "iterations_per_s": round(statistics.median(run["iterations_per_s"] for run in runs), 1),
        "iteration_us": round(statistics.median(run["loop_s"] * 1e6 / run["iterations"] for run in runs), 1),
        "blocked_us_per_iteration": round(statistics.median(total), 1),
        "blocked_us_per_iteration_by_site": per_site,
        "calls_per_run_by_site": calls,
    }
    if "gpu_idle_us" in runs[0]:
        idle = [statistics.mean(run["gpu_idle_us"]) for run in runs if run["gpu_idle_us"]]
        busy = [statistics.mean(run["gpu_busy_us"]) for run in runs if run["gpu_busy_us"]]
        share = [sum(run["gpu_busy_us"]) / run["gpu_span_us"] for run in runs if run["gpu_span_us"]]
        summary.update(
            gpu_idle_us_between_forwards=round(statistics.median(idle), 1) if idle else None,
            gpu_busy_us_per_forward=round(statistics.median(busy), 1) if busy else None,
            forward_stream_busy_share=round(statistics.median(share), 3) if share else None,
        )
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="racefuzz.engines.sglang.costs")
    parser.add_argument("--python-dir", required=True)
    parser.add_argument("--sglang-version", help="the version of a checkout without _version.py")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--workload", help="a Workload as JSON (default: COST_WORKLOAD)")
    parser.add_argument("--repeats", type=int, default=REPEATS, help="runs per --forward-us, the first a warm-up")
    parser.add_argument("--forward-us", type=float, action="append", default=[], help="repeatable (default 0)")
    parser.add_argument("--traceback", action="store_true")
    args = parser.parse_args(argv)
    out: dict[str, Any] = {"python_dir": args.python_dir, "device": args.device}
    began = time.perf_counter()
    try:
        from racefuzz.engines.harness_process import Unsupported
        from racefuzz.engines.sglang import stubs
        from racefuzz.engines.sglang.harness import load_version
        from racefuzz.engines.sglang.workload import Workload

        if args.repeats < 2:
            raise ValueError(f"--repeats must be at least 2 (a warm-up and a measured run), got {args.repeats}")
        forward_us = args.forward_us or [0.0]
        if args.device == "cpu" and any(forward_us):
            raise ValueError("--forward-us is a GPU spin: on the CPU it must be 0")
        workload = Workload.from_json(json.loads(args.workload) if args.workload else COST_WORKLOAD)
        out["workload"] = workload.describe()
        out["stubbed"] = stubs.install() if args.device == "cpu" else stubs.install(force=())
        if args.device == "cuda":
            from racefuzz.engines.device_choice import resolve_device

            resolve_device("cuda")
        adapter = load_version(args.python_dir, args.sglang_version, out)
        sgl = SimpleNamespace(server_args=None, device_module=None)
        out["settings"] = []
        for us in forward_us:
            cycles, per_us = spin_cycles(us) if args.device == "cuda" and us else (0, None)
            runs = [
                plain_run(args.python_dir, sgl, adapter, workload, args.device, us, cycles) for _ in range(args.repeats)
            ]
            out["settings"].append(
                {
                    "forward_us": us,
                    "spin_cycles": cycles,
                    "cycles_per_us": round(per_us, 1) if per_us else None,
                    "warmup": runs[0],
                    "measured": runs[1:],
                    "summary": summarize(runs[1:]),
                }
            )
        out["status"] = "ok"
    except Unsupported as exc:
        out["status"] = "unsupported"
        out["error"] = str(exc)
    except Exception as exc:  # one line for the parent; the traceback with --traceback
        out["status"] = "error"
        out["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
        if args.traceback:
            out["traceback"] = traceback.format_exc()
    out["seconds"] = round(time.perf_counter() - began, 3)
    sys.stdout.write("\n" + json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
