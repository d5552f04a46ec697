"""The value oracle of a traced step: a fuzzed run against the serialized reference run.

The reference run synchronizes the device after every launch, so every launch sees the values host order
implies. Each launch's stores are snapshotted right after it, on its own stream (so the copy sees exactly
what the launch left), in both runs. The first launch, in host order, whose stores differ is the first
launch that saw a wrong value: it read something a racing launch had not yet written, or had already
overwritten. A run that launched a different sequence of kernels (host control flow diverged, e.g. on a
value read back with `.item()`), raised, or returned different outputs has manifested too.

Some launches store different values in every run, with no delay and no concurrency at all: float atomics
(`index_add_`, `scatter_add_` on CUDA), sampling from an unseeded generator, split-K reductions. What
differs between serialized runs of the step is its `Nondeterminism` (`nondeterminism`); `masked` takes it
out of the reference run, so that the value oracle compares only what the schedule can have changed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from racefuzz.program import Launch
from racefuzz.trace.builder import launch_text
from racefuzz.trace.recorder import RunRecord


@dataclass(frozen=True)
class Divergence:
    """How a fuzzed run differed from the reference run.

    Args:
        kind: `value` (a launch stored different values), `control-flow` (a different launch sequence),
            `output` (the step returned different values), or `exception` (the step raised).
        launch: the reference run's launch where it first showed, if any.
        detail: one line for the report.
    """

    kind: str
    launch: Launch | None
    detail: str

    def __str__(self) -> str:
        where = f" at launch {launch_text(self.launch)}" if self.launch else ""
        return f"{self.kind} divergence{where}: {self.detail}"


@dataclass(frozen=True)
class Nondeterminism:
    """What differed between serialized runs of one step without any delay: not the schedule's doing.

    Args:
        stores: (launch ordinal, snapshot slot) of every store whose bytes differed.
        outputs: the returned values that differed.
        unstable: why the value oracle cannot judge the step at all, if it cannot: its launch sequence
            differed (an ordinal no longer names one launch) or it raised in one of those runs.
    """

    stores: frozenset[tuple[int, object]] = frozenset()
    outputs: frozenset[str] = frozenset()
    unstable: str | None = None

    def __bool__(self) -> bool:
        return bool(self.stores or self.outputs or self.unstable)

    def __or__(self, other: Nondeterminism) -> Nondeterminism:
        return Nondeterminism(self.stores | other.stores, self.outputs | other.outputs, self.unstable or other.unstable)

    @property
    def launches(self) -> list[int]:
        """The ordinals of the nondeterministic launches, in host order."""
        return sorted({ordinal for ordinal, _ in self.stores})


def nondeterminism(reference: RunRecord, run: RunRecord | BaseException, ordinals: set[int] | None) -> Nondeterminism:
    """Everything in which `run` (another serialized run of the step, without delays, snapshotting what
    `reference` snapshotted) differs from `reference`; `ordinals` as in `compare`."""
    if isinstance(run, BaseException):
        return Nondeterminism(unstable=f"it raised {type(run).__name__} in one serialized run and not in another")
    ref_seq, run_seq = reference.kernel_sequence(), run.kernel_sequence()
    if ref_seq != run_seq:
        at = next((i for i, (a, b) in enumerate(zip(ref_seq, run_seq, strict=False)) if a != b), None)
        at = min(len(ref_seq), len(run_seq)) if at is None else at
        return Nondeterminism(
            unstable=f"its launch sequence differs between serialized runs from launch ordinal {at} on (host "
            "control flow that depends on a nondeterministic value), so an ordinal does not name one launch"
        )
    stores = set()
    for ordinal, snaps in reference.snapshots.items():
        if ordinals is not None and ordinal not in ordinals:
            continue
        theirs = {snap.slot: snap for snap in run.snapshots.get(ordinal, ())}
        for mine in snaps:
            other = theirs.get(mine.slot)
            if other is not None and _first_difference(mine, other) is not None:
                stores.add((ordinal, mine.slot))
    outputs = {name for name, value in reference.outputs.items() if not _equal(value, run.outputs.get(name))}
    return Nondeterminism(frozenset(stores), frozenset(outputs))


def masked(reference: RunRecord, nondeterministic: Nondeterminism) -> RunRecord:
    """`reference` without the nondeterministic stores and outputs: what `compare` then compares (and what
    a fuzzed run, planned from it, snapshots)."""
    if not nondeterministic:
        return reference
    snapshots = {
        ordinal: [snap for snap in snaps if (ordinal, snap.slot) not in nondeterministic.stores]
        for ordinal, snaps in reference.snapshots.items()
    }
    outputs = {name: value for name, value in reference.outputs.items() if name not in nondeterministic.outputs}
    return replace(reference, snapshots=snapshots, outputs=outputs)


def compare(reference: RunRecord, fuzzed: RunRecord, ordinals: set[int] | None = None) -> Divergence | None:
    """The first way `fuzzed` differs from `reference` (see the module doc), or None.

    `ordinals`: compare only these launches' stores (the launches touching watched tensors); None: all.
    """
    ref_ops = reference.builder.ops
    ref_seq = reference.kernel_sequence()
    fz_seq = fuzzed.kernel_sequence()
    diverged_at = next((i for i, (a, b) in enumerate(zip(ref_seq, fz_seq, strict=False)) if a != b), None)
    if diverged_at is None and len(ref_seq) != len(fz_seq):
        diverged_at = min(len(ref_seq), len(fz_seq))
    for ordinal in sorted(reference.snapshots):
        if diverged_at is not None and ordinal >= diverged_at:
            break
        if ordinals is not None and ordinal not in ordinals:
            continue
        theirs = {snap.slot: snap for snap in fuzzed.snapshots.get(ordinal, ())}
        for mine in reference.snapshots[ordinal]:
            other = theirs.get(mine.slot)
            if other is None:
                continue
            differing = _first_difference(mine, other)
            if differing is not None:
                launch = ref_ops[reference.launch_ops[ordinal]]
                assert type(launch) is Launch
                storage = _written_storage(reference, launch)
                return Divergence(
                    "value",
                    launch,
                    f"stored different values at byte {differing} of {storage} than in the serialized run",
                )
    if diverged_at is not None:
        launch = ref_ops[reference.launch_ops[diverged_at]] if diverged_at < len(reference.launch_ops) else None
        got = fz_seq[diverged_at] if diverged_at < len(fz_seq) else ("-", "nothing")
        return Divergence(
            "control-flow",
            launch if type(launch) is Launch else None,
            f"host control flow diverged: the fuzzed run launched {got[1]} on {got[0]} instead",
        )
    for name, expected in reference.outputs.items():
        got = fuzzed.outputs.get(name)
        if not _equal(expected, got):
            return Divergence("output", None, f"the step returned a different {name!r} than in the serialized run")
    return None


def _written_storage(record: RunRecord, launch: Launch) -> str:
    buffers = record.builder.buffers
    names = [buffers[key].name for key in dict.fromkeys(cells.buffer.id for cells in launch.writes)]
    return ", ".join(names) or "its output"


def _first_difference(mine, other) -> int | None:
    """The first byte (storage offset) inside `mine`'s intervals where the two snapshots differ."""
    a, b = mine.data, other.data
    if a is None or b is None or a.shape != b.shape:
        return None
    for start, end in mine.intervals:
        x, y = a[start - mine.lo : end - mine.lo], b[start - mine.lo : end - mine.lo]
        if not bool((x == y).all()):
            return start + int((x != y).nonzero()[0, 0])
    return None


def _equal(expected: object, got: object) -> bool:
    """Equal as the step's outputs of two identical runs are: tensors bit for bit (so a NaN equals the same
    NaN), lists, tuples and dicts element by element, anything else by `==`."""
    if isinstance(expected, Mapping):
        return (
            isinstance(got, Mapping)
            and expected.keys() == got.keys()
            and all(_equal(value, got[key]) for key, value in expected.items())
        )
    if isinstance(expected, (list, tuple)):
        return (
            isinstance(got, (list, tuple))
            and len(expected) == len(got)
            and all(_equal(a, b) for a, b in zip(expected, got, strict=True))
        )
    if hasattr(expected, "shape") and hasattr(got, "shape"):
        return _equal_arrays(expected, got)
    if isinstance(expected, float) and isinstance(got, float) and math.isnan(expected) and math.isnan(got):
        return True
    try:
        return bool(expected == got)
    except Exception:  # an object whose == is not a truth value: not provably equal
        return False


def _equal_arrays(expected: Any, got: Any) -> bool:
    import torch

    if isinstance(expected, torch.Tensor) and isinstance(got, torch.Tensor):
        if expected.shape != got.shape or expected.dtype != got.dtype:
            return False
        if expected.layout != torch.strided or got.layout != torch.strided:
            return bool(torch.equal(expected.to_dense(), got.to_dense()))
        if expected.numel() == 0:
            return True
        try:  # bitwise: a NaN (or -0.0) the reference run computed must come back as the same bits
            a = expected.detach().contiguous().reshape(-1).view(torch.uint8)
            b = got.detach().contiguous().reshape(-1).view(torch.uint8)
        except (RuntimeError, TypeError):  # a dtype without a byte view (quantized): NaN-free ones
            return bool(torch.equal(expected, got))
        return bool(torch.equal(a, b))
    try:
        import numpy
    except ImportError:
        return False
    try:
        return bool(numpy.array_equal(expected, got, equal_nan=True))
    except TypeError:  # equal_nan on a dtype without NaN
        return bool(numpy.array_equal(expected, got))
