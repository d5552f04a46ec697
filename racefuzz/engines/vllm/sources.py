"""Where a vLLM version's Python sources come from (`racefuzz.engines.sources`, one mechanism for every
engine): its wheel from the package registry, unpacked into a cache, or a checkout (a pull request's tree).

* `fetch(version)`: `pip download --no-deps --only-binary=:all: vllm==X` (vLLM ships one `abi3` manylinux
  wheel per release), then `vllm/**/*.py` unpacked into `python_dir(version)` (the wheel's bulk is CUDA
  extensions the harness never imports).
* `locate(version=..., source=...)`: the directory to put on `sys.path`, or `SourcesUnavailable` in one line.
* `pack(version, out)`: a slim `.tar.gz` of the files the harness imports (`slim_files`), for a GPU host
  without network; `unpack(archive, version)` puts one back in the cache (`racefuzz vllm fetch --archive`).

The cache is `~/.cache/racefuzz/vllm/<version>/`, or `$RACEFUZZ_VLLM_CACHE/<version>/`. Nothing here imports
vLLM or torch.
"""

from __future__ import annotations

import os
from pathlib import Path

from racefuzz.engines.sources import EngineSources, SourcesUnavailable

VLLM = EngineSources(
    package="vllm",
    display="vLLM",
    article="a",
    example_version="0.33.0",
    marker="vllm/v1/worker/gpu_model_runner.py",
    cache_env="RACEFUZZ_VLLM_CACHE",
)
CACHE_ENV = VLLM.cache_env
MARKER = VLLM.marker
"""The file whose presence makes a directory a vLLM source tree the harness can import."""

check_version = VLLM.check_version
cache_root = VLLM.cache_root
python_dir = VLLM.python_dir
is_source_tree = VLLM.is_source_tree
locate = VLLM.locate
fetch = VLLM.fetch
unpack_wheel = VLLM.unpack_wheel
unpack = VLLM.unpack


def imported_by_harness(python_dir: Path, *, timeout: float = 900.0) -> list[str]:
    """The files of `python_dir`'s vLLM that the harness imports on the CPU (the fixed workload, with its
    control), relative to `python_dir`: the harness subprocess's `--list-imports`."""
    from racefuzz.engines.harness_process import run_json_process

    env = dict(os.environ, PYTHONWARNINGS="ignore", VLLM_LOGGING_LEVEL="ERROR")
    result = run_json_process("racefuzz.engines.vllm.harness", python_dir, ["--list-imports"], timeout=timeout, env=env)
    if result.get("status") != "ok":
        raise SourcesUnavailable(f"pack: the harness failed on {python_dir}: {result.get('error')}")
    return list(result["imported"])


def slim_files(python_dir: Path, imported: list[str]) -> list[str]:
    """What a slim archive holds: every `.py` file of each directory the harness imports a file from (the
    imported ones and their siblings, not subdirectories): a GPU run's other branches import a sibling of
    what the CPU run imported (`vllm/platforms/`'s, `vllm/v1/sample/ops/`'s), rarely a new package."""
    directories = {str(Path(name).parent) for name in imported}
    files = set(imported)
    for directory in directories:
        files.update(str(Path(directory) / p.name) for p in (python_dir / directory).glob("*.py"))
    return sorted(files)


def pack(version: str | None, out: Path, source: str | Path | None = None) -> tuple[Path, int, int]:
    """A `.tar.gz` at `out` of a version's (or a source tree's) files `slim_files` names (and
    `vllm/_version.py`), under `python/`; returns the path, the file count and their bytes (uncompressed)."""
    root = locate(version, source)
    files = slim_files(root, imported_by_harness(root))
    if (root / "vllm" / "_version.py").is_file() and "vllm/_version.py" not in files:
        files.append("vllm/_version.py")
    return VLLM.write_archive(root, files, out)


__all__ = [
    "CACHE_ENV",
    "MARKER",
    "VLLM",
    "SourcesUnavailable",
    "cache_root",
    "check_version",
    "fetch",
    "imported_by_harness",
    "is_source_tree",
    "locate",
    "pack",
    "python_dir",
    "slim_files",
    "unpack",
    "unpack_wheel",
]
