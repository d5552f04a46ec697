"""`read-done`: the global barrier plus DFLASH's fine-grained `read_done` (sglang PR #29541).

`DecodeCudaGraphRunner.execute` (decode_cuda_graph_runner.py:998-1007 at `be17475a1`) records
`read_done` on the forward stream after the verify `load_batch` -- the last read of req_to_token in a
DFLASH decode step -- and before `replay`. Prefill (extend) forwards publish nothing, so the barrier
after a prefill takes the coarse `wait_stream(forward_stream)` fallback.
"""

from __future__ import annotations

from racefuzz.scenarios.sglang.designs.global_war import apply_war_barrier


class ReadDone:
    name = "read-done"
    description = "Global barrier with DFLASH verify publishing read_done after load_batch (#29541)."

    def after_reads(self, ctx) -> None:
        if ctx.is_decode:
            ctx.state["read_done"] = ctx.forward_stream.record_event("read_done")

    def loop_top(self, ctx) -> None:
        apply_war_barrier(ctx)


design = ReadDone()
