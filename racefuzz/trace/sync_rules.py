"""Where the host waits for the current stream inside a torch op: one rule per op name, in one table.

A rule answers, from an op's `(args, kwargs, out, on_gpu)`, where the host waited for the current stream:
"before" its launch (it waited for the work issued before the op, then the op's last kernels ran), "after"
it, or "" (no sync). Each answers "" unless the op surely synced: an assumed sync that did not happen could
hide a race, a sync racefuzz does not know of can only make it report more (a missing edge). A device
tensor is a CUDA one in a GPU run, any tensor in a CPU run. `RULES` is the table (op name -> rule);
`SyncRules` holds the rules over a tensor type (torch's, handed in: this module imports no torch).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

SyncRule = Callable[[tuple, dict, Any, bool], str]
"""`(args, kwargs, out, on_gpu) -> "before" | "after" | ""`: see the module doc."""

HOST_SYNCING = frozenset(
    {
        "nonzero",  # and what decomposes to it: `argwhere`, one-argument `where`
        "masked_select",
        "_unique",
        "_unique2",
        "unique_dim",
        "unique_consecutive",
        "unique_dim_consecutive",
    }
)
"""Ops during which the host waits for the current stream (CUDA, non-empty input): torch's CUDA kernels
count, read the count back (`at::cuda::memcpy_and_sync`) to size their output, then launch the kernels
that read the input again and write the output. So the sync is recorded *before* the op's launch: the host
has waited for everything before the op, not for the op. `.item()` / `.tolist()` (`_local_scalar_dense`)
sync after their copy. Ops that sync only sometimes are left out, as is an assignment through a boolean
mask (`x[mask] = v` with a scalar `v` is a `masked_fill_`, no sync)."""


RULES: Mapping[str, str] = {
    "_local_scalar_dense": "after_copy_out",
    **dict.fromkeys(sorted(HOST_SYNCING), "on_input"),
    "index": "on_mask",  # a read through a boolean (or uint8) mask: `nonzero` inside
    "_to_copy": "in_copy",
    "copy_": "in_copy",
}
"""Op name (`schema.name` without its namespace) -> the `SyncRules` method that says where it syncs the host;
an op not here never syncs it."""


class SyncRules:
    """The rules of `RULES` over one kind of tensor (torch's; a stand-in in tests).

    Args:
        tensor_type: what a tensor argument is an instance of (`torch.Tensor`).
        mask_dtypes: the dtypes of a boolean mask index (`torch.bool`, `torch.uint8`).
    """

    def __init__(self, tensor_type: type, mask_dtypes: frozenset[Any]) -> None:
        self.tensor_type = tensor_type
        self.mask_dtypes = mask_dtypes

    def of(self, op_name: str) -> SyncRule | None:
        """The rule of op `op_name` (`add_`, `nonzero`), or None: it never syncs the host."""
        rule = RULES.get(op_name)
        return None if rule is None else getattr(self, rule)

    def _is_device(self, tensor: Any, on_gpu: bool) -> bool:
        return isinstance(tensor, self.tensor_type) and (tensor.is_cuda or not on_gpu) and tensor.numel() > 0

    def after_copy_out(self, args: tuple, kwargs: dict, out: Any, on_gpu: bool) -> str:
        """`_local_scalar_dense` (`.item()`, `.tolist()`): a copy to the host, then the sync."""
        return "after" if args and self._is_device(args[0], on_gpu) else ""

    def on_input(self, args: tuple, kwargs: dict, out: Any, on_gpu: bool) -> str:
        """A `HOST_SYNCING` op on a non-empty device tensor: the sync comes before its output's kernels."""
        return "before" if args and self._is_device(args[0], on_gpu) else ""

    def on_mask(self, args: tuple, kwargs: dict, out: Any, on_gpu: bool) -> str:
        """`index` through a non-empty device boolean or uint8 mask (`x[mask]`): `nonzero` first, so a sync
        before."""
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        masked = any(self._is_device(index, on_gpu) and index.dtype in self.mask_dtypes for index in indices or ())
        return "before" if masked else ""

    def in_copy(self, args: tuple, kwargs: dict, out: Any, on_gpu: bool) -> str:
        """`_to_copy` / `copy_` of a non-empty tensor between the host and the GPU without `non_blocking=True`
        (torch's `memcpy_and_sync`). A copy to the host syncs after the copy; one to the GPU too, unless it
        needs work on the device after the copy (a non-contiguous operand, another dtype, a conjugate or
        negative bit that differs: torch's `copy_kernel_cuda` syncs, then runs a kernel): the sync is then
        before it. A `non_blocking` copy is never taken for a sync (CUDA's copy into pageable memory "might be
        synchronous": not a promise). None on the CPU."""
        if not on_gpu:
            return ""
        # `_to_copy` takes it keyword-only; `copy_(self, src, non_blocking)`
        non_blocking = kwargs["non_blocking"] if "non_blocking" in kwargs else len(args) > 2 and bool(args[2])
        if non_blocking:
            return ""
        if len(args) > 1 and isinstance(args[1], self.tensor_type):  # copy_(dst, src)
            dst, src = args[0], args[1]
        elif isinstance(out, self.tensor_type):  # `_to_copy(src)` returns one tensor
            dst, src = out, args[0]
        else:
            return ""
        if dst.is_cuda == src.is_cuda or not dst.numel():
            return ""
        if src.is_cuda:
            return "after"
        plain = (
            dst.is_contiguous()
            and src.is_contiguous()
            and dst.dtype == src.dtype
            and dst.is_conj() == src.is_conj()  # else `conj_physical_` / `neg_` runs on the device after the sync
            and dst.is_neg() == src.is_neg()
        )
        return "after" if plain else "before"
