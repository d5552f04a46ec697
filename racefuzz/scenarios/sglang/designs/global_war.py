"""`global-war`: the scheduler's global WAR barrier, which DFLASH joins in sglang PR #29556.

Models `Scheduler._apply_war_barrier` (scheduler.py:1496-1510 at `6582fc1e5`), called at the loop top:
`schedule_stream.wait_event(read_done)` when a runner published a read-done event, else the coarse
`schedule_stream.wait_stream(forward_stream)`. DFLASH published no read-done until #29541, so here it
always takes the fallback. The plan stream inherits the edge through `plan_stream.wait_stream(
schedule_stream)` in `prepare_for_decode` (the scenario's default `plan_enter`).
"""

from __future__ import annotations


def apply_war_barrier(ctx) -> None:
    """The barrier body shared by the designs that use it (fast path, else coarse fallback)."""
    read_done = ctx.state.pop("read_done", None)
    if read_done is not None:
        ctx.schedule_stream.wait_event(read_done)
    else:
        ctx.schedule_stream.wait_stream(ctx.forward_stream)


class GlobalWar:
    name = "global-war"
    description = "Global WAR barrier at the loop top (#29556): wait_event(read_done) else wait_stream(forward)."

    def loop_top(self, ctx) -> None:
        apply_war_barrier(ctx)


design = GlobalWar()
