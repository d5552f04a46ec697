"""Model-runner v2's round-robin pinned buffers (vLLM #54269), on vLLM's own buffer classes.

Model-runner v2 (`vllm/v1/worker/gpu/`, 0.33.0) keeps per-request state its kernels read straight from
pinned host memory through a device view (UVA, zero-copy): `buffer_utils.py: UvaBackedTensor` holds the
state in a plain CPU tensor and, at each `copy_to_uva`, copies it into the next pinned slot of a
`UvaBufferPool` (round robin, `_DEFAULT_MAX_CONCURRENCY` = 2 slots) and points `.gpu` at that slot's device
view. The pool's contract is its docstring: "Callers must retire a slot's GPU readers before reuse". What
a step does with the sampler's temperature (the same for `top_k`, `top_p`, `min_p`, `seeds`):

* `model_runner.py: GPUModelRunner.add_requests` ends with `self.sampler.apply_staged_writes()` on every
  step (`sample/states.py: SamplingStates.apply_staged_writes` -> `temperature.copy_to_uva()`): the host
  rewrites the next slot;
* `model_runner.py: GPUModelRunner.sample_tokens`: the sampler's kernels read `temperature.gpu`; then
  `AsyncOutput(...)` (`async_utils.py: AsyncOutput.__init__`) records its `copy_event` on the main stream;
  then, with a speculator, `self.speculator.propose(..., self.sampler.sampling_states.temperature.gpu,
  ...)` reads the slot again, after the event ("intentionally done after creating the AsyncOutput");
* the engine (`v1/engine/core.py: EngineCore.step_with_batch_queue`, batch queue 2) schedules and
  executes step N+1 before it takes step N's output (`future.result()`: `AsyncOutput.get_output`,
  `copy_event.synchronize()`), then schedules step N+2, whose `copy_to_uva` rewrites step N's slot.
  `spec_decode/utils.py: DraftTokensHandler.get_draft_tokens` waits for the draft tokens only with
  structured outputs.

`run_ring` drives vLLM's own `UvaBackedTensor` / `UvaBufferPool` in that order under `racefuzz.trace`
(CPU, virtual streams, `racefuzz.trace.host_memory.HostTensors`), the kernels stand-ins (torch ops on the
device reading `.gpu`). `ModelledUvaBuffer` is `UvaBuffer` on the CPU: its device view is the recorder's
zero-copy view of the pinned tensor (`racefuzz.trace.host_memory.device_view`: one storage, so a host
write of a slot and a kernel's read of its view are accesses of the same bytes) and its `np` a
`HostArray` (the host's NumPy copy into the slot is recorded). The negative control takes no output (no
`copy_event.synchronize()`): the sampler's read of a slot then races its rewrite two steps later.

    racefuzz vllm --version 0.33.0 --uva-ring     # the harness subprocess runs `run_cases` after its workloads
"""

from __future__ import annotations

import importlib
import time
from collections import deque
from collections.abc import Callable
from typing import Any

MAX_REQS = 4
STEPS = 5
CASES = (
    ("no speculator", False, False),
    ("speculator (propose reads temperature.gpu after copy_event)", True, False),
    ("control: no speculator, outputs never taken", False, True),
)
"""(name, speculative, control) of each run."""


class ModelledUvaBuffer:
    """`buffer_utils.UvaBuffer` on the CPU: its `cpu` a host tensor (pinned on a GPU), its `np` the
    recorded NumPy view of it, its device view (`uva`) the same storage (zero-copy)."""

    def __init__(self, size: Any, dtype: Any) -> None:
        import torch

        from racefuzz.trace import host_memory

        self.cpu = torch.zeros(size, dtype=dtype, device="cpu")
        self.np = host_memory.wrap(self.cpu.numpy(), self.cpu)
        self._uva = host_memory.device_view(self.cpu)  # a device view of pinned memory: one storage with it

    def uva(self, n: int | None = None) -> Any:
        return self._uva[:n] if n is not None else self._uva


def model_uva(buffer_utils: Any) -> None:
    """The pool's slots as `ModelledUvaBuffer`s (`UvaBufferPool.__init__` picks `UvaBuffer` when
    `is_uva_available()`, both looked up in the module at call time)."""
    buffer_utils.is_uva_available = lambda: True
    buffer_utils.UvaBuffer = ModelledUvaBuffer


def run_ring(
    speculative: bool, control: bool, as_json: Callable[[Any], dict[str, Any]], steps: int = STEPS
) -> dict[str, Any]:
    """`steps` engine steps of MRV2's temperature ring (module docstring); the trace's races, each as
    `as_json` writes it (the harness's `race_json`)."""
    import torch
    from vllm.v1.worker.gpu import buffer_utils

    from racefuzz.trace.host_memory import HostTensors
    from racefuzz.trace.judge import trace_races
    from racefuzz.trace.search import run_once

    model_uva(buffer_utils)
    device = torch.device("cpu", 0)

    def step(env: Any) -> None:
        with HostTensors().recorded():
            temperature = buffer_utils.UvaBackedTensor(MAX_REQS, dtype=torch.float32)  # SamplingStates.__init__
            for index, slot in enumerate(temperature.pool._uva_bufs):
                env.name(slot.cpu, f"temperature.pool._uva_bufs[{index}].cpu")
            logits = torch.ones(MAX_REQS, 8, device=device)
            env.synchronize()
            in_flight: deque[Any] = deque()
            for number in range(steps):
                temperature.np[number % MAX_REQS] = 0.5 + number  # SamplingStates.add_request
                temperature.copy_to_uva()  # add_requests -> sampler.apply_staged_writes
                scaled = logits / temperature.gpu.unsqueeze(1)  # the sampler's kernel
                copy_event = torch.cuda.Event()
                copy_event.record()  # AsyncOutput.__init__, before postprocess and the drafter
                if speculative:
                    _ = scaled * temperature.gpu.unsqueeze(1)  # speculator.propose's read
                in_flight.append(copy_event)
                if len(in_flight) == 2:  # batch queue 2: step N's output taken after step N+1 launched
                    taken = in_flight.popleft()
                    if not control:
                        taken.synchronize()  # AsyncOutput.get_output

    began = time.perf_counter()
    record = run_once(step, "cpu")
    races = trace_races(record.program)
    return {
        "speculative": speculative,
        "control": control,
        "steps": steps,
        "slots": buffer_utils._DEFAULT_MAX_CONCURRENCY,
        "races": [as_json(r) for r in races],
        "seconds": round(time.perf_counter() - began, 3),
    }


def run_cases(as_json: Callable[[Any], dict[str, Any]]) -> list[dict[str, Any]] | str:
    """Every case of `CASES` (in the harness's subprocess, the version's vLLM importable), or why none ran:
    a version before model-runner v2 has no `vllm/v1/worker/gpu/buffer_utils.py`."""
    try:
        importlib.import_module("vllm.v1.worker.gpu.buffer_utils")
    except ModuleNotFoundError as exc:
        return f"no model-runner v2 buffer pool in this version ({exc})"
    return [dict(run_ring(speculative, control, as_json), case=name) for name, speculative, control in CASES]
