"""When a free is a race: the caching allocator's lifetime hazards, placed where the block can be reused.

The recorder records a free where it happens (`Recorder.on_free`: a write of the whole block on the stream
it was allocated on, unless `record_stream` deferred it). The free itself changes no byte: torch's caching
allocator puts the block back in the pool of its allocation stream, and the bytes change only when a later
allocation on that stream is handed the block and its new owner touches them. So a use on another stream
still pending at the free is a race with that reuse, not with the free: none if the reuse is ordered after
the use (the stream waited for it before allocating), and none yet if nothing allocates on that stream
afterwards.

`with_reuse(trace)` moves each free's write to its possible reuse: just before the first access of the
first storage allocated on the free's stream (`Storage.allocated_on`) from the same pool (the caching
allocator keeps blocks of at most 1 MiB apart from larger ones; a block may be split or merged, so any size
within the pool may get it), first accessed after the free, on the stream of that access. A free that no
later allocation in the trace could reuse stays where it is: a race against it is a latent lifetime hazard
(`racefuzz.trace.convert.judge_trace`): harmless in this trace, a corruption as soon as the program
allocates on that stream again (the next iteration of a loop, a new code path), so it is said, not
reported as a race.

Pure (no torch): it reads the trace only. The reuse point is the new storage's first access, not its
allocation (allocating touches no byte); a storage allocated before the free but first accessed after it is
taken as a reuse too (it cannot be handed the block: a race reported there is conservative).
"""

from __future__ import annotations

from racefuzz.trace.model import HOST, Trace, TraceLaunch, TraceOp

SMALL_BLOCK_BYTES = 1 << 20
"""The caching allocator's small-pool limit (`kSmallSize`): a block of at most this many bytes is reused
only by an allocation of at most this many, a larger one only by a larger one."""


def _pool(nbytes: int) -> bool:
    """Whether a block of `nbytes` is in the small pool."""
    return nbytes <= SMALL_BLOCK_BYTES


def reuse_points(trace: Trace) -> dict[int, int]:
    """Position (in `trace.ops`) of each free with a possible reuse -> position of the op that reuses it (the
    first access of a storage allocated later on the free's stream, from the same pool)."""
    storages = trace.storages
    pending: dict[tuple[str, bool], list[int]] = {}
    seen: set[int] = set()
    reused: dict[int, int] = {}
    for position, op in enumerate(trace.ops):
        if type(op) is not TraceLaunch or op.stream == HOST:
            continue
        if op.kind == "free":
            for access in op.writes:
                seen.add(access.storage)
                pending.setdefault((op.stream, _pool(storages[access.storage].nbytes)), []).append(position)
            continue
        for access in op.writes + op.reads:
            if access.storage in seen:
                continue
            seen.add(access.storage)
            storage = storages[access.storage]
            if storage.allocated_on:
                for free in pending.pop((storage.allocated_on, _pool(storage.nbytes)), ()):
                    reused[free] = position
    return reused


def with_reuse(trace: Trace) -> tuple[Trace, set[int]]:
    """`trace` with each free's write moved to its reuse (see the module doc), and the `index` of every free
    left where it was (no reuse in the trace). A moved free keeps its index and source (where the block was
    released: where a `record_stream` or a wait belongs) and names the reuse in its kernel."""
    reused = reuse_points(trace)
    ops = trace.ops
    unreused = {op.index for op in ops if type(op) is TraceLaunch and op.kind == "free" and op.stream != HOST}
    if not reused:
        return trace, unreused
    at_reuse: dict[int, list[TraceLaunch]] = {}
    for free_position, reuse_position in reused.items():
        free, reuser = ops[free_position], ops[reuse_position]
        assert type(free) is TraceLaunch and type(reuser) is TraceLaunch
        unreused.discard(free.index)
        where = f" ({reuser.source})" if reuser.source else ""
        at_reuse.setdefault(reuse_position, []).append(
            free._replace(stream=reuser.stream, kernel=f"{free.kernel}, its block reused by {reuser.kernel}{where}")
        )
    moved: list[TraceOp] = []
    for position, op in enumerate(ops):
        if position in reused:
            continue
        moved.extend(at_reuse.get(position, ()))
        moved.append(op)
    return Trace(trace.storages, trace.streams, moved, trace.assumed_kernels, trace.whole_view_indexing), unreused
