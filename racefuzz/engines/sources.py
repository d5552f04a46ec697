"""Where an engine version's Python sources come from, one mechanism for sglang and vLLM: the version's
wheel from the package registry, unpacked into a cache, or a checkout (a pull request's tree).

* `EngineSources.fetch(version)`: `pip download --no-deps --only-binary=:all: <package>==X` into a
  temporary directory of the version's cache directory, then unpacks `<package>/**/*.py` (and, where the
  engine keeps them, the wheel's directories, empty ones included) into `<cache>/<version>/python/`; the
  wheel is deleted (its bulk is compiled extensions the harness never imports).
* `EngineSources.locate(version=..., source=...)`: the directory to put on `sys.path`, or
  `SourcesUnavailable` with one line naming what is missing.
* `EngineSources.write_archive(root, names, out)`: a `.tar.gz` of `names` under `python/`, for a GPU host
  without network; `EngineSources.unpack(archive, version)` puts one back in the cache.

What differs between the engines is data (`EngineSources`' fields: the package, the file that marks a
tree, the cache's environment variable, which wheel to ask for, what to keep); which files a slim archive
holds is the engine's own (`engines/sglang/sources.py`, `engines/vllm/sources.py`). Nothing here imports
an engine or torch.
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
from dataclasses import dataclass
from pathlib import Path

from racefuzz.errors import InvalidArgument

_VERSION = re.compile(r"^\d+\.\d+\.\d+(\.post\d+|rc\d+)?$")


class SourcesUnavailable(InvalidArgument):
    """An engine version's sources are not here (the message is one line naming what is missing)."""


@dataclass(frozen=True)
class EngineSources:
    """One engine's sources: where they are cached, what marks a tree of them, which wheel holds them."""

    package: str
    """The import package, the wheel's distribution name and the CLI subcommand (`sglang`, `vllm`)."""
    display: str
    """The engine's name in messages (`sglang`, `vLLM`), after `article` (`an`, `a`)."""
    article: str
    example_version: str
    """A version the harness drives, shown when a version is malformed."""
    marker: str
    """The file whose presence makes a directory a source tree the harness can import."""
    cache_env: str
    """The environment variable that moves the cache (`<it>/<version>/` instead of the default)."""
    source_subdirs: tuple[str, ...] = ("",)
    """Where under a `--source` directory the tree may be (`python` for sglang's checkout layout)."""
    platform_wheel: bool = False
    """Ask pip for a wheel of this Python on manylinux x86_64 (sglang's are per-CPython); else any (vLLM's
    one abi3 wheel)."""
    keep_directories: bool = False
    """Unpack the wheel's directories too, empty ones included (sglang's JIT-kernel module checks that its
    `include/` and `csrc/` exist)."""

    def check_version(self, version: str) -> str:
        if not _VERSION.match(version):
            raise InvalidArgument(
                f"not {self.article} {self.display} version: {version!r} (expected e.g. {self.example_version})"
            )
        return version

    def cache_root(self) -> Path:
        configured = os.environ.get(self.cache_env)
        if configured:
            return Path(configured).expanduser()
        return Path.home() / ".cache" / "racefuzz" / self.package

    def cache_dir(self, version: str) -> Path:
        return self.cache_root() / self.check_version(version)

    def python_dir(self, version: str) -> Path:
        """Where `fetch` unpacks `version`'s sources (the directory holding the package)."""
        return self.cache_dir(version) / "python"

    def is_source_tree(self, path: Path) -> bool:
        return (path / self.marker).is_file()

    def locate(self, version: str | None = None, source: str | Path | None = None) -> Path:
        """The directory holding the package of `source` (a checkout, or one of its `source_subdirs`) or of
        the fetched `version`; `SourcesUnavailable` in one line otherwise."""
        if source is not None:
            path = Path(source).expanduser().resolve()
            for subdir in self.source_subdirs:
                if self.is_source_tree(path / subdir):
                    return path / subdir
            where = "".join(f" or in its {subdir}/" for subdir in self.source_subdirs if subdir)
            raise SourcesUnavailable(
                f"{path} is not {self.article} {self.display} source tree: no {self.marker} in it{where}"
            )
        if version is None:
            raise InvalidArgument(
                f"give {self.article} {self.display} version (--version X) or a source tree (--source DIR)"
            )
        path = self.python_dir(version)
        if not self.is_source_tree(path):
            raise SourcesUnavailable(
                f"{self.display} {version}'s sources are not in {path}: run `racefuzz {self.package} fetch "
                f"--version {version}` (or set {self.cache_env}, or unpack an archive with "
                f"`racefuzz {self.package} fetch --archive FILE`)"
            )
        return path

    def wheel_args(self) -> list[str]:
        """`pip download`'s flags choosing the wheel: this Python (cp311/cp312...) on manylinux x86_64 where
        the engine builds one wheel per CPython, none otherwise."""
        if not self.platform_wheel:
            return []
        major, minor = sys.version_info[:2]
        return ["--python-version", f"{major}.{minor}", "--platform", "manylinux_2_34_x86_64"]

    def fetch(self, version: str, *, python: str = sys.executable) -> Path:
        """Download `version`'s wheel (no dependencies) and unpack its Python sources; returns
        `python_dir(version)`. Already unpacked: returns at once."""
        target = self.python_dir(version)
        if self.is_source_tree(target):
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        download = Path(tempfile.mkdtemp(prefix="wheel-", dir=target.parent))
        command = [python, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check"]
        command += ["--quiet", *self.wheel_args(), "-d", str(download), f"{self.package}=={version}"]
        try:
            done = subprocess.run(command, capture_output=True, text=True)
            wheels = sorted(download.glob(f"{self.package}-*.whl"))
            if done.returncode != 0 or not wheels:
                last = (done.stderr.strip().splitlines() or ["no output"])[-1]
                raise SourcesUnavailable(f"pip could not download {self.package}=={version}: {last}")
            self.unpack_wheel(wheels[0], target)
        finally:
            shutil.rmtree(download, ignore_errors=True)
        return target

    def unpack_wheel(self, wheel: Path, target: Path) -> int:
        """Unpack `<package>/**/*.py` of `wheel` (and its directories, with `keep_directories`) into
        `target`; returns the file count."""
        staging = Path(tempfile.mkdtemp(prefix=f"{self.package}-", dir=target.parent))
        count = 0
        with zipfile.ZipFile(wheel) as archive:
            for name in archive.namelist():
                if not name.startswith(f"{self.package}/") or ".." in Path(name).parts:
                    continue
                python = name.endswith(".py")
                if python or self.keep_directories:
                    (staging / name).parent.mkdir(parents=True, exist_ok=True)
                if python:
                    (staging / name).write_bytes(archive.read(name))
                    count += 1
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
        return count

    def write_archive(self, root: Path, names: list[str], out: Path) -> tuple[Path, int, int]:
        """A `.tar.gz` at `out` of `names` (files and directories relative to `root`, each added alone) under
        `python/`; returns the path, the file count and their bytes (uncompressed)."""
        count = size = 0
        with tarfile.open(out, "w:gz", compresslevel=9) as archive:
            for name in names:
                path = root / name
                archive.add(path, arcname=f"python/{name}", recursive=False)
                if path.is_file():
                    count += 1
                    size += path.stat().st_size
        return out, count, size

    def unpack(self, archive_path: Path, version: str) -> Path:
        """Put a `pack` archive back as `version`'s sources in the cache; returns `python_dir(version)`."""
        target = self.python_dir(version)
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f"{self.package}-", dir=target.parent))
        try:
            with tarfile.open(archive_path, "r:gz") as archive:
                try:
                    archive.extractall(staging, filter="data")
                except TypeError:  # Python < 3.10.12 has no extraction filters
                    archive.extractall(staging)
        except (OSError, tarfile.TarError) as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise SourcesUnavailable(f"{archive_path}: not a readable .tar.gz ({type(exc).__name__}: {exc})") from None
        if not self.is_source_tree(staging / "python"):
            shutil.rmtree(staging, ignore_errors=True)
            raise SourcesUnavailable(
                f"{archive_path} holds no python/{self.marker}: not an archive made by `{self.package} pack`"
            )
        if target.exists():
            shutil.rmtree(target)
        (staging / "python").rename(target)
        shutil.rmtree(staging, ignore_errors=True)
        return target
