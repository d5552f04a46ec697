"""`self-event`: DFLASH's own `verify_done` fence, before sglang PR #29556.

Models `dflash_info_v2.py` at `6582fc1e5^`, with the global barrier disabled for DFLASH
(`_war_barrier_enabled = ... and not is_dflash()`):
* `DFlashWorkerV2.forward_batch_generation` records a fresh `verify_done` on the forward stream at the
  end of every forward (decode :1735-1737, prefill :1334-1336), carried on the running batch's spec_info;
  `merge_batch` keeps the running (left-hand) batch's, so after a prefill the fence stays the last
  decode forward's event unless there was no running batch;
* `prepare_for_decode` (decode iterations only) fences on it: `verify_done.synchronize()` on the host
  without a plan stream (:129-131, ~2.1 ms a step), `plan_stream.wait_event(verify_done)` with one
  (:195-196).
"""

from __future__ import annotations


class SelfEvent:
    name = "self-event"
    description = "DFLASH verify_done fence before #29556: host sync, or plan_stream.wait_event with a plan stream."

    def forward_end(self, ctx) -> None:
        event = ctx.forward_stream.record_event("verify_done")
        if ctx.is_decode or "verify_done" not in ctx.state:
            ctx.state["verify_done"] = event

    def prepare_decode(self, ctx) -> None:
        verify_done = ctx.state.get("verify_done")
        if ctx.plan_stream is None and verify_done is not None:
            verify_done.synchronize()

    def plan_fence(self, ctx) -> None:
        verify_done = ctx.state.get("verify_done")
        if verify_done is not None:
            ctx.plan_stream.wait_event(verify_done)


design = SelfEvent()
