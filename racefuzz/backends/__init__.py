"""Backends: what runs a recorded `Program` under a `Schedule` and returns an `Execution`.

The simulator (`racefuzz.sim.simulate`) is the CPU backend. `racefuzz.backends.cuda.execute` runs the same
program for real: the kernels of `kernels/*.cu` on torch streams, through CuPy. Both return the same
`Execution`, so the oracle and the reports never care which one ran.

This package is the light, torch-free surface: choosing a backend (`BACKENDS`, `resolve_backend`,
`executor`, `cuda_unavailable_reason`), the result types (`Execution`, `Span`, `HOST`) and the executor
protocols the search drives (`Executor`, `PreparingExecutor`, `PreparedRun`, `StartedRun`). Importing it,
or `racefuzz.backends.cuda`, imports neither torch nor CuPy; they are imported when a GPU run is asked for.
"""

from racefuzz.backends.choice import BACKENDS, cuda_unavailable_reason, executor, resolve_backend
from racefuzz.backends.protocol import (
    HOST,
    Execution,
    Executor,
    PreparedRun,
    PreparingExecutor,
    Span,
    StartedRun,
)

__all__ = [
    "BACKENDS",
    "HOST",
    "Execution",
    "Executor",
    "PreparedRun",
    "PreparingExecutor",
    "Span",
    "StartedRun",
    "cuda_unavailable_reason",
    "executor",
    "resolve_backend",
]
