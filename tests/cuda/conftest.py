"""Every test under tests/cuda needs a CUDA GPU with torch CUDA and CuPy.

Each one gets the `cuda` marker (so `-m "not cuda"` deselects them) and, where
`cuda_unavailable_reason()` names a reason, a skip that says it, e.g. on CPU CI:
"needs a CUDA GPU: torch 2.13.0+cpu is a CPU-only build: ...".
"""

from __future__ import annotations

from pathlib import Path

import pytest

from racefuzz.backends.cuda import cuda_unavailable_reason

_HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # before the mark plugin deselects by `-m`
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A conftest's collection hook sees every collected item, not just this folder's.
    ours = [item for item in items if _HERE in Path(item.path).resolve().parents]
    if not ours:
        return
    reason = cuda_unavailable_reason()
    for item in ours:
        item.add_marker(pytest.mark.cuda)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=f"needs a CUDA GPU: {reason}"))

