"""The recorder's torch dispatch mode: every torch op the C++ fast path leaves to Python, as a launch.

`trace_mode_class()` makes `TraceMode`, the `TorchDispatchMode` a recording pushes (`racefuzz.trace.capture.
recording`): an op's read and write sets come from its schema (`racefuzz.trace.op_schemas`), its host sync
from `racefuzz.trace.sync_rules`, its stream from the recorder's current stream; an op the fast path takes
goes to it first (`launch_op`). `capture_mode_class()` makes the mode a CUDA graph capture puts on top of
it (`racefuzz.trace.graphs`). Imports torch lazily: the classes are made on first use.
"""

from __future__ import annotations

import functools
from typing import Any

from racefuzz.trace import fastpath, graphs, op_schemas
from racefuzz.trace.recorder import Recorder


@functools.cache
def trace_mode_class() -> type:
    """The recorder's `TorchDispatchMode` subclass (made once: torch is imported here, not at import time)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    # Locals the mode's methods close over (no `import torch`, no module global, per op).
    tensor_type = torch.Tensor
    strided = torch.strided
    set_eval_frame = torch._C._dynamo.eval_frame.set_eval_frame
    disable_torch_dispatch = torch._C._DisableTorchDispatch
    schemas = op_schemas.schemas()
    infos = schemas.infos
    info_of = schemas.info
    accesses_of = schemas.accesses
    tensors_of = schemas.tensors

    class TraceMode(TorchDispatchMode):
        """Records every torch op as a launch on the current stream (see `racefuzz.trace.recorder`)."""

        def __init__(self, recorder: Recorder) -> None:
            super().__init__()
            self.recorder = recorder
            self.fastpath = fastpath.load()
            self.launch_op = self.fastpath.launch_op if self.fastpath is not None else None
            self.bail = object()
            self.fast_state = (
                fastpath.pack_state(self.fastpath, recorder.fast_state(self.bail))
                if self.fastpath is not None
                else None
            )

        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            # torch wraps a mode's `__torch_dispatch__` in `torch._dynamo.disable` (a Python wrapper of a
            # few µs per op); this one keeps Dynamo out of its frames itself, with the C call that wrapper
            # makes (`set_eval_frame(None)`, the prior callback restored after).
            return False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            prior = set_eval_frame(None)
            try:
                info = infos.get(func) or info_of(func)
                if kwargs is None:
                    kwargs = op_schemas.NO_KWARGS
                recorder = self.recorder
                if (
                    info.fast
                    and self.fast_state is not None
                    and not recorder.paused
                    and not recorder.opaque
                    and not graphs.CAPTURES  # the C++ applies delays and snapshots: not inside a capture
                ):
                    out = self.launch_op(self.fast_state, info.arguments, info.label, info.call, args, kwargs)
                    if out is not self.bail:
                        return out
                return self._record(func, info, args, kwargs)
            finally:
                set_eval_frame(prior)

        def _record(self, func: Any, info: op_schemas.OpInfo, args: tuple, kwargs: dict) -> Any:
            recorder = self.recorder
            if recorder.paused or recorder.opaque or info.not_access:
                if info.name == "record_stream":
                    recorder.on_record_stream(args[0])
                out = func(*args, **kwargs)
                if recorder.paused:
                    return out  # the recorder's own copies
                if info.name == "resize_":
                    recorder.resized(args[0])
                # Allocations count inside an opaque launch too (a launcher's own tensors can be freed and
                # their blocks reused); an output on an input's storage is a view, not an allocation.
                if info.allocates or (recorder.opaque and info.fresh_outputs):
                    inputs = op_schemas.storage_ptrs(tensors_of(list(args)))
                    for tensor in tensors_of(out):
                        on_device = tensor.is_cuda or not recorder.on_gpu
                        if on_device and tensor.untyped_storage().data_ptr() not in inputs:
                            recorder.allocated(tensor)
                return out
            if info.name == "lift_fresh" and (recorder.on_gpu or recorder.lifting_to_device):
                return self._lifted(func, args, kwargs)
            reads, writes = accesses_of(info, args, kwargs)
            outputs_written = info.fresh_outputs
            if not writes and not outputs_written:
                return func(*args, **kwargs)  # a view or metadata op
            on_gpu = recorder.on_gpu
            capture = graphs.capture_of(recorder) if graphs.CAPTURES else None
            if capture is not None:
                if info.sync is not None and info.sync(args, kwargs, None, on_gpu):
                    raise capture.refused(f"{info.label} (it makes the host wait for the stream)")
                if not on_gpu:
                    func = capture.deferred(func)  # CUDA runs a captured kernel at each replay, not now
            if on_gpu:
                device = kwargs.get("device")
                if not reads and not writes:
                    # A factory (`zeros`, `arange`): a device launch iff it makes a CUDA tensor.
                    if device is None or device.type != "cuda":
                        return func(*args, **kwargs)
                elif [t for t in reads if not t.is_cuda] or [t for _, t in writes if not t.is_cuda]:
                    # Host tensors only: the host's own access of pinned memory, unless the op makes a CUDA
                    # tensor from them (`x.to("cuda")`: a copy launched on the stream, writing its output).
                    # Only strided sources: a sparse tensor's copy has no plain storage to record.
                    to_device = (
                        outputs_written
                        and device is not None
                        and device.type == "cuda"
                        and all(t.layout == strided for t in reads)
                    )
                    on_host = not [t for t in reads if t.is_cuda] and not [t for _, t in writes if t.is_cuda]
                    if on_host and not to_device:
                        pinned_reads = [t for t in reads if t.is_pinned()]
                        pinned_writes = [t for _, t in writes if t.is_pinned()]
                        out = func(*args, **kwargs)
                        if outputs_written:
                            pinned_writes += [t for t in tensors_of(out) if t.is_pinned()]
                        if pinned_reads or pinned_writes:
                            recorder.host_access(info.label, pinned_reads, pinned_writes)
                        return out
                    reads = [t for t in reads if t.is_cuda or t.is_pinned()]
                    writes = [(slot, t) for slot, t in writes if t.is_cuda or t.is_pinned()]
                    if on_host and info.name != "_to_copy":
                        reads = []  # `zeros_like(t, device="cuda")`, `t.new_zeros(...)`: `t`'s shape, not its data

            read_tensors = reads
            if info.exact is not None:
                reads, writes = self._exact(info, args, kwargs, reads, writes)
            fresh = None
            if outputs_written:

                def fresh(out: Any) -> list[tuple[object, Any]]:
                    # An output on an input's storage is a view the schema does not declare (`_unsafe_view`).
                    inputs = {t.untyped_storage().data_ptr() for t in read_tensors}
                    made = [
                        (f"out{i}", t)
                        for i, t in enumerate(tensors_of(out))
                        if (not on_gpu or t.is_cuda or t.is_pinned()) and t.untyped_storage().data_ptr() not in inputs
                    ]
                    for _, t in made:
                        recorder.allocated(t)
                    return made

            if fresh is None and info.sync is None:
                return recorder.launch_op(info.label, func, args, kwargs, reads, writes)
            host_sync = None
            if info.sync is not None:
                sync = info.sync

                def host_sync(out: Any) -> str:
                    return sync(args, kwargs, out, on_gpu)

            return recorder.launch(
                info.label, "torch", lambda: func(*args, **kwargs), reads, writes, outputs=fresh, host_sync=host_sync
            )

        def _exact(
            self, info: op_schemas.OpInfo, args: tuple, kwargs: dict, reads: list[Any], writes: list[tuple[object, Any]]
        ) -> tuple[list[Any], list[tuple[object, Any]]]:
            """An index op's reads and writes with the byte sets its index values select
            (`racefuzz.trace.indexing`) in place of the schema's whole views, where the recorder can read
            those values (`Recorder.exact_indexing`); else, or if they cannot be worked out, the whole views,
            noted in the trace (`Recorder.whole_view`)."""
            recorder = self.recorder
            if not recorder.exact_indexing:
                recorder.whole_view(info.label)
                return reads, writes
            recorder.paused += 1  # the recorder's own reads of the index values (copies on a GPU)
            try:
                with disable_torch_dispatch():
                    found = info.exact(args, kwargs)
            except Exception:  # an index the rules do not know: the op's own checks say more, when it runs
                recorder.whole_view(info.label)
                return reads, writes
            finally:
                recorder.paused -= 1
            exact_reads, exact_writes = list(reads), list(writes)
            for region in found.reads.values():
                at = next((i for i, t in enumerate(exact_reads) if t is region.tensor), None)
                if at is None:  # not one of the op's arguments: the rule is wrong, the whole views stay
                    recorder.whole_view(info.label)
                    return reads, writes
                exact_reads[at] = region
            for region in found.writes.values():
                at = next((i for i, (_, t) in enumerate(exact_writes) if t is region.tensor), None)
                if at is None:
                    recorder.whole_view(info.label)
                    return reads, writes
                exact_writes[at] = (exact_writes[at][0], region)
            return exact_reads, exact_writes

        def _lifted(self, func: Any, args: tuple, kwargs: dict) -> Any:
            """`lift_fresh(t)` in a GPU run: torch made `t` from Python data (`torch.tensor`,
            `torch.as_tensor`) with the copy to the GPU hidden from the mode (torch excludes the Python key
            while it fills and copies the tensor; `lift_fresh` follows). A CUDA `t` was an allocation and a
            blocking copy on the current stream: a launch writing `t` (`TORCH_TENSOR_COPY`), then the host's
            sync of that stream (torch's copy from pageable memory waits for it). A host `t` (a tensor the step
            keeps on the host, a scalar torch wraps for an indexing assignment) is no launch, nor is a CUDA
            `t` on a storage the recorder has seen (made from that storage: no copy). In a CPU run, where every
            CPU tensor stands for a device tensor, only inside a `torch.tensor` / `as_tensor` / `asarray` call
            that names a `device` (`Recorder.lifting_to_device`, `racefuzz.trace.torch_patches`): the call a
            step makes as `torch.tensor(data, device=env.device)` to run on both, a copy to the GPU there.
            """
            recorder = self.recorder
            tensor = args[0] if args else None
            if (
                not isinstance(tensor, tensor_type)
                or (recorder.on_gpu and not tensor.is_cuda)
                or tensor.numel() == 0
                or recorder.knows(tensor)
            ):
                return func(*args, **kwargs)

            def made(out: Any) -> list[tuple[object, Any]]:
                recorder.allocated(out)
                return [("out0", out)]

            return recorder.launch(
                op_schemas.TORCH_TENSOR_COPY,
                "copy",  # it ran already: no delay point (a delay here would only follow the copy and its sync)
                lambda: func(*args, **kwargs),
                [],
                [],
                outputs=made,
                host_sync=lambda out: "after",
            )

    return TraceMode


@functools.cache
def capture_mode_class() -> type:
    """The dispatch mode a CUDA graph capture puts on top of the recorder's (`racefuzz.trace.graphs`)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class CaptureMode(TorchDispatchMode):
        """On top of the recorder's mode during a CUDA graph capture (`racefuzz.trace.graphs`): keeps what each
        op allocates (its fresh outputs), which belongs to the graph's pool, alive until the recording ends."""

        def __init__(self, kept: list[Any]) -> None:
            super().__init__()
            self.kept = kept

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if op_schemas.is_compute(func):
                self.kept.append(out)
            return out

    return CaptureMode


def capture_mode(kept: list[Any]) -> Any:
    """The dispatch mode a CUDA graph capture puts on top of the recorder's (`racefuzz.trace.graphs.begin`)."""
    return capture_mode_class()(kept)
