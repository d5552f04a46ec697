"""racefuzz: a correctness fuzzer for CUDA stream-ordering races.

The pure core (program IR, device API, happens-before checker, simulator, oracle, schedules, scenarios,
designs) imports neither torch nor CuPy; only `racefuzz.backends.cuda` does, lazily.
"""

from racefuzz.device import Device, EventHandle, StreamHandle
from racefuzz.errors import BackendUnavailable, InvalidArgument, InvalidProgram, RacefuzzError, ReplayError
from racefuzz.hb import Race, RaceKind, find_races
from racefuzz.oracle import Corruption, expected_observations, find_corruptions
from racefuzz.program import Buffer, CellRange, Program
from racefuzz.schedule import Schedule
from racefuzz.sim import Execution, SimConfig, simulate

__version__ = "0.1.0"

__all__ = [
    "BackendUnavailable",
    "Buffer",
    "CellRange",
    "Corruption",
    "Device",
    "EventHandle",
    "Execution",
    "InvalidArgument",
    "InvalidProgram",
    "Program",
    "Race",
    "RaceKind",
    "RacefuzzError",
    "ReplayError",
    "Schedule",
    "SimConfig",
    "StreamHandle",
    "__version__",
    "expected_observations",
    "find_corruptions",
    "find_races",
    "simulate",
]
