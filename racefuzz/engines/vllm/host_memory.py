"""Host memory in a CPU recording of vLLM's runner: the recorder's host/device split
(`racefuzz.trace.host_memory`), and the vLLM buffers whose NumPy views are the host's writes.

vLLM's runner holds device tensors (made on `self.device`) and host tensors (the pinned halves of
`CpuGpuBuffer`s, the input batch's `*_cpu_tensor`s, made with `device="cpu"`). The harness gives the runner
the device stand-in `cpu:0` (`racefuzz.trace.host_memory.DEVICE`) and runs it inside
`HostTensors().recorded()`, so host ops are the host's accesses and a copy between the halves a launch on
the current stream, as on a GPU.

vLLM's input preparation writes the pinned half of each `CpuGpuBuffer` (`vllm/v1/utils.py`) mostly
through its NumPy view `buffer.np` (`BlockTable.append_row`: `self.block_table.np[row, a:b] = ids`;
`_prepare_inputs`: `self.query_start_loc.np[1 : n + 1] = cu_num_tokens`, ...). NumPy writes dispatch no
torch op, so the recorder sees none of them. The harness replaces each buffer's `np`, and the input batch's
`*_cpu` arrays, by a `HostArray` over the same memory (`wrap`; `runner.watch_pinned_numpy_writes`,
`runner.watch_input_batch_numpy_writes`): its writes are recorded as the host's accesses of the bytes
written, on the buffer's `cpu` tensor's storage, where the device's non-blocking copy reads them.
"""

from __future__ import annotations

from racefuzz.trace.host_memory import HOST_WRITE, HostArray, HostTensors, device_view, wrap

__all__ = ["HOST_WRITE", "HostArray", "HostTensors", "device_view", "wrap"]
