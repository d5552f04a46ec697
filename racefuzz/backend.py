"""Choosing a backend: the simulator, or real kernels on a GPU (`auto` picks the GPU when there is one)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from racefuzz.errors import BackendUnavailable, InvalidArgument
from racefuzz.program import Program
from racefuzz.schedule import Schedule
from racefuzz.sim import Execution, simulate

BACKENDS = ("auto", "sim", "cuda")

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


def cuda_unavailable_reason() -> str | None:
    """None when the CUDA backend can run here, else why not (one line)."""
    try:
        from racefuzz.backends import cuda
    except ImportError as exc:  # the backend module itself is missing from this installation
        return f"the CUDA backend is not installed ({exc})"
    return cuda.cuda_unavailable_reason()


def resolve_backend(name: str) -> str:
    """`sim` or `cuda`; `auto` is `cuda` when a GPU is usable here, else `sim`."""
    if name not in BACKENDS:
        raise InvalidArgument(f"unknown backend {name!r}; choose from {', '.join(BACKENDS)}")
    if name == "auto":
        return "cuda" if cuda_unavailable_reason() is None else "sim"
    if name == "cuda":
        reason = cuda_unavailable_reason()
        if reason is not None:
            raise BackendUnavailable(f"--backend cuda: {reason}")
    return name


def executor(name: str) -> Executor:
    """The function that runs a program under a schedule on backend `name` (`sim` or `cuda`; the CUDA one is
    a `PreparingExecutor`).

    Neither tracks which launch stored each loaded value (`Execution.writers` is None) nor records a
    timeline: on the simulator `explain` and the timeline writer re-run a counterexample with them, which
    is deterministic.
    """
    if name == "sim":
        return lambda program, schedule: simulate(program, schedule, record_timeline=False)
    if name == "cuda":
        from racefuzz.backends import cuda

        return cuda.CudaExecutor()
    raise InvalidArgument(f"backend {name!r} is not resolved; call resolve_backend first")
