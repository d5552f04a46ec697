"""`war-after-launch`: the WAR barrier moved to right after `run_batch` (sglang PR #31687).

At `cce5fe769` `_apply_war_barrier` runs just after `batch_result = self.run_batch(batch)`, so the
result-processing writes of `pop_and_process` (radix rewrites, SWA updates) are fenced behind the
just-launched forward's reads; iterations with no batch apply no barrier. The read-done fast path of
#29541 is kept.
"""

from __future__ import annotations

from racefuzz.scenarios.sglang.designs.global_war import apply_war_barrier


class WarAfterLaunch:
    name = "war-after-launch"
    description = "WAR barrier right after run_batch (#31687): also fences post-launch result processing."

    def after_reads(self, ctx) -> None:
        if ctx.is_decode:
            ctx.state["read_done"] = ctx.forward_stream.record_event("read_done")

    def after_launch(self, ctx) -> None:
        apply_war_barrier(ctx)


design = WarAfterLaunch()
