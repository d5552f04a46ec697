"""The value oracle of a traced step: a fuzzed run against the serialized reference run.

The reference run synchronizes the device after every launch, so every launch sees the values host order
implies. Each launch's stores are snapshotted right after it, on its own stream (so the copy sees exactly
what the launch left), in both runs. The first launch, in host order, whose stores differ is the first
launch that saw a wrong value: it read something a racing launch had not yet written, or had already
overwritten. A run that launched a different sequence of kernels (host control flow diverged, e.g. on a
value read back with `.item()`), raised, or returned different outputs has manifested too.
"""

from __future__ import annotations

from dataclasses import dataclass

from racefuzz.trace.model import TraceLaunch
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
    launch: TraceLaunch | None
    detail: str

    def __str__(self) -> str:
        where = f" at launch {self.launch.describe()}" if self.launch else ""
        return f"{self.kind} divergence{where}: {self.detail}"


def compare(reference: RunRecord, fuzzed: RunRecord, ordinals: set[int] | None = None) -> Divergence | None:
    """The first way `fuzzed` differs from `reference` (see the module doc), or None.

    `ordinals`: compare only these launches' stores (the launches touching watched tensors); None: all.
    """
    ref_ops = reference.trace.ops
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
                assert isinstance(launch, TraceLaunch)
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
            launch if isinstance(launch, TraceLaunch) else None,
            f"host control flow diverged: the fuzzed run launched {got[1]} on {got[0]} instead",
        )
    for name, expected in reference.outputs.items():
        got = fuzzed.outputs.get(name)
        if not _equal(expected, got):
            return Divergence("output", None, f"the step returned a different {name!r} than in the serialized run")
    return None


def _written_storage(record: RunRecord, launch: TraceLaunch) -> str:
    names = [record.trace.storages[access.storage].name for access in launch.writes]
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
    if hasattr(expected, "shape") and hasattr(got, "shape"):
        import torch

        return expected.shape == got.shape and bool(torch.equal(expected, got))  # type: ignore[arg-type]
    return expected == got
