"""`step-event`: an event per step; the host waits for the last user's step before a connector writes a block.

Not vLLM's code: the alternative to #45357's deferral that keeps the pool's capacity. Blocks return to the pool
at once (`immediate-free`), every step records `step_done` on the compute stream after its forward, and
before `start_load_kv` writes newly allocated blocks the host synchronizes the `step_done` of the last step
that contained a previous owner of any of them. The wait is on the host, not on the connector's stream: a
NIXL read is a NIC write that no CUDA stream orders, so only the host can hold it back. It costs a host stall
where #45357 costs blocks held back for a step (`racefuzz compare --scenario vllm-kv-reuse`).
"""

from __future__ import annotations

from racefuzz.scenarios.vllm.designs.immediate_free import PrepareInputsEvent


class StepEvent(PrepareInputsEvent):
    name = "step-event"
    description = (
        "Blocks freed at once; the host syncs the step_done event of a block's last user before a connector writes it."
    )

    def step_end(self, ctx) -> None:
        ctx.state[f"step_done {ctx.step}"] = ctx.compute_stream.record_event("step_done")

    def before_kv_load(self, ctx) -> None:
        if ctx.reused_from is not None:
            ctx.state[f"step_done {ctx.reused_from}"].synchronize()


design = StepEvent()
