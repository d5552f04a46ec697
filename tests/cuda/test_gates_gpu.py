"""Gates on a real GPU: forced orders hold every time, an impossible one times out, and the simulator agrees.

* litmus: a reader on one stream and a writer of the same cells on another, no edge between them. Forced
  writer-first, the reader loads the writer's value in RUNS of RUNS runs with no spin at all; forced
  reader-first, it loads the old value in RUNS of RUNS although a spin holds the reader back long enough
  for the writer to clobber it otherwise (the same run without the gate is the negative control: it
  clobbers). Beside them, the plain run loads the old value (what the gate overturns).
* infeasible: the reader's stream is synchronized by the host before the writer is issued, so "writer
  first" can never hold: the run raises ScheduleInfeasible within a bounded time instead of hanging.
* no-op gates: on race-free programs, forced orders among unordered launches that share no cell change
  no loaded value (the sequential reference), run after run.
* agreement: for every built-in design, AGREEMENT_SCHEDULES forced-order schedules (`orders`, completed
  in issue order: every conflicting pair has one order), the GPU's loads equal the simulator's, cell for
  cell: 100%, asserted.
"""

from __future__ import annotations

import random
import time
import zlib

import numpy as np
import pytest

from racefuzz.backends import executor
from racefuzz.designs import load_design
from racefuzz.device import Device
from racefuzz.memory import in_order_loads
from racefuzz.program import Program
from racefuzz.scenarios.sglang import HAZARDS, build_program, decode_workload
from racefuzz.scenarios.sglang.designs import BUILTIN
from racefuzz.schedule import Schedule, ScheduleInfeasible
from racefuzz.schedulers.interleave import decode_interleaving
from racefuzz.schedulers.orders import decode_orders
from racefuzz.sim import simulate

RUNS = 1000
AGREEMENT_SCHEDULES = 1000
SPIN_US = 300.0


def _litmus() -> tuple[Program, int, int]:
    device = Device()
    forward, schedule = device.stream("forward_stream"), device.stream("schedule_stream")
    table = device.buffer("req_to_token", 4, 64)
    schedule.launch("prefill_write", writes=[(table[0, 0:64], 7)])
    device.synchronize()
    forward.launch("page_table_build", reads=[table[0, 0:64]])
    schedule.launch("rewrite_live_row", writes=[(table[0, 0:64], 9)])
    program = device.finish()
    reader, writer = 2, 3
    return program, reader, writer


def _loaded(execution, reader: int) -> set[int]:
    return set(np.unique(execution.observations[reader][0]).tolist())


def test_a_forced_order_holds_every_time() -> None:
    program, reader, writer = _litmus()
    run = executor("cuda")
    counts = {"writer first": 0, "reader first": 0, "plain": 0, "spun, no gate": 0}
    writer_first = Schedule(orders=((writer, reader),))
    reader_first = Schedule(read_spins={reader: SPIN_US}, orders=((reader, writer),))
    spun = Schedule(read_spins={reader: SPIN_US})
    for _ in range(RUNS):
        counts["writer first"] += _loaded(run(program, writer_first), reader) == {9}
        counts["reader first"] += _loaded(run(program, reader_first), reader) == {7}
        counts["plain"] += _loaded(run(program, Schedule()), reader) == {7}
        counts["spun, no gate"] += _loaded(run(program, spun), reader) == {9}
    print(f"litmus over {RUNS} runs each: {counts}")
    assert counts["writer first"] == RUNS and counts["reader first"] == RUNS
    # The controls: the plain run keeps the old value (what the writer-first gate overturns), and the spin
    # lets the writer clobber the read (what the reader-first gate prevents).
    assert counts["plain"] >= RUNS * 0.99 and counts["spun, no gate"] >= RUNS * 0.99


def test_an_impossible_order_times_out_cleanly() -> None:
    device = Device()
    forward, schedule = device.stream("forward_stream"), device.stream("schedule_stream")
    table = device.buffer("req_to_token", 4, 64)
    forward.launch("page_table_build", reads=[table[0, 0:64]])
    forward.synchronize()  # the host waits for the reader before it issues the writer
    schedule.launch("rewrite_live_row", writes=[(table[0, 0:64], 9)])
    program = device.finish()
    impossible = Schedule(orders=((2, 0),))
    with pytest.raises(ScheduleInfeasible):
        simulate(program, impossible)
    start = time.perf_counter()
    with pytest.raises(ScheduleInfeasible, match="timed out"):
        executor("cuda")(program, impossible)
    seconds = time.perf_counter() - start
    print(f"infeasible order: ScheduleInfeasible after {seconds:.3f} s")
    assert seconds < 5.0
    # The device is usable afterwards: the same program without the order runs and loads the fill.
    assert _loaded(executor("cuda")(program, Schedule()), 0) == {0}


def _workload(rng: random.Random):
    data = bytes(rng.randrange(256) for _ in range(rng.randrange(11, 61)))
    return decode_workload(data, hazards=frozenset(HAZARDS), max_iterations=8, plan_stream=None)


def test_gates_between_launches_that_share_no_cell_change_no_value() -> None:
    rng = random.Random(16)
    run = executor("cuda")
    design = load_design("war-after-launch")
    checked = gates = 0
    for _ in range(300):
        program = build_program(_workload(rng), design.hooks)
        schedule = decode_interleaving(bytes(rng.randrange(256) for _ in range(16)), program)
        gates += len(schedule.orders)
        execution = run(program, schedule)
        reference = in_order_loads(program)
        for index, arrays in reference.items():
            for want, got in zip(arrays, execution.observations[index], strict=True):
                np.testing.assert_array_equal(got, want)
        checked += 1
    print(f"no-op gates: {checked} race-free programs, {gates} gates, every load the sequential reference's")
    assert gates >= checked  # the gates were really there


@pytest.mark.parametrize("design_name", sorted(BUILTIN))
def test_simulator_and_gpu_agree_on_forced_orders(design_name: str) -> None:
    rng = random.Random(zlib.crc32(design_name.encode()))
    run = executor("cuda")
    design = load_design(design_name)
    agree = corrupted = gates = 0
    mismatches = []
    for _ in range(AGREEMENT_SCHEDULES):
        program = build_program(_workload(rng), design.hooks)
        schedule = decode_orders(bytes(rng.randrange(256) for _ in range(8)), program)
        gates += len(schedule.orders)
        on_sim = simulate(program, schedule, record_timeline=False).observations
        on_gpu = run(program, schedule).observations
        same = all(
            np.array_equal(x, y) for index, arrays in on_sim.items() for x, y in zip(arrays, on_gpu[index], strict=True)
        )
        agree += same
        reference = in_order_loads(program)
        corrupted += any(
            not np.array_equal(x, y)
            for index, arrays in reference.items()
            for x, y in zip(arrays, on_sim[index], strict=True)
        )
        if not same and len(mismatches) < 5:
            mismatches.append(schedule.to_json())
    print(
        f"{design_name}: {agree}/{AGREEMENT_SCHEDULES} forced-order schedules agree cell for cell "
        f"({corrupted} corrupting on the simulator, {gates} gates); mismatches: {mismatches}"
    )
    assert agree == AGREEMENT_SCHEDULES
