"""The CUDA backend's asynchronous form (`prepare` / `start` / `finish`), which batched searches use.

* `prepare(p, s).start().finish()` loads what `execute(p, s)` loads;
* preparing the next run while one is in flight neither waits for it nor disturbs it: the run in flight
  is still running when `prepare` returns (its streams' tail events are not complete) and loads exactly
  the sequential reference, and so does the prepared run once started;
* a batched search on the GPU builds during runs and still catches the control (`none`) k/k.
"""

from __future__ import annotations

import pytest

from racefuzz.backends import executor
from racefuzz.designs import load_design
from racefuzz.litmus import all_litmus
from racefuzz.oracle import expected_observations, find_corruptions
from racefuzz.program import Program
from racefuzz.scenarios.sglang import HAZARDS, MAX_ITERATIONS, build_program, decode_workload
from racefuzz.schedule import NO_DELAYS, Schedule
from racefuzz.search import search

pytestmark = pytest.mark.cuda

K = 5


def _program(data: bytes, design: str = "war-after-launch") -> Program:
    workload = decode_workload(data, hazards=frozenset(HAZARDS), max_iterations=MAX_ITERATIONS, plan_stream=None)
    return build_program(workload, load_design(design).hooks)


PROGRAMS = [
    bytes([3, 5, 2, 1, 0, 7, 3, 4, 0xB1, 0x6C, 5, 2, 9, 4, 2, 0x4E, 0x1F, 2]),
    bytes([1, 7, 0, 0, 1, 3, 12, 5, 0xFF, 0x03, 0x12, 4, 2, 1, 1, 0x20, 0x01, 9, 6, 1, 2, 3, 0, 0, 0]),
]


def _equal(a, b) -> bool:
    """Two `Observations` hold the same arrays for the same launches."""
    if a.keys() != b.keys():
        return False
    return all(len(a[k]) == len(b[k]) and all((x == y).all() for x, y in zip(a[k], b[k], strict=True)) for k in a)


@pytest.mark.parametrize("data", PROGRAMS, ids=["program-a", "program-b"])
def test_prepare_start_finish_loads_what_execute_loads(data: bytes) -> None:
    from racefuzz.backends import cuda

    program = _program(data)
    reader = next(op for op in program.launches if op.reads)
    schedule = Schedule(read_spins={reader.index: 400.0})
    synchronous = cuda.execute(program, schedule)
    asynchronous = cuda.prepare(program, schedule).start().finish()
    assert _equal(synchronous.observations, asynchronous.observations)
    assert not find_corruptions(program, asynchronous.observations)


def test_preparing_the_next_run_neither_waits_for_nor_disturbs_the_running_one() -> None:
    import torch

    from racefuzz.backends import cuda

    # The running program must end in a device launch: an sglang program ends by processing its last
    # result (the host blocks on copy_done), so its run is over when `start()` returns. A race-free litmus
    # whose last op is a launch after a wait_stream stays on the GPU after its issue.
    running_program = next(lit for lit in all_litmus() if lit.name == "war_wait_stream").program
    next_program = _program(PROGRAMS[1])
    reader = next(op for op in running_program.launches if op.reads)
    # 30 ms of read window inside the reader (the writer waits for it): the run is still on the GPU long
    # after its ops are issued, and its load is stored only after the next run was prepared.
    running = cuda.prepare(running_program, Schedule(read_spins={reader.index: 30_000.0})).start()
    tails = []
    for stream in running.bound.streams:
        event = torch.cuda.Event()
        event.record(stream)
        tails.append(event)
    prepared = cuda.prepare(next_program, NO_DELAYS)
    still_running = not all(event.query() for event in tails)
    reported_busy = not running.done()
    execution = running.finish()
    assert still_running, "prepare() waited for the run in flight (it must not synchronize the device)"
    assert reported_busy and running.done(), "done() is False while the run's streams work, True once finished"
    assert _equal(execution.observations, expected_observations(running_program))
    assert _equal(prepared.start().finish().observations, expected_observations(next_program))


def test_a_batched_gpu_search_catches_the_control_k_of_k() -> None:
    gpu = executor("cuda")
    assert hasattr(gpu, "prepare"), "executor('cuda') is a PreparingExecutor"
    # Forced orders (gates): a spin counterexample shrunk to the delay floor replays 4 or 5 times in 5 (seen
    # on an H200 in sessions 5 to 7), a gated one holds its order exactly; spins stay covered, k of k
    # within the search, by the properties.
    result = search(
        load_design("none"), gpu, backend="cuda", examples=400, seed=1, repeat=K, batch=8, strategy="orders"
    )
    assert result.found and result.counterexample.oracle == "corruption"
    c = result.counterexample
    assert sum(bool(find_corruptions(c.program, gpu(c.program, c.schedule).observations)) for _ in range(K)) == K


def test_a_run_dropped_before_finish_does_not_leak_into_later_runs() -> None:
    """A started run dropped without `finish` (a batch ended by an exception) keeps its device array until its
    kernels are done (`runtime.used_on_streams`): the later runs, uploaded at once into whatever the caching
    allocator hands out, load exactly the sequential reference, and no CUDA error surfaces."""
    import gc

    import torch

    from racefuzz.backends import cuda

    program = _program(PROGRAMS[0])
    readers = [op.index for op in program.launches if op.reads]
    # The dropped run's readers spin 20 ms each before they load and store their observations, long after
    # the array is freed; without the record, the next uploads reuse the block under them.
    dropped = cuda.prepare(program, Schedule(read_spins={i: 20_000.0 for i in readers})).start()
    block, size = dropped.bound.staged.data_ptr(), dropped.bound.staged.numel()
    del dropped
    gc.collect()
    # Without the record the caching allocator hands the block just freed to the next request of its size.
    same_size = torch.empty(size, dtype=torch.int32, device=f"cuda:{torch.cuda.current_device()}")
    assert same_size.data_ptr() != block, "the dropped run's array was handed out while its kernels run"
    del same_size
    for _ in range(20):
        run = cuda.prepare(program, NO_DELAYS).start()
        assert not find_corruptions(program, run.finish().observations)
    torch.cuda.synchronize()
