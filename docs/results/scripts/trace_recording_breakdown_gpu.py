"""Issue 13 diagnostics: where the recording cost goes (micro variants, sglang step), on the GPU."""
import cProfile, io, pstats, statistics, sys, time
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from racefuzz.trace.proof import micro_step, _plain_env, _time_step, _time_recorded
from racefuzz.trace.recorder import Recorder
from racefuzz.trace.env import TraceEnv
from racefuzz.trace.capture import recording, _install_gpu_callbacks

OPS, RUNS = 2000, 15

class Empty(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))

def ops_only(env, ops):
    a, b = env.stream("a"), env.stream("b")
    x = torch.zeros(1024, device="cuda"); y = torch.zeros(1024, device="cuda")
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
    s = []
    for i in range(RUNS + 1):
        if mode == "rec":
            rec = Recorder("cuda", snapshot_plan={})
            env = TraceEnv(rec, "cuda")
            start = time.perf_counter()
            with recording(rec):
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
            s.append((time.perf_counter() - start) / OPS * 1e6)
    return statistics.median(s)

fns = {"micro": micro_step, "ops_only": ops_only, "waits_only": waits_only, "use_only": use_only}
print("phase 1: gpu trace NOT activated")
for name, fn in fns.items():
    print(f"  {name:10s} plain={timed(fn):7.2f} empty_mode={timed(fn, 'empty'):7.2f} us/op")
_install_gpu_callbacks()
print("phase 2: gpu trace activated (racefuzz callbacks, no active recorder unless rec)")
for name, fn in fns.items():
    print(f"  {name:10s} plain={timed(fn):7.2f} empty_mode={timed(fn, 'empty'):7.2f} rec={timed(fn, 'rec'):7.2f} us/op")

pr = cProfile.Profile()
pr.enable()
for _ in range(3):
    rec = Recorder("cuda", snapshot_plan={}); env = TraceEnv(rec, "cuda")
    with recording(rec):
        micro_step(env, OPS)
pr.disable()
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(30); print(s.getvalue())

try:
    from racefuzz.trace import sglang_overlap
    from racefuzz.trace.search import run_once
except Exception as exc:
    print("no sglang:", exc); sys.exit(0)
for design in sglang_overlap.DESIGNS:
    step = sglang_overlap.step_for(design)
    plain = _time_step(step, 30); traced = _time_recorded(step, 30)
    n = len(run_once(step, "cuda", evaluate_annotations=False, snapshot_plan={}).launch_ops)
    print(f"COST design={design} plain={plain:.1f} traced={traced:.1f} launches={n} per_launch={(traced-plain)/n:.1f}")
step = sglang_overlap.step_for("none")
for label, opts in (("trace-only", dict(evaluate_annotations=False, snapshot_plan={})), ("reference", dict(serialize=True))):
    pr = cProfile.Profile(); pr.enable()
    for _ in range(50):
        run_once(step, "cuda", **opts)
    pr.disable()
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(35); print(label, s.getvalue())
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(45); print(label, s.getvalue())
