"""Where the recording cost of a torch op goes, on the CPU (virtual streams).

4000 in-place ops on CPU tensors alternating between two virtual streams: unrecorded, under an empty
TorchDispatchMode that keeps Dynamo out as racefuzz's does (the floor of any Python dispatch mode), and
recorded as a trace. Min of 15 runs per figure, 3 rounds.
Run: PYTHONPATH=. python docs/results/scripts/trace_recording_breakdown_cpu.py
"""

import gc
import time

import torch

from ci.bench.proof import _empty_mode_class
from racefuzz.trace.capture import recording
from racefuzz.trace.env import TraceEnv
from racefuzz.trace.recorder import Recorder

OPS = 4000
Floor = _empty_mode_class()  # the proof's empty mode: Dynamo kept out as racefuzz's own mode does


def ops_only(env, ops):
    a, b = env.stream("a"), env.stream("b")
    x = torch.zeros(1024)
    y = torch.zeros(1024)
    for _ in range(ops // 2):
        with env.use(a):
            x.add_(1)
        with env.use(b):
            y.add_(x)


def timed(kind, runs=15):
    samples = []
    for _ in range(runs):
        gc.collect()
        recorder = Recorder("cpu", snapshot_plan={})
        env = TraceEnv(recorder, "cpu")
        start = time.perf_counter()
        if kind == "plain":
            ops_only(env, OPS)
        elif kind == "floor":
            with Floor():
                ops_only(env, OPS)
        else:
            with recording(recorder):
                ops_only(env, OPS)
        samples.append((time.perf_counter() - start) / OPS * 1e6)
    return round(min(samples), 2)


timed("rec", 2)  # warm the recorder's caches
rounds = [{kind: timed(kind) for kind in ("plain", "floor", "rec")} for _ in range(3)]
print(rounds, "rec-floor min:", min(r["rec"] - r["floor"] for r in rounds))
