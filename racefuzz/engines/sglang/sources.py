"""Where an sglang version's Python sources come from (`racefuzz.engines.sources`, one mechanism for every
engine): a wheel from the package registry, unpacked into a cache, or a checkout's `python/` directory (a
pull request's tree).

* `fetch(version)`: `pip download --no-deps --only-binary=:all: sglang==X` (a manylinux cp311/cp312 wheel,
  whatever this machine's Python is), then `sglang/**/*.py` and the wheel's directories, empty ones
  included (sglang's JIT-kernel module checks that its `include/` and `csrc/` exist), unpacked into
  `python_dir(version)`; the wheel's bulk is Rust extensions the loop never imports.
* `pack(version, out)`: a slim `.tar.gz` of those sources (about 15 MB for 0.5.23) for a machine without
  network; `unpack(archive, version)` puts one back into the cache.
* `locate(version=..., source=...)`: the directory to put on `sys.path`, or `SourcesUnavailable` with one
  line naming what is missing.

The cache is `~/.cache/racefuzz/sglang/<version>/`, or `$RACEFUZZ_SGLANG_CACHE/<version>/`. Nothing here
imports sglang or torch.
"""

from __future__ import annotations

import os
from pathlib import Path

from racefuzz.engines.sources import EngineSources, SourcesUnavailable

SGLANG = EngineSources(
    package="sglang",
    display="sglang",
    article="an",
    example_version="0.5.23",
    marker="sglang/srt/managers/scheduler.py",
    cache_env="RACEFUZZ_SGLANG_CACHE",
    source_subdirs=("", "python"),
    platform_wheel=True,
    keep_directories=True,
)
CACHE_ENV = SGLANG.cache_env
MARKER = SGLANG.marker
"""The file whose presence makes a directory an sglang source tree the harness can import."""

check_version = SGLANG.check_version
cache_root = SGLANG.cache_root
cache_dir = SGLANG.cache_dir
python_dir = SGLANG.python_dir
is_source_tree = SGLANG.is_source_tree
locate = SGLANG.locate
fetch = SGLANG.fetch
unpack_wheel = SGLANG.unpack_wheel
unpack = SGLANG.unpack


def pack(version: str | None, out: Path, source: str | Path | None = None) -> tuple[Path, int, int]:
    """A `.tar.gz` at `out` of a version's (or a source tree's) `sglang/**/*.py` and directories, under
    `python/`; returns the path, the file count and their bytes (uncompressed)."""
    root = locate(version, source)
    names: list[str] = []
    for directory, _dirs, files in os.walk(root / "sglang"):
        relative = Path(directory).relative_to(root)
        names.append(str(relative))
        names += [str(relative / name) for name in sorted(files) if name.endswith(".py")]
    return SGLANG.write_archive(root, names, out)


__all__ = [
    "CACHE_ENV",
    "MARKER",
    "SGLANG",
    "SourcesUnavailable",
    "cache_dir",
    "cache_root",
    "check_version",
    "fetch",
    "is_source_tree",
    "locate",
    "pack",
    "python_dir",
    "unpack",
    "unpack_wheel",
]
