"""racefuzz: a correctness fuzzer for CUDA stream-ordering races.

The pure core (program IR, device API, happens-before checker, simulator, oracle, schedules, scenarios,
designs) imports neither torch nor CuPy; only `racefuzz.backends.cuda` does, lazily. The names below are
loaded on first use, so importing `racefuzz` (as its pytest plugin does in every test session) costs
nothing until racefuzz is actually used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_EXPORTS = {
    "Device": "racefuzz.device",
    "EventHandle": "racefuzz.device",
    "StreamHandle": "racefuzz.device",
    "BackendUnavailable": "racefuzz.errors",
    "InvalidArgument": "racefuzz.errors",
    "InvalidProgram": "racefuzz.errors",
    "RacefuzzError": "racefuzz.errors",
    "ReplayError": "racefuzz.errors",
    "Race": "racefuzz.hb",
    "RaceKind": "racefuzz.hb",
    "find_races": "racefuzz.hb",
    "Corruption": "racefuzz.oracle",
    "expected_observations": "racefuzz.oracle",
    "find_corruptions": "racefuzz.oracle",
    "Buffer": "racefuzz.program",
    "CellRange": "racefuzz.program",
    "Program": "racefuzz.program",
    "Schedule": "racefuzz.schedule",
    "Execution": "racefuzz.backends",
    "SimConfig": "racefuzz.sim",
    "simulate": "racefuzz.sim",
}

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


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'racefuzz' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:  # for type checkers and IDEs; never executed
    from racefuzz.backends import Execution
    from racefuzz.device import Device, EventHandle, StreamHandle
    from racefuzz.errors import BackendUnavailable, InvalidArgument, InvalidProgram, RacefuzzError, ReplayError
    from racefuzz.hb import Race, RaceKind, find_races
    from racefuzz.oracle import Corruption, expected_observations, find_corruptions
    from racefuzz.program import Buffer, CellRange, Program
    from racefuzz.schedule import Schedule
    from racefuzz.sim import SimConfig, simulate
