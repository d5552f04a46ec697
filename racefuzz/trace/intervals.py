"""Byte intervals of strided views: which bytes of its storage a view covers, exactly.

A view is `(offset, sizes, strides, itemsize)` in bytes-of-storage terms (offset and strides in elements,
as torch reports them). Its byte set is a union of runs; two views conflict only when their sets share a
byte, so two disjoint rows of one table never conflict and `R[1, 4:8]` overlaps `R`. PyTorch's CUDA
sanitizer keys an access by the address where the view starts and misses both distinctions.

Pure Python: no torch here, so the checker side of tracing is tested without it.
"""

from __future__ import annotations

from collections.abc import Sequence

MAX_RUNS = 4096
"""A view made of more runs than this is coarsened to its bounding interval (conservative: it can only add
conflicts, never hide one); `view_intervals` says when it did."""

Interval = tuple[int, int]
"""A half-open byte range `[start, end)` of one storage."""


def view_intervals(
    offset: int, sizes: Sequence[int], strides: Sequence[int], itemsize: int
) -> tuple[list[Interval], bool]:
    """The sorted, merged byte intervals a view covers, and whether they were coarsened (see `MAX_RUNS`).

    Args:
        offset: the view's storage offset, in elements.
        sizes, strides: the view's shape and strides, in elements (non-negative, as torch's).
        itemsize: bytes per element.
    """
    if any(size == 0 for size in sizes):
        return [], False
    # Dimensions that do not move (size 1, or stride 0 from expand) add no bytes.
    dims = sorted(((st, sz) for sz, st in zip(sizes, strides, strict=True) if sz > 1 and st != 0), reverse=True)
    start = offset * itemsize
    # Fold the innermost dimensions that are contiguous with each other into one run of bytes.
    run = itemsize
    while dims and dims[-1][0] * itemsize == run:
        stride, size = dims.pop()
        run = stride * itemsize * size
    outer = [(stride * itemsize, size) for stride, size in dims]
    count = 1
    for _, size in outer:
        count *= size
    if count > MAX_RUNS:
        end = start + run + sum(stride * (size - 1) for stride, size in outer)
        return [(start, end)], True
    starts = [start]
    for stride, size in outer:
        starts = [s + k * stride for s in starts for k in range(size)]
    return merge([(s, s + run) for s in starts]), False


def merge(intervals: Sequence[Interval]) -> list[Interval]:
    """Sort and merge overlapping or touching intervals."""
    merged: list[Interval] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def overlap(left: Sequence[Interval], right: Sequence[Interval]) -> list[Interval]:
    """The bytes both sorted, merged interval lists cover."""
    shared: list[Interval] = []
    i = j = 0
    while i < len(left) and j < len(right):
        start = max(left[i][0], right[j][0])
        end = min(left[i][1], right[j][1])
        if start < end:
            shared.append((start, end))
        if left[i][1] < right[j][1]:
            i += 1
        else:
            j += 1
    return shared
