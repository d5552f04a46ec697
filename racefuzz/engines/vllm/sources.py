"""Where a vLLM version's Python sources come from: its wheel from the package registry, unpacked into a
cache, or a checkout (a pull request's tree).

* `fetch(version)`: `pip download --no-deps --only-binary=:all: vllm==X` (vLLM ships one `abi3` manylinux
  wheel per release) into `cache_dir(version)`, then unpacks `vllm/**/*.py` into `cache_dir(version)/python/`
  and deletes the wheel (its bulk is CUDA extensions the harness never imports).
* `locate(version=..., source=...)`: the directory to put on `sys.path`, or `SourcesUnavailable` in one line.
* `pack(version, out)`: a slim `.tar.gz` of the files the harness imports (`slim_files`), for a GPU host
  without network; `unpack(archive, version)` puts one back in the cache (`racefuzz vllm fetch --archive`).

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


def imported_by_harness(python_dir: Path, *, python: str = sys.executable, timeout: float = 900.0) -> list[str]:
    """The files of `python_dir`'s vLLM that the harness imports on the CPU (the fixed workload, with its
    control), relative to `python_dir`: the harness subprocess's `--list-imports`."""
    import json

    command = [python, "-m", "racefuzz.engines.vllm.harness", "--python-dir", str(python_dir), "--list-imports"]
    env = dict(os.environ, PYTHONWARNINGS="ignore", VLLM_LOGGING_LEVEL="ERROR")
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    result = json.loads(lines[-1]) if lines else {"status": "error", "error": f"the harness exited {done.returncode}"}
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
    import tarfile

    root = locate(version, source)
    files = slim_files(root, imported_by_harness(root))
    if (root / "vllm" / "_version.py").is_file() and "vllm/_version.py" not in files:
        files.append("vllm/_version.py")
    size = 0
    with tarfile.open(out, "w:gz", compresslevel=9) as archive:
        for name in files:
            archive.add(root / name, arcname=f"python/{name}")
            size += (root / name).stat().st_size
    return out, len(files), size


def unpack(archive_path: Path, version: str) -> Path:
    """Put a `pack` archive back as `version`'s sources in the cache; returns `python_dir(version)`."""
    import tarfile

    target = python_dir(version)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="vllm-", dir=target.parent))
    try:
        with tarfile.open(archive_path, "r:gz") as archive:
            try:
                archive.extractall(staging, filter="data")
            except TypeError:  # Python < 3.10.12 has no extraction filters
                archive.extractall(staging)
    except (OSError, tarfile.TarError) as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise SourcesUnavailable(f"{archive_path}: not a readable .tar.gz ({type(exc).__name__}: {exc})") from None
    if not is_source_tree(staging / "python"):
        shutil.rmtree(staging, ignore_errors=True)
        raise SourcesUnavailable(f"{archive_path} holds no python/{MARKER}: not an archive made by `vllm pack`")
    if target.exists():
        shutil.rmtree(target)
    (staging / "python").rename(target)
    shutil.rmtree(staging, ignore_errors=True)
    return target
