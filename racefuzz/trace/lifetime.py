"""When a free is a race: the caching allocator's lifetime hazards, placed where the block can be reused.

The recorder records a free where it happens (`Recorder.on_free`: a write of the whole block on the stream
it was allocated on, unless `record_stream` deferred it). The free itself changes no byte: torch's caching
allocator puts the block back in the pool of its allocation stream, and the bytes change only when a later
allocation on that stream is handed the block and its new owner touches them. So a use on another stream
still pending at the free is a race with that reuse, not with the free: none if the reuse is ordered after
the use (the stream waited for it before allocating), and none yet if nothing allocates on that stream
afterwards.

`with_reuse(program)` moves each free's write to its possible reuse: just before the first access of the
first buffer allocated on the free's stream (`Allocation.allocated_on`) from the same pool (the caching
allocator keeps blocks of at most 1 MiB apart from larger ones; a block may be split or merged, so any size
within the pool may get it), first accessed after the free, on the stream of that access. A free that no
later allocation in the program could reuse stays where it is: a race against it is a latent lifetime hazard
(`racefuzz.trace.judge.judge`): harmless in this trace, a corruption as soon as the program allocates on
that stream again (the next iteration of a loop, a new code path), so it is said, not reported as a race.

Pure (no torch): it reads the program only. The reuse point is the new buffer's first access, not its
allocation (allocating touches no byte); a buffer allocated before the free but first accessed after it is
taken as a reuse too (it cannot be handed the block: a race reported there is conservative).
"""

from __future__ import annotations

from racefuzz.program import Launch, Op, Program
from racefuzz.trace.builder import HOST, ProgramBuilder, is_host_order, launch_source

SMALL_BLOCK_BYTES = 1 << 20
"""The caching allocator's small-pool limit (`kSmallSize`): a block of at most this many bytes is reused
only by an allocation of at most this many, a larger one only by a larger one."""


def _pool(nbytes: int) -> bool:
    """Whether a block of `nbytes` is in the small pool."""
    return nbytes <= SMALL_BLOCK_BYTES


def _frees(program: Program) -> list[int]:
    return [
        op.index
        for op in program.ops
        if type(op) is Launch and op.stream.name != HOST and op.info.get("kind") == "free"
    ]


def reuse_points(program: Program) -> dict[int, int]:
    """Index of each free with a possible reuse -> index of the op that reuses it (the first access of a
    buffer allocated later on the free's stream, from the same pool). Buffers are `program.buffers[id]`
    (the one mechanism naming a storage: its buffer id)."""
    buffers = program.buffers
    pending: dict[tuple[str, bool], list[int]] = {}
    seen: set[int] = set()
    reused: dict[int, int] = {}
    for op in program.ops:
        if type(op) is not Launch or op.stream.name == HOST:
            continue
        if op.info.get("kind") == "free":
            for cells in op.writes:
                key = cells.buffer.id
                seen.add(key)
                pending.setdefault((op.stream.name, _pool(buffers[key].cols)), []).append(op.index)
            continue
        for cells in op.writes + op.reads:
            key = cells.buffer.id
            if key in seen:
                continue
            seen.add(key)
            buffer = buffers[key]
            allocated_on = buffer.allocation.allocated_on if buffer.allocation is not None else ""
            if allocated_on:
                for free in pending.pop((allocated_on, _pool(buffer.cols)), ()):
                    reused[free] = op.index
    return reused


def with_reuse(program: Program) -> tuple[Program, list[int], set[int]]:
    """`program` with each free's write moved to its reuse (see the module doc); for each op of the moved
    program the index of the op it stands for in `program`; and the index of every free left where it was
    (no reuse in the program). A moved free names the reuse in its kernel and is on the reuse's stream; the
    host order is emitted again for the moved order (`ProgramBuilder.replay`), as the recorder emits it."""
    reused = reuse_points(program)
    unreused = set(_frees(program)) - set(reused)
    ops = program.ops
    if not reused:
        return program, list(range(len(ops))), unreused
    at_reuse: dict[int, list[Launch]] = {}
    for free_index, reuse_index in reused.items():
        free, reuser = ops[free_index], ops[reuse_index]
        assert type(free) is Launch and type(reuser) is Launch
        source = launch_source(reuser)
        where = f" ({source})" if source else ""
        kernel = f"{free.kernel}, its block reused by {reuser.kernel}{where}"
        at_reuse.setdefault(reuse_index, []).append(free._replace(stream=reuser.stream, kernel=kernel))
    builder = ProgramBuilder.over(program)
    origin: list[int] = []

    def emit(op: Op, stands_for: int) -> None:
        before = len(builder.ops)
        builder.replay(op)
        origin.extend([-1] * (len(builder.ops) - before))
        # A host access is followed by its host-order record; any other op may follow a host-order wait.
        origin[before if type(op) is Launch and op.stream.name == HOST else -1] = stands_for

    for op in ops:
        if op.index in reused or is_host_order(op):
            continue
        for moved_free in at_reuse.get(op.index, ()):
            emit(moved_free, moved_free.index)
        emit(op, op.index)
    return builder.program(), origin, unreused
