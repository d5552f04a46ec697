"""Design lint: sync calls that CUDA accepts but that are almost always a bug in a design.

* a `wait_event` (or `event.synchronize()`) on an event never recorded before it: CUDA makes it a no-op,
  so the fence the design meant is not there;
* a stream waiting on itself (`s.wait_stream(s)`): a no-op as well, usually the wrong stream named;
* an event recorded in a hook and never waited on nor synchronized anywhere: a fence left half-built.

Each finding names the hook that issued the call. `preflight` builds the programs of a few fixed workloads
before a search, so that a design hook that raises fails at once (a `UserCodeError` through the design's
`GuardedHooks`), and lints them. The attribution reads the op count of `ctx.device` around each hook call,
so it works for any scenario whose hook context has a `device` (sglang's `LoopContext` does).
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable, Collection
from dataclasses import dataclass

from racefuzz.designs import Design
from racefuzz.program import EventSync, Program, Record, WaitEvent, WaitStream
from racefuzz.scenarios import check_hazards

PREFLIGHT_WORKLOADS = 16
"""Fixed workloads whose programs are built and linted before a search (a few ms each)."""


@dataclass(frozen=True, order=True)
class Finding:
    """One lint finding: the hook that made the call (None: outside any hook) and what is wrong."""

    hook: str | None
    message: str

    def __str__(self) -> str:
        return f"hook {self.hook}: {self.message}" if self.hook else self.message


class _Spans:
    """Which hook issued each op of the program being built: (first op, end op, hook) in host order."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.spans: list[tuple[int, int, str]] = []

    def add(self, start: int, end: int, hook: str) -> None:
        if end > start:
            self.starts.append(start)
            self.spans.append((start, end, hook))

    def hook_of(self, index: int) -> str | None:
        at = bisect.bisect_right(self.starts, index) - 1
        if at >= 0:
            start, end, hook = self.spans[at]
            if start <= index < end:
                return hook
        return None


class _RecordingHooks:
    """A design's hooks that note which ops each call issued (by `ctx.device.op_count` before and after)."""

    def __init__(self, hooks: object, hook_names: Collection[str], spans: _Spans) -> None:
        self._hooks = hooks
        for name in hook_names:
            hook = getattr(hooks, name, None)
            if hook is not None:
                setattr(self, name, _recording(hook, name, spans))

    def __getattr__(self, name: str) -> object:
        return getattr(self._hooks, name)


def _recording(hook: Callable[..., object], name: str, spans: _Spans) -> Callable[..., object]:
    def call(*args: object, **kwargs: object) -> object:
        device = getattr(args[0], "device", None) if args else None
        before = getattr(device, "op_count", None)
        try:
            return hook(*args, **kwargs)
        finally:
            if before is not None:
                spans.add(before, device.op_count, name)  # type: ignore[union-attr]

    return call


def lint_program(program: Program, spans: _Spans, waited: set[str], recorded_in: dict[str, set[str]]) -> set[Finding]:
    """The per-program findings; collects the event names waited on and, by name, the hooks that recorded
    events, for the whole-design "recorded and never waited" rule."""
    findings: set[Finding] = set()
    recorded: set[int] = set()
    for op in program.ops:
        if isinstance(op, Record):
            recorded.add(op.event.id)
            hook = spans.hook_of(op.index)
            if hook is not None:
                recorded_in.setdefault(op.event.name, set()).add(hook)
        elif isinstance(op, (WaitEvent, EventSync)):
            waited.add(op.event.name)
            hook = spans.hook_of(op.index)
            if hook is not None and op.event.id not in recorded:
                call = "wait_event" if isinstance(op, WaitEvent) else "event.synchronize()"
                findings.add(
                    Finding(hook, f"{call} on event {op.event.name!r} before it was ever recorded (a no-op in CUDA)")
                )
        elif isinstance(op, WaitStream) and op.stream == op.other:
            hook = spans.hook_of(op.index)
            if hook is not None:
                call = f"{op.stream.name}.wait_stream({op.other.name})"
                findings.add(Finding(hook, f"{call}: a stream waiting on itself (a no-op in CUDA)"))
    return findings


def preflight(
    design: Design, hazards: Collection[str] | None = None, samples: int = PREFLIGHT_WORKLOADS, **options: object
) -> list[Finding]:
    """Build `design`'s programs for `samples` fixed workloads and lint them. The workloads are short byte
    strings drawn with a fixed seed and decoded by the scenario's space under `hazards`, as a search's first
    examples are. A hook that raises propagates (a `UserCodeError` for a user's design). Returns the
    findings, sorted."""
    scenario = design.scenario
    space = scenario.workload_space(
        check_hazards(scenario, scenario.hazards if hazards is None else hazards), **options
    )
    rng = random.Random(0)
    findings: set[Finding] = set()
    waited: set[str] = set()
    recorded_in: dict[str, set[str]] = {}
    for i in range(samples):
        data = bytes(64) if i == 0 else rng.randbytes(rng.randrange(4, 64))
        workload = space.decode(data)
        spans = _Spans()
        program = scenario.build_program(workload, _RecordingHooks(design.hooks, scenario.hook_names, spans))
        findings |= lint_program(program, spans, waited, recorded_in)
    for name, hooks in recorded_in.items():
        if name not in waited:
            for hook in hooks:
                findings.add(Finding(hook, f"event {name!r} is recorded but never waited on nor synchronized"))
    return sorted(findings, key=lambda f: (f.hook or "", f.message))
