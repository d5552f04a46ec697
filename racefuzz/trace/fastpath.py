"""The recorder's C++ fast path (`_fastpath.cpp`): compiled on first use, once per torch and Python version.

`load()` gives the compiled module, or None where it cannot be had: Python before 3.11, no C++ compiler or
ninja, `RACEFUZZ_TRACE_FASTPATH=0`. It records torch ops below torch's dispatcher, before they reach the
dispatch mode (`begin`/`end`, which `racefuzz.trace.capture.recording` brackets a recording with): ops that
write only their arguments (in-place, `out=`) and ops that return fresh tensors from tensor inputs, index
ops of either kind excepted (they take the Python path: `racefuzz.trace.indexing`); and,
from the mode (`launch_op`), an op of the first kind that does reach it (one a composite op decomposed
into). Recording without it takes the Python
path, which records the same trace (tests/unit/test_trace_fastpath.py compares them), more slowly; why is
said once on stderr. The build (10-60 s) goes to `$XDG_CACHE_HOME/racefuzz` (default `~/.cache/racefuzz`),
one directory per torch version, Python version, interpreter prefix (`sys.prefix`: two virtual
environments on one host keep a build each, instead of rebuilding it whenever the other ran last) and
source (`_fastpath.cpp`'s digest: two checkouts of different versions keep theirs too); the
first build says on stderr, in one line, that it is compiling and where, whoever asked for it (the CLI,
the pytest fixture, `racefuzz.trace.fuzz`). It compiles a copy of the source kept in that directory
(`build_source`), so that checkouts of one source share one build. Concurrent processes (pytest-xdist
workers) wait for one build through torch's lock in that directory; a lock older than `STALE_LOCK_S` is a
killed build's and is removed first.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

ENV = "RACEFUZZ_TRACE_FASTPATH"
"""`0` turns the fast path off (the Python path then records every op)."""

NAME = "racefuzz_trace_fastpath"
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_fastpath.cpp")

_loaded: list[Any] = []
"""The loaded module (or None, with the reason said), once tried."""


def build_directory() -> str:
    """Where this interpreter's build of this source goes: one directory per torch version, Python version,
    `sys.prefix` and `_fastpath.cpp` (digests of the last two: a virtual environment's path may be long or
    odd; two checkouts of racefuzz on one host with different sources, a tree and its CI copy, would
    otherwise rebuild in one directory whenever the other ran last, each loading the other's build)."""
    import hashlib

    import torch

    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    prefix = hashlib.sha256(os.path.realpath(sys.prefix).encode()).hexdigest()[:12]
    with open(SOURCE, "rb") as source:
        code = hashlib.sha256(source.read()).hexdigest()[:12]
    version = f"torch{torch.__version__}-py{sys.version_info.major}{sys.version_info.minor}-{prefix}-{code}"
    return os.path.join(cache, "racefuzz", f"fastpath-{version}")


def load() -> Any | None:
    """The compiled module (`launch_op`, `begin`, `end`, `configure`, `pack_state`, `STATE_FIELDS`,
    `CONSTANT_FIELDS`), built and loaded on the first call; None if it is off or cannot be built. Use it through
    `configure` and `pack_state` here, which check the names the recorder and the build exchange."""
    if not _loaded:
        _loaded.append(_load())
    return _loaded[0]


def _load() -> Any | None:
    if os.environ.get(ENV, "1") == "0":
        return None
    if sys.version_info < (3, 11):
        return _unavailable("it needs Python 3.11 or later")
    try:
        from torch.utils.cpp_extension import load

        directory = build_directory()
        os.makedirs(directory, exist_ok=True)
        _clear_stale_lock(os.path.join(directory, "lock"))
        if not any(name.startswith(NAME) and name.endswith(".so") for name in os.listdir(directory)):
            print(
                f"racefuzz: compiling the trace recorder's C++ fast path (once for this interpreter, 10-60 s); "
                f"cache: {directory}",
                file=sys.stderr,
                flush=True,
            )
        module = load(NAME, [build_source(directory)], build_directory=directory, extra_cflags=["-O2"], verbose=False)
    except Exception as error:  # no compiler, no ninja, a torch without headers: record in Python
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return _unavailable(f"{type(error).__name__}: {first}")
    return module


def build_source(directory: str) -> str:
    """The copy of `_fastpath.cpp` that the build in `directory` compiles, written there if it is not yet.

    ninja's build file names its source by absolute path, so compiling the tree's own file would make two
    checkouts of one source (a tree and its CI clone, git worktrees), which share `directory`, rebuild
    whenever the other ran last. The copy's path is the directory's, the same for every checkout; its
    content is the digest's. It is replaced atomically, and only when it differs (a rewrite would change
    its mtime and make ninja rebuild)."""
    copy = os.path.join(directory, os.path.basename(SOURCE))
    with open(SOURCE, "rb") as source:
        code = source.read()
    with contextlib.suppress(OSError), open(copy, "rb") as existing:
        if existing.read() == code:
            return copy
    partial = f"{copy}.{os.getpid()}.tmp"
    with open(partial, "wb") as out:
        out.write(code)
    os.replace(partial, copy)
    return copy


STALE_LOCK_S = 600
"""A build lock older than this is a killed build's (a build takes 10-60 s)."""


def _clear_stale_lock(lock: str) -> None:
    """Remove the lock a killed build left (torch's `load` would otherwise wait for it forever, silently);
    a younger lock is a build in progress in another process, which `load` waits for."""
    import time

    try:
        seen = os.stat(lock)
    except OSError:
        return  # no lock: no build in progress
    age = time.time() - seen.st_mtime
    if age > STALE_LOCK_S:
        with contextlib.suppress(OSError):
            now = os.stat(lock)
            # Still the same old file: another process that removed it first and started a build has made a
            # new lock, which must stay.
            if (now.st_ino, now.st_mtime) == (seen.st_ino, seen.st_mtime):
                print(f"racefuzz: removing {lock}, left {age:.0f} s ago by an unfinished build", file=sys.stderr)
                os.remove(lock)


def _unavailable(why: str) -> None:
    print(
        f"racefuzz: the trace recorder's C++ fast path is unavailable ({why}); recording in Python, more "
        f"slowly ({ENV}=0 turns it off without this message)",
        file=sys.stderr,
    )
    return None


class FieldMismatch(RuntimeError):
    """The loaded build of `_fastpath.cpp` and the recorder disagree on the fields they exchange."""


def _check_fields(module: Any, what: str, expected_name: str, given: Any) -> None:
    """Raise `FieldMismatch` unless `given` (a dict) has exactly the keys `module.<expected_name>` lists."""
    expected = getattr(module, expected_name, None)
    if expected is None or not isinstance(given, dict) or set(given) != set(expected):
        theirs = set(expected or ())
        ours = set(given) if isinstance(given, dict) else set()
        raise FieldMismatch(
            f"racefuzz: the C++ fast path ({getattr(module, '__file__', NAME)}) and the recorder disagree on "
            f"{what}: the recorder's lack {sorted(theirs - ours)}, the build's lack {sorted(ours - theirs)} "
            f"(the names in _fastpath.cpp and in racefuzz.trace.recorder must agree; {ENV}=0 records without it)"
        )


def configure(module: Any, helper: Any, set_eval_frame: Any, constants: dict[str, Any]) -> None:
    """`module.configure(...)` once the names of `constants` (`racefuzz.trace.recorder.fast_constants`) are
    checked against the build's `CONSTANT_FIELDS` (`FieldMismatch` if they differ)."""
    _check_fields(module, "the constants", "CONSTANT_FIELDS", constants)
    module.configure(helper, set_eval_frame, constants)


def pack_state(module: Any, fields: dict[str, Any]) -> Any:
    """The state `module.launch_op` / `module.begin` take, from `Recorder.fast_state()`'s dict, whose names are
    checked against the build's `STATE_FIELDS` first (`FieldMismatch` if they differ)."""
    _check_fields(module, "a recorder's state", "STATE_FIELDS", fields)
    return module.pack_state(fields)
