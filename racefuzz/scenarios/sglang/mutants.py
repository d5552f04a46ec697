"""Mutants: deliberately broken sync designs, each planting one bug that sglang has had or could have.

A fuzzer is only as good as the bugs it catches. Each mutant here is a correct design (its `base`,
almost always `war-after-launch`, clean over every hazard) with one mutation, and says in its
`description` what it breaks and which sglang PR or issue it models. `racefuzz bench mutants` searches
each one and reports whether, how fast and by which oracle it was caught (its kill rate), beside the
baselines (a plain stress loop, the PCT-style delay strategy). Besides the design hooks, a mutant
carries what the benchmark needs to search it:

    base        the correct design it mutates
    hazards     the workload hazards searched: ones the base design is clean under, so a detection is
                the mutation's (`racefuzz.scenarios.sglang.strategies.HAZARDS` plus the opt-in ones)
    plan_stream True when the mutated code only runs with DFLASH's plan stream; None lets workloads draw it
    equivalent  None, or why no schedule of the scenario can tell it from its base (an equivalent mutant:
                reported, not counted in the kill rate)

Load one like a built-in: `racefuzz run --design mutant-plan-exit-self-wait`, `load_design(name)`.
"""

from __future__ import annotations

from racefuzz.scenarios.sglang.designs.global_war import apply_war_barrier
from racefuzz.scenarios.sglang.designs.read_done import ReadDone
from racefuzz.scenarios.sglang.designs.record_stream import RecordStream
from racefuzz.scenarios.sglang.strategies import ALL_HAZARDS, HAZARDS, LATER_HAZARDS, LIFETIME_HAZARDS

ALL = ALL_HAZARDS
"""Every hazard, the opt-in page_size > 1 read included: the base `war-after-launch` is clean under all."""


class _WarAfterLaunch:
    """The base most mutants start from: `war-after-launch` (#31687 with #29541's read-done fast path)."""

    base = "war-after-launch"
    hazards: tuple[str, ...] = ALL
    plan_stream: bool | None = None
    equivalent: str | None = None

    def after_reads(self, ctx) -> None:
        if ctx.is_decode:
            ctx.state["read_done"] = ctx.forward_stream.record_event("read_done")

    def after_launch(self, ctx) -> None:
        apply_war_barrier(ctx)


class PlanNoWaitSchedule(_WarAfterLaunch):
    name = "mutant-plan-no-wait-schedule"
    description = (
        "The plan stream skips `plan_stream.wait_stream(schedule_stream)` on entering its context "
        "(dflash_info_v2.py:193), so with page_size > 1 its `get_last_loc` read of R can run before the "
        "schedule stream's prefill write of that cell lands (the plan-stream reads of in-flight data of #28034)."
    )
    plan_stream = True

    def plan_enter(self, ctx) -> None:
        """The missing `plan_stream.wait_stream(caller_stream)`: nothing is enqueued."""


class PlanExitSelfWait(_WarAfterLaunch):
    name = "mutant-plan-exit-self-wait"
    description = (
        "`schedule_stream.wait_stream(plan_stream)` is issued inside the plan-stream context, where the "
        "current stream is the plan stream itself: a self-wait no-op, so the forward can read the "
        "over-allocation before the plan stream wrote it (the fork variant #23000 explicitly avoids)."
    )
    plan_stream = True

    def plan_exit(self, ctx) -> None:
        ctx.plan_stream.wait_stream(ctx.plan_stream)  # `current_stream()` is the plan stream here


class ReadDoneBeforeLastReader(_WarAfterLaunch):
    name = "mutant-read-done-early"
    description = (
        "The forward records `read_done` before the verify page-table build, a reader that follows it, "
        "as a pre-replay event is for a breakable-graph verify that re-reads R during replay (#30261)."
    )

    def after_reads(self, ctx) -> None:
        """Recorded in `before_verify` instead."""

    def before_verify(self, ctx) -> None:
        ctx.state["read_done"] = ctx.forward_stream.record_event("read_done")


class ReusedReadDone(_WarAfterLaunch):
    name = "mutant-reused-read-done"
    description = (
        "One reusable `read_done` event, re-recorded by every decode forward and waited on unconditionally: "
        "a forward that records none (extend) leaves an older forward's record armed, so the barrier binds "
        "to an *older* forward's record and orders too little. Not #31072: there a wait bound to a *newer* "
        "record, which orders more and deadlocked across ranks (#31698's event rings address both)."
    )

    def _event(self, ctx):
        event = ctx.state.get("reused_read_done")
        if event is None:
            event = ctx.state["reused_read_done"] = ctx.device.event("read_done")
        return event

    def after_reads(self, ctx) -> None:
        if ctx.is_decode:
            self._event(ctx).record(ctx.forward_stream)  # re-arms the one event

    def after_launch(self, ctx) -> None:
        # Never None, so the coarse fallback is never taken; before the first record the wait is a no-op.
        ctx.schedule_stream.wait_event(self._event(ctx))


class HeadroomOneBlock(_WarAfterLaunch):
    name = "mutant-headroom-one-block"
    description = (
        "Over-allocation headroom of `committed + B` instead of `committed + 2B`: with the host's committed "
        "length one forward behind, the forward reads R cells nobody allocated for it (the double buffer "
        "#33579 calls the overlap-mode double buffer, halved)."
    )
    headroom_blocks = 1


class SkipCopyDoneSync(_WarAfterLaunch):
    name = "mutant-skip-copy-done"
    description = (
        "Result processing skips `copy_done.synchronize()` (batch_result_processor.py:187), so the host reads "
        "the copied-back tokens / accept lengths before the copy stream's D2H landed: RAW on the host (no "
        "sglang PR of its own: the mutant of model section 7.2)."
    )

    def wait_result(self, ctx, copy_done) -> None:
        """The skipped host sync."""


class BarrierDecodeOnly(_WarAfterLaunch):
    name = "mutant-barrier-decode-only"
    description = (
        "The WAR barrier after run_batch is applied on decode iterations only, so the next chunk's stash "
        "rewrite (and any write after an extend forward) races the extend forward's reads, the gap of "
        "DFLASH's decode-only self-fence before #29556."
    )

    def after_launch(self, ctx) -> None:
        if ctx.is_decode:
            apply_war_barrier(ctx)


class WaitPreviousEvent(_WarAfterLaunch):
    name = "mutant-wait-previous-event"
    description = (
        "The barrier waits on the previous forward's `read_done` (an off-by-one through `last_batch`) "
        "instead of the just-launched forward's, so result-processing rewrites race forward k's reads "
        "(what #31687 set out to fence)."
    )

    def after_reads(self, ctx) -> None:
        ctx.state["current"] = ctx.forward_stream.record_event("read_done") if ctx.is_decode else None

    def after_launch(self, ctx) -> None:
        previous = ctx.state.get("previous")
        if previous is not None:
            ctx.schedule_stream.wait_event(previous)
        else:
            ctx.schedule_stream.wait_stream(ctx.forward_stream)
        ctx.state["previous"] = ctx.state.get("current")


class BarrierWrongStream(_WarAfterLaunch):
    name = "mutant-barrier-wrong-stream"
    description = (
        "The barrier waits on the wrong stream: `forward_stream.wait_event(read_done)` / "
        "`forward_stream.wait_stream(schedule_stream)` (waiter and awaited swapped), which orders nothing "
        "new, so every schedule-stream write after the launch races the forward (#26380's edge reversed)."
    )

    def after_launch(self, ctx) -> None:
        read_done = ctx.state.pop("read_done", None)
        if read_done is not None:
            ctx.forward_stream.wait_event(read_done)
        else:
            ctx.forward_stream.wait_stream(ctx.schedule_stream)


class ReadDoneOnScheduleStream(_WarAfterLaunch):
    name = "mutant-read-done-on-schedule-stream"
    description = (
        "`read_done.record()` is issued outside `forward_stream_ctx`, so it is recorded on the schedule "
        "stream and the barrier's `schedule_stream.wait_event(read_done)` waits on itself (#28363/#29541's "
        "fast path with its event on the wrong stream)."
    )

    def after_reads(self, ctx) -> None:
        if ctx.is_decode:
            ctx.state["read_done"] = ctx.schedule_stream.record_event("read_done")


class RecycledRowUnfenced(_WarAfterLaunch):
    name = "mutant-18744-recycled-row"
    description = (
        "The only WAR fence sits in decode prep (`schedule_stream.wait_stream(forward_stream)` in "
        "prepare_for_decode), so a prefill into the row of a request freed in result k-1 writes it while "
        "forward k, which still contains that request, reads it (#18744, MTPv2 overlap; fixes #18746/#18803)."
    )
    hazards = ("recycled-row-prefill",)

    def prepare_decode(self, ctx) -> None:
        ctx.schedule_stream.wait_stream(ctx.forward_stream)

    def after_launch(self, ctx) -> None:
        """No barrier after the launch."""


class LoopTopBarrier(_WarAfterLaunch):
    name = "mutant-31687-loop-top-barrier"
    description = (
        "The WAR barrier back at the loop top instead of right after run_batch, so `pop_and_process`'s "
        "radix rewrites land while the just-launched forward still reads them (the race #31687 fixed)."
    )

    def loop_top(self, ctx) -> None:
        apply_war_barrier(ctx)

    def after_launch(self, ctx) -> None:
        """Moved to `loop_top`."""


class PlanOverwritesDraftReads(_WarAfterLaunch):
    name = "mutant-28034-plan-overwrite"
    description = (
        "EAGLE-style plan-stream prep: a single block of headroom and a plan stream that does not wait on "
        "the schedule stream, so its write of R[row, seq_len:seq_len+B] lands while the previous forward's "
        "draft still reads those cells (#28034's accept-length loss)."
    )
    hazards = HAZARDS
    plan_stream = True
    headroom_blocks = 1

    def plan_enter(self, ctx) -> None:
        """No `plan_stream.wait_stream(schedule_stream)`: the barrier's edge is not inherited."""


class ReadDoneBeforeReplay(_WarAfterLaunch):
    """Base `read-done-post-replay` (clean under every hazard, replay reads included), mutated back: its
    hooks become war-after-launch's, whose `read_done` is recorded before the replay."""

    name = "mutant-30261-read-done-before-replay"
    description = (
        "With a verify whose CUDA-graph replay re-reads req_to_token, `read_done` is recorded after "
        "`load_batch` and before `replay` (#29541's event position) instead of after the replay, so the "
        "barrier releases result-processing rewrites while the replay still reads the row (#30261; the fix "
        "records read_done_post_replay, decode_cuda_graph_runner.py:1225-1261 at `8905cbd42`)."
    )
    base = "read-done-post-replay"
    hazards: tuple[str, ...] = ALL_HAZARDS + LATER_HAZARDS


class SwaRecoveryFastPath(ReadDone):
    """Base `global-war` with #29353's forced coarse barrier (clean under the SWA and replay hazards),
    mutated to `read-done`'s hooks: the loop-top barrier with the read-done fast path."""

    name = "mutant-29352-swa-fast-path"
    description = (
        "The loop-top barrier takes the read-done fast path (`read_done` recorded after `load_batch`, #29541) "
        "while trtllm_mha translates the SWA window again inside the graph replay, so the locked-full SWA "
        "recovery's clear of a running request's full_to_swa entries lands before the in-flight forward's "
        "in-graph translate (#29352; #29353's SGLANG_FORCE_COARSE_WAR_BARRIER is the base)."
    )
    base = "global-war"
    hazards: tuple[str, ...] = ("swa-mapping", "replay-reads")
    plan_stream: bool | None = None
    equivalent: str | None = None


class ChunkedRowRecycled(_WarAfterLaunch):
    name = "mutant-17850-chunked-row-recycled"
    description = (
        "The pre-#17850 allocator (`027f31405`) frees a chunked request's row between chunks and allocates "
        "it again: the row goes to the back of the free list, the request takes the front one, and a request "
        "admitted later writes its prefix into the old row while the previous chunk's extend may still read it."
    )
    hazards = ("chunked-stash", "recycled-row-prefill")
    recycle_chunked_rows = True
    equivalent = (
        "The WAR barrier fences it: every schedule-stream write of iteration k follows the coarse "
        "`schedule_stream.wait_stream(forward_stream)` issued after launch k-1 (an extend forward publishes no "
        "read_done), so the new owner's prefill write of the old row is ordered after the previous chunk's "
        "extend read. #17850 raced in a loop without that barrier (on `none`, tests/quality/"
        "test_mutant_catalogue.py shows the race)."
    )


class NoRecordStream(RecordStream):
    """Base `record-stream` (clean under every hazard, the tensor-lifetime one included), mutated back."""

    name = "mutant-34076-no-record-stream"
    description = (
        "`resolve_forward_inputs` gathers `output_tokens_buf[mix_running_indices]` on the forward stream and "
        "drops the reference without `mix_running_indices.record_stream(forward_stream)` (overlap_utils.py:84-104 "
        "at `8905cbd42`), so the caching allocator hands the block to the next schedule-stream allocation, which "
        "writes it before the gather ran (#34076: corrupted 19/20 runs with expandable segments or cudaMallocAsync)."
    )
    base = "record-stream"
    hazards: tuple[str, ...] = LIFETIME_HAZARDS
    plan_stream: bool | None = None
    equivalent: str | None = None
    record_stream_mix_indices = False  # the whole mutation: the barrier is the base's


class SwaNoWarBarrier:
    """Base `global-war` (clean under the SWA hazard), mutated back to EAGLE's loop before #26380."""

    name = "mutant-26380-swa-no-barrier"
    description = (
        "EAGLE's overlap loop before #26380 (`163b97012^`): no loop-top `schedule_stream.wait_stream("
        "forward_stream)`; the only sync in decode prep is the blocking H2D of the kv lengths "
        "(`cur_kv_lens_cpu.to(device)` in eagle_info_v2.py `prepare_for_decode`), a schedule-stream sync that "
        "orders nothing on the forward stream, so the SWA allocator's full_to_swa_index_mapping updates race "
        "the previous forward's translate (#26380: 'on the SWA index mapping in particular')."
    )
    base = "global-war"
    hazards: tuple[str, ...] = ("swa-mapping",)
    plan_stream: bool | None = None
    equivalent: str | None = None

    def prepare_decode(self, ctx) -> None:
        # The blocking `.to(device)` waits for the schedule stream only: #26380 made it non_blocking because
        # once the barrier chains S to F it would stall the host for a whole forward.
        ctx.schedule_stream.synchronize()


MUTANTS: dict[str, object] = {
    mutant.name: mutant
    for mutant in (
        PlanNoWaitSchedule(),
        PlanExitSelfWait(),
        ReadDoneBeforeLastReader(),
        ReusedReadDone(),
        HeadroomOneBlock(),
        SkipCopyDoneSync(),
        BarrierDecodeOnly(),
        WaitPreviousEvent(),
        BarrierWrongStream(),
        ReadDoneOnScheduleStream(),
        RecycledRowUnfenced(),
        LoopTopBarrier(),
        PlanOverwritesDraftReads(),
        ReadDoneBeforeReplay(),
        SwaRecoveryFastPath(),
        ChunkedRowRecycled(),
        NoRecordStream(),
        SwaNoWarBarrier(),
    )
}
"""The mutants by name, in the benchmark's order."""
