"""Host memory in a CPU recording: which tensors are the host's, and the host's accesses of them, recorded
as the host's (`Recorder.host_access`) rather than as device launches.

In a plain CPU recording every tensor stands for a device tensor. An engine holds both: device tensors
(made on its device) and host tensors (pinned staging buffers, `*_cpu` mirrors, results copied back to the
host). A recording that asks for the split (`HostTensors().recorded()` around the step's code) gives the
engine the device stand-in `DEVICE` (`cpu:0`) for its device tensors; torch keeps `cpu:0` apart from
`cpu` in every op's `device` argument (and `x.to(cpu:0)` copies where `x.to(cpu)` would not), so host and
device tensors are told apart as on a GPU:

* a tensor made with `device="cpu"` (or none: torch's default), or computed by an op whose tensors are all
  host tensors, or by `torch.from_numpy`, is a host tensor; one made on `cpu:0` or by an op reading a device
  tensor is a device tensor;
* an op whose tensors are all host tensors is the host's access: it runs with the recorder paused and is
  recorded as a host access (its schema's written arguments written, the others read). Every other op
  (a device op; a copy between host and device: a non-blocking `copy_`, `.to("cpu")`) goes to the
  recorder as a launch on the current stream, as on a GPU;
* a host tensor indexed by a list of ints (`host[[0, 2]]`) is the host's op, its result a host tensor
  (torch makes the list an index tensor of its own, which would otherwise count as a device tensor);
* `Tensor.numpy()` / `.tolist()` (and `.item()`, `int()`: `_local_scalar_dense`) of a host tensor is the
  host's read, not a device read-back with a sync of the stream (a sync the engine never makes);
* a device tensor's `.to("cpu")` / `.cpu()` is a copy (torch would return the tensor itself, `cpu:0`
  being its `cpu`): a launch on the current stream writing a new host tensor, as on a GPU. A copy between
  host and device without `non_blocking=True` is followed by the host's sync of the current stream, as a
  GPU run records it (`SyncRules.in_copy`, there "after" the copy but for a copy to the device that
  converts on the device, "before" it: here always after, the later of the two);
* zero-copy (UVA): pinned host memory that kernels read through a device view is one storage with its
  host buffer. `device_view(host_tensor)` is that view: the same storage, but a device tensor, so an op
  on it is a launch on the current stream while the host's accesses through the host tensor (or its
  `HostArray`) stay the host's; a host write then races a kernel's read whichever name each used. Views
  of a device view are device views. (On a GPU the recorder needs none of this: the device view of pinned
  memory has the host buffer's address, so the recorder's storage key is the same.)

The host's NumPy writes are recorded too, through a `HostArray` (`wrap`): an `ndarray` view of a host
tensor's memory whose writes (item assignment, `fill`, a ufunc or NumPy function with `out=` it) are
recorded as the host's accesses of the bytes written, on the tensor's storage. A write through an index
array records the bounding range of what it selects (conservative).

This module is the recorder's: an access it records is named by the innermost frame outside it (the
engine's line), as the recorder names its own frames' callers (`sources._MACHINERY`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

DEVICE = "cpu:0"
"""The device stand-in a CPU recording with host memory gives an engine for its device tensors."""
HOST_WRITE = "numpy write (host)"
"""The kernel name of a host write through a `HostArray`."""
_DEVICE_VIEW = "_racefuzz_device_view"
"""The attribute that marks a tensor as a device view of host memory (`device_view`)."""


class HostArray(np.ndarray):
    """An `ndarray` view of a host tensor's memory whose writes are recorded as host accesses."""

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
    """`array` (the NumPy view of `owner`, a host tensor) as a `HostArray` over the same memory."""
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
        region_view = torch_view(owner, plain, first, (last - first) // plain.itemsize + 1, None)
    else:
        region_view = torch_view(owner, region, 0, None, region.strides)
    recorder.host_access(HOST_WRITE, [], [region_view])


def torch_view(owner: Any, region: np.ndarray, extra: int, length: int | None, strides: Any) -> Any:
    """The view of `owner` (a torch tensor) over `region`'s bytes (+ `extra`): its shape and strides, or a
    flat run of `length` elements."""
    base = owner.untyped_storage().data_ptr()
    itemsize = owner.element_size()
    start = (region.__array_interface__["data"][0] + extra - base) // itemsize
    flat = owner.reshape(-1) if owner.is_contiguous() else owner.as_strided((owner.numel(),), (1,), 0)
    if length is not None:
        return flat.as_strided((length,), (1,), start)
    return flat.as_strided(region.shape, tuple(s // itemsize for s in strides), start)


_ACTIVE: list[HostTensors] = []
"""The registries whose `recorded()` is on, innermost last."""


def active_host_tensors() -> HostTensors | None:
    """The registry of the innermost `HostTensors.recorded()` now on, else None (a recording without the
    host/device split)."""
    return _ACTIVE[-1] if _ACTIVE else None


def device_view(host_tensor: Any) -> Any:
    """A device view of `host_tensor`'s memory (UVA, zero-copy; module docstring): inside
    `HostTensors.recorded()`, the same storage as a device tensor; outside it (a GPU run, or a CPU run
    without the split) the tensor itself, every tensor there already being what it is."""
    registry = active_host_tensors()
    if registry is None:
        return host_tensor
    return registry.device_view(host_tensor)


def is_device_view(tensor: Any) -> bool:
    return bool(getattr(tensor, _DEVICE_VIEW, False))


class HostTensors:
    """The run's host tensors (by storage) and the context that records the host's accesses of them."""

    def __init__(self) -> None:
        self.storages: set[int] = set()
        self._alive: list[Any] = []  # held for the run: a freed host block's address must not be reused

    def add(self, tensor: Any) -> None:
        self.storages.add(tensor.untyped_storage().data_ptr())
        self._alive.append(tensor)

    def holds(self, tensor: Any) -> bool:
        """Whether `tensor` is a host tensor (a device view of host memory is not)."""
        return (
            tensor.is_cpu
            and tensor.untyped_storage().data_ptr() in self.storages
            and not getattr(tensor, _DEVICE_VIEW, False)
        )

    def device_view(self, host_tensor: Any) -> Any:
        """The device view of `host_tensor` (module docstring); `host_tensor` becomes a host tensor if it
        was not one."""
        import torch

        if not self.holds(host_tensor) and not is_device_view(host_tensor):
            self.add(host_tensor)
        with torch._C._DisableTorchDispatch():  # a view: no access
            view = host_tensor.view(host_tensor.shape)
        setattr(view, _DEVICE_VIEW, True)
        return view

    @contextlib.contextmanager
    def recorded(self) -> Iterator[HostTensors]:
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

        recorded_to = torch.Tensor.to
        torch_device = torch._C.TensorBase.device.__get__
        torch_pin_memory = torch.Tensor.pin_memory
        stand_in = torch.device(DEVICE)

        def device(self: Any) -> Any:
            # A CPU tensor's `device` is `cpu` whatever device it was made on: a device tensor's is the
            # stand-in, so that `torch.empty(n, device=t.device)` makes a device tensor, as on a GPU.
            if self.is_cpu and not registry.holds(self):
                return stand_in
            return torch_device(self)

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

        def is_cuda(self: Any) -> bool:
            # A device tensor is what a GPU's is, for the code that asks (0.5.15 managers/utils.py
            # `_async_d2h`: a pinned copy and `record_stream` for a CUDA tensor, a plain `.to("cpu")` else).
            return self.is_cpu and not registry.holds(self)

        def pin_memory(self: Any, *args: Any, **kwargs: Any) -> Any:
            # A host tensor stands for pinned memory already (a CPU-only torch has no pinned allocator); a
            # device tensor's is torch's error, as on a GPU.
            return self if registry.holds(self) else torch_pin_memory(self, *args, **kwargs)

        tensor_getitem, tensor_setitem = torch._C.TensorBase.__getitem__, torch._C.TensorBase.__setitem__

        def host_index(self: Any, index: Any) -> Any:
            # `host[[i, j]]`: torch makes the list an index tensor below Python, which no factory here sees
            # and the op would take for a device tensor; a list of ints indexing a host tensor is the host's.
            if isinstance(index, list) and index and all(type(i) is int for i in index) and registry.holds(self):
                return tensor(index, dtype=torch.int64)
            return index

        def getitem(self: Any, index: Any) -> Any:
            return tensor_getitem(self, host_index(self, index))

        def setitem(self: Any, index: Any, value: Any) -> None:
            tensor_setitem(self, host_index(self, index), value)

        patches = (
            (torch.Tensor, "__getitem__", getitem),
            (torch.Tensor, "__setitem__", setitem),
            (torch.Tensor, "numpy", numpy),
            (torch.Tensor, "tolist", tolist),
            (torch.Tensor, "to", to),
            (torch.Tensor, "cpu", cpu),
            (torch.Tensor, "device", property(device)),
            (torch.Tensor, "is_cuda", property(is_cuda)),
            (torch.Tensor, "pin_memory", pin_memory),
            (torch, "from_numpy", host_from_numpy),
            (torch, "tensor", tensor),
        )
        saved = [(owner, name, vars(owner).get(name, _ABSENT)) for owner, name, _ in patches]
        for owner, name, patch in patches:
            setattr(owner, name, patch)
        _ACTIVE.append(registry)
        try:
            with _host_ops_mode(registry):
                yield registry
        finally:
            _ACTIVE.remove(registry)
            for owner, name, before in reversed(saved):
                if before is _ABSENT:
                    delattr(owner, name)  # the inherited one (`TensorBase`'s) again
                else:
                    setattr(owner, name, before)


_ABSENT = object()


def is_host_device(device: Any) -> bool:
    """`cpu` (no index) is the host; the device stand-in is `cpu:0` (`DEVICE`)."""
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
            if kwargs.get("pin_memory"):  # a host tensor stands for pinned memory (no pinned allocator here)
                kwargs = dict(kwargs, pin_memory=False)
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
                out = func(*args, **kwargs)
                if device is not None and targets_host:  # a copy to the host (`.to("cpu")`): host memory
                    for made in _fresh(out, inputs):
                        registry.add(made)
                if recorder is not None and not recorder.paused and _blocking_copy(registry, func, args, kwargs, out):
                    recorder.on_stream_sync(recorder.current_stream())  # as `SyncRules.in_copy` on a GPU
                views = [t for t in tensors if is_device_view(t)]
                if views:  # a view of a device view of host memory is one too
                    viewed = {t.untyped_storage().data_ptr() for t in views}
                    for made in tree_leaves(out):
                        if isinstance(made, torch.Tensor) and made.untyped_storage().data_ptr() in viewed:
                            setattr(made, _DEVICE_VIEW, True)
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
                host_reads = [t for t in reads if t.numel()]
                recorder.host_access(f"{func} (host)", host_reads, [t for t in writes + fresh if t.numel()])
            elif not fresh and reads and func.__name__.split(".")[0] == "_local_scalar_dense":
                recorder.host_access(f"{func} (host read)", [t for t in reads if t.numel()], [])
            return out

    return HostOps()


def _blocking_copy(registry: HostTensors, func: Any, args: Any, kwargs: Any, out: Any) -> bool:
    """Whether `func` was a copy between host and device memory without `non_blocking=True` (torch's
    `memcpy_and_sync` on a GPU: the host waits for the stream after it). `copy_(dst, src, non_blocking)`;
    `_to_copy(src, ..., non_blocking=)`, its output the destination."""
    import torch

    name = func.__name__.split(".")[0]
    if name == "copy_" and len(args) > 1 and isinstance(args[1], torch.Tensor):
        dst, src = args[0], args[1]
        non_blocking = kwargs.get("non_blocking", len(args) > 2 and bool(args[2]))
    elif name == "_to_copy" and isinstance(out, torch.Tensor):
        dst, src = out, args[0]
        non_blocking = kwargs.get("non_blocking", False)
    else:
        return False
    return not non_blocking and bool(dst.numel()) and registry.holds(dst) != registry.holds(src)


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
        recorder.host_access(kernel, [tensor], [])


__all__ = [
    "DEVICE",
    "HOST_WRITE",
    "HostArray",
    "HostTensors",
    "active_host_tensors",
    "device_view",
    "is_device_view",
    "is_host_device",
    "wrap",
]
