"""Where the recording cost goes on a GPU: the micro workload and three parts of it (ops only, waits only,
stream switches only), unrecorded, under an empty TorchDispatchMode, and recorded; before and after
racefuzz's `torch.cuda` patches are installed (they stay once a recorder has run). Median of 15 runs, us
per op. (The output committed for c288adb is of this script's earlier version, whose second phase turned
torch's GPU-trace callbacks on instead.)
Run: PYTHONPATH=. python docs/results/scripts/trace_recording_breakdown_gpu.py
"""

import statistics
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ci.bench.proof import _plain_env, micro_step
from racefuzz.trace import cuda_api
from racefuzz.trace.capture import recording
from racefuzz.trace.env import TraceEnv
from racefuzz.trace.recorder import Recorder

OPS, RUNS = 2000, 15


class Empty(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def ops_only(env, ops):
    a, b = env.stream("a"), env.stream("b")
    x = torch.zeros(1024, device="cuda")
    y = torch.zeros(1024, device="cuda")
    for _ in range(ops // 2):
        with env.use(a):
            x.add_(1)
        with env.use(b):
            y.add_(1)
    env.synchronize()


def waits_only(env, ops):
    a, b = env.stream("a"), env.stream("b")
    for _ in range(ops // 2):
        b.wait_stream(a)
        a.wait_stream(b)
    env.synchronize()


def use_only(env, ops):
    a, b = env.stream("a"), env.stream("b")
    for _ in range(ops // 2):
        with env.use(a):
            pass
        with env.use(b):
            pass
    env.synchronize()


def timed(fn, mode=None):
    samples = []
    for i in range(RUNS + 1):
        if mode == "rec":
            recorder = Recorder("cuda", snapshot_plan={})
            env = TraceEnv(recorder, "cuda")
            start = time.perf_counter()
            with recording(recorder):
                fn(env, OPS)
        elif mode == "empty":
            env = _plain_env()
            start = time.perf_counter()
            with Empty():
                fn(env, OPS)
        else:
            env = _plain_env()
            start = time.perf_counter()
            fn(env, OPS)
        if i:
            samples.append((time.perf_counter() - start) / OPS * 1e6)
    return statistics.median(samples)


parts = {"micro": micro_step, "ops_only": ops_only, "waits_only": waits_only, "use_only": use_only}
print("phase 1: racefuzz's torch.cuda patches NOT installed")
for name, fn in parts.items():
    print(f"  {name:10s} plain={timed(fn):7.2f} empty_mode={timed(fn, 'empty'):7.2f} us/op")
cuda_api.patch()
print("phase 2: racefuzz's torch.cuda patches installed (no active recorder unless rec)")
for name, fn in parts.items():
    print(f"  {name:10s} plain={timed(fn):7.2f} empty_mode={timed(fn, 'empty'):7.2f} rec={timed(fn, 'rec'):7.2f} us/op")
