"""Where in the step's code a launch was made: `user_source()`, the innermost frame outside racefuzz's recorder.

A launch, a free or a host access names the line of the step (or of the engine) that made it, not the
recorder's, torch's, Triton's or Hypothesis's frames it went through. The caches here are the process's:
the C++ fast path reads them and fills them through `code_is_library` and `frame_source`
(`racefuzz.trace.recorder.fast_constants`).
"""

from __future__ import annotations

import os
import sys
from typing import Any

_MACHINERY = frozenset(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
    for name in (
        "recorder.py",
        "sources.py",
        "storages.py",
        "capture.py",
        "torch_mode.py",
        "op_schemas.py",
        "sync_rules.py",
        "cuda_api.py",
        "triton_launches.py",
        "env.py",
        "annotations.py",
        "search.py",
        "torch_patches.py",
        "host_memory.py",
    )
)
_LIBRARY_MARKERS = (f"{os.sep}torch{os.sep}", f"{os.sep}triton{os.sep}", f"{os.sep}hypothesis{os.sep}", "contextlib.py")
_IS_LIBRARY: dict[str, bool] = {}
_SHOWN: dict[str, str] = {}
LIBRARY_CODE: dict[int, bool] = {}
SOURCES: dict[tuple[int, int], str] = {}
_CODES: list[Any] = []
"""`user_source`'s caches: whether a code object is the recorder's, torch's, Triton's or Hypothesis's, and
the formatted `file:line (function)` of a (code object, bytecode offset): one source line is formatted once,
not once per op (both bounded by the step's code, as its call sites are). Keyed by `id(code)`, not by the
code object: a code object's hash is computed from its bytecode, constants and names at every lookup
(microseconds for a long step function, several lookups an op); `_CODES` holds every code object the
caches know, so that no other object can take its id."""


def _is_library(filename: str) -> bool:
    known = _IS_LIBRARY.get(filename)
    if known is None:
        known = filename in _MACHINERY or any(marker in filename for marker in _LIBRARY_MARKERS)
        _IS_LIBRARY[filename] = known
    return known


def user_source(skip: int = 2) -> str:
    """`file:line (function)` of the innermost frame outside the recorder, torch, Triton and Hypothesis."""
    frame = sys._getframe(skip)
    library = LIBRARY_CODE
    while frame is not None:
        code = frame.f_code
        known = library.get(id(code))
        if known is None:
            known = code_is_library(code)
        if not known:
            source = SOURCES.get((id(code), frame.f_lasti))
            return frame_source(frame) if source is None else source
        frame = frame.f_back
    return ""


def code_is_library(code: Any) -> bool:
    """Whether `code` is the recorder's, torch's, Triton's or Hypothesis's (cached; the fast path calls it too)."""
    _CODES.append(code)
    known = LIBRARY_CODE[id(code)] = _is_library(code.co_filename)
    return known


def count_as_recorder(code: Any) -> None:
    """Frames of `code` are the recorder's from now on (`user_source` looks past them): for a wrapper that
    sits between the engine's line and the recorder, such as an engine harness's profiler pausing around
    the recorder's dispatch."""
    if id(code) not in LIBRARY_CODE:  # every code object there is held in `_CODES`: this one, if its id is
        _CODES.append(code)
    LIBRARY_CODE[id(code)] = True


def frame_source(frame: Any) -> str:
    """`file:line (function)` of `frame`, cached by (code object, bytecode offset) (the fast path calls it too,
    as `user_source` does: for a code object `code_is_library` has seen)."""
    code = frame.f_code
    source = SOURCES[(id(code), frame.f_lasti)] = _format_source(code, frame.f_lineno)
    return source


def _format_source(code: Any, lineno: int) -> str:
    filename = code.co_filename
    shown = _SHOWN.get(filename)
    if shown is None:
        shown = _SHOWN[filename] = filename if filename.startswith("<") else os.path.relpath(filename)
    return f"{shown}:{lineno} ({code.co_name})"
