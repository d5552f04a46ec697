"""Where an sglang version's Python sources come from: a wheel from the package registry, unpacked into a
cache, or a checkout's `python/` directory (a pull request's tree).

* `fetch(version)`: `pip download --no-deps --only-binary=:all: sglang==X` (a manylinux cp311/cp312 wheel,
  whatever this machine's Python is) into `cache_dir(version)`, then unpacks `sglang/**/*.py` (and the
  wheel's directories, empty: sglang's JIT-kernel module checks that its `include/` and `csrc/` exist)
  into `cache_dir(version)/python/`. The wheel is deleted afterwards (the sources are what the harness
  imports; the wheel's bulk is Rust extensions the loop never imports).
* `pack(version, out)`: a slim `.tar.gz` of those sources (about 15 MB for 0.5.23) for a machine without
  network; `unpack(archive)` puts one back into the cache.
* `locate(version=..., source=...)`: the directory to put on `sys.path`, or `SourcesUnavailable` with one
  line naming what is missing.

The cache is `~/.cache/racefuzz/sglang/<version>/`, or `$RACEFUZZ_SGLANG_CACHE/<version>/`. Nothing here
imports sglang or torch.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from racefuzz.errors import InvalidArgument

CACHE_ENV = "RACEFUZZ_SGLANG_CACHE"
_VERSION = re.compile(r"^\d+\.\d+\.\d+(\.post\d+|rc\d+)?$")
MARKER = "sglang/srt/managers/scheduler.py"
"""The file whose presence makes a directory an sglang source tree the harness can import."""


class SourcesUnavailable(InvalidArgument):
    """An sglang version's sources are not here (the message is one line naming what is missing)."""


def check_version(version: str) -> str:
    if not _VERSION.match(version):
        raise InvalidArgument(f"not an sglang version: {version!r} (expected e.g. 0.5.23)")
    return version


def cache_root() -> Path:
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "racefuzz" / "sglang"


def cache_dir(version: str) -> Path:
    return cache_root() / check_version(version)


def python_dir(version: str) -> Path:
    """Where `fetch` unpacks `version`'s sources (the directory holding the `sglang` package)."""
    return cache_dir(version) / "python"


def is_source_tree(path: Path) -> bool:
    return (path / MARKER).is_file()


def locate(version: str | None = None, source: str | Path | None = None) -> Path:
    """The directory holding the `sglang` package of `source` (a checkout's `python/`, or the checkout
    itself) or of the fetched `version`; `SourcesUnavailable` in one line otherwise."""
    if source is not None:
        path = Path(source).expanduser().resolve()
        for candidate in (path, path / "python"):
            if is_source_tree(candidate):
                return candidate
        raise SourcesUnavailable(f"{path} is not an sglang source tree: no {MARKER} in it or in its python/")
    if version is None:
        raise InvalidArgument("give an sglang version (--version X) or a source tree (--source DIR)")
    path = python_dir(version)
    if not is_source_tree(path):
        raise SourcesUnavailable(
            f"sglang {version}'s sources are not in {path}: run `racefuzz sglang fetch --version {version}` "
            f"(or set {CACHE_ENV}, or unpack an archive with `racefuzz sglang fetch --archive FILE`)"
        )
    return path


def wheel_platform_args() -> list[str]:
    """`pip download`'s flags for a wheel of this Python (cp311/cp312...) on manylinux x86_64."""
    major, minor = sys.version_info[:2]
    return ["--python-version", f"{major}.{minor}", "--platform", "manylinux_2_34_x86_64"]


def fetch(version: str, *, python: str = sys.executable, quiet: bool = True) -> Path:
    """Download sglang `version`'s wheel (no dependencies) and unpack its Python sources; returns
    `python_dir(version)`. Already unpacked: returns at once."""
    target = python_dir(version)
    if is_source_tree(target):
        return target
    directory = cache_dir(version)
    directory.mkdir(parents=True, exist_ok=True)
    download = directory / "wheel"
    download.mkdir(exist_ok=True)
    command = [python, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check"]
    command += [*wheel_platform_args(), "-d", str(download), f"sglang=={version}"]
    if quiet:
        command.append("--quiet")
    done = subprocess.run(command, capture_output=True, text=True)
    wheels = sorted(download.glob("sglang-*.whl"))
    if done.returncode != 0 or not wheels:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise SourcesUnavailable(f"pip could not download sglang=={version}: {last}")
    unpack_wheel(wheels[0], target)
    shutil.rmtree(download, ignore_errors=True)
    return target


def unpack_wheel(wheel: Path, target: Path) -> int:
    """Unpack `sglang/**/*.py` of `wheel` and its directories into `target`; returns the file count."""
    staging = Path(tempfile.mkdtemp(prefix="sglang-", dir=target.parent))
    count = 0
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if not name.startswith("sglang/") or ".." in Path(name).parts:
                continue
            (staging / name).parent.mkdir(parents=True, exist_ok=True)
            if name.endswith(".py"):
                (staging / name).write_bytes(archive.read(name))
                count += 1
    if target.exists():
        shutil.rmtree(target)
    staging.rename(target)
    return count


def pack(version: str | None, out: Path, source: str | Path | None = None) -> Path:
    """A `.tar.gz` of a version's (or a source tree's) `sglang/**/*.py` and directories at `out`."""
    root = locate(version, source)
    with tarfile.open(out, "w:gz", compresslevel=9) as archive:
        for directory, _dirs, files in os.walk(root / "sglang"):
            relative = Path(directory).relative_to(root)
            archive.add(directory, arcname=f"python/{relative}", recursive=False)
            for name in sorted(files):
                if name.endswith(".py"):
                    archive.add(Path(directory) / name, arcname=f"python/{relative}/{name}")
    return out


def unpack(archive_path: Path, version: str) -> Path:
    """Put a `pack` archive back as `version`'s sources in the cache; returns `python_dir(version)`."""
    directory = cache_dir(version)
    directory.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="sglang-", dir=directory))
    with tarfile.open(archive_path, "r:gz") as archive:
        try:
            archive.extractall(staging, filter="data")
        except TypeError:  # Python < 3.10.12 has no extraction filters
            archive.extractall(staging)
    if not is_source_tree(staging / "python"):
        shutil.rmtree(staging, ignore_errors=True)
        raise SourcesUnavailable(f"{archive_path} holds no python/{MARKER}: not an archive made by `sglang pack`")
    target = python_dir(version)
    if target.exists():
        shutil.rmtree(target)
    (staging / "python").rename(target)
    shutil.rmtree(staging, ignore_errors=True)
    return target
