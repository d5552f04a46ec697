"""The litmus programs on a real GPU, against the simulator.

For every litmus: a racy one corrupts in every one of RUNS runs under its corrupting schedule and in none
under its benign one; a race-free one never corrupts under its stressing schedule; and in every run the
values the GPU's readers loaded equal the simulator's under the same schedule (the litmus schedules are
delay-dominated, so the simulator's verdict must be the GPU's). Each test prints its counts, so a log of
`pytest -s` is the record of what the GPU did.
"""

from __future__ import annotations

import numpy as np
import pytest

from racefuzz import Device, Schedule, expected_observations, find_corruptions, simulate
from racefuzz.backends import HOST, Execution, Span
from racefuzz.backends.cuda import CudaConfig, execute
from racefuzz.litmus import SPIN_US, Litmus, all_litmus
from racefuzz.memory import Observations
from racefuzz.program import Launch, Program
from racefuzz.schedule import NO_DELAYS

pytestmark = pytest.mark.cuda

LITMUS = {litmus.name: litmus for litmus in all_litmus()}
RACY = sorted(name for name, litmus in LITMUS.items() if litmus.racy)
RACE_FREE = sorted(name for name, litmus in LITMUS.items() if not litmus.racy)
RUNS = 5


def differences(got: Observations, want: Observations) -> list[str]:
    """Where two runs' loads differ, one line per differing read range."""
    if got.keys() != want.keys():
        return [f"reading launches differ: {sorted(got)} vs {sorted(want)}"]
    out = []
    for index in sorted(want):
        for k, (g, w) in enumerate(zip(got[index], want[index], strict=True)):
            if g.shape != w.shape or not np.array_equal(g, w):
                out.append(f"launch #{index} read {k}: {g.tolist()} vs {w.tolist()}")
    return out


def run_many(name: str, litmus: Litmus, schedule: Schedule | None, which: str) -> int:
    """Run `litmus` RUNS times under `schedule` on the GPU; return how many runs corrupted.

    Fails at once if any run's loads differ from the simulator's.
    """
    assert schedule is not None, f"{name} has no {which} schedule"
    program = litmus.program
    sim = simulate(program, schedule)
    corrupted = 0
    mismatches: list[str] = []
    for run in range(RUNS):
        gpu = execute(program, schedule)
        corrupted += bool(find_corruptions(program, gpu.observations))
        mismatches += [f"run {run}: {d}" for d in differences(gpu.observations, sim.observations)]
    print(f"\n  {name} [{which}]: corrupted {corrupted}/{RUNS}, equal to the simulator {RUNS - len(mismatches)}/{RUNS}")
    assert not mismatches, "GPU loads differ from the simulator's:\n" + "\n".join(mismatches)
    return corrupted


@pytest.mark.parametrize("name", RACY)
def test_racy_litmus_corrupts_every_run_under_its_corrupting_schedule(name: str) -> None:
    litmus = LITMUS[name]
    assert run_many(name, litmus, litmus.corrupting, "corrupting") == RUNS


@pytest.mark.parametrize("name", RACY)
def test_racy_litmus_never_corrupts_under_its_benign_schedule(name: str) -> None:
    litmus = LITMUS[name]
    assert run_many(name, litmus, litmus.benign, "benign") == 0


@pytest.mark.parametrize("name", RACE_FREE)
def test_race_free_litmus_never_corrupts_under_stress(name: str) -> None:
    litmus = LITMUS[name]
    assert run_many(name, litmus, litmus.stressing, "stressing") == 0


def test_spins_last_what_they_ask_for() -> None:
    # Spins wait on %globaltimer (ns), so their length does not depend on the SM clock, which moves.
    from racefuzz.backends import cuda

    torch, cupy = cuda.require(0)
    runtime = cuda.get_runtime(torch, cupy, 0)
    spin = runtime.kernels["rf_spin"]
    stream = torch.cuda.Stream()
    ext = runtime.external_stream(stream.cuda_stream)
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for us in (500.0, 2000.0, 10000.0):
        begin.record(stream)
        spin((1,), (1,), (cuda.spin_ns(us),), stream=ext)
        end.record(stream)
        end.synchronize()
        measured = begin.elapsed_time(end) * 1000.0
        print(f"\n  spin {us:.0f} us -> {measured:.1f} us")
        assert us <= measured < us * 1.05 + 30.0


def two_buffer_program() -> Program:
    """One stream, two buffers, reads interleaving them, overlapping stores, a read-then-write launch."""
    device = Device()
    s = device.stream("s")
    a = device.buffer("a", 8, 64, fill=-1)
    b = device.buffer("b", 3, 5, fill=7)
    s.launch("prefill_write", writes=[(a[0:4, 0:64], np.arange(256)), (b[1, 0:5], [1, 2, 3, 4, 5])])
    s.launch("rewrite_live_row", writes=[(a[0, 2:40], 50), (a[0, 30:50], 60), (a[7, 0:3], 70)])
    s.launch("page_table_build", reads=[a[0, 0:64], b[0:3, 1:4], a[2:8, 60:64]])
    s.launch("custom_step", reads=[a[1, 0:16]], writes=[(a[1, 0:16], 99)])
    s.launch("block_gather", reads=[a[1, 0:16], a[0:4, 0:64]])
    return device.finish()


def test_staged_calls_load_the_sequential_reference_on_the_device() -> None:
    program = two_buffer_program()
    want = expected_observations(program)
    reader = next(op.index for op in program.ops if isinstance(op, Launch) and op.kernel == "page_table_build")
    for schedule in (NO_DELAYS, Schedule(read_spins={reader: 200.0}, device_delays={reader: 100.0})):
        assert differences(execute(program, schedule).observations, want) == []


def one_span(run: Execution, op_index: int, kind: str) -> Span:
    spans = [span for span in run.timeline if span.op_index == op_index and span.kind == kind]
    assert len(spans) == 1, f"expected one {kind} span of op #{op_index}, got {spans}"
    return spans[0]


def close_to(duration_us: float, wanted_us: float) -> bool:
    """Within 15% of the wanted delay, plus 50 µs for the kernel around it."""
    return 0.85 * wanted_us <= duration_us <= 1.15 * wanted_us + 50.0


def test_timeline_shows_the_read_spin_and_the_writer_landing_inside_it() -> None:
    litmus = LITMUS["war_unfenced"]
    assert litmus.corrupting is not None
    (read,) = litmus.corrupting.read_spins
    write = max(launch.index for launch in litmus.program.launches)
    run = execute(litmus.program, litmus.corrupting, CudaConfig(timeline=True))
    assert find_corruptions(litmus.program, run.observations)
    reader, writer = one_span(run, read, "kernel"), one_span(run, write, "kernel")
    print(f"\n  reader {reader.start_us:.1f}..{reader.end_us:.1f} us", end="")
    print(f", writer {writer.start_us:.1f}..{writer.end_us:.1f} us")
    assert close_to(reader.end_us - reader.start_us, SPIN_US)
    assert reader.start_us < writer.start_us <= writer.end_us < reader.end_us, "the store lands in the read window"
    assert run.access_time_us[read] == reader.end_us
    assert run.host_end_us >= reader.end_us
    tracks = {s.name for s in litmus.program.streams} | {HOST}
    assert all(span.track in tracks and span.end_us >= span.start_us for span in run.timeline)


def test_timeline_shows_the_writer_held_back_by_its_device_delay() -> None:
    litmus = LITMUS["war_unfenced"]
    assert litmus.benign is not None
    (write,) = litmus.benign.device_delays
    read = min(launch.index for launch in litmus.program.launches if launch.reads)
    run = execute(litmus.program, litmus.benign, CudaConfig(timeline=True))
    assert not find_corruptions(litmus.program, run.observations)
    spin, writer, reader = one_span(run, write, "spin"), one_span(run, write, "kernel"), one_span(run, read, "kernel")
    print(f"\n  spin {spin.start_us:.1f}..{spin.end_us:.1f} us on {spin.track}, reader ends at {reader.end_us:.1f} us")
    assert spin.track == writer.track == "schedule_stream"
    assert close_to(spin.end_us - spin.start_us, SPIN_US)
    assert reader.end_us <= spin.end_us <= writer.start_us


def test_timeline_shows_the_host_blocked_on_an_event_sync() -> None:
    litmus = LITMUS["host_event_sync"]
    assert litmus.stressing is not None
    (read,) = litmus.stressing.read_spins
    run = execute(litmus.program, litmus.stressing, CudaConfig(timeline=True))
    syncs = [span for span in run.timeline if span.track == HOST and span.kind == "sync" and span.op_index > read]
    assert len(syncs) == 1
    reader = one_span(run, read, "kernel")
    print(f"\n  host blocked {syncs[0].start_us:.1f}..{syncs[0].end_us:.1f} us; reader ends at {reader.end_us:.1f} us")
    # The host returns from the sync only once the spinning reader finished (clocks agree to a few µs).
    assert syncs[0].end_us >= reader.end_us - 20.0
    assert syncs[0].end_us - syncs[0].start_us >= 0.5 * SPIN_US
