"""Read and write sets of kernels that have no schema (Triton, CuPy): annotations, and the conservative default.

An annotation names, per kernel, which arguments it reads and which it writes. Each entry maps an argument
name to `WHOLE` (the argument's whole view) or to a function of the bound arguments returning the views of
that argument the kernel touches, for instance the rows a kernel indexes:

    annotate("create_flashinfer_kv_indices_triton",
             reads={"req_to_token_ptr": rows("req_to_token_ptr", "req_pool_indices_ptr",
                                             lengths="page_kernel_lens_ptr"),
                    "req_pool_indices_ptr": WHOLE, "page_kernel_lens_ptr": WHOLE, "kv_indptr": WHOLE},
             writes={"kv_indices_ptr": WHOLE})

A kernel without an annotation is assumed to read and write every tensor argument over its whole view:
never misses a conflict among its arguments, may report ones it does not have; the trace lists such kernels
once (`Trace.assumed_kernels`). An annotation function that reads device values (`.tolist()`) runs only in
the serialized reference run, where the recorder evaluates annotations.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

WHOLE = "whole"
"""The argument's whole view."""

Regions = Callable[[Mapping[str, Any]], list[Any]]
"""bound arguments -> the tensor views of one argument that a kernel touches."""


@dataclass(frozen=True)
class KernelAccess:
    """Which arguments a kernel reads and writes; see the module doc."""

    reads: Mapping[str, Regions | str]
    writes: Mapping[str, Regions | str]


_REGISTRY: dict[str, KernelAccess] = {}


def annotate(kernel: str, *, reads: Mapping[str, Regions | str], writes: Mapping[str, Regions | str]) -> KernelAccess:
    """Declare the read and write sets of `kernel` (its function name, e.g. a `@triton.jit` function's)."""
    access = KernelAccess(dict(reads), dict(writes))
    _REGISTRY[kernel] = access
    return access


def annotation(kernel: str) -> KernelAccess | None:
    """The annotation of `kernel`, or None (then the conservative default applies)."""
    return _REGISTRY.get(kernel)


def rows(
    table: str, row_indices: str, *, lengths: str | None = None, starts: str | None = None, ends: str | None = None
) -> Regions:
    """The views `table[row_indices[i], start_i:stop_i]` for every i.

    `start_i` is `starts[i]` (default 0); `stop_i` is `ends[i]`, else `start_i + lengths[i]`, else the row's
    end. `lengths`, `starts` and `ends` name per-row tensor arguments (a None argument counts as absent).
    Reads the index tensors' values (see the module doc).
    """

    def values(args: Mapping[str, Any], name: str | None, count: int) -> list[int] | None:
        if name is None or args.get(name) is None:
            return None
        return [int(x) for x in args[name].tolist()][:count]

    def regions(args: Mapping[str, Any]) -> list[Any]:
        view = args[table]
        indices = [int(i) for i in args[row_indices].tolist()]
        count = len(indices)
        begins = values(args, starts, count) or [0] * count
        stops = values(args, ends, count)
        spans = values(args, lengths, count)
        out = []
        for i, row in enumerate(indices):
            start = begins[i]
            stop = stops[i] if stops is not None else start + spans[i] if spans is not None else view.shape[-1]
            if stop > start:
                out.append(view[row, start:stop])
        return out

    return regions
