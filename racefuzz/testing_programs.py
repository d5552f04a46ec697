"""Program generators for tests and benchmarks: reproducible random programs of the IR.

`overlap_shaped_program` is the engine benchmark's program (`python -m ci.bench engine`) and the property
tests' large random input: random, but shaped like an overlap loop -- four streams, small rectangles of one
table, events recorded and waited on, `wait_stream` snapshots, and a host sync every ~100 ops (the
`copy_done` sync that bounds the in-flight window).
"""

from __future__ import annotations

import random

from racefuzz.device import Device
from racefuzz.program import Program


def overlap_shaped_program(n_ops: int = 10_000, seed: int = 0) -> Program:
    """A reproducible random program of exactly `n_ops` ops."""
    rng = random.Random(seed)
    device = Device()
    streams = [device.stream(name) for name in ("schedule_stream", "forward_stream", "plan_stream", "copy_stream")]
    events = [device.event(f"e{i}") for i in range(8)]
    table = device.buffer("req_to_token", 64, 512)
    while device.op_count < n_ops:
        stream = rng.choice(streams)
        roll = rng.random()
        row = rng.randrange(64)
        col = rng.randrange(0, 480)
        cells = table[row, col : col + rng.randint(1, 32)]
        if device.op_count % 100 == 99:
            streams[3].record_event("copy_done").synchronize() if rng.random() < 0.5 else device.synchronize()
        elif roll < 0.30:
            stream.launch("page_table_build", reads=[cells])
        elif roll < 0.55:
            stream.launch("prefill_write", writes=[(cells, rng.randrange(1 << 20))])
        elif roll < 0.70:
            rng.choice(events).record(stream)
        elif roll < 0.85:
            stream.wait_event(rng.choice(events))
        else:
            stream.wait_stream(rng.choice(streams))
    program = device.finish()
    return Program(program.streams, program.events, program.buffers, program.ops[:n_ops])
