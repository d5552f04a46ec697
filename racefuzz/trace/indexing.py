"""Exact byte sets of index ops: which bytes of its input a gather reads, which of its target a scatter writes.

`R[idx]`, `R[idx, :k]` (`aten.index`), `index_select`, `embedding`, `gather`, `take`, `masked_select` read
only the elements their index values (or mask) select; `index_put_` (`R[idx] = v`), `index_copy_`,
`index_fill_`, `index_add_`, `index_reduce_`, `scatter_` / `scatter_add_` / `scatter_reduce_`,
`masked_fill_` and `masked_scatter_` write only those. Their schemas say only "this view": a write to a row
the gather never reads would conflict with it. Here the index values themselves give the set, so they must
be the values the op sees: they are read (a copy to the host, the recorder paused) where host order is the
order of execution, a CPU run or a GPU run that is serialized (`Recorder.exact_indexing`); elsewhere the op
keeps its whole views and the trace says so (`Trace.whole_view_indexing`).

`exact(name, args, kwargs)` gives, for an op it knows, the `Region`s replacing the schema's whole-view read
or write of an argument (by position); anything it cannot work out (an index of an unexpected kind) raises,
and the caller keeps the whole views. A set of more than `MAX_RUNS` runs is coarsened to its bounding
interval (conservative, as `view_intervals` does).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from racefuzz.trace.intervals import MAX_RUNS, Interval, merge, view_intervals


class Region(NamedTuple):
    """The bytes `intervals` of `tensor`'s storage (sorted, merged): an access narrower than the view."""

    tensor: Any
    intervals: tuple[Interval, ...]


class Exact(NamedTuple):
    """What `exact` found for one call: the regions read and written, by argument position."""

    reads: dict[int, Region]
    writes: dict[int, Region]


def _torch() -> Any:
    import torch

    return torch


def _host_long(index: Any) -> Any:
    """`index` as an int64 CPU tensor (a copy to the host on a GPU: the caller has paused the recorder)."""
    torch = _torch()
    return index.detach().to(device="cpu", dtype=torch.int64)


def _regions_of_offsets(tensor: Any, offsets: Any, rest: Sequence[tuple[int, int]]) -> Region:
    """The region of `tensor`'s storage made of a sub-view with dimensions `rest` ((size, stride) pairs, in
    elements) starting at each element offset of the int64 tensor `offsets`."""
    itemsize = tensor.element_size()
    sizes = [size for size, _ in rest]
    strides = [stride for _, stride in rest]
    relative, coarse = view_intervals(0, sizes, strides, itemsize)
    if offsets.numel() == 0 or not relative:
        return Region(tensor, ())
    bases = offsets.flatten().unique()  # sorted
    if coarse or bases.numel() * len(relative) > MAX_RUNS:
        low, high = int(bases[0]) * itemsize, int(bases[-1]) * itemsize
        return Region(tensor, ((low + relative[0][0], high + relative[-1][1]),))
    runs = [(b * itemsize + s, b * itemsize + e) for b in bases.tolist() for s, e in relative]
    return Region(tensor, tuple(merge(runs)))


def _positive(index: Any, size: int) -> Any:
    """Negative indices counted from the end, as torch does (an index out of range makes the op raise)."""
    return index % size if size else index


def indexed(tensor: Any, indices: Sequence[Any]) -> Region:
    """The elements `tensor[indices]` (`aten.index`'s `Tensor?[]`: None keeps a dimension, an integer tensor
    indexes one, a boolean or uint8 mask of k dimensions indexes k) touches."""
    torch = _torch()
    sizes, strides = list(tensor.shape), list(tensor.stride())
    used: list[tuple[int, Any]] = []  # (dimension, integer index)
    dim = 0
    for entry in indices:
        if entry is None:
            dim += 1
            continue
        if entry.dtype in (torch.bool, torch.uint8):
            chosen = entry.detach().to("cpu").nonzero()
            for k in range(entry.dim()):
                used.append((dim + k, chosen[:, k]))
            dim += entry.dim()
        elif entry.dtype in (torch.int64, torch.int32, torch.int16, torch.int8):
            used.append((dim, _host_long(entry)))
            dim += 1
        else:
            raise TypeError(f"an index of dtype {entry.dtype}")
    if dim > len(sizes):
        raise IndexError("more indices than dimensions")
    offsets = torch.tensor(tensor.storage_offset(), dtype=torch.int64)
    for (d, _), broadcast in zip(used, torch.broadcast_tensors(*[i for _, i in used]), strict=True):
        offsets = offsets + _positive(broadcast, sizes[d]) * strides[d]
    dims = {d for d, _ in used}
    rest = [(sizes[d], strides[d]) for d in range(len(sizes)) if d not in dims]
    return _regions_of_offsets(tensor, offsets, rest)


def along(tensor: Any, dim: int, index: Any) -> Region:
    """The slices `tensor.select(dim, i)` for every value `i` of the index (`index_select`, `index_copy_`,
    `index_fill_`, `index_add_`)."""
    if tensor.dim() == 0:
        return _whole(tensor)
    dim = dim % tensor.dim()
    return indexed(tensor, [None] * dim + [index.reshape(-1)])


def _whole(tensor: Any) -> Region:
    intervals, _ = view_intervals(tensor.storage_offset(), tensor.shape, tensor.stride(), tensor.element_size())
    return Region(tensor, tuple(intervals))


def elementwise(tensor: Any, dim: int, index: Any) -> Region:
    """The elements `gather` reads and `scatter_` writes: `tensor[i0, ..., index[i0, ..., ik], ..., ik]` for
    every position of `index` (whose shape may be smaller than `tensor`'s in every dimension)."""
    torch = _torch()
    if tensor.dim() == 0:
        return _whole(tensor)
    dim = dim % tensor.dim()
    values = _host_long(index)
    if values.dim() == 0:
        values = values.reshape(1)
    offsets = torch.full(values.shape, tensor.storage_offset(), dtype=torch.int64)
    for d in range(values.dim()):
        if d == dim:
            offsets = offsets + _positive(values, tensor.shape[d]) * tensor.stride(d)
        else:
            shape = [1] * values.dim()
            shape[d] = values.shape[d]
            offsets = offsets + torch.arange(values.shape[d]).reshape(shape) * tensor.stride(d)
    return _regions_of_offsets(tensor, offsets, ())


def flat(tensor: Any, positions: Any) -> Region:
    """The elements at row-major positions `positions` of `tensor` (`take`, `masked_scatter_`'s source)."""
    torch = _torch()
    positions = _positive(positions.reshape(-1), tensor.numel())
    offsets = torch.full(positions.shape, tensor.storage_offset(), dtype=torch.int64)
    if tensor.dim():
        for coordinate, stride in zip(torch.unravel_index(positions, tensor.shape), tensor.stride(), strict=True):
            offsets = offsets + coordinate * stride
    return _regions_of_offsets(tensor, offsets, ())


def masked(tensor: Any, mask: Any) -> Region:
    """The elements of `tensor` where `mask` (broadcast to `tensor`'s shape) is true."""
    torch = _torch()
    chosen = mask.detach().to("cpu").expand(tensor.shape).nonzero()
    strides = torch.tensor(tensor.stride(), dtype=torch.int64)
    offsets = tensor.storage_offset() + (chosen * strides).sum(1) if tensor.dim() else torch.zeros(1, dtype=torch.int64)
    return _regions_of_offsets(tensor, offsets, ())


def _sub_view(tensor: Any, shape: Sequence[int]) -> Region:
    """The leading `shape` corner of `tensor` (the part of `scatter_`'s `src` its index reads)."""
    intervals, _ = view_intervals(tensor.storage_offset(), shape, tensor.stride(), tensor.element_size())
    return Region(tensor, tuple(intervals))


def _arg(args: tuple, kwargs: dict, position: int, name: str, default: Any = None) -> Any:
    return args[position] if len(args) > position else kwargs.get(name, default)


def _index(args: tuple, kwargs: dict) -> Exact:
    return Exact({0: indexed(args[0], _arg(args, kwargs, 1, "indices"))}, {})


def _index_put(args: tuple, kwargs: dict) -> Exact:
    return Exact({}, {0: indexed(args[0], _arg(args, kwargs, 1, "indices"))})


def _index_select(args: tuple, kwargs: dict) -> Exact:
    return Exact({0: along(args[0], _arg(args, kwargs, 1, "dim"), _arg(args, kwargs, 2, "index"))}, {})


def _embedding(args: tuple, kwargs: dict) -> Exact:
    return Exact({0: along(args[0], 0, _arg(args, kwargs, 1, "indices"))}, {})


def _index_write(args: tuple, kwargs: dict) -> Exact:
    return Exact({}, {0: along(args[0], _arg(args, kwargs, 1, "dim"), _arg(args, kwargs, 2, "index"))})


def _gather(args: tuple, kwargs: dict) -> Exact:
    return Exact({0: elementwise(args[0], _arg(args, kwargs, 1, "dim"), _arg(args, kwargs, 2, "index"))}, {})


def _scatter(args: tuple, kwargs: dict) -> Exact:
    index = _arg(args, kwargs, 2, "index")
    reads = {}
    src = _arg(args, kwargs, 3, "src")
    torch = _torch()
    if isinstance(src, torch.Tensor) and src.dim() == index.dim() and src.dim():
        reads[3] = _sub_view(src, list(index.shape))
    return Exact(reads, {0: elementwise(args[0], _arg(args, kwargs, 1, "dim"), index)})


def _take(args: tuple, kwargs: dict) -> Exact:
    return Exact({0: flat(args[0], _host_long(_arg(args, kwargs, 1, "index")))}, {})


def _masked_select(args: tuple, kwargs: dict) -> Exact:
    tensor, mask = args[0], _arg(args, kwargs, 1, "mask")
    shape = _torch().broadcast_shapes(tensor.shape, mask.shape)
    # A tensor broadcast to the mask's shape: its elements read again (the region stays the argument's).
    return Exact({0: Region(tensor, masked(tensor.expand(shape), mask).intervals)}, {})


def _masked_fill(args: tuple, kwargs: dict) -> Exact:
    return Exact({}, {0: masked(args[0], _arg(args, kwargs, 1, "mask"))})


def _masked_scatter(args: tuple, kwargs: dict) -> Exact:
    torch = _torch()
    tensor, mask, source = args[0], _arg(args, kwargs, 1, "mask"), _arg(args, kwargs, 2, "source")
    written = masked(tensor, mask)
    count = int(mask.detach().to("cpu").expand(tensor.shape).sum())
    return Exact({2: flat(source, torch.arange(count))}, {0: written})


RULES: dict[str, Callable[[tuple, dict], Exact]] = {
    "index": _index,
    "_unsafe_index": _index,
    "index_put_": _index_put,
    "_index_put_impl_": _index_put,
    "index_select": _index_select,
    "embedding": _embedding,
    "index_copy_": _index_write,
    "index_fill_": _index_write,
    "index_add_": _index_write,
    "index_reduce_": _index_write,
    "gather": _gather,
    "scatter_": _scatter,
    "scatter_add_": _scatter,
    "scatter_reduce_": _scatter,
    "take": _take,
    "masked_select": _masked_select,
    "masked_fill_": _masked_fill,
    "masked_scatter_": _masked_scatter,
}
"""The ops (by schema name, every overload) whose byte sets come from their index values. In-place and
`out=` forms only where the target is written at the indices alone: an out-of-place `index_put` or
`scatter` copies its whole input (the schema's set is then exact)."""
