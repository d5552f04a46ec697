"""Mutants: deliberately broken designs of the vLLM KV-reuse scenario, each planting one bug vLLM has had or could have.

Each is a correct design (its `base`, clean under its `hazards`) with one mutation, and says in its
`description` what it breaks. Besides the hooks, a mutant carries what a search or a bounded proof needs:

    base        the correct design it mutates
    hazards     the workload hazards it is searched under (ones its base is clean under)
    equivalent  None, or why no schedule can tell it from its base (not counted as missed)

Load one like a built-in: `racefuzz run --scenario vllm-kv-reuse --design mutant-fence-off-by-one`.
"""

from __future__ import annotations

from racefuzz.scenarios.vllm.designs.deferred_free import DeferredFree
from racefuzz.scenarios.vllm.designs.step_event import StepEvent
from racefuzz.scenarios.vllm.strategies import HAZARDS

OFFLOAD = (*HAZARDS, "offload")


class NoPrepareInputsEvent(DeferredFree):
    name = "mutant-no-prepare-inputs-event"
    description = (
        "`synchronize_input_prep` skips `prepare_inputs_event.synchronize()`, so the host rewrites the pinned "
        "block table (`add_row`/`append_row`) while the previous step's non-blocking `copy_to_gpu` may still read "
        "it (the class of #24527/#25279: CPU tensors written while async copies still read them)."
    )
    base = "deferred-free"
    hazards = HAZARDS
    equivalent = None

    def input_prep_enter(self, ctx) -> None:
        """The skipped host sync."""


class PrepareEventEarly(DeferredFree):
    name = "mutant-prepare-event-early"
    description = (
        "`prepare_inputs_event.record()` is issued on entering the input preparation instead of on leaving it, "
        "before `commit_block_table`'s copy: the next step's `synchronize()` no longer waits for that copy, so "
        "the pinned rows are rewritten under it."
    )
    base = "deferred-free"
    hazards = HAZARDS
    equivalent = None

    def input_prep_enter(self, ctx) -> None:
        super().input_prep_enter(ctx)
        super().input_prep_exit(ctx)

    def input_prep_exit(self, ctx) -> None:
        """Recorded on entry instead."""


class FenceOffByOne(DeferredFree):
    name = "mutant-fence-off-by-one"
    description = (
        "#45357's deferral with its fence test loosened by one step (`last_sched_seq <= processed_step_seq + 1`): "
        "the blocks of a request that finished in step k return while step k+1, which still writes them, is in "
        "flight, and a connector load into them races that write (the race #45357 fixed)."
    )
    base = "deferred-free"
    hazards = HAZARDS
    equivalent = None
    fence_slack = 1


class WaitFinishingStep(StepEvent):
    name = "mutant-wait-finishing-step"
    description = (
        "`step-event` waiting on the event of the step whose output showed the previous owner finished (step k) "
        "instead of the last step that contained it (k+1, over-scheduled under async scheduling): the load "
        "still races step k+1's KV write."
    )
    base = "step-event"
    hazards = HAZARDS
    equivalent = None

    def before_kv_load(self, ctx) -> None:
        if ctx.revealed_at is not None:
            ctx.state[f"step_done {ctx.revealed_at}"].synchronize()


class StepEventBeforeForward(StepEvent):
    name = "mutant-step-event-before-forward"
    description = (
        "`step-event` recording `step_done` at the end of the input preparation, before the forward's "
        "`reshape_and_cache_flash`: the host's wait returns before the KV write it should wait for."
    )
    base = "step-event"
    hazards = HAZARDS
    equivalent = None

    def input_prep_exit(self, ctx) -> None:
        super().input_prep_exit(ctx)
        ctx.state[f"step_done {ctx.step}"] = ctx.compute_stream.record_event("step_done")

    def step_end(self, ctx) -> None:
        """Recorded before the forward instead."""


class TransferNoWaitCompute(DeferredFree):
    name = "mutant-transfer-no-wait-compute"
    description = (
        "The offloading connector's `transfer_async` without `stream.wait_stream(current_stream())` (\"Stores must "
        "wait for the model to finish writing the KV they read\"): a finished request's store reads its blocks "
        "before the compute stream's last KV writes to them landed (RAW on the block pool)."
    )
    base = "deferred-free"
    hazards = OFFLOAD
    equivalent = None

    def transfer_enter(self, ctx) -> None:
        """The missing wait on the compute stream."""


class StoreNoFlush(DeferredFree):
    name = "mutant-store-no-flush"
    description = (
        "The offloading connector ignores `jobs_to_flush`: a finished request's store still reads its blocks on "
        "the transfer stream when the scheduler hands them to a new request, whose prefill writes them on the "
        "compute stream (WAR on the block pool)."
    )
    base = "deferred-free"
    hazards = OFFLOAD
    equivalent = None

    def flush_stores(self, ctx, ends) -> None:
        """No wait for the stores of reallocated blocks."""


MUTANTS: dict[str, object] = {
    mutant.name: mutant
    for mutant in (
        NoPrepareInputsEvent(),
        PrepareEventEarly(),
        FenceOffByOne(),
        WaitFinishingStep(),
        StepEventBeforeForward(),
        TransferNoWaitCompute(),
        StoreNoFlush(),
    )
}
"""The mutants by name."""
