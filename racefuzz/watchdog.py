"""Stopping a run cleanly: Ctrl-C lands at the next checkpoint, and a per-example watchdog abandons a hang.

Python raises `KeyboardInterrupt` wherever the main thread happens to be, including inside a garbage
collector callback, where it is printed as "Exception ignored" and lost (seen in 2 of 14 timed Ctrl-Cs of
a long search). Inside `stoppable()` the first Ctrl-C only sets a flag; the next `checkpoint()` -- the
search passes one before and after every example's run and every hook of a user's design -- raises
`StopRequested` (a `KeyboardInterrupt`, which Hypothesis lets through) in ordinary code, and the search
hands what it had found to its caller on the exception (`partial`). A second Ctrl-C raises at once.

The watchdog is a thread that watches the time since the last checkpoint. Past `example_timeout` it asks
for a stop as Ctrl-C does; if the main thread does not reach a checkpoint within `GRACE_S` -- a design hook
that never returns, a GPU kernel that never finishes -- nothing can unwind it from another thread, so the
watchdog prints one line naming what was running and ends the process with `os._exit(ExitCode.TIMEOUT)`:
the run (and on the GPU its kernels) is abandoned, never silently hung.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from racefuzz.exitcodes import ExitCode

GRACE_S = 2.0
"""How long the watchdog waits for the main thread to stop at a checkpoint before abandoning the process."""


class StopRequested(KeyboardInterrupt):
    """Raised at a checkpoint after Ctrl-C (`reason` "interrupt") or a watchdog timeout ("timeout").

    `partial` is set by the search it passes through: a `SearchResult` with what was found so far."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail
        self.partial: object | None = None


class _State:
    def __init__(self) -> None:
        self.active = False
        self.requested: str | None = None  # "interrupt" or "timeout", once asked for
        self.detail = ""
        self.raised = False
        self.last_beat = time.monotonic()
        self.doing = "starting"


_state = _State()


def checkpoint(doing: str) -> None:
    """Note that the run is alive and about to do `doing`; raise StopRequested once a stop was asked for."""
    state = _state
    state.last_beat = time.monotonic()
    state.doing = doing
    if state.requested is not None and not state.raised:
        state.raised = True
        raise StopRequested(state.requested, state.detail)


def stop_requested() -> str | None:
    """ "interrupt" or "timeout" when a stop was asked for in the current `stoppable()` block, else None."""
    return _state.requested


def request_stop(reason: str = "interrupt") -> None:
    """Ask for a stop at the next checkpoint, as Ctrl-C does (for a caller's own signal or condition)."""
    _state.requested = reason


def _on_sigint(signum: int, frame: object) -> None:
    if _state.requested is not None:  # the second Ctrl-C: at once, wherever the main thread is
        signal.signal(signal.SIGINT, signal.default_int_handler)
        raise KeyboardInterrupt
    request_stop("interrupt")
    print("racefuzz: stopping at the next example (Ctrl-C again to stop at once)", file=sys.stderr, flush=True)


@contextmanager
def stoppable(example_timeout: float | None, on_abandon: Callable[[str], None] | None = None) -> Iterator[None]:
    """Within the block, Ctrl-C and the watchdog stop the run at a checkpoint (see the module docstring).

    `example_timeout`: seconds without a checkpoint before the watchdog asks for a stop (None: no
    watchdog). `on_abandon(message)` is called from the watchdog thread just before `os._exit`, e.g. to
    write what is known; the message is printed on stderr either way.
    """
    global _state
    _state = _State()
    _state.active = True
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, _on_sigint) if main_thread else None
    done = threading.Event()
    watcher = None
    if example_timeout is not None:
        watcher = threading.Thread(
            target=_watch, args=(_state, example_timeout, done, on_abandon), name="racefuzz-watchdog", daemon=True
        )
        watcher.start()
    try:
        yield
    finally:
        done.set()
        _state.active = False
        if main_thread:
            signal.signal(signal.SIGINT, previous)
        if watcher is not None:
            watcher.join(timeout=1.0)


def _watch(state: _State, timeout: float, done: threading.Event, on_abandon: Callable[[str], None] | None) -> None:
    poll = min(0.25, timeout / 4)
    while not done.wait(poll):
        idle = time.monotonic() - state.last_beat
        if idle <= timeout or state.requested is not None:
            continue
        doing = state.doing
        state.detail = f"{doing} took more than {timeout:g} s (--example-timeout)"
        state.requested = "timeout"
        if done.wait(GRACE_S) or state.raised:
            return  # the main thread reached a checkpoint and is unwinding
        message = f"racefuzz: error: {state.detail}; the run is abandoned (nothing can interrupt it)"
        try:
            if on_abandon is not None:
                on_abandon(message)
        finally:
            print(message, file=sys.stderr, flush=True)
            os._exit(ExitCode.TIMEOUT)


class WatchedExecutor:
    """An executor (see `racefuzz.backends.Executor`) whose every run passes a checkpoint before and after;
    a `PreparingExecutor`'s prepared and started runs too (a GPU run is waited for in `finish`)."""

    def __init__(self, run: Callable[..., object], backend: str) -> None:
        self._run = run
        self._doing = f"an example on {backend}"
        if getattr(run, "prepare", None) is not None:
            self.prepare = self._prepare

    def __call__(self, program: object, schedule: object) -> object:
        checkpoint(f"running {self._doing}")
        execution = self._run(program, schedule)
        checkpoint("judging an example")
        return execution

    def _prepare(self, program: object, schedule: object) -> object:
        checkpoint(f"preparing {self._doing}")
        return _Watched(self._run.prepare(program, schedule), self._doing)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self._run, name)


class _Watched:
    """A prepared or started run whose `start` and `finish` pass checkpoints; anything else is forwarded."""

    def __init__(self, run: object, doing: str) -> None:
        self._inner = run
        self._doing = doing

    def start(self) -> object:
        checkpoint(f"starting {self._doing}")
        return _Watched(self._inner.start(), self._doing)  # type: ignore[attr-defined]

    def finish(self) -> object:
        checkpoint(f"waiting for {self._doing} to finish")
        execution = self._inner.finish()  # type: ignore[attr-defined]
        checkpoint("judging an example")
        return execution

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)
