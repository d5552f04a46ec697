"""Choosing a backend: the simulator, or real kernels on a GPU (`auto` picks the GPU when there is one)."""

from __future__ import annotations

from racefuzz.backends.protocol import Executor
from racefuzz.errors import BackendUnavailable, InvalidArgument

BACKENDS = ("auto", "sim", "cuda")


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
        from racefuzz.sim import simulate  # here: the simulator imports this package's protocol module

        return lambda program, schedule: simulate(program, schedule, record_timeline=False)
    if name == "cuda":
        from racefuzz.backends import cuda

        return cuda.CudaExecutor()
    raise InvalidArgument(f"backend {name!r} is not resolved; call resolve_backend first")
