"""Host memory in a CPU recording (`racefuzz.trace.host_memory`): host tensors on `cpu`, device tensors on the
stand-in `cpu:0`; the host's accesses recorded as the host's, a copy between them a launch; zero-copy (UVA)
views of pinned memory one storage with it. Each "no race" beside its racy control in the same module.
tests/cuda/test_trace_host_memory_gpu.py runs the UVA and D2H steps on a GPU (real pinned memory)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from racefuzz.trace import host_memory  # noqa: E402
from racefuzz.trace.judge import trace_races  # noqa: E402
from racefuzz.trace.search import run_once  # noqa: E402

DEVICE = torch.device(host_memory.DEVICE)


def races(step):
    return trace_races(run_once(step, "cpu").program)


def uva_step(sync: str, through: str):
    """The host writes a pinned buffer (through its tensor or its NumPy view) after a kernel read it
    through its device view, and, as `sync` says, after waiting for the kernel's event or not."""

    def step(env):
        with host_memory.HostTensors().recorded():
            pinned = torch.zeros(8, dtype=torch.float32, device="cpu")
            array = host_memory.wrap(pinned.numpy(), pinned)
            view = host_memory.device_view(pinned)
            env.synchronize()
            read = view * 2  # the kernel reads pinned memory through its device view (no other input)
            done = torch.cuda.Event()
            done.record()
            if sync == "event":
                done.synchronize()
            if through == "tensor":
                pinned.fill_(1.0)  # the host's write, by the host tensor's name
            else:
                array[0:4] = 1.0  # the host's write, through NumPy
            return {"read": read}

    return step


@pytest.mark.parametrize("through", ["tensor", "numpy"])
def test_a_host_write_races_a_kernel_reading_the_uva_view(through):
    found = races(uva_step("none", through))
    assert [(r.race.kind, r.first.stream.name, r.second.stream.name) for r in found] == [("WAR", "default", "host")]
    assert found[0].first.kernel == "aten.mul.Tensor"  # a device launch, though its only input is host memory


@pytest.mark.parametrize("through", ["tensor", "numpy"])
def test_the_same_write_after_the_kernels_event_sync_is_clean(through):
    assert races(uva_step("event", through)) == []


def test_a_device_view_is_one_storage_with_its_host_tensor_and_its_views_are_device_views():
    seen = {}

    def step(env):
        with host_memory.HostTensors().recorded() as host_tensors:
            pinned = torch.zeros(4, device="cpu")
            view = host_memory.device_view(pinned)
            part = view[1:3].unsqueeze(0)
            seen["host"], seen["view"], seen["part"] = (host_tensors.holds(t) for t in (pinned, view, part))
            seen["same"] = view.untyped_storage().data_ptr() == pinned.untyped_storage().data_ptr()
            part.add_(1)  # a launch on the view's bytes

    trace = run_once(step, "cpu").program
    assert seen == {"host": True, "view": False, "part": False, "same": True}
    (launch,) = [op for op in trace.ops if getattr(op, "kernel", "") == "aten.add_.Tensor"]
    assert launch.stream.name == "default"


def d2h_step(sync: str):
    """A device result copied to the host with `non_blocking=True` (the copy a launch on the stream), its
    event recorded, then `.tolist()` of the host copy: before the event's sync or after it."""

    def step(env):
        with host_memory.HostTensors().recorded():
            result = torch.arange(4, device=DEVICE) * 3
            host = result.to("cpu", non_blocking=True)
            copy_done = torch.cuda.Event()
            copy_done.record()
            if sync == "event":
                copy_done.synchronize()
            values = host.tolist()  # the host's read: no sync of the stream
            return {"values": torch.tensor(values)}

    return step


def test_tolist_of_a_host_copy_before_its_copy_event_sync_races():
    found = races(d2h_step("none"))
    assert [(r.race.kind, r.first.kernel, r.second.kernel) for r in found] == [
        ("RAW", "aten._to_copy.default", "Tensor.tolist (host read)")
    ]


def test_tolist_of_a_host_copy_after_its_copy_event_sync_is_clean():
    assert races(d2h_step("event")) == []


def test_a_blocking_copy_to_the_host_syncs_the_stream_as_on_a_gpu():
    def step(env):
        with host_memory.HostTensors().recorded():
            host = (torch.arange(4, device=DEVICE) * 3).to("cpu")  # torch's memcpy_and_sync on a GPU
            return {"values": torch.tensor(host.tolist())}

    assert races(step) == []
    assert races(d2h_step("none"))  # the same read after a non-blocking copy: the control


def test_a_tensor_made_on_a_device_tensors_device_is_a_device_tensor():
    seen = {}

    def step(env):
        with host_memory.HostTensors().recorded() as host_tensors:
            device_tensor = torch.zeros(4, device=DEVICE)
            made = torch.ones(4, device=device_tensor.device)  # `device=t.device`: `cpu` to torch
            host = torch.ones(4, device="cpu")
            seen["device"] = device_tensor.device
            seen["made"] = host_tensors.holds(made)
            seen["host"] = host_tensors.holds(host), host.device
            seen["is_cuda"] = device_tensor.is_cuda, host.is_cuda

    run_once(step, "cpu")
    assert seen == {
        "device": DEVICE,
        "made": False,
        "host": (True, torch.device("cpu")),
        "is_cuda": (True, False),
    }
    assert "device" not in vars(torch.Tensor) and "is_cuda" not in vars(torch.Tensor)  # torch's own again


def test_item_of_a_host_tensor_is_a_host_read_not_a_sync():
    def step(env):
        with host_memory.HostTensors().recorded():
            result = torch.arange(4, device=DEVICE)
            host = result.to("cpu", non_blocking=True)
            total = int(host.sum())  # the host's own op and read: no wait for the copy
            return {"total": torch.tensor(total)}

    found = races(step)
    assert found and all(r.second.stream.name == "host" for r in found)


def test_a_host_tensor_indexed_by_a_list_stays_a_host_tensor():
    # sglang 0.5.23 ScheduleBatch.filter_batch: `self.seq_lens_cpu = self.seq_lens_cpu[keep_indices]`, a list
    # of ints; torch turns the list into an index tensor of its own, which was taken for a device tensor.
    seen = {}

    def step(env):
        with host_memory.HostTensors().recorded() as host_tensors:
            host = torch.tensor([5, 6, 7], dtype=torch.int64)
            kept = host[[0, 2]]
            host[[1]] = 9
            by_device = host[torch.tensor([0, 1], device=DEVICE)]  # a device index: a device op (the control)
            seen["kept"] = host_tensors.holds(kept), kept.tolist()
            seen["written"] = host.tolist()
            seen["by_device"] = host_tensors.holds(by_device)

    run_once(step, "cpu")
    assert seen == {"kept": (True, [5, 7]), "written": [5, 9, 7], "by_device": False}
    assert "__getitem__" not in vars(torch.Tensor) and "__setitem__" not in vars(torch.Tensor)
