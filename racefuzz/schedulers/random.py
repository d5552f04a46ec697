"""The default delay strategy: up to `max_delays` delays, each on a drawn launch.

Each 4 bytes of the drawn string are one delay (kind, launch, launch, length), decoded in the manner of
libFuzzer's FuzzedDataProvider: shrinking the bytes toward zero and the string toward empty means fewer
delays, each toward zero. A delay byte b means b * 20 us: 0 to 5.1 ms, far longer than the simulated
kernels.
"""

from __future__ import annotations

from hypothesis import strategies as st

from racefuzz.errors import InvalidArgument
from racefuzz.program import Program
from racefuzz.schedule import Schedule

NAME = "random"
DESCRIPTION = "up to --max-delays delays, each a read spin, a stream spin or a host delay on a drawn launch"

DELAY_STEP_US = 20.0
"""A delay byte b means b * 20 us."""

_DELAY = 4  # kind, op (2 bytes), length


class RandomDelays:
    """Up to `max_delays` delays on drawn launches, each `min_delay_us` plus a drawn length."""

    name = NAME

    def __init__(self, *, max_delays: int = 4, min_delay_us: float = 0.0, **_: object) -> None:
        if max_delays < 0:
            raise InvalidArgument(f"random delays: max_delays must be >= 0, got {max_delays}")
        self.max_delays = max_delays
        self.min_delay_us = min_delay_us

    def strategy(self) -> st.SearchStrategy[bytes]:
        return schedule_bytes(self.max_delays)

    def decode(self, data: bytes, program: Program) -> Schedule:
        return decode_schedule(data, program, min_delay_us=self.min_delay_us)


def schedule_bytes(max_delays: int = 4) -> st.SearchStrategy[bytes]:
    """The raw bytes `decode_schedule` decodes: up to `max_delays` delays."""
    if max_delays < 0:
        raise InvalidArgument(f"schedules: max_delays must be >= 0, got {max_delays}")
    return st.binary(max_size=_DELAY * max_delays)


def decode_schedule(data: bytes, program: Program, *, min_delay_us: float = 0.0) -> Schedule:
    """The delays a byte string stands for on `program`: each 4 bytes are (kind, launch, launch, length).

    Delays attach to launches only -- a read spin on a reading launch, a spin on the stream before a
    launch, a host delay before issuing a launch -- chosen by position among the launches. Designs add
    sync ops but not launches, so the same bytes put the same delays on the same kernels under every
    design of one workload: that is what lets designs be compared on the same schedule.

    `min_delay_us` is added to every delay: with it far above kernel and launch costs the schedule is
    delay-dominated, the regime in which the simulator's verdict must be the GPU's.
    """
    launches = program.launches
    readers = [op.index for op in launches if op.reads]
    device_delays: dict[int, float] = {}
    read_spins: dict[int, float] = {}
    host_delays: dict[int, float] = {}
    for at in range(0, len(data) - _DELAY + 1, _DELAY):
        kind, lo, hi, length = data[at : at + _DELAY]
        where, us = lo | hi << 8, min_delay_us + length * DELAY_STEP_US
        if kind % 3 == 0 and readers:
            read_spins[readers[where % len(readers)]] = us
        elif kind % 3 == 1 and launches:
            device_delays[launches[where % len(launches)].index] = us
        elif launches:
            host_delays[launches[where % len(launches)].index] = us
    return Schedule(device_delays, read_spins, host_delays)


def schedules(program: Program, *, max_delays: int = 4, min_delay_us: float = 0.0) -> st.SearchStrategy[Schedule]:
    """Up to `max_delays` injected delays on `program`: read spins, spins before launches, host delays."""
    return schedule_bytes(max_delays).map(lambda data: decode_schedule(data, program, min_delay_us=min_delay_us))
