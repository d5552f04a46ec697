"""Which ops reach racefuzz's dispatch mode on the GPU (each such op pays the mode's round trip through
Python) and which the C++ fast path recorded below torch's dispatcher: the micro workload (200 ops), the
out-of-place one (200 ops) and, where sglang 0.5.23 is importable, sglang's step (`global-war`). A
diagnostic: a fast path that let every op through to the mode would cost what the Python path costs.
Run: PYTHONPATH=. python docs/results/scripts/trace_ops_reaching_the_mode_gpu.py
(`--device cpu` on a machine without a GPU; sglang's step needs one).
"""

import collections
import sys

from ci.bench.proof import micro_step, out_of_place_step
from racefuzz.trace.capture import recording
from racefuzz.trace.env import TraceEnv
from racefuzz.trace.recorder import Recorder
from racefuzz.trace.torch_mode import trace_mode_class

device = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "cuda"
mode_class = trace_mode_class()
original = mode_class.__torch_dispatch__
reached: collections.Counter = collections.Counter()


def counted(self, func, types, args=(), kwargs=None):
    reached[str(func)] += 1
    return original(self, func, types, args, kwargs)


mode_class.__torch_dispatch__ = counted
steps = {"micro": lambda env: micro_step(env, 200), "out-of-place": lambda env: out_of_place_step(env, 200)}
if device == "cuda":
    try:
        from racefuzz.scenarios.sglang import real_kernels as sglang_overlap

        sglang_overlap.load_sglang()  # its modules loaded standalone, as the proof does
        steps["sglang global-war"] = sglang_overlap.step_for("global-war")
    except ImportError as error:
        print(f"sglang's step skipped: {type(error).__name__}: {error}")
for name, step in steps.items():
    step(TraceEnv(Recorder(device, snapshot_plan={}), device))  # unrecorded once: kernels compiled, caches warm
    reached.clear()
    recorder = Recorder(device, snapshot_plan={})
    with recording(recorder):
        step(TraceEnv(recorder, device))
    kinds = [(getattr(op, "kind", None), getattr(op, "kernel", None)) for op in recorder.record.trace.ops]
    recorded = collections.Counter(
        kernel if kind == "torch" else "free" for kind, kernel in kinds if kind in ("torch", "free")
    )
    print(f"{name}: device={device} torch launches and frees recorded: {dict(recorded)}")
    print(f"{name}: device={device} ops that reached the dispatch mode: {dict(reached)}")
