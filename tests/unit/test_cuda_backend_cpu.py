"""The CUDA backend's CPU-side contract: lazy imports, clean refusals, and the staging it hands the GPU.

The staging tests decode the packed descriptor array exactly as the kernels in `kernels/req_to_token.cu`
do (numpy stands in for the device) and replay the calls in host order: what the emulated kernels load
must be the sequential reference, so a wrong offset, grouping or kernel choice fails here, on CPU CI.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from racefuzz import Device, InvalidArgument, Schedule, expected_observations
from racefuzz.backends import cuda
from racefuzz.backends.cuda import (
    POISON,
    READ_FALLBACK,
    WRITE_FALLBACK,
    CudaConfig,
    Staging,
    collect_observations,
    draw_distinct_streams,
    kernel_catalog,
    stage,
)
from racefuzz.errors import BackendUnavailable
from racefuzz.kernel_sources import kernel_source
from racefuzz.litmus import all_litmus
from racefuzz.program import Program

CATALOG = kernel_catalog(kernel_source())


def test_importing_the_backend_imports_neither_torch_nor_cupy() -> None:
    code = (
        "import sys\n"
        "import racefuzz.backends, racefuzz.sim\n"
        "racefuzz.backends.executor('sim')\n"
        "import racefuzz.backends.cuda as c\n"
        "c.CudaExecutor()\n"
        "c.CudaConfig(timeline=True)\n"
        "from racefuzz.kernel_sources import kernel_source\n"
        "c.kernel_catalog(kernel_source())\n"
        "leaked = sorted(m for m in ('torch', 'cupy') if m in sys.modules)\n"
        "assert not leaked, leaked\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_execute_without_a_usable_gpu_raises_a_one_line_backend_unavailable() -> None:
    reason = cuda.cuda_unavailable_reason()
    if reason is None:
        pytest.skip("a GPU is usable here; tests/cuda covers execute")
    assert "\n" not in reason
    program = all_litmus()[0].program
    with pytest.raises(BackendUnavailable) as raised:
        cuda.execute(program)
    message = str(raised.value)
    assert "\n" not in message
    assert reason in message


def test_missing_torch_or_cupy_names_the_pip_line(monkeypatch: pytest.MonkeyPatch) -> None:
    # A None entry in sys.modules makes `import name` raise ImportError, as if it were not installed.
    monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(BackendUnavailable, match=r"CuPy is not installed.*pip install 'racefuzz\[cuda1[23]\]'"):
        cuda.import_cupy()
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(BackendUnavailable, match=r"torch is not installed.*pip install 'racefuzz\[cuda13\]'"):
        cuda.import_torch()
    reason = cuda.cuda_unavailable_reason()
    assert reason is not None and "pip install 'racefuzz[cuda13]'" in reason and "\n" not in reason


def test_pip_line_follows_torchs_cuda_major_version() -> None:
    class Version:
        def __init__(self, cuda: str | None) -> None:
            self.cuda = cuda

    class Torch:
        def __init__(self, cuda: str | None) -> None:
            self.version = Version(cuda)

    assert cuda.pip_line(Torch("12.8")) == "pip install 'racefuzz[cuda12]'"
    assert cuda.pip_line(Torch("13.0")) == "pip install 'racefuzz[cuda13]'"
    assert cuda.pip_line(Torch(None)) == "pip install 'racefuzz[cuda13]'"


def test_bad_device_index_is_an_invalid_argument() -> None:
    with pytest.raises(InvalidArgument):
        CudaConfig(device=-1)


# -- kernels ------------------------------------------------------------------------------------------------


def test_catalog_sorts_the_kernels_by_signature() -> None:
    assert {"rf_write_cells", "prefill_write", "overalloc_write", "rewrite_live_row"} <= CATALOG.writers
    assert {"rf_read_cells", "block_gather", "page_table_build"} <= CATALOG.readers
    assert not CATALOG.writers & CATALOG.readers
    # A reader's name on a writing launch must not bind the writer's argument list, and vice versa.
    assert CATALOG.writer_for("block_gather") == WRITE_FALLBACK
    assert CATALOG.reader_for("prefill_write") == READ_FALLBACK
    assert CATALOG.writer_for("prefill_write") == "prefill_write"
    assert CATALOG.reader_for("no_such_kernel") == READ_FALLBACK


def test_catalog_refuses_a_source_without_the_fallbacks() -> None:
    source = 'extern "C" __global__ void rf_spin(long long cycles) {}\n'
    with pytest.raises(BackendUnavailable, match="rf_write_cells"):
        kernel_catalog(source)
    wrong = kernel_source().replace("int* observed,\n", "float* observed,\n")
    with pytest.raises(BackendUnavailable, match="rf_read_cells"):
        kernel_catalog(wrong)


# -- staging ------------------------------------------------------------------------------------------------


def emulate(program: Program, staging: Staging) -> np.ndarray:
    """Run every staged call in host order on numpy tables, as the kernels would; return the observation slots."""
    tables = {b.id: np.full((b.rows, b.cols), b.fill, dtype=np.int32) for b in program.buffers}
    host = staging.host.copy()  # the device copy: readers store into its observation slots
    observed = host[staging.observed_base :]
    assert (observed[: staging.observed_size] == POISON).all()
    for launch in program.launches:
        for call in staging.calls[launch.index]:
            assert (call.kernel in CATALOG.readers) == call.reads
            assert (call.kernel in CATALOG.writers) == (not call.reads)
            table = tables[call.buffer]
            for k in range(call.count):
                at = call.rects_at + 5 * k
                assert at + 5 <= staging.observed_base, "descriptors lie before the observation slots"
                row0, nrows, col0, ncols, offset = (int(v) for v in host[at : at + 5])
                cells = table[row0 : row0 + nrows, col0 : col0 + ncols]
                n = nrows * ncols
                if call.reads:
                    assert offset + n <= staging.observed_size
                    observed[offset : offset + n] = cells.reshape(-1)
                else:
                    assert offset + n <= staging.observed_base, "writers read values, never observation slots"
                    cells[...] = host[offset : offset + n].reshape(nrows, ncols)
    return observed[: staging.observed_size]


def assert_same(got: dict[int, tuple[np.ndarray, ...]], want: dict[int, tuple[np.ndarray, ...]]) -> None:
    assert got.keys() == want.keys()
    for index in want:
        assert len(got[index]) == len(want[index])
        for g, w in zip(got[index], want[index], strict=True):
            assert g.dtype == np.int32 and g.shape == w.shape
            np.testing.assert_array_equal(g, w)


def mixed_program() -> Program:
    """Two buffers; reads across both; overlapping stores in one launch; a launch that reads and writes."""
    device = Device()
    s = device.stream("s")
    a = device.buffer("a", 6, 10, fill=-1)
    b = device.buffer("b", 3, 4, fill=7)
    s.launch("prefill_write", writes=[(a[0:2, 0:10], np.arange(20)), (b[1, 0:4], [1, 2, 3, 4])])
    # Overlapping stores: the later one wins in the replay, so they must not share a call.
    s.launch("rewrite_live_row", writes=[(a[0, 2:6], 50), (a[0, 4:8], 60), (a[5, 0:3], 70)])
    # A reader's name on a writing launch.
    s.launch("block_gather", writes=[(a[3:5, 8:10], [[1, 2], [3, 4]])])
    # Reads interleaving buffers: a, b, a.
    s.launch("page_table_build", reads=[a[0, 0:10], b[0:3, 1:3], a[3:6, 7:10]])
    # Read then write the same cells in one launch: loads see the old values.
    s.launch("custom_step", reads=[a[1, 0:4]], writes=[(a[1, 0:4], 99)])
    s.launch("block_gather", reads=[a[1, 0:4], a[0:2, 0:10]])
    return device.finish()


def test_staging_replays_the_sequential_reference_for_every_litmus_and_a_mixed_program() -> None:
    programs = [litmus.program for litmus in all_litmus()] + [mixed_program()]
    for program in programs:
        staging = stage(program, Schedule(), CATALOG)
        observed = emulate(program, staging)
        assert POISON not in observed, "every observation slot is written by some reader"
        assert_same(collect_observations(staging, observed), expected_observations(program))


def test_staging_splits_calls_by_buffer_and_by_overlapping_stores() -> None:
    program = mixed_program()
    staging = stage(program, Schedule(), CATALOG)
    calls = [staging.calls[launch.index] for launch in program.launches]
    assert [(c.kernel, c.buffer, c.count) for c in calls[0]] == [("prefill_write", 0, 1), ("prefill_write", 1, 1)]
    # a[0, 2:6] and a[0, 4:8] overlap: two calls; a[5, 0:3] joins the second.
    assert [(c.kernel, c.count) for c in calls[1]] == [("rewrite_live_row", 1), ("rewrite_live_row", 2)]
    assert [c.kernel for c in calls[2]] == [WRITE_FALLBACK]
    assert [(c.kernel, c.buffer, c.count, c.reads) for c in calls[3]] == [
        ("page_table_build", 0, 2, True),
        ("page_table_build", 1, 1, True),
    ]
    assert [(c.kernel, c.reads) for c in calls[4]] == [(READ_FALLBACK, True), (WRITE_FALLBACK, False)]


def test_only_the_first_read_call_of_a_launch_carries_the_read_spin() -> None:
    program = mixed_program()
    reader = program.launches[3]
    staging = stage(program, Schedule(read_spins={reader.index: 1500.0}), CATALOG)
    assert [c.spin_us for c in staging.calls[reader.index]] == [1500.0, 0.0]
    assert all(c.spin_us == 0.0 for i, calls in staging.calls.items() if i != reader.index for c in calls)


# -- streams ------------------------------------------------------------------------------------------------


class FakePool:
    """torch's stream pool in miniature: hands out `size` handles round-robin."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.drawn = 0

    def __call__(self) -> int:
        handle = 1000 + self.drawn % self.size
        self.drawn += 1
        return handle


def test_aliased_streams_are_redrawn() -> None:
    # The pool wraps around onto a stream already taken (the current stream, say) ...
    pool = FakePool(5)
    pool.drawn = 3
    assert draw_distinct_streams(4, pool, lambda s: s, taken={1000}) == [1003, 1004, 1001, 1002]
    # ... or hands out one stream twice (another thread drew in between, or a lap of the pool).
    handles = iter([7, 7, 8, 7, 9])
    assert draw_distinct_streams(3, lambda: next(handles), lambda s: s, taken=set()) == [7, 8, 9]


def test_a_pool_too_small_for_the_program_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="distinct CUDA streams"):
        draw_distinct_streams(5, FakePool(4), lambda s: s, taken=set())


def test_a_schedule_for_another_program_is_refused_before_any_gpu_work() -> None:
    program = all_litmus()[0].program
    with pytest.raises(InvalidArgument, match="read_spins"):
        cuda.execute(program, Schedule(read_spins={len(program.ops) + 3: 10.0}))


def test_staging_packed_once_per_program_is_what_a_cold_packing_gives_under_any_schedule() -> None:
    # stage() keeps the program's packing and lays each schedule's read windows and gate slots over it: a
    # schedule with both, then one with neither, then the first again, must each stage exactly as a fresh
    # packing of the program would, and the kept packing must not pick up the first schedule's windows.
    from racefuzz.backends.cuda.staging import _pack

    for litmus in all_litmus():
        program = litmus.program
        launches = program.launches
        readers = [op.index for op in launches if op.reads]
        if not readers or len(launches) < 2:
            continue
        busy = Schedule(read_spins={readers[0]: 700.0}, orders=((launches[0].index, launches[-1].index),))
        for schedule in (busy, Schedule(), busy):
            staged = stage(program, schedule, CATALOG)
            cold = _pack(program, CATALOG)
            gates_at = cold.observed_base + cold.observed_size
            assert staged.gates_at == gates_at and staged.gate_count == len(schedule.orders)
            assert np.array_equal(staged.host[:gates_at], cold.prefix)
            assert not staged.host[gates_at : gates_at + 2 * staged.gate_count].any()
            assert np.array_equal(staged.host[gates_at + 2 * staged.gate_count :], cold.tables)
            spun = {index: [call.spin_us for call in calls if call.spin_us] for index, calls in staged.calls.items()}
            assert {i: s for i, s in spun.items() if s} == ({readers[0]: [700.0]} if schedule.read_spins else {}), (
                litmus.name
            )
            assert all(call.spin_us == 0.0 for calls in cold.calls.values() for call in calls)
