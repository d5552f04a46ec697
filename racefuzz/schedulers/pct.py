"""A PCT-style delay strategy (Burckhardt, Kothari, Musuvathi, Nagarakatte, ASPLOS 2010).

PCT takes over a thread scheduler: it gives the n threads random distinct priorities, picks d-1 random
change points among the k steps, always runs the highest-priority enabled thread, and drops the running
thread's priority below all others at each change point; a bug of depth d is found with probability
>= 1/(n k^(d-1)) per run. racefuzz cannot take over the GPU's scheduler, only slow streams down, so the
mapping (docs/model/prior-art.md, section 4) is:

* threads -> the program's streams that launch kernels; steps -> its launches, in host issue order;
* random distinct priorities -> a random permutation of those streams;
* d-1 change points -> d-1 launches drawn among the k; at each, that launch's stream drops to the lowest
  priority from that launch on;
* "run the highest-priority thread" -> every launch of the stream that is lowest at that point gets an
  injected spin of one drawn length L right before it: it falls ever further behind, and the others
  overtake it. A write-after-read needs one ordering constraint (the writer lands before the reader
  loads: d = 1), met with probability about 1/n by making the reader's stream lowest; a read-after-write
  needs the writer's stream lowest.

Everything is decoded from one fixed-length byte string, so Hypothesis shrinks it like the random
strategy's: all-zero bytes are the identity priority order, change points at the first launch, and the
shortest spin.
"""

from __future__ import annotations

from hypothesis import strategies as st

from racefuzz.errors import InvalidArgument
from racefuzz.program import Program
from racefuzz.schedule import Schedule

NAME = "pct"
DESCRIPTION = "PCT-style: random stream priorities, d-1 change points, the lowest stream's launches spun"

DEFAULT_DEPTH = 2
"""d: one change point. Ordering bugs have d = 1; d = 2 also covers a race whose reader and writer both
need to be late relative to a third stream."""

SPIN_STEP_US = 20.0
MAX_SPIN_STEPS = 32
"""L = (1 + byte % 32) * 20 us: 20 to 640 us per delayed launch. Shorter than the random strategy's longest
single delay (5.1 ms), because PCT spins every launch of the lowest stream, not one."""

_MAX_STREAMS = 8


def pct_byte_length(depth: int = DEFAULT_DEPTH) -> int:
    """How many bytes `decode_pct_schedule` reads: L, the priority shuffle, two per change point."""
    if depth < 1:
        raise InvalidArgument(f"pct: depth must be >= 1, got {depth}")
    return 1 + (_MAX_STREAMS - 1) + 2 * (depth - 1)


def pct_bytes(depth: int = DEFAULT_DEPTH) -> st.SearchStrategy[bytes]:
    """The fixed-length byte string `decode_pct_schedule` reads."""
    size = pct_byte_length(depth)
    return st.binary(min_size=size, max_size=size)


def decode_pct_schedule(
    data: bytes, program: Program, *, depth: int = DEFAULT_DEPTH, min_delay_us: float = 0.0
) -> Schedule:
    """The PCT-style schedule `data` stands for on `program` (see the module docstring).

    Contract: delays go only on launches (as `racefuzz.schedulers.random.decode_schedule`'s do), so designs that
    add sync ops but no launches share a schedule; every delay is in [20, 640] us plus `min_delay_us`.
    """
    size = pct_byte_length(depth)
    data = data.ljust(size, b"\0")
    launches = program.launches
    if not launches:
        return Schedule()
    spin = min_delay_us + (1 + data[0] % MAX_SPIN_STEPS) * SPIN_STEP_US
    # Streams that launch anything, in program order; a Fisher-Yates shuffle from the next bytes gives the
    # random distinct priorities (index 0 = highest). Zero bytes leave a fixed order.
    streams = [s.id for s in program.streams if any(op.stream.id == s.id for op in launches)]
    order = list(streams)
    for i in range(len(order) - 1, 0, -1):
        j = data[1 + (len(order) - 1 - i)] % (i + 1)
        order[i], order[j] = order[j], order[i]
    at = 1 + (_MAX_STREAMS - 1)
    change_points = {(data[at + 2 * c] | data[at + 2 * c + 1] << 8) % len(launches) for c in range(depth - 1)}
    delays: dict[int, float] = {}
    for position, launch in enumerate(launches):
        if position in change_points:
            order.remove(launch.stream.id)  # drops to the lowest priority from this launch on
            order.append(launch.stream.id)
        if launch.stream.id == order[-1]:
            delays[launch.index] = spin
    return Schedule(device_delays=delays)


class PctDelays:
    """The PCT-style strategy of depth `depth`, each spin `min_delay_us` longer."""

    name = NAME

    def __init__(self, *, depth: int = DEFAULT_DEPTH, min_delay_us: float = 0.0, **_: object) -> None:
        pct_byte_length(depth)  # validates depth
        self.depth = depth
        self.min_delay_us = min_delay_us

    def strategy(self) -> st.SearchStrategy[bytes]:
        return pct_bytes(self.depth)

    def decode(self, data: bytes, program: Program) -> Schedule:
        return decode_pct_schedule(data, program, depth=self.depth, min_delay_us=self.min_delay_us)
