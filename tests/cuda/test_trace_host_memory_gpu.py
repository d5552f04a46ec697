"""Host memory on a real GPU, beside the CPU's model of it (tests/unit/test_trace_host_memory.py): a kernel
reading pinned memory through a zero-copy device view (UVA) and the host writing that memory are accesses of
one storage (the view has the pinned buffer's address), a race unless the host waited for the kernel's
event; `.tolist()` of a host copy a non-blocking D2H copy is still writing races unless after its event.

Each test prints what it saw (run with `-s` for the record)."""

from __future__ import annotations

import pytest

from racefuzz.trace.judge import trace_races
from racefuzz.trace.search import run_once

pytestmark = pytest.mark.cuda


def uva_view(pinned):
    """A CUDA tensor over `pinned`'s memory, zero-copy (UVA: a pinned host pointer is a device pointer), as
    vLLM's `get_accelerator_view_from_cpu_tensor` makes one, here through `__cuda_array_interface__`."""
    import torch

    class Interface:
        def __init__(self) -> None:
            self.__cuda_array_interface__ = {
                "data": (pinned.data_ptr(), False),
                "shape": tuple(pinned.shape),
                "typestr": "<f4",
                "version": 3,
            }

    view = torch.as_tensor(Interface(), device="cuda")
    assert view.data_ptr() == pinned.data_ptr()
    return view


def uva_step(sync: str):
    def step(env):
        import torch

        pinned = torch.zeros(8, dtype=torch.float32, pin_memory=True)
        view = uva_view(pinned)
        env.synchronize()
        read = view * 2  # the kernel reads pinned memory through its device view
        done = torch.cuda.Event()
        done.record()
        if sync == "event":
            done.synchronize()
        pinned.fill_(1.0)  # the host's write of the same bytes
        return {"read": read}

    return step


def d2h_step(sync: str):
    def step(env):
        import torch

        result = torch.arange(1 << 16, device="cuda") * 3
        host = result.to("cpu", non_blocking=True)  # pinned (torch pins a non-blocking copy's destination)
        copy_done = torch.cuda.Event()
        copy_done.record()
        if sync == "event":
            copy_done.synchronize()
        values = host.tolist()
        return {"first": torch.tensor(values[:4])}

    return step


def kinds(step):
    found = trace_races(run_once(step, "cuda").program)
    print(*found, sep="\n  ")
    return [(r.race.kind, r.first.stream.name, r.second.stream.name) for r in found]


def test_a_host_write_races_a_kernel_reading_its_uva_view_unless_after_the_event():
    assert kinds(uva_step("none")) == [("WAR", "default", "host")]
    assert kinds(uva_step("event")) == []


def test_tolist_of_a_pending_d2h_copy_races_unless_after_its_event():
    assert kinds(d2h_step("none")) == [("RAW", "default", "host")]
    assert kinds(d2h_step("event")) == []
