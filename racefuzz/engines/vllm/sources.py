"""Where a vLLM version's Python sources come from: its wheel from the package registry, unpacked into a
cache, or a checkout (a pull request's tree).

* `fetch(version)`: `pip download --no-deps --only-binary=:all: vllm==X` (vLLM ships one `abi3` manylinux
  wheel per release) into `cache_dir(version)`, then unpacks `vllm/**/*.py` into `cache_dir(version)/python/`
  and deletes the wheel (its bulk is CUDA extensions the harness never imports).
* `locate(version=..., source=...)`: the directory to put on `sys.path`, or `SourcesUnavailable` in one line.

The cache is `~/.cache/racefuzz/vllm/<version>/`, or `$RACEFUZZ_VLLM_CACHE/<version>/`. Nothing here imports
vLLM or torch.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from racefuzz.errors import InvalidArgument

CACHE_ENV = "RACEFUZZ_VLLM_CACHE"
_VERSION = re.compile(r"^\d+\.\d+\.\d+(\.post\d+|rc\d+)?$")
MARKER = "vllm/v1/worker/gpu_model_runner.py"
"""The file whose presence makes a directory a vLLM source tree the harness can import."""


class SourcesUnavailable(InvalidArgument):
    """A vLLM version's sources are not here (the message is one line naming what is missing)."""


def check_version(version: str) -> str:
    if not _VERSION.match(version):
        raise InvalidArgument(f"not a vLLM version: {version!r} (expected e.g. 0.33.0)")
    return version


def cache_root() -> Path:
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "racefuzz" / "vllm"


def python_dir(version: str) -> Path:
    """Where `fetch` unpacks `version`'s sources (the directory holding the `vllm` package)."""
    return cache_root() / check_version(version) / "python"


def is_source_tree(path: Path) -> bool:
    return (path / MARKER).is_file()


def locate(version: str | None = None, source: str | Path | None = None) -> Path:
    """The directory holding the `vllm` package of `source` (a checkout) or of the fetched `version`."""
    if source is not None:
        path = Path(source).expanduser().resolve()
        if is_source_tree(path):
            return path
        raise SourcesUnavailable(f"{path} is not a vLLM source tree: no {MARKER} in it")
    if version is None:
        raise InvalidArgument("give a vLLM version (--version X) or a source tree (--source DIR)")
    path = python_dir(version)
    if not is_source_tree(path):
        raise SourcesUnavailable(
            f"vLLM {version}'s sources are not in {path}: run `racefuzz vllm fetch --version {version}` "
            f"(or set {CACHE_ENV})"
        )
    return path


def fetch(version: str, *, python: str = sys.executable) -> Path:
    """Download vLLM `version`'s wheel (no dependencies) and unpack its Python sources; returns
    `python_dir(version)`. Already unpacked: returns at once."""
    target = python_dir(version)
    if is_source_tree(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    download = Path(tempfile.mkdtemp(prefix="wheel-", dir=target.parent))
    command = [python, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check"]
    command += ["--quiet", "-d", str(download), f"vllm=={version}"]
    try:
        done = subprocess.run(command, capture_output=True, text=True)
        wheels = sorted(download.glob("vllm-*.whl"))
        if done.returncode != 0 or not wheels:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise SourcesUnavailable(f"pip could not download vllm=={version}: {last}")
        unpack_wheel(wheels[0], target)
    finally:
        shutil.rmtree(download, ignore_errors=True)
    return target


def unpack_wheel(wheel: Path, target: Path) -> int:
    """Unpack `vllm/**/*.py` of `wheel` into `target`; returns the file count."""
    staging = Path(tempfile.mkdtemp(prefix="vllm-", dir=target.parent))
    count = 0
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name.startswith("vllm/") and name.endswith(".py") and ".." not in Path(name).parts:
                (staging / name).parent.mkdir(parents=True, exist_ok=True)
                (staging / name).write_bytes(archive.read(name))
                count += 1
    if target.exists():
        shutil.rmtree(target)
    staging.rename(target)
    return count
