"""The overlap-loop properties take their settings from racefuzz's pytest plugin.

`--racefuzz-backend` (auto, sim, cuda; default auto: the GPU when usable), `--racefuzz-examples` (default:
the active Hypothesis profile's max_examples, e.g. `--hypothesis-profile=ci`), `--racefuzz-seed`.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def examples(racefuzz_config) -> int:
    """Examples per property."""
    return racefuzz_config.examples


@pytest.fixture(scope="session")
def backend_name(racefuzz_backend: str) -> str:
    """The resolved backend: `sim` or `cuda`."""
    return racefuzz_backend


@pytest.fixture(scope="session")
def run_program(racefuzz_backend: str):
    """Runs a program under a schedule on the chosen backend."""
    from racefuzz.backends import executor

    return executor(racefuzz_backend)
