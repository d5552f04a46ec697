"""Where the CUDA sources (`kernels/*.cu`) are, installed or in a source checkout.

A wheel ships them as `racefuzz/kernels/` (see pyproject.toml's force-include), found through
`importlib.resources`; a source checkout or editable install keeps them at the repository's top level.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from racefuzz.errors import BackendUnavailable


def kernel_dir() -> Path:
    """The folder holding the `.cu` sources."""
    packaged = resources.files("racefuzz") / "kernels"
    if packaged.is_dir():
        return Path(str(packaged))
    checkout = Path(__file__).resolve().parent.parent / "kernels"
    if checkout.is_dir():
        return checkout
    raise BackendUnavailable("racefuzz's CUDA sources (kernels/*.cu) are missing from this installation")


def kernel_source(name: str = "req_to_token.cu") -> str:
    """The text of one `.cu` source file."""
    path = kernel_dir() / name
    if not path.is_file():
        raise BackendUnavailable(f"CUDA source {name} not found in {path.parent}")
    return path.read_text()
