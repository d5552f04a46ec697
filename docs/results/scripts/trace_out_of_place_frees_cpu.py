"""The out-of-place workload (`c = a + b`, `racefuzz.trace.proof.out_of_place_step`) on the CPU with every
free watched and recorded, as on a GPU (a CPU recorder does not watch frees by default): the median over 9
rounds of recorded minus unrecorded, us/op. Run with the fast path and with RACEFUZZ_TRACE_FASTPATH=0:
PYTHONPATH=. python docs/results/scripts/trace_out_of_place_frees_cpu.py
"""

import gc
import statistics
import time

from ci.bench.proof import _plain_env, out_of_place_step
from racefuzz.trace.capture import recording
from racefuzz.trace.env import TraceEnv
from racefuzz.trace.recorder import Recorder

OPS = 2000


def timed(recorder):
    gc.collect()
    if recorder is None:
        env = _plain_env("cpu")
        start = time.perf_counter()
        out_of_place_step(env, OPS)
    else:
        env = TraceEnv(recorder, "cpu")
        start = time.perf_counter()
        with recording(recorder):
            out_of_place_step(env, OPS)
    return (time.perf_counter() - start) / OPS * 1e6


def watched():
    return Recorder("cpu", snapshot_plan={}, watch_frees=True)


timed(watched())  # warm the caches
rounds = [(timed(None), timed(watched())) for _ in range(9)]
overhead = statistics.median(recorded - plain for plain, recorded in rounds)
print(f"out-of-place, frees watched: median recorded-minus-plain {overhead:.2f} us/op")
