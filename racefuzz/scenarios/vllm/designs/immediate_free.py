"""`immediate-free`: `prepare_inputs_event` guards the pinned inputs; freed blocks return to the pool at once.

`GPUModelRunner.synchronize_input_prep` (vllm/v1/worker/gpu_model_runner.py at 0.33.0) wraps the input
preparation of `execute_model`: `prepare_inputs_event.synchronize()` on entry ("Ensure prior step has finished
with reused CPU tensors. This is required in the async scheduling case because the CPU->GPU transfer happens
async") and `prepare_inputs_event.record()` on exit, after `commit_block_table`'s non-blocking copy. One
event, created once (`torch.cuda.Event(blocking=True)`) and re-recorded every step.

Blocks: `Scheduler._free_request_blocks` (vllm/v1/core/sched/scheduler.py) with `defer_block_free` False, which
is every configuration but async scheduling (or PP) with a KV consumer, and every configuration before #45357:
`kv_cache_manager.free(request)` at once, while the step scheduled after the one that finished the request may
still be writing its KV.
"""

from __future__ import annotations


class PrepareInputsEvent:
    """The `prepare_inputs_event` guard every vLLM design shares."""

    def input_prep_enter(self, ctx) -> None:
        event = ctx.state.get("prepare_inputs_event")
        if event is not None:  # before the first record a synchronize() returns at once: leave it out
            event.synchronize()

    def input_prep_exit(self, ctx) -> None:
        event = ctx.state.get("prepare_inputs_event")
        if event is None:
            event = ctx.state["prepare_inputs_event"] = ctx.device.event("prepare_inputs_event")
        event.record(ctx.compute_stream)


class ImmediateFree(PrepareInputsEvent):
    name = "immediate-free"
    description = (
        "prepare_inputs_event guards the pinned block table; finished requests' blocks are freed at once "
        "(before #45357)."
    )


design = ImmediateFree()
