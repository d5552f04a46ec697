"""Litmus programs: the smallest programs that pin down one CUDA ordering rule each.

Each litmus is a reader on one stream and a writer on another (or a small variation), fenced or not by
the rule under test. For every racy one it names a schedule under which the simulator (and the GPU)
shows the corrupted value, and one under which it does not; race-free ones must never corrupt. The unit
tests run them on the checker and the simulator; the CUDA tests run the same programs on the GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from racefuzz.device import Device, StreamHandle
from racefuzz.program import Buffer, Program
from racefuzz.schedule import Schedule

SPIN_US = 2000.0
"""Delay used by the litmus schedules: far longer than any simulated or real kernel here."""


@dataclass(frozen=True)
class Litmus:
    """A litmus program and its expected verdicts.

    Args:
        name: what rule it pins down.
        rule: the rule, in one sentence.
        program: the program.
        races: the expected race kinds, e.g. ("WAR",); empty when race-free.
        corrupting: for racy programs, a schedule under which the race manifests.
        benign: for racy programs, a schedule under which it does not.
        stressing: for race-free programs, a schedule that would expose a race if there were one.
    """

    name: str
    rule: str
    program: Program
    races: tuple[str, ...]
    corrupting: Schedule | None = None
    benign: Schedule | None = None
    stressing: Schedule | None = None

    @property
    def racy(self) -> bool:
        return bool(self.races)


class _Builder:
    """A two-or-three stream fixture: forward (reader), schedule (writer), plan; table `R[4, 16]`."""

    def __init__(self, streams: int = 2) -> None:
        self.device = Device()
        self.forward = self.device.stream("forward_stream")
        self.schedule = self.device.stream("schedule_stream")
        self.plan = self.device.stream("plan_stream") if streams == 3 else None
        self.table: Buffer = self.device.buffer("req_to_token", 4, 16, fill=-1)
        # Seed the table sequentially so the reader has a known old value to lose.
        self.schedule.launch("init", writes=[(self.table[0, 0:8], 100)])
        self.device.synchronize()

    def read(self, stream: StreamHandle | None = None, cols: slice = slice(0, 8)) -> int:
        index = self.device.op_count
        (stream or self.forward).launch("block_gather", reads=[self.table[0, cols]])
        return index

    def write(self, stream: StreamHandle | None = None, cols: slice = slice(0, 8), value: int = 200) -> int:
        index = self.device.op_count
        (stream or self.schedule).launch("prefill_write", writes=[(self.table[0, cols], value)])
        return index

    def finish(self) -> Program:
        return self.device.finish()


def _war(name: str, rule: str, fence: Callable[[_Builder], None] | None, *, racy: bool, streams: int = 2) -> Litmus:
    """Reader on forward_stream, then `fence`, then a writer of the same cells (on plan if there is one)."""
    b = _Builder(streams)
    read = b.read()
    if fence is not None:
        fence(b)
    write = b.write(b.plan)
    program = b.finish()
    if racy:
        return Litmus(
            name,
            rule,
            program,
            ("WAR",),
            corrupting=Schedule(read_spins={read: SPIN_US}),
            benign=Schedule(device_delays={write: SPIN_US}),
        )
    return Litmus(name, rule, program, (), stressing=Schedule(read_spins={read: SPIN_US}))


def all_litmus() -> list[Litmus]:
    """Every litmus program, racy and race-free."""
    tests: list[Litmus] = []

    tests.append(_war("war_unfenced", "A write on another stream is unordered with an earlier read.", None, racy=True))
    tests.append(
        _war(
            "war_wait_stream",
            "schedule.wait_stream(forward) after the read was issued orders the write after it.",
            lambda b: b.schedule.wait_stream(b.forward),
            racy=False,
        )
    )

    # wait_stream snapshots the other stream at host-call time: a read issued after the call is not covered.
    b = _Builder()
    b.schedule.wait_stream(b.forward)
    read = b.read()
    write = b.write()
    tests.append(
        Litmus(
            "wait_stream_snapshot",
            "wait_stream covers only work enqueued on the other stream before the call.",
            b.finish(),
            ("WAR",),
            corrupting=Schedule(read_spins={read: SPIN_US}),
            benign=Schedule(device_delays={write: SPIN_US}),
        )
    )

    tests.append(
        _war(
            "wait_event_after_read",
            "An event recorded after the read, waited on before the write, orders them.",
            lambda b: b.schedule.wait_event(b.forward.record_event("read_done")),
            racy=False,
        )
    )

    # wait_event binds to the latest record issued before the call: a record issued before the read
    # (the #30261 shape: read_done published before a later reader) does not cover it.
    b = _Builder()
    read_done = b.forward.record_event("read_done")
    read = b.read()
    b.schedule.wait_event(read_done)
    write = b.write()
    tests.append(
        Litmus(
            "wait_event_record_before_read",
            "An event recorded before the read does not cover the read.",
            b.finish(),
            ("WAR",),
            corrupting=Schedule(read_spins={read: SPIN_US}),
            benign=Schedule(device_delays={write: SPIN_US}),
        )
    )

    # A record issued after the wait call cannot help: the wait already bound to the older record.
    b = _Builder()
    read_done = b.forward.record_event("read_done")
    read = b.read()
    b.schedule.wait_event(read_done)
    read_done.record(b.forward)
    write = b.write()
    tests.append(
        Litmus(
            "wait_event_binds_at_call",
            "wait_event binds to the latest record issued before the call, not to later re-records.",
            b.finish(),
            ("WAR",),
            corrupting=Schedule(read_spins={read: SPIN_US}),
            benign=Schedule(device_delays={write: SPIN_US}),
        )
    )

    # Waiting on an event that was never recorded is a no-op (torch creates CUDA events lazily).
    b = _Builder()
    never = b.device.event("read_done")
    read = b.read()
    b.schedule.wait_event(never)
    write = b.write()
    tests.append(
        Litmus(
            "wait_event_never_recorded",
            "Waiting on a never-recorded event is a no-op.",
            b.finish(),
            ("WAR",),
            corrupting=Schedule(read_spins={read: SPIN_US}),
            benign=Schedule(device_delays={write: SPIN_US}),
        )
    )

    # One reusable event (#31072): its record after the first read is stale for a second read.
    b = _Builder()
    b.read(cols=slice(8, 16))
    read_done = b.forward.record_event("read_done")
    read = b.read()
    b.schedule.wait_event(read_done)
    write = b.write()
    tests.append(
        Litmus(
            "reused_event_stale_record",
            "A reused event waited on before it was re-armed covers only the earlier read.",
            b.finish(),
            ("WAR",),
            corrupting=Schedule(read_spins={read: SPIN_US}),
            benign=Schedule(device_delays={write: SPIN_US}),
        )
    )

    b = _Builder()
    b.read(cols=slice(8, 16))
    read_done = b.forward.record_event("read_done")
    read = b.read()
    read_done.record(b.forward)  # re-armed after the second read, before the wait
    b.schedule.wait_event(read_done)
    b.write()
    tests.append(
        Litmus(
            "reused_event_rearmed",
            "Re-recording an event re-arms it: a wait issued after the re-record covers the second read.",
            b.finish(),
            (),
            stressing=Schedule(read_spins={read: SPIN_US}),
        )
    )

    tests.append(
        _war(
            "transitive_three_streams",
            "plan.wait_stream(schedule) after schedule.wait_stream(forward) orders plan after forward.",
            lambda b: (b.schedule.wait_stream(b.forward), b.plan.wait_stream(b.schedule)),
            racy=False,
            streams=3,
        )
    )
    tests.append(
        _war(
            "transitive_wrong_order",
            "plan.wait_stream(schedule) issued before schedule.wait_stream(forward) inherits nothing.",
            lambda b: (b.plan.wait_stream(b.schedule), b.schedule.wait_stream(b.forward)),
            racy=True,
            streams=3,
        )
    )
    tests.append(
        _war(
            "transitive_later_record",
            "An event recorded on schedule after it waited on forward covers forward's read too.",
            lambda b: (b.schedule.wait_stream(b.forward), b.plan.wait_event(b.schedule.record_event("handoff"))),
            racy=False,
            streams=3,
        )
    )
    tests.append(
        _war(
            "self_wait_is_noop",
            "plan.wait_stream(plan) (a self-wait inside the plan-stream context) orders nothing.",
            lambda b: b.plan.wait_stream(b.plan),
            racy=True,
            streams=3,
        )
    )
    tests.append(
        _war(
            "host_event_sync",
            "read_done.synchronize() on the host orders everything enqueued after it.",
            lambda b: b.forward.record_event("verify_done").synchronize(),
            racy=False,
        )
    )
    tests.append(
        _war(
            "host_stream_sync",
            "forward.synchronize() on the host orders everything enqueued after it.",
            lambda b: b.forward.synchronize(),
            racy=False,
        )
    )
    tests.append(
        _war(
            "host_device_sync",
            "A device synchronize on the host orders everything enqueued after it.",
            lambda b: b.device.synchronize(),
            racy=False,
        )
    )

    # A host sync issued before the read does not order the read before a later write.
    b = _Builder()
    b.device.synchronize()
    read = b.read()
    write = b.write()
    tests.append(
        Litmus(
            "host_sync_before_read",
            "A host sync covers only work enqueued before it.",
            b.finish(),
            ("WAR",),
            corrupting=Schedule(read_spins={read: SPIN_US}),
            benign=Schedule(device_delays={write: SPIN_US}),
        )
    )

    # RAW: the reader on forward never waited for the schedule stream's write.
    b = _Builder()
    write = b.write()
    read = b.read()
    tests.append(
        Litmus(
            "raw_unfenced",
            "A read on another stream is unordered with an earlier write.",
            b.finish(),
            ("RAW",),
            corrupting=Schedule(device_delays={write: SPIN_US}),
            benign=Schedule(read_spins={read: SPIN_US}),
        )
    )

    # Cell granularity: disjoint columns of the same row never conflict; a partial overlap does.
    b = _Builder()
    read = b.read(cols=slice(0, 8))
    b.write(cols=slice(8, 16))
    tests.append(
        Litmus(
            "disjoint_cells",
            "Accesses to disjoint cells of one table do not conflict.",
            b.finish(),
            (),
            stressing=Schedule(read_spins={read: SPIN_US}),
        )
    )
    b = _Builder()
    read = b.read(cols=slice(0, 8))
    write = b.write(cols=slice(6, 12))
    tests.append(
        Litmus(
            "partial_overlap",
            "A write overlapping two cells of a read's range conflicts with it.",
            b.finish(),
            ("WAR",),
            corrupting=Schedule(read_spins={read: SPIN_US}),
            benign=Schedule(device_delays={write: SPIN_US}),
        )
    )
    return tests
