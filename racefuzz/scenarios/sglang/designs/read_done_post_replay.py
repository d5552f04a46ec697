"""`read-done-post-replay`: the barrier after the launch, with `read_done` recorded after the graph replay.

When the verify's CUDA-graph replay re-reads req_to_token (trtllm_mha's in-graph metadata, #31686; a
breakable-graph verify), a `read_done` recorded after `load_batch` and before `replay` -- #29541's event,
kept by #31687 -- no longer follows every read: #30261. `DecodeCudaGraphRunner` then records
`read_done_post_replay` after the replay instead (decode_cuda_graph_runner.py:1225-1261 at `8905cbd42`).
Here: `war-after-launch`'s barrier right after `run_batch`, waiting on an event recorded at the end of the
decode forward (after the replay); prefill forwards publish none (coarse fallback).
"""

from __future__ import annotations

from racefuzz.scenarios.sglang.designs.global_war import apply_war_barrier


class ReadDonePostReplay:
    name = "read-done-post-replay"
    description = "Barrier after run_batch waiting on read_done recorded after the verify graph replay (#30261's fix)."

    def forward_end(self, ctx) -> None:
        if ctx.is_decode:
            ctx.state["read_done"] = ctx.forward_stream.record_event("read_done_post_replay")

    def after_launch(self, ctx) -> None:
        apply_war_barrier(ctx)


design = ReadDonePostReplay()
