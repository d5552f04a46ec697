"""Settings for the overlap-loop properties: which backend, how many examples.

`RACEFUZZ_BACKEND` (auto, sim, cuda; default auto: the GPU when one is usable) and `RACEFUZZ_EXAMPLES`
(default 200) choose them.
"""

from __future__ import annotations

import os

import pytest

from racefuzz.backend import executor, resolve_backend


@pytest.fixture(scope="session")
def examples() -> int:
    """Examples per property (RACEFUZZ_EXAMPLES, default 200)."""
    raw = os.environ.get("RACEFUZZ_EXAMPLES", "200")
    try:
        value = int(raw)
    except ValueError:
        raise pytest.UsageError(f"RACEFUZZ_EXAMPLES must be a positive integer, got {raw!r}") from None
    if value < 1:
        raise pytest.UsageError(f"RACEFUZZ_EXAMPLES must be a positive integer, got {value}")
    return value


@pytest.fixture(scope="session")
def backend_name() -> str:
    """The resolved backend: `sim` or `cuda`."""
    return resolve_backend(os.environ.get("RACEFUZZ_BACKEND", "auto"))


@pytest.fixture(scope="session")
def run_program(backend_name: str):
    """Runs a program under a schedule on the chosen backend."""
    return executor(backend_name)
