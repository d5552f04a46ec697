"""Where racefuzz writes, checked before any work is done, and where a counterexample goes when that fails.

A search can run for minutes; a race it found must not be lost to an output path that was never usable.
So every output option (`--report-dir`, `--json`, `--plot`, `--out`, the plugin's `--racefuzz-report-dir`)
is checked first, creating nothing: the path, or its nearest existing ancestor, must be a writable
directory (for a file: its parent; an existing file is overwritten, an existing directory is an error).
If writing still fails later (the disk filled, a directory was removed), `fallback_dir` gives a fresh
temporary directory and the message says where the files went.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from racefuzz.errors import InvalidArgument

DEFAULT_REPORT_DIR = ".racefuzz"
"""Where counterexamples go unless `--report-dir` (`--racefuzz-report-dir`) says otherwise: relative, so in the
directory racefuzz runs in."""


def _nearest_existing(path: Path) -> Path:
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    return probe


def check_output_dir(path: str | os.PathLike[str], option: str) -> Path:
    """`path` as a Path if it is, or could be created as, a writable directory; else a one-line InvalidArgument."""
    if not os.fspath(path):  # Path("") is the working directory: files would land there unasked
        raise InvalidArgument(f"{option}: an empty path names no directory")
    path = Path(path)
    try:
        return _check_output_dir(path, option)
    except OSError as exc:  # a name longer than the filesystem allows, a loop of symbolic links
        raise InvalidArgument(f"{option} {_shortened(path)}: {exc.strerror or exc}") from None


def _shortened(path: Path) -> str:
    text = os.fspath(path)
    return text if len(text) <= 80 else f"{text[:40]}...{text[-30:]} ({len(text)} characters)"


def _check_output_dir(path: Path, option: str) -> Path:
    if path.exists():
        if not path.is_dir():
            raise InvalidArgument(f"{option} {path}: exists and is not a directory")
        if not os.access(path, os.W_OK | os.X_OK):
            raise InvalidArgument(f"{option} {path}: directory is not writable")
        return path
    ancestor = _nearest_existing(path.absolute())
    if not ancestor.is_dir():
        raise InvalidArgument(f"{option} {path}: cannot be created, {ancestor} is not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise InvalidArgument(f"{option} {path}: cannot be created, {ancestor} is not writable")
    return path


def check_output_file(path: str | os.PathLike[str], option: str) -> Path:
    """`path` as a Path if a file can be written there (its directory is created on writing)."""
    text = os.fspath(path)
    path = Path(path)
    try:
        exists_as = "directory" if path.is_dir() else "file" if path.is_file() else "other" if path.exists() else None
    except OSError as exc:  # a name longer than the filesystem allows
        raise InvalidArgument(f"{option} {_shortened(path)}: {exc.strerror or exc}") from None
    if exists_as == "other":  # /dev/full, a FIFO: a write there fails or blocks, after the work
        raise InvalidArgument(f"{option} {path}: not a regular file (racefuzz writes a file there)")
    if text.endswith(("/", os.sep)) or exists_as == "directory":
        raise InvalidArgument(f"{option} {path}: is a directory, not a file")
    if path.exists() and not os.access(path, os.W_OK):
        raise InvalidArgument(f"{option} {path}: file is not writable")
    check_output_dir(path.parent if str(path.parent) else Path("."), option)
    return path


def write_text(path: Path, text: str) -> None:
    """Write `text` to `path`, creating its directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def fallback_dir() -> Path:
    """A fresh temporary directory for a counterexample whose own directory could not be written."""
    return Path(tempfile.mkdtemp(prefix="racefuzz-"))
