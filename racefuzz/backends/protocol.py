"""The executor protocols the search drives, and what every backend returns (`Execution`, made of `Span`s).

A backend runs a recorded `Program` under a `Schedule` and returns an `Execution`: the simulator
(`racefuzz.sim.simulate`) and the CUDA backend (`racefuzz.backends.cuda`) return the same shape, so the
oracles and the reports never care which one ran. `Execution`, `Span` and `HOST` are defined in
`racefuzz.execution` (the pure core, which the simulator imports) and re-exported here. Pure: imports
neither the simulator nor torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from racefuzz.execution import HOST, Execution, Span
from racefuzz.program import Program
from racefuzz.schedule import Schedule

__all__ = ["HOST", "Execution", "Executor", "PreparedRun", "PreparingExecutor", "Span", "StartedRun"]

Executor = Callable[[Program, Schedule], Execution]
"""Runs a program under a schedule to the end. An executor may also have a `prepare` method (see
`PreparingExecutor`), which `racefuzz.search` uses to overlap its host work with the device."""


class StartedRun(Protocol):
    """A run whose ops are all issued; the device may still be running it. It may also have `done()`,
    which says without blocking whether the device has finished it (without, it counts as finished)."""

    def finish(self) -> Execution: ...


class PreparedRun(Protocol):
    """A run ready to issue; `start` issues every op in host order (host delays and syncs included)."""

    def start(self) -> StartedRun: ...


class PreparingExecutor(Protocol):
    """An executor with an asynchronous form: `prepare(p, s).start().finish()` equals `run(p, s)`.

    `prepare` may be called while another run is started but not finished (it must neither synchronize
    the device nor touch that run's memory or streams); `start` is only called once the previous run
    is finished, so that each run has the device to itself.
    """

    def __call__(self, program: Program, schedule: Schedule) -> Execution: ...

    def prepare(self, program: Program, schedule: Schedule) -> PreparedRun: ...
