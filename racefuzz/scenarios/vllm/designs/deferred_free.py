"""`deferred-free`: #45357's fix, as vLLM 0.33.0 runs it with async scheduling and a KV consumer.

vllm/v1/core/sched/scheduler.py at 0.33.0: `defer_block_free` is set when `max_concurrent_batches > 1` and the
KV connector is a consumer ("a step may still be writing a freed request's KV blocks. A consumer KV Connector
can reallocate and fill those blocks via a load that isn't ordered against that write, so defer freeing them").
`schedule` advances `sched_step_seq` for every non-empty step and stamps each scheduled request's
`last_sched_seq`; `_free_request_blocks` frees at once only if `last_sched_seq <= processed_step_seq`, else
appends `(sched_step_seq, blocks)` to `deferred_frees`; `update_from_output` advances `processed_step_seq` and
`_drain_deferred_frees` returns every entry whose fence it reached ("Every GPU write enqueued by this and
earlier steps has completed"): the host has synchronized that step's `async_copy_ready_event`, whose copy
waited on the compute stream behind the step's forward. Plus `prepare_inputs_event` (`immediate-free`).
"""

from __future__ import annotations

from racefuzz.scenarios.vllm.designs.immediate_free import PrepareInputsEvent


class DeferredFree(PrepareInputsEvent):
    name = "deferred-free"
    description = "#45357 (vLLM 0.33.0): blocks return to the pool once the last step that used them was processed."
    defer_block_free = True


design = DeferredFree()
