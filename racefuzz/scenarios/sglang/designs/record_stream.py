"""`record-stream`: `read-done-post-replay` plus #34076's `record_stream` of `mix_running_indices`.

No commit the other designs model carries it: at `8905cbd42` (`read-done-post-replay`'s commit)
`resolve_forward_inputs` (overlap_utils.py:84-104) gathers `output_tokens_buf[batch.mix_running_indices]` on
the forward stream and drops the reference with no `record_stream`, so every other built-in design races on
the `tensor-lifetime` hazard. PR #34076 ("record_stream mix_running_indices for the forward-stream relay
gather") adds `mix_running_indices.record_stream(forward_stream)` there; sglang 0.5.23 carries it
(docs/model/model-audit.md, omitted 3; not re-checked against the 0.5.23 source).
It belongs to designs, not to the loop: the loop is the event loop every design shares, and which sglang
commit carries the call is what tells the designs apart. The WAR barrier cannot stand in for it: the block's
free is ordered on the schedule stream before the barrier ("wait_stream orders execution but does not
protect deallocation", #34076).
"""

from __future__ import annotations

from racefuzz.scenarios.sglang.designs.read_done_post_replay import ReadDonePostReplay


class RecordStream(ReadDonePostReplay):
    name = "record-stream"
    description = (
        "read-done-post-replay's barrier plus mix_running_indices.record_stream(forward_stream) in "
        "resolve_forward_inputs (#34076, sglang 0.5.23): the gathered block is not reused before the gather."
    )
    record_stream_mix_indices = True


design = RecordStream()
