"""Stopping a run cleanly: Ctrl-C and SIGTERM land where racefuzz can act on them, and a per-example
watchdog abandons a hang.

Python raises `KeyboardInterrupt` wherever the main thread happens to be, including inside a garbage
collector callback (Hypothesis keeps one installed) or a `__del__`, where it is printed as "Exception
ignored" and lost: the run goes on. So racefuzz mostly does not raise from its signal handler. The handler
(`handle_signals`, installed by the `racefuzz` command for SIGINT and SIGTERM alike) notes the signal, and
then, depending on where the main thread is:

* in a `hold()` region (start-up, until the command is dispatched; `racefuzz run` and `replay` outside
  their search; writing a counterexample): nothing else; the region's owner looks at `signal_received()`
  when it is done (a counterexample is written, printed and named, then the command exits 130). The
  `FORCE_AFTER`-th signal raises at once, so that a write that hangs can still be interrupted;
* inside `stoppable()` (a search): the first signal makes the next `checkpoint()` -- the search passes one
  before and after every example's run and every hook of a user's design -- raise `StopRequested` (a
  `KeyboardInterrupt`, which Hypothesis lets through) in ordinary code, and the search hands what it had
  found to its caller on the exception (`partial`). A second signal raises at once;
* anywhere else (the commands without checkpoints): it raises `StopRequested` at once. If that exception
  is swallowed as unraisable, `sys.unraisablehook` delivers it again, until it lands in ordinary code.

SIGTERM behaves as Ctrl-C does, exit code 130 included (`racefuzz.exitcodes`). A signal that arrives before
the entry point installed the handler (`racefuzz.__main__`, its first statements) gets Python's own
handling: during the interpreter's start-up the process dies of the signal, which a shell reports as 130
(SIGINT) or 143 (SIGTERM).

The watchdog is a thread that watches the time since the last checkpoint. Past `example_timeout` it asks
for a stop as Ctrl-C does; if the main thread does not reach a checkpoint within `GRACE_S` -- a design hook
that never returns, a GPU kernel that never finishes -- nothing can unwind it from another thread, so the
watchdog prints one line naming what was running and ends the process with `os._exit(ExitCode.TIMEOUT)`:
the run (and on the GPU its kernels) is abandoned, never silently hung.

Two environment variables exist for the stopping tests (tests/unit/test_stopping.py), which must signal
at known moments rather than guess them: `RACEFUZZ_TEST_EVENTS=FILE` appends a line to FILE at named
moments ("handlers" once the handler is installed, "search" as a `stoppable()` block starts, "signal
<name>" as one arrives, "pause <point>" at a pause point), and
`RACEFUZZ_TEST_PAUSE=POINT` makes `pause_point(POINT)` wait there until a signal arrives (at most
`TEST_PAUSE_MAX_S`). Unset, both cost one dictionary lookup.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from racefuzz.exitcodes import ExitCode

GRACE_S = 2.0
"""How long the watchdog waits for the main thread to stop at a checkpoint before abandoning the process."""
FORCE_AFTER = 3
"""In a `hold()` region, the signal that raises at once rather than being held (the third: a user who
presses Ctrl-C twice while a counterexample is written still gets it written)."""
TEST_PAUSE_MAX_S = 60.0
"""The longest `pause_point` waits for a signal (it only bounds a test that sends none)."""
SIGNAL_NAMES = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM"}


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


class _Signals:
    """What the command's handler saw: the first signal's name, how many arrived, and where the main thread
    is (`hold` depth)."""

    def __init__(self) -> None:
        self.installed = False
        self.received: str | None = None  # "SIGINT" or "SIGTERM": the first one
        self.count = 0
        self.hold = 0
        self.hold_note: list[str | None] = []
        self.redelivering = False
        self.redeliver = threading.Event()


_signals = _Signals()


def checkpoint(doing: str) -> None:
    """Note that the run is alive and about to do `doing`; inside `stoppable()`, raise StopRequested once a
    stop was asked for."""
    state = _state
    state.last_beat = time.monotonic()
    state.doing = doing
    if state.active and state.requested is not None and not state.raised:
        state.raised = True
        raise StopRequested(state.requested, state.detail)


def stop_requested() -> str | None:
    """ "interrupt" or "timeout" when a stop was asked for in the current or last `stoppable()` block, or
    "interrupt" when a signal reached the command's handler since; else None."""
    return _state.requested or ("interrupt" if _signals.received else None)


def signal_received() -> str | None:
    """The name of the first SIGINT or SIGTERM the command's handler received ("SIGINT", "SIGTERM"), or None."""
    return _signals.received


def interrupted_line() -> str:
    """The line racefuzz prints on stderr when a signal stopped it."""
    return "racefuzz: interrupted" + (" (SIGTERM)" if _signals.received == "SIGTERM" else "")


def request_stop(reason: str = "interrupt") -> None:
    """Ask for a stop at the next checkpoint, as Ctrl-C does (for a caller's own signal or condition)."""
    _state.requested = reason


def _on_signal(signum: int, frame: object) -> None:
    sig = _signals
    if sig.redelivering:  # an interrupt swallowed as unraisable, delivered again: not a new signal
        if _inside(frame, _unraisable.__code__):  # still in the hook that asked for it: too early, again
            _redeliver_soon()
            return
        sig.redelivering = False
    else:
        sig.count += 1
        sig.received = sig.received or SIGNAL_NAMES.get(signum, f"signal {signum}")
        _event(f"signal {sig.received}")
        if _state.active and _state.requested is None:
            _state.requested = "interrupt"
        if sig.hold and sig.count < FORCE_AFTER:
            note = sig.hold_note[-1] if sig.hold_note else None
            if sig.count == 1 and note:
                print(f"racefuzz: {note}", file=sys.stderr, flush=True)
            return
        if _state.active and sig.count == 1:
            print("racefuzz: stopping at the next example (Ctrl-C again to stop at once)", file=sys.stderr, flush=True)
            return
    if _state.active:
        _state.raised = True  # a checkpoint reached while this unwinds must not raise a second time
    raise StopRequested("interrupt")


def _inside(frame: object, code: object) -> bool:
    while frame is not None:
        if getattr(frame, "f_code", None) is code:
            return True
        frame = getattr(frame, "f_back", None)
    return False


def _unraisable(unraisable: object) -> None:
    """`sys.unraisablehook` while the handler is installed: an interrupt raised inside a garbage-collector
    callback or a `__del__` is delivered again, as a fresh SIGINT to the main thread once this hook has
    returned, instead of being printed as "Exception ignored" and lost; anything else goes to the previous
    hook."""
    if isinstance(getattr(unraisable, "exc_value", None), KeyboardInterrupt) and _signals.installed:
        _state.raised = False  # the next checkpoint raises, if the main thread gets there first
        _redeliver_soon()
        return
    _previous_unraisablehook(unraisable)


def _redeliver_soon() -> None:
    _signals.redeliver.set()


def _redeliver(signals: _Signals, main_thread: int) -> None:
    """The re-delivery thread: on request, SIGINT to the main thread, marked as a re-delivery (not counted as
    a new signal), until the handler is uninstalled. A real signal, not `_thread.interrupt_main`: it also
    wakes a main thread blocked in a system call. The handler asks again while the main thread is still in
    the hook that asked (a thread of its own, rather than a new one per request, which the hook would have
    to wait for)."""
    while True:
        signals.redeliver.wait()
        signals.redeliver.clear()
        if not signals.installed:
            return
        signals.redelivering = True
        signal.pthread_kill(main_thread, signal.SIGINT)


_previous_unraisablehook = sys.unraisablehook


@contextmanager
def handle_signals(*, held: Sequence[int] = ()) -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM go to racefuzz's handler (see the module docstring), and an
    interrupt swallowed as unraisable is delivered again. Re-entrant: an inner block (the command's `main`
    inside the entry point's) changes nothing. `held`: signals the caller already caught (the entry point,
    before it imported this module), counted as received. Off the main thread it does nothing."""
    global _signals, _previous_unraisablehook
    if _signals.installed or threading.current_thread() is not threading.main_thread():
        yield
        return
    _signals = signals = _Signals()
    signals.installed = True
    previous = {signum: signal.signal(signum, _on_signal) for signum in SIGNAL_NAMES}
    main_thread = threading.main_thread().ident
    assert main_thread is not None
    redeliverer = threading.Thread(
        target=_redeliver, args=(signals, main_thread), name="racefuzz-redeliver", daemon=True
    )
    redeliverer.start()
    _previous_unraisablehook, sys.unraisablehook = sys.unraisablehook, _unraisable
    for signum in held:
        _signals.count += 1
        _signals.received = _signals.received or SIGNAL_NAMES.get(signum, f"signal {signum}")
    _event("handlers")
    try:
        yield
    finally:
        signals.installed = False
        signals.redeliver.set()  # the re-delivery thread ends
        sys.unraisablehook = _previous_unraisablehook
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        _signals = _Signals()  # a later caller in this process starts with no signal received


@contextmanager
def hold(note: str | None = None) -> Iterator[None]:
    """Within the block, a signal is only noted (`signal_received()`), not raised, up to the `FORCE_AFTER`-th;
    `note`, if given, is printed on the first. For bounded work that must not be cut in half: start-up,
    writing a counterexample. Without the command's handler (a library caller, the pytest plugin) the block
    installs a holding one for itself, and a signal held there is raised as KeyboardInterrupt when it ends.
    `stoppable()` inside a hold region still stops its search at a checkpoint."""
    if not _signals.installed:
        with handle_signals():
            with hold(note):
                yield
            if _signals.received is not None and _signals.installed:
                raise KeyboardInterrupt
        return
    _signals.hold += 1
    _signals.hold_note.append(note)
    try:
        yield
    finally:
        _signals.hold -= 1
        _signals.hold_note.pop()


@contextmanager
def released() -> Iterator[None]:
    """Within a `hold()` region, a block where signals raise at once again (a command without checkpoints)."""
    depth, notes = _signals.hold, _signals.hold_note
    _signals.hold, _signals.hold_note = 0, []
    try:
        if _signals.received is not None:
            raise StopRequested("interrupt")
        yield
    finally:
        _signals.hold, _signals.hold_note = depth, notes


def _event(line: str) -> None:
    path = os.environ.get("RACEFUZZ_TEST_EVENTS")
    if path:
        with open(path, "a") as events:
            events.write(line + "\n")


def pause_point(point: str) -> None:
    """A test hook (see the module docstring): with RACEFUZZ_TEST_PAUSE=`point`, wait here until a signal
    arrives (at most TEST_PAUSE_MAX_S), having logged "pause `point`" to RACEFUZZ_TEST_EVENTS."""
    if os.environ.get("RACEFUZZ_TEST_PAUSE") != point:
        return
    _event(f"pause {point}")
    deadline = time.monotonic() + TEST_PAUSE_MAX_S
    while _signals.received is None and time.monotonic() < deadline:
        time.sleep(0.005)


@contextmanager
def stoppable(example_timeout: float | None, on_abandon: Callable[[str], None] | None = None) -> Iterator[None]:
    """Within the block, Ctrl-C and the watchdog stop the run at a checkpoint (see the module docstring).

    `example_timeout`: seconds without a checkpoint before the watchdog asks for a stop (None: no
    watchdog). `on_abandon(message)` is called from the watchdog thread just before `os._exit`, e.g. to
    write what is known; the message is printed on stderr either way.
    """
    global _state
    with handle_signals():  # the command's, if it installed them; else for this block
        _event("search")
        _state = _State()
        _state.active = True
        if _signals.received is not None:  # held since start-up: the first checkpoint stops
            _state.requested = "interrupt"
        done = threading.Event()
        watcher = None
        if example_timeout is not None:
            watcher = threading.Thread(
                target=_watch, args=(_state, example_timeout, done, on_abandon), name="racefuzz-watchdog", daemon=True
            )
            watcher.start()
        depth, notes = _signals.hold, _signals.hold_note
        _signals.hold, _signals.hold_note = 0, []  # inside the search, checkpoints take the signal
        try:
            yield
        finally:
            _signals.hold, _signals.hold_note = depth, notes
            done.set()
            _state.active = False
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


@contextmanager
def watched(example_timeout: float | None, on_abandon: Callable[[str], None] | None = None) -> Iterator[None]:
    """The per-example watchdog and Ctrl-C of `racefuzz run` around an assertion (`stoppable`): an
    example past `example_timeout` fails it as `ExampleTimeout` (the CLI's exit code 6)."""
    from racefuzz.errors import ExampleTimeout

    try:
        with stoppable(example_timeout, on_abandon):
            yield
    except StopRequested as stop:
        if stop.reason == "timeout":
            raise ExampleTimeout(stop.detail) from None
        raise
