"""What the recorder needs of a torch op's schema: its read and write sets, computed once per op.

`OpSchemas.info(func)` gives an op's `OpInfo` (which arguments may hold tensors and which of them it
writes, whether it returns fresh tensors, allocates only, syncs the host, takes the fast path);
`OpSchemas.accesses` applies it to one call. Written arguments are those whose `alias_info.is_write` is
set (in-place and `out=` arguments); fresh outputs are written too; views and allocations are no accesses.
`dispatcher_op_info` tells the C++ fast path's dispatcher entry the same, by op name. Imports torch lazily
(`schemas()` makes the one instance once torch is there).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

from racefuzz.trace import indexing, sync_rules

NOT_ACCESSES = frozenset(
    {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "record_stream", "set_", "resize_"}
)
"""Ops that allocate or re-point memory without reading or writing its contents."""

ALLOCATING = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"})
"""`NOT_ACCESSES` ops that return a fresh allocation (its stream is where the caching allocator may reuse it)."""

TORCH_TENSOR_COPY = "torch.tensor (host-to-device copy)"
"""The kernel name of the copy `torch.tensor(data, device=...)` makes, hidden from the mode (`TraceMode._lifted`)."""


class OpInfo(NamedTuple):
    """What the recorder needs of an op's schema, computed once per op."""

    name: str  # `add_`
    label: str  # `aten.add_.Tensor`
    arguments: tuple[tuple[int, str, bool, bool], ...]  # (position, name, keyword-only, written)
    fresh_outputs: bool  # returns new tensors (not views of its inputs)
    not_access: bool  # allocates or re-points memory only (`NOT_ACCESSES`)
    allocates: bool  # one of those that returns a fresh allocation (`ALLOCATING`)
    sync: sync_rules.SyncRule | None  # where the host waits for the stream (`sync_rules.RULES`)
    fast: bool  # what the C++ fast path records (`launch_op`'s case: no fresh outputs, no sync, an access)
    exact: Callable[[tuple, dict], Any] | None  # an index op's byte sets from its index values (`indexing.RULES`)
    call: Callable[..., Any]  # the op's C++ callable (`OpOverload.__call__` is `self._op(*args, **kwargs)`)


NO_KWARGS: dict[str, Any] = {}
"""The kwargs of a call that has none (shared: never written to)."""


def is_compute(func: Any) -> bool:
    """An op that returns fresh tensors (not views of its inputs)."""
    return not any(r.alias_info is not None for r in func._schema.returns)


def _may_hold_tensors(schema_type: Any) -> bool:
    """Whether an argument of this schema type can be a tensor or hold tensors (`Tensor`, `Tensor?`,
    `Tensor[]`, `Tensor?[]`, `Any`); an `int[]`, `Scalar` or `str` argument is never looked at."""
    text = str(schema_type)
    return "Tensor" in text or "Any" in text


class OpSchemas:
    """The op-schema analysis of one process (`schemas()`): `OpInfo`s cached per op, and their use on a call.

    Args:
        torch: the torch module (its `Tensor` type, mask dtypes and `inplace_view` tag are read once here).
    """

    def __init__(self, torch: Any) -> None:
        self.tensor_type = torch.Tensor
        self.inplace_view = torch.Tag.inplace_view
        self.sync_rules = sync_rules.SyncRules(torch.Tensor, frozenset({torch.bool, torch.uint8}))
        self.infos: dict[Any, OpInfo] = {}
        """Op (an `OpOverload`) -> its `OpInfo`; the mode reads it first (`infos.get(func) or info(func)`)."""

    def info(self, func: Any) -> OpInfo:
        """`func`'s `OpInfo`, computed on the first call and cached in `infos`."""
        known = self.infos.get(func)
        if known is not None:
            return known
        schema = func._schema
        arguments = tuple(
            (i, arg.name, arg.kwarg_only, arg.alias_info is not None and arg.alias_info.is_write)
            for i, arg in enumerate(schema.arguments)
            if _may_hold_tensors(arg.type)
        )
        name = schema.name.split("::")[-1]
        sync = self.sync_rules.of(name)
        # An in-place view op (`detach_`, `unsqueeze_`, `as_strided_`: torch's `inplace_view` tag) declares a
        # write of `self` but changes only its metadata: no launch, no access.
        fresh_outputs = is_compute(func)
        not_access = name in NOT_ACCESSES or self.inplace_view in getattr(func, "tags", ())
        # `lift_fresh` stands for a copy the mode did not see (`TraceMode._lifted`): the mode's, not the fast
        # path's. An index op's byte sets come from its index values, read in Python (`TraceMode._exact`): not
        # the fast path's either, which records the schema's whole views.
        exact = indexing.RULES.get(name)
        fast = not fresh_outputs and not not_access and sync is None and name != "lift_fresh" and exact is None
        call = getattr(func, "_op", func)
        info = OpInfo(
            name, str(func), arguments, fresh_outputs, not_access, name in ALLOCATING, sync, fast, exact, call
        )
        self.infos[func] = info
        return info

    def accesses(self, info: OpInfo, args: tuple, kwargs: dict) -> tuple[list[Any], list[tuple[object, Any]]]:
        """(read tensors, (slot, written tensor) pairs) of one call, from the op's schema."""
        reads: list[Any] = []
        writes: list[tuple[object, Any]] = []
        count = len(args)
        tensor_type = self.tensor_type
        for i, name, kwarg_only, written in info.arguments:
            if kwarg_only or i >= count:
                if name not in kwargs:
                    continue
                value = kwargs[name]
            else:
                value = args[i]
            if isinstance(value, tensor_type):
                if written:
                    writes.append((name, value))
                else:
                    reads.append(value)
            elif isinstance(value, (list, tuple)):
                found = self.tensors(value)
                if written:
                    writes += [(f"{name}{k}", t) for k, t in enumerate(found)]
                else:
                    reads += found
        return reads, writes

    def tensors(self, value: Any) -> list[Any]:
        """The tensors of `value`: itself, or those inside its (nested) lists and tuples."""
        if isinstance(value, self.tensor_type):
            return [value]
        if isinstance(value, (list, tuple)):
            return [t for v in value for t in self.tensors(v)]
        return []


@functools.cache
def schemas() -> OpSchemas:
    """The process's `OpSchemas` (made on the first call, which imports torch)."""
    import torch

    return OpSchemas(torch)


def storage_ptrs(tensors: list[Any]) -> set[int]:
    """The storage addresses of `tensors`, skipping any without a plain storage (sparse, nested)."""
    ptrs = set()
    for tensor in tensors:
        with contextlib.suppress(RuntimeError, NotImplementedError):
            ptrs.add(tensor.untyped_storage().data_ptr())
    return ptrs


FAST_WRITES, FAST_FRESH, FAST_ALLOCATES, FAST_LIFTED = range(4)
"""What the C++ fast path's dispatcher entry does with an op (`dispatcher_op_info`'s kind; its `OpKind`)."""


def dispatcher_op_info(name: str, overload: str) -> tuple[Any, str, int] | None:
    """For the C++ fast path's dispatcher entry, asked once per op (`aten::add_`, `Tensor`): the op's
    `(arguments, label, kind)` if it is one the fast path records, else None. The kinds:

    * `FAST_WRITES`: an op that writes only its arguments (`OpInfo.fast`), or `copy_` (its sync rule,
      `SyncRules.in_copy`, answers "" between two tensors of the recording's device, the only ones the
      entry takes);
    * `FAST_FRESH`: one that returns fresh tensors, each a plain `Tensor` (no list, no optional), and neither
      syncs the host nor only allocates; `_to_copy` too (a copy on the device: the entry leaves one with a
      `device` of another kind, between the host and the device, to the mode);
    * `FAST_ALLOCATES`: an allocation only (`ALLOCATING`: `empty`, `empty_like`, ...), no launch;
    * `FAST_LIFTED`: `lift_fresh`, the copy `torch.tensor(data, device=...)` made (`TraceMode._lifted`), its
      label `TORCH_TENSOR_COPY`.
    """
    import torch

    namespace, _, op_name = name.partition("::")
    try:
        func = getattr(getattr(getattr(torch.ops, namespace), op_name), overload or "default")
    except (AttributeError, RuntimeError):
        return None
    info = schemas().info(func)
    returns = func._schema.returns
    plain_returns = bool(returns) and all(str(r.type) == "Tensor" for r in returns)
    copies = sync_rules.RULES.get(info.name) == "in_copy" and info.exact is None
    if info.name == "lift_fresh":
        return info.arguments, TORCH_TENSOR_COPY, FAST_LIFTED
    if info.allocates:
        return (info.arguments, info.label, FAST_ALLOCATES) if plain_returns else None
    if info.fresh_outputs and not info.not_access and (info.sync is None or copies) and info.exact is None:
        return (info.arguments, info.label, FAST_FRESH) if plain_returns else None
    if info.fast or (copies and not info.fresh_outputs and not info.not_access):
        return info.arguments, info.label, FAST_WRITES
    return None
