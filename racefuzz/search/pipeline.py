"""One batch of examples, run in order while the host works ahead of the device.

On the GPU one Hypothesis example is a batch of racefuzz examples: the batch pays Hypothesis' per-example
cost (~0.5-1 ms: PRNG seeding, bookkeeping, done while nothing runs) once, and the host draws, builds,
judges ahead and prepares member i+1 while the device runs member i. On the simulator a batch is one
example and nothing overlaps.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from contextlib import suppress
from typing import Generic, NamedTuple, Protocol, TypeVar

from racefuzz.backends import PreparedRun, StartedRun
from racefuzz.memory import Observations
from racefuzz.program import Program
from racefuzz.scenarios import Workload
from racefuzz.schedule import Schedule

LOOKAHEAD = 3
"""Members of a batch drawn ahead of the one running: how much host work a search can bank during a long run."""

Draw = tuple[bytes, bytes]
"""One example as Hypothesis draws it: (workload bytes, schedule bytes)."""


class Example(NamedTuple):
    """One example built and ready to run: what the search judges its run against."""

    key: Draw
    workload: Workload
    program: Program
    schedule: Schedule
    expected: Observations
    racy: bool


class _Prepare(Protocol):
    def __call__(self, program: Program, schedule: Schedule) -> PreparedRun: ...


E = TypeVar("E", bound=Example)


class Batch(Generic[E]):
    """Draws, builds and runs up to `size` examples in order, keeping the device busy.

    Members are drawn at fixed points -- LOOKAHEAD up front, one more each time a run starts -- so the
    draws depend on the choices alone, as Hypothesis requires. Building and preparing (host work) go on
    whenever a drawn member waits and the device is still running: the host works ahead during long runs
    and spends that work on short ones. Without `prepare` (an executor with no asynchronous form), one run
    at a time.

    A member equal to an earlier one of the batch is drawn again (at most `size` extra draws a batch) and
    not run: Hypothesis' first example is all zeros, one trivial example `size` times over, and its
    mutations copy draws within a test case (about one member in nine).

    `settle(example, started)` finishes (or, without a started run, runs) and judges one member, finishing
    the run before anything else; whatever it raises ends the batch. A batch ended by an exception from
    anywhere else finishes the run on the device first. `draws` counts the draws made so far, for
    replaying the batch's draws.
    """

    def __init__(
        self,
        size: int,
        runnable: int,
        build: Callable[[bytes, bytes], E],
        settle: Callable[[E, StartedRun | None], None],
        prepare: _Prepare | None,
    ) -> None:
        self.size = size
        self.runnable = runnable  # members it may run: the search's remaining budget
        self.build = build
        self.settle = settle
        self.prepare = prepare
        self.draws = 0
        self._draws_left = 2 * size  # every member is drawn, even past the budget: same choices, same draws
        self._members_left = size
        self._seen: set[Draw] = set()
        self._drawn: deque[Draw] = deque()

    def _draw_next(self, draw: Callable[[], Draw]) -> None:
        while self._draws_left and self._members_left:
            self._draws_left -= 1
            self.draws += 1
            member = draw()
            if member not in self._seen:
                self._seen.add(member)
                self._members_left -= 1
                self._drawn.append(member)
                return

    def run(self, draw: Callable[[], Draw]) -> None:
        in_flight: list[tuple[E, StartedRun | None]] = []  # the run on the device, if any
        try:
            self._run(draw, in_flight)
        except BaseException:
            # Whatever ended the batch early (a draw past Hypothesis' budget, a build that raised, Ctrl-C),
            # , the run still on the device must finish before its memory can go: the device array is
            # torch's, allocated on another stream than the one its kernels run on, so the caching allocator
            # would hand it to the next upload while those kernels still read their descriptors from it.
            for _, started in in_flight:
                if started is not None:
                    with suppress(Exception):
                        started.finish()
            raise

    def _run(self, draw: Callable[[], Draw], in_flight_out: list[tuple[E, StartedRun | None]]) -> None:
        built: deque[E] = deque()
        ready: deque[tuple[E, PreparedRun | None]] = deque()
        in_flight: tuple[E, StartedRun | None] | None = None
        for _ in range(LOOKAHEAD):
            self._draw_next(draw)
        while True:
            if in_flight is None:
                if ready:
                    example, prepared = ready.popleft()
                    in_flight = (example, prepared.start() if prepared is not None else None)
                    in_flight_out[:] = [in_flight]
                    self._draw_next(draw)
                    continue
            elif not (built or (self._drawn and self.runnable)) or _finished(in_flight[1], len(ready)):
                in_flight_out.clear()  # settle's first step finishes the run
                self.settle(*in_flight)
                in_flight = None
                continue
            if built:  # host work, one step at a time so that a finished run is noticed soon
                example = built.popleft()
                prepared = self.prepare(example.program, example.schedule) if self.prepare is not None else None
                ready.append((example, prepared))
            elif self._drawn and self.runnable:
                self.runnable -= 1
                built.append(self.build(*self._drawn.popleft()))
            else:
                break
        while self._draws_left and self._members_left:
            self._draw_next(draw)


def _finished(started: StartedRun | None, prepared_ahead: int) -> bool:
    """Whether to wait for `started` now: the device has finished it, or -- for a run without `done()`,
    which cannot say -- the next member is already prepared."""
    if started is None:
        return True
    done = getattr(started, "done", None)
    return prepared_ahead > 0 if done is None else bool(done())
