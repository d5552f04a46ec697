"""Host memory in a CPU recording of vLLM's runner: which tensors are the host's, and the host's accesses
of them, recorded as the host's (`Recorder.host_access`) rather than as device launches.

In a CPU recording every tensor stands for a device tensor. vLLM's runner holds both: device tensors
(made on `self.device`) and host tensors (the pinned halves of `CpuGpuBuffer`s, the input batch's
`*_cpu_tensor`s, made with `device="cpu"`). The harness gives the runner the device `cpu:0`, which torch
keeps apart from `cpu` in every op's `device` argument (and `x.to(cpu:0)` copies where `x.to(cpu)` would
not), so `HostTensors` can tell them apart as vLLM does on a GPU:

* a tensor made with `device="cpu"` (or none: torch's default), or computed by an op whose tensors are all
  host tensors, or by `torch.from_numpy`, is a host tensor; one made on `cpu:0` or by an op reading a device
  tensor is a device tensor;
* an op whose tensors are all host tensors is the host's access: it runs with the recorder paused and is
  recorded as a host access (its schema's written arguments written, the others read). Every other op
  (a device op; a copy between host and device: `copy_to_gpu`'s non-blocking copy, `.to("cpu")`) goes to
  the recorder as a launch on the current stream, as on a GPU;
* `Tensor.numpy()` / `.tolist()` of a host tensor is the host's read (not a device read-back with a sync
  of the stream, a sync vLLM never makes);
* a device tensor's `.to("cpu")` / `.cpu()` is a copy (torch would return the tensor itself, `cpu:0`
  being its `cpu`): a launch on the current stream writing a new host tensor, as on a GPU;

and the host's NumPy writes (below) are recorded too.

vLLM's input preparation writes the pinned half of each `CpuGpuBuffer` (`vllm/v1/utils.py`) mostly
through its NumPy view `buffer.np` (`BlockTable.append_row`: `self.block_table.np[row, a:b] = ids`;
`_prepare_inputs`: `self.query_start_loc.np[1 : n + 1] = cu_num_tokens`, ...). NumPy writes dispatch no
torch op, so the recorder sees none of them. Here each buffer's `np` is replaced by a `HostArray`: the same
memory, an `ndarray` subclass whose writes (item assignment, `fill`, a ufunc or NumPy function with
`out=` it) are recorded as the host's accesses (`Recorder.host_access`) of the bytes written, on the
buffer's `cpu` tensor's storage, where the device's non-blocking copy reads them. A write through an
index array records the bounding range of what it selects (conservative).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import numpy as np

HOST_WRITE = "numpy write (host)"


class HostArray(np.ndarray):
    """An `ndarray` view of a pinned buffer's memory whose writes are recorded as host accesses."""

    _owner: Any = None  # the torch CPU tensor whose storage this memory is

    def __array_finalize__(self, obj: Any) -> None:
        self._owner = getattr(obj, "_owner", None)

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        _record(self, key)

    def fill(self, value: Any) -> None:
        super().fill(value)
        _record(self, None)

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        outs = kwargs.get("out") or ()
        plain_inputs = [np.asarray(x) if isinstance(x, HostArray) else x for x in inputs]
        if outs:
            kwargs["out"] = tuple(np.asarray(o) if isinstance(o, HostArray) else o for o in outs)
        result = getattr(ufunc, method)(*plain_inputs, **kwargs)
        for out in outs:
            if isinstance(out, HostArray):
                _record(out, None)
        if outs:
            return outs[0] if len(outs) == 1 else outs
        return result

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        out = kwargs.get("out")
        plain_args = [np.asarray(x) if isinstance(x, HostArray) else x for x in args]
        if isinstance(out, HostArray):
            kwargs = dict(kwargs, out=np.asarray(out))
        if func is np.copyto and plain_args and isinstance(args[0], HostArray):
            result = func(*plain_args, **kwargs)
            _record(args[0], None)
            return result
        result = func(*plain_args, **kwargs)
        if isinstance(out, HostArray):
            _record(out, None)
            return out
        return result


def wrap(array: np.ndarray, owner: Any) -> HostArray:
    """`array` (the NumPy view of `owner`, a CPU tensor) as a `HostArray` over the same memory."""
    view = array.view(HostArray)
    view._owner = owner
    return view


def _record(array: HostArray, key: Any) -> None:
    """Record the host's write of `array[key]` (all of `array` for None) on its owner's storage."""
    from racefuzz.trace.capture import active

    recorder = active()
    owner = array._owner
    if recorder is None or recorder.paused or owner is None:
        return
    plain = np.asarray(array)
    region = plain if key is None else plain[key]
    if region.size == 0:
        return
    if not np.shares_memory(region, plain):  # advanced indexing: a copy; take the bounding range written
        positions = np.arange(plain.size).reshape(plain.shape)[key].ravel()
        flat = np.unravel_index(positions, plain.shape)
        offsets = sum(index * stride for index, stride in zip(flat, plain.strides, strict=True))
        first, last = int(np.min(offsets)), int(np.max(offsets))
        region_view = _torch_view(owner, plain, first, (last - first) // plain.itemsize + 1, None)
    else:
        region_view = _torch_view(owner, region, 0, None, region.strides)
    start = len(recorder.record.trace.ops)
    recorder.host_access(HOST_WRITE, [], [region_view])
    name_vllm_lines(recorder, start)


def _torch_view(owner: Any, region: np.ndarray, extra: int, length: int | None, strides: Any) -> Any:
    """The view of `owner` (a torch tensor) over `region`'s bytes (+ `extra`): its shape and strides, or a
    flat run of `length` elements."""
    base = owner.untyped_storage().data_ptr()
    itemsize = owner.element_size()
    start = (region.__array_interface__["data"][0] + extra - base) // itemsize
    flat = owner.reshape(-1) if owner.is_contiguous() else owner.as_strided((owner.numel(),), (1,), 0)
    if length is not None:
        return flat.as_strided((length,), (1,), start)
    return flat.as_strided(region.shape, tuple(s // itemsize for s in strides), start)


class HostTensors:
    """The run's host tensors (by storage) and the context that records the host's accesses of them."""

    def __init__(self) -> None:
        self.storages: set[int] = set()
        self._alive: list[Any] = []  # held for the run: a freed host block's address must not be reused

    def add(self, tensor: Any) -> None:
        self.storages.add(tensor.untyped_storage().data_ptr())
        self._alive.append(tensor)

    def holds(self, tensor: Any) -> bool:
        return tensor.device.type == "cpu" and tensor.untyped_storage().data_ptr() in self.storages

    @contextlib.contextmanager
    def recorded(self) -> Any:
        """Inside a CPU recording: host ops and host reads recorded as the host's (module docstring). The
        recorder's own patches of `Tensor.numpy` / `.tolist` and `torch.tensor` are then below these."""
        import torch

        registry = self
        recorded_numpy, recorded_tolist = torch.Tensor.numpy, torch.Tensor.tolist
        from_numpy, recorded_tensor = torch.from_numpy, torch.tensor

        def numpy(self: Any, *args: Any, **kwargs: Any) -> Any:
            if registry.holds(self):
                _host_read(self, "Tensor.numpy (host read)")
                return torch._C.TensorBase.numpy(self, *args, **kwargs)
            return recorded_numpy(self, *args, **kwargs)

        def tolist(self: Any) -> Any:
            if registry.holds(self):
                _host_read(self, "Tensor.tolist (host read)")
                return torch._C.TensorBase.tolist(self)
            return recorded_tolist(self)

        def host_from_numpy(array: Any) -> Any:
            tensor = from_numpy(np.asarray(array))
            registry.add(tensor)
            return tensor

        def tensor(*args: Any, **kwargs: Any) -> Any:
            if is_host_device(kwargs.get("device", "cpu")):  # a host tensor: no copy to a device
                made = recorded_tensor(*args, **{k: v for k, v in kwargs.items() if k != "device"})
                registry.add(made)
                return made
            return recorded_tensor(*args, **kwargs)

        recorded_to, recorded_cpu = torch.Tensor.to, torch.Tensor.cpu

        def to(self: Any, *args: Any, **kwargs: Any) -> Any:
            # A device tensor's `.to("cpu")` is a copy to the host on a GPU; here the device (cpu:0) is
            # torch's `cpu`, where `.to("cpu")` would return the tensor itself: copy, as a GPU does.
            target = kwargs.get("device", next((a for a in args if isinstance(a, (str, torch.device))), None))
            if target is not None and is_host_device(target) and not registry.holds(self):
                kwargs = dict(kwargs, copy=True)
            return recorded_to(self, *args, **kwargs)

        def cpu(self: Any, *args: Any, **kwargs: Any) -> Any:
            if registry.holds(self):
                return self
            return recorded_to(self, "cpu", copy=True)

        torch.Tensor.numpy, torch.Tensor.tolist, torch.from_numpy, torch.tensor = numpy, tolist, host_from_numpy, tensor
        torch.Tensor.to, torch.Tensor.cpu = to, cpu
        try:
            with _host_ops_mode(registry):
                yield registry
        finally:
            torch.Tensor.numpy, torch.Tensor.tolist = recorded_numpy, recorded_tolist
            torch.from_numpy, torch.tensor = from_numpy, recorded_tensor
            torch.Tensor.to, torch.Tensor.cpu = recorded_to, recorded_cpu


def is_host_device(device: Any) -> bool:
    """`cpu` (no index) is the host; the harness's device is `cpu:0`."""
    import torch

    if device is None:
        return False
    device = torch.device(device)
    return device.type == "cpu" and device.index is None


def _host_ops_mode(registry: HostTensors) -> Any:
    """The dispatch mode above the recorder's that classifies every op (module docstring)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    from racefuzz.trace.capture import active

    class HostOps(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
            device = kwargs.get("device")
            targets_host = device is None or is_host_device(device)
            device_inputs = [t for t in tensors if not registry.holds(t) and not (t.dim() == 0 and t.is_cpu)]
            recorder = active()
            like = _LIKE.get(func.__name__.split(".")[0])
            if like is not None and not targets_host and tensors and registry.holds(tensors[0]):
                # `zeros_like(host_tensor, device=cpu:0)` takes only the host tensor's shape (as the recorder
                # takes it on a GPU): made as `zeros(shape, device=cpu:0)`, it reads nothing of the host's.
                source = tensors[0]
                factory = getattr(torch.ops.aten, like).default
                return factory(list(source.shape), dtype=kwargs.get("dtype") or source.dtype, device=device)
            inputs = {t.untyped_storage().data_ptr() for t in tensors}
            if recorder is None or recorder.paused or device_inputs or not targets_host:
                start = len(recorder.record.trace.ops) if recorder is not None else 0
                out = func(*args, **kwargs)
                if device is not None and targets_host:  # a copy to the host (`.to("cpu")`): host memory
                    for made in _fresh(out, inputs):
                        registry.add(made)
                if recorder is not None:
                    name_vllm_lines(recorder, start)
                return out
            reads, writes = [], []
            for index, argument in enumerate(func._schema.arguments):
                value = args[index] if index < len(args) else kwargs.get(argument.name)
                values = [v for v in tree_leaves(value) if isinstance(v, torch.Tensor) and registry.holds(v)]
                alias = argument.alias_info
                (writes if alias is not None and alias.is_write else reads).extend(values)
            recorder.paused += 1
            try:
                out = func(*args, **kwargs)
            finally:
                recorder.paused -= 1
            fresh = _fresh(out, inputs)
            for made in fresh:
                registry.add(made)
            if writes or (fresh and reads):  # a view, or a fresh host allocation, is no access
                start = len(recorder.record.trace.ops)
                host_reads = [t for t in reads if t.numel()]
                recorder.host_access(f"{func} (host)", host_reads, [t for t in writes + fresh if t.numel()])
                name_vllm_lines(recorder, start)
            return out

    return HostOps()


_LIKE = {"zeros_like": "zeros", "empty_like": "empty", "ones_like": "ones"}
"""The `*_like` factories, by the factory that makes the same tensor from a shape."""


def _fresh(out: Any, inputs: set[int]) -> list[Any]:
    import torch
    from torch.utils._pytree import tree_leaves

    return [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs]


def _host_read(tensor: Any, kernel: str) -> None:
    from racefuzz.trace.capture import active

    recorder = active()
    if recorder is not None and not recorder.paused and tensor.numel():
        start = len(recorder.record.trace.ops)
        recorder.host_access(kernel, [tensor], [])
        name_vllm_lines(recorder, start)


_OWN_FILES = (os.path.abspath(__file__), os.path.join(os.path.dirname(os.path.abspath(__file__)), "runner.py"))
_SKIPPED = (
    f"{os.sep}torch{os.sep}",
    f"{os.sep}numpy{os.sep}",
    f"{os.sep}racefuzz{os.sep}trace{os.sep}",
    "contextlib.py",
)


def caller_line() -> str:
    """`file:line (function)` of the innermost frame that is none of this harness's, racefuzz's recorder's,
    torch's or NumPy's: the vLLM line that made the access."""
    import sys

    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if name not in _OWN_FILES and not any(part in name for part in _SKIPPED):
            return f"{name}:{frame.f_lineno} ({frame.f_code.co_name})"
        frame = frame.f_back
    return ""


def name_vllm_lines(recorder: Any, start: int) -> None:
    """The recorder names the innermost frame outside torch and itself, which for an access made through
    this module is this module's line: the trace ops from `start` on that name it get the vLLM line."""
    ops = recorder.record.trace.ops
    line = None
    for index in range(start, len(ops)):
        if os.path.basename(__file__) in getattr(ops[index], "source", ""):
            line = line or caller_line()
            ops[index] = ops[index]._replace(source=line)
