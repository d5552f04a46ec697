"""Properties of the engine over random programs and schedules.

* The vector-clock checker agrees with a brute-force happens-before graph (reachability over stream
  FIFO, record->wait, wait_stream snapshot and host-sync edges), pair for pair.
* Every corruption the simulator manifests is explained by a race the checker reports: a read that
  differs from the sequential reference takes part in a reported race with the culprit writer.
* Under forced orders (the gated simulator), every happens-before edge and every forced order holds in
  the run, and the default path's loads (its no-replay shortcut trusts happens-before) equal the replay's.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from racefuzz import Schedule, find_corruptions, find_races, simulate
from racefuzz.hb import analysis
from racefuzz.program import (
    DeviceSync,
    EventSync,
    Launch,
    Program,
    Record,
    StreamOp,
    StreamSync,
    WaitEvent,
    WaitStream,
)
from racefuzz.schedulers.orders import decode_orders
from racefuzz.sim import SimConfig
from racefuzz.testing_programs import overlap_shaped_program


def brute_force_races(program: Program) -> set[tuple[int, int, str]]:
    ops = program.ops
    preds: list[set[int]] = [set() for _ in ops]
    last_on: dict[int, int] = {}
    last_record: dict[int, int] = {}
    syncs: list[int] = []
    for op in ops:
        i = op.index
        preds[i].update(syncs)  # every host sync issued earlier orders this op after what it waited for
        if isinstance(op, StreamOp):
            s = op.stream.id
            if s in last_on:
                preds[i].add(last_on[s])
            if isinstance(op, WaitEvent) and op.event.id in last_record:
                preds[i].add(last_record[op.event.id])
            if isinstance(op, WaitStream) and op.other.id in last_on:
                preds[i].add(last_on[op.other.id])
            if isinstance(op, Record):
                last_record[op.event.id] = i
            last_on[s] = i
        elif isinstance(op, EventSync):
            if op.event.id in last_record:
                preds[i].add(last_record[op.event.id])
            syncs.append(i)
        elif isinstance(op, StreamSync):
            if op.stream.id in last_on:
                preds[i].add(last_on[op.stream.id])
            syncs.append(i)
        elif isinstance(op, DeviceSync):
            preds[i].update(last_on.values())
            syncs.append(i)
    ancestors: list[set[int]] = []
    for i in range(len(ops)):
        mine: set[int] = set()
        for p in preds[i]:
            mine.add(p)
            mine |= ancestors[p]
        ancestors.append(mine)
    launches = [op for op in ops if isinstance(op, Launch)]
    found = set()
    for b in launches:
        for a in launches:
            if a.index >= b.index or a.stream == b.stream or a.index in ancestors[b.index]:
                continue
            for kind, left, right in (
                ("WAR", a.reads, b.writes),
                ("RAW", a.writes, b.reads),
                ("WAW", a.writes, b.writes),
            ):
                if any(x.intersection(y) for x in left for y in right):
                    found.add((a.index, b.index, kind))
    return found


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_ops=st.integers(2, 80))
def test_vector_clocks_match_brute_force_happens_before(seed: int, n_ops: int) -> None:
    program = overlap_shaped_program(n_ops, seed)
    got = {(race.first.index, race.second.index, race.kind.value) for race in find_races(program)}
    assert got == brute_force_races(program)


def mixed_shape_program(n_ops: int, seed: int) -> Program:
    """Like `overlap_shaped_program`, with two buffers, several ranges a launch and rectangles of 1 to 16
    rows: the checker's row index, its multi-row keys and its wide ranges (> hb.WIDE_ROWS rows)."""
    import random

    from racefuzz.device import Device

    rng = random.Random(seed)
    device = Device()
    streams = [device.stream(name) for name in ("a", "b", "c")]
    events = [device.event(f"e{i}") for i in range(3)]
    tables = [device.buffer("t0", 20, 16), device.buffer("t1", 20, 16)]

    def cells():
        table = rng.choice(tables)
        row0 = rng.randrange(20)
        row1 = min(20, row0 + rng.choice((1, 1, 2, 3, 9, 16)))
        col0 = rng.randrange(16)
        return table[row0:row1, col0 : min(16, col0 + rng.randint(1, 6))]

    while device.op_count < n_ops:
        stream = rng.choice(streams)
        roll = rng.random()
        if roll < 0.45:
            reads = [cells() for _ in range(rng.randint(0, 2))]
            writes = [(cells(), rng.randrange(100)) for _ in range(rng.randint(0 if reads else 1, 2))]
            stream.launch("k", reads=reads, writes=writes)
        elif roll < 0.65:
            rng.choice(events).record(stream)
        elif roll < 0.85:
            stream.wait_event(rng.choice(events))
        elif roll < 0.95:
            stream.wait_stream(rng.choice(streams))
        else:
            device.synchronize()
    program = device.finish()
    return Program(program.streams, program.events, program.buffers, program.ops[:n_ops])


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_ops=st.integers(2, 60))
def test_vector_clocks_match_brute_force_on_multi_row_ranges(seed: int, n_ops: int) -> None:
    program = mixed_shape_program(n_ops, seed)
    got = {(race.first.index, race.second.index, race.kind.value) for race in find_races(program)}
    assert got == brute_force_races(program)


def test_multi_row_programs_do_race() -> None:
    # The property above is only worth something if these programs race, across wide ranges too.
    from racefuzz.hb import WIDE_ROWS

    races = [race for seed in range(30) for race in find_races(mixed_shape_program(60, seed))]
    assert len(races) > 100
    assert any(r.first.reads + r.first.writes and max(c.row1 - c.row0 for c in r.cells) > 1 for r in races)
    assert any(
        any(c.row1 - c.row0 > WIDE_ROWS for c in (*launch.reads, *launch.writes))
        for r in races
        for launch in (r.first, r.second)
    )


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_ops=st.integers(2, 80), data=st.data())
def test_every_manifested_corruption_is_a_reported_race(seed: int, n_ops: int, data: st.DataObject) -> None:
    program = overlap_shaped_program(n_ops, seed)
    stream_ops = [op.index for op in program.ops if isinstance(op, StreamOp)]
    readers = [op.index for op in program.launches if op.reads]
    delays = st.floats(0, 3000, allow_nan=False)
    schedule = Schedule(
        device_delays=data.draw(st.dictionaries(st.sampled_from(stream_ops), delays)) if stream_ops else {},
        read_spins=data.draw(st.dictionaries(st.sampled_from(readers), delays)) if readers else {},
    )
    run = simulate(program, schedule, track_writers=True)
    pairs = {(race.first.index, race.second.index) for race in find_races(program)}
    for corruption in find_corruptions(program, run.observations, run.writers):
        read = corruption.read.index
        assert any((min(read, culprit), max(read, culprit)) in pairs for culprit in corruption.culprits), (
            f"corruption of op #{read} by {corruption.culprits} is not a reported race"
        )


def test_the_corruption_property_is_not_vacuous() -> None:
    # The property above only bites when corruptions happen: with long read spins on a few readers,
    # some of these programs must corrupt (5 of 100 did when this test was written).
    import random

    corrupted = 0
    for seed in range(100):
        program = overlap_shaped_program(60, seed)
        readers = [op.index for op in program.launches if op.reads]
        spins = {i: 2000.0 for i in random.Random(seed).sample(readers, min(3, len(readers)))}
        run = simulate(program, Schedule(read_spins=spins), track_writers=True)
        corrupted += bool(find_corruptions(program, run.observations, run.writers))
    assert corrupted >= 1


@settings(max_examples=300, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n_ops=st.integers(2, 60),
    mixed=st.booleans(),
    chosen=st.binary(max_size=8),
    complete=st.booleans(),
    config=st.sampled_from([SimConfig(), SimConfig(launch_cost_us=0.0, kernel_cost_us=0.0), SimConfig(5.0, 0.0, 0.5)]),
    data=st.data(),
)
def test_forced_orders_keep_every_happens_before_edge_on_the_gated_simulator(
    seed: int, n_ops: int, mixed: bool, chosen: bytes, complete: bool, config: SimConfig, data: st.DataObject
) -> None:
    # The orders are drawn as the `orders` strategy draws them (racing pairs forced either way, consistent
    # with happens-before, so the gates never deadlock), with or without delays on top. The gated machine
    # must still realize every edge of the program: a launch ordered after another applies after it. The
    # default path's shortcut returns the sequential loads whenever the racing pairs applied in issue
    # order, trusting that the ordered pairs did; the replay (`track_writers`) does not trust it.
    program = (mixed_shape_program if mixed else overlap_shaped_program)(n_ops, seed)
    orders = decode_orders(chosen, program, complete=complete).orders
    stream_ops = [op.index for op in program.ops if isinstance(op, StreamOp)]
    readers = [op.index for op in program.launches if op.reads]
    delays = st.floats(0, 3000, allow_nan=False)
    schedule = Schedule(
        device_delays=data.draw(st.dictionaries(st.sampled_from(stream_ops), delays, max_size=4)) if stream_ops else {},
        read_spins=data.draw(st.dictionaries(st.sampled_from(readers), delays, max_size=4)) if readers else {},
        orders=orders,
    )
    replayed = simulate(program, schedule, config, track_writers=True)
    applied = replayed.access_time_us
    ordered = analysis(program).ordered
    launches = [op.index for op in program.launches]
    for position, a in enumerate(launches):
        for b in launches[position + 1 :]:
            if ordered(a, b):
                assert (applied[a], a) < (applied[b], b), f"op #{a} happens before op #{b} but applied after it"
    for first, then in orders:
        assert (applied[first], first) < (applied[then], then), f"forced order ({first}, {then}) did not hold"
    default = simulate(program, schedule, config).observations
    assert default.keys() == replayed.observations.keys()
    for index, loads in replayed.observations.items():
        assert all((x == y).all() for x, y in zip(default[index], loads, strict=True)), f"op #{index} loads differ"


def test_the_forced_order_property_draws_gates_that_a_wait_stream_must_respect() -> None:
    # The property above is only worth something if its programs wait on a stream whose launch a gate
    # holds back: a `wait_stream` issued after a gated launch on the other stream (36 of these 40 programs
    # had one when this test was written).
    programs = 0
    for seed in range(40):
        program = mixed_shape_program(60, seed)
        held = {then for _, then in decode_orders(b"\x00\x01\x02\x03", program).orders}
        gated_streams: set[int] = set()
        waits = 0
        for op in program.ops:
            if isinstance(op, WaitStream) and op.other != op.stream and op.other.id in gated_streams:
                waits += 1
            if isinstance(op, StreamOp) and op.index in held:
                gated_streams.add(op.stream.id)
        programs += waits > 0
    assert programs >= 20
