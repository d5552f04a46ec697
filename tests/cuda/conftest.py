"""Every test under tests/cuda needs a CUDA GPU with torch CUDA and CuPy.

Each one gets the `cuda` marker here (so `-m "not cuda"` deselects them); racefuzz's pytest plugin then
skips every `cuda`-marked test with the reason where no GPU is usable, e.g. on CPU CI:
"needs a CUDA GPU: torch 2.13.0+cpu is a CPU-only build: ...".
"""

from __future__ import annotations

from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # before the mark plugin deselects by `-m`, and before the plugin skips
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A conftest's collection hook sees every collected item, not just this folder's.
    for item in items:
        if _HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.cuda)
