"""The harness's subprocess: load one vLLM version's sources, run its `GPUModelRunner` (made by its own
`__init__`) through vLLM's engine-core step order on a workload under `racefuzz.trace` (happens-before),
with `prepare_inputs_event` as the version has it and, as the negative control, the same workload under
async scheduling with the event's `synchronize` a no-op; print one JSON object.

    python -m racefuzz.engines.vllm.harness --python-dir DIR [--workload JSON] [--no-control]
        [--device cpu|cuda] [--slot-mapping torch|vllm] [--list-imports] [--uva-ring]

`--device cpu` (virtual streams): the host/device split is `host_memory.HostTensors`'s. `--device cuda`
(docs/vllm.md, "On a GPU"): torch.cuda's own streams and events, the runner's pinned buffers really pinned
(the recorder records a pinned CPU tensor's ops as the host's), Triton real. `--list-imports`: the result
also lists the version's files the run imported (`imported`, relative to the python dir: what
`sources.pack` puts in a slim archive). `--uva-ring`: also model-runner v2's pinned ring on the CPU
(`uva_ring.run_cases`, in the result as `uva_ring`).

One version per process (vLLM's modules are imported by their own names). Stubs first (`stubs.install`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import time
import traceback
from dataclasses import replace
from typing import Any

from racefuzz.engines.harness_process import Unsupported


def _short(source: str) -> str:
    at = source.rfind(f"{os.sep}vllm{os.sep}")
    return source[at + 1 :] if at >= 0 else source


def race_json(race: Any) -> dict[str, Any]:
    def access(launch: Any) -> dict[str, Any]:
        from racefuzz.trace.builder import launch_source

        return {"kernel": launch.kernel, "stream": launch.stream.name, "source": _short(launch_source(launch))}

    return {
        "kind": race.race.kind,
        "first": access(race.first),
        "second": access(race.second),
        "bytes": list(race.where),
        "missing_edge": race.race.missing_edge(),
    }


def run_workload(workload: Any, control: bool, device: str = "cpu", slot_mapping: str = "torch") -> dict[str, Any]:
    """One recorded run of the runner on `workload` (`control`: the event's synchronize a no-op) on
    `device` (`cpu`: virtual streams, the device `cpu:0`; `cuda`: the GPU `cuda:0`), the slot mapping by
    `slot_mapping` (`torch`: `runner.SlotMappingKernel`; `vllm`: the version's own Triton kernel, GPU only)."""
    import torch

    from racefuzz.engines.vllm import runner as vllm_runner
    from racefuzz.engines.vllm.host_memory import HostTensors
    from racefuzz.trace.builder import HOST, is_host_order
    from racefuzz.trace.judge import trace_races
    from racefuzz.trace.search import run_once

    holder: dict[str, Any] = {}
    target = torch.device(device, 0)

    def step(env: Any) -> None:
        # The sampled requests (temperature 1) draw from torch's global generator: seeded, two runs of one
        # workload sample the same tokens (their `outputs` agree), as a replay expects. vLLM's own per-request
        # generators (`SamplingParams.seed`) would change which of its code runs; the global seed does not.
        torch.manual_seed(0)
        # On a GPU the recorder tells host from device itself (a pinned CPU tensor's op is the host's).
        host = HostTensors().recorded() if device == "cpu" else contextlib.nullcontext()
        with host, vllm_runner.device_generic_events():
            runner = vllm_runner.build_runner(workload, target, control, slot_mapping)
            holder["control_events"] = vllm_runner.control_events(runner)
            vllm_runner.name_buffers(env, runner)
            # The engine's init ends with the device idle (profiling and warmup synchronize it).
            env.synchronize()
            holder["run"] = vllm_runner.run_loop(runner, workload)

    began = time.perf_counter()
    record = run_once(step, device)
    races = trace_races(record.program)
    run = holder["run"]
    return {
        "control": control,
        "control_events": holder["control_events"],
        "async_scheduling": workload.async_scheduling,
        "steps": run.steps,
        "forwards": run.forwards,
        "outputs": run.outputs,
        "launches": len(record.launch_ops),
        "host_accesses": sum(
            1
            for op in record.builder.ops
            if getattr(getattr(op, "stream", None), "name", None) == HOST and not is_host_order(op)
        ),
        "races": [race_json(r) for r in races],
        "seconds": round(time.perf_counter() - began, 3),
    }


def set_pinned_memory(available: bool) -> None:
    """vLLM's own switch for pinned memory, set before the modules that import it by name
    (`vllm.utils.torch_utils.PIN_MEMORY` in 0.1x-0.33, `is_pin_memory_available()` read in
    `GPUModelRunner.__init__` from `vllm.utils` before 0.11 and from `vllm.utils.platform_utils` in
    0.17-0.18): off on the CPU (a CPU-only torch has no pinned allocator), on on a GPU (what vLLM decides
    there; the platform the harness pins, `pin_platform`, would not be asked)."""
    import importlib

    import vllm.utils

    modules = [vllm.utils]
    for name in ("vllm.utils.torch_utils", "vllm.utils.platform_utils"):  # 0.17-0.18 import it from the latter
        with contextlib.suppress(ModuleNotFoundError):
            modules.append(importlib.import_module(name))
    torch_utils = next((m for m in modules if m.__name__ == "vllm.utils.torch_utils"), None)
    if torch_utils is not None and hasattr(torch_utils, "PIN_MEMORY"):
        torch_utils.PIN_MEMORY = available
    for module in modules:
        if module is not None and hasattr(module, "is_pin_memory_available"):
            module.is_pin_memory_available = lambda: available


def pin_platform() -> str:
    """`vllm.platforms.current_platform` as the CPU run resolves it, on either device: vLLM's
    `UnspecifiedPlatform` (no platform plugin activates without vLLM's compiled extensions). On a GPU
    host vLLM's CUDA plugin would activate (its NVML probe finds the GPU) and `vllm.platforms.cuda` imports
    `vllm._C_stable_libtorch` (0.33.0 platforms/cuda.py), a compiled extension the sources lack; the
    runner is given its device explicitly and needs no platform. Returns the platform's class name."""
    import vllm.platforms as platforms
    from vllm.platforms.interface import UnspecifiedPlatform

    if getattr(platforms, "_current_platform", None) is None:
        platforms._current_platform = UnspecifiedPlatform()
    return type(platforms.current_platform).__name__


def imported_files(python_dir: str) -> list[str]:
    """The version's files the process has imported, relative to `python_dir`, sorted."""
    root = os.path.abspath(python_dir) + os.sep
    files = {getattr(module, "__file__", None) for name, module in list(sys.modules.items()) if name.startswith("vllm")}
    return sorted(os.path.relpath(f, root) for f in files if f and os.path.abspath(f).startswith(root))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="racefuzz.engines.vllm.harness")
    parser.add_argument("--python-dir", required=True)
    parser.add_argument("--workload", action="append", default=[], help="a Workload as JSON, repeatable")
    parser.add_argument("--no-control", action="store_true")
    parser.add_argument("--traceback", action="store_true")
    parser.add_argument("--vllm-version", help="the version of a checkout without vllm/_version.py")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--slot-mapping", choices=("torch", "vllm"), default="torch")
    parser.add_argument("--list-imports", action="store_true")
    parser.add_argument("--uva-ring", action="store_true", help="also model-runner v2's pinned ring (uva_ring.py)")
    args = parser.parse_args(argv)
    out: dict[str, Any] = {"python_dir": args.python_dir}
    began = time.perf_counter()
    try:
        from racefuzz.engines.vllm import stubs
        from racefuzz.engines.vllm.workload import FIXED, Workload

        workloads = [Workload.from_json(json.loads(text)) for text in args.workload] or [FIXED]
        if args.slot_mapping == "vllm" and args.device != "cuda":
            raise ValueError("--slot-mapping vllm needs --device cuda (Triton does not run on the CPU)")
        out["stubbed"] = stubs.install() if args.device == "cpu" else stubs.install(force=())
        out["device"] = args.device
        out["slot_mapping"] = args.slot_mapping
        if args.device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise RuntimeError("--device cuda: torch sees no CUDA device here (torch.cuda.is_available() is False)")
            out["gpu"] = torch.cuda.get_device_name(0)
        sys.path.insert(0, args.python_dir)
        version = _version(args.python_dir)
        out["version"] = version if version != "unknown" or not args.vllm_version else args.vllm_version
        import_began = time.perf_counter()
        out["platform"] = pin_platform()
        set_pinned_memory(args.device == "cuda")
        import vllm.v1.worker.gpu_model_runner  # noqa: F401

        out["import_seconds"] = round(time.perf_counter() - import_began, 3)
        out["runs"] = []
        for workload in workloads:
            run = run_workload(workload, False, args.device, args.slot_mapping)
            run["workload"], run["workload_json"] = workload.describe(), workload.to_json()
            out["runs"].append(run)
            if not args.no_control:
                # The control needs the event, which exists only under async scheduling.
                controlled = replace(workload, async_scheduling=True)
                run = run_workload(controlled, True, args.device, args.slot_mapping)
                run["workload"], run["workload_json"] = controlled.describe(), controlled.to_json()
                out["runs"].append(run)
        from racefuzz.engines.vllm.fake_model import FakeModelConfig, FakeVllmConfig

        out["defaulted_to_none"] = sorted(
            [f"model_config.{n}" for n in FakeModelConfig.asked] + [f"vllm_config.{n}" for n in FakeVllmConfig.asked]
        )
        if args.uva_ring:
            from racefuzz.engines.vllm import uva_ring

            out["uva_ring"] = uva_ring.run_cases(race_json)
        if args.list_imports:
            out["imported"] = imported_files(args.python_dir)
        out["status"] = "ok"
    except Unsupported as exc:
        out["status"] = "unsupported"
        out["error"] = str(exc)
    except Exception as exc:  # reported as one line by the parent; the traceback with --traceback
        out["status"] = "error"
        out["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
        if args.traceback:
            out["traceback"] = traceback.format_exc()
    out["seconds"] = round(time.perf_counter() - began, 3)
    sys.stdout.write("\n" + json.dumps(out) + "\n")
    return 0


def _version(python_dir: str) -> str:
    """`vllm/_version.py`'s version (a wheel's, generated at build), else `unknown`."""
    try:
        with open(os.path.join(python_dir, "vllm", "_version.py")) as file:
            text = file.read()
    except OSError:
        return "unknown"
    found = re.search(r"^__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"]+)", text, re.M)
    return found.group(1) if found else "unknown"


if __name__ == "__main__":
    sys.exit(main())
