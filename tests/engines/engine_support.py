"""What the engine tests share: an engine version's sources or a skip that says why, and a harness result
computed once per test session.

Not a test module: pytest puts this folder on `sys.path` for its test modules (they have no package), which
import it as `engine_support`."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest


def sources_or_skip(sources: ModuleType, engine: str, version: str) -> Path:
    """`sources.locate(version=version)` (`racefuzz.engines.sglang.sources` or `...vllm.sources`), or the test
    skipped, naming the engine, the version and why its sources are not here."""
    try:
        return sources.locate(version=version)
    except sources.SourcesUnavailable as exc:
        pytest.skip(f"{engine} {version}'s sources are not here: {exc}")


def once_per_session(tmp_path_factory: pytest.TempPathFactory, name: str, compute: Callable[[], Any]) -> Any:
    """`compute()` (a JSON-able harness result) once per test session, kept under `name`: with pytest-xdist
    its workers share it through a file under a lock in the session's directory (each harness run costs a
    subprocess importing the engine). The directory is this session's, never an earlier one's: alone,
    pytest's base temporary directory is the session's; under xdist it is a worker's folder in it."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    cache = (base.parent if "PYTEST_XDIST_WORKER" in os.environ else base) / f"{name}.json"
    with FileLock(f"{cache}.lock"):
        if cache.is_file():
            return json.loads(cache.read_text())
        result = compute()
        cache.write_text(json.dumps(result))
        return result
