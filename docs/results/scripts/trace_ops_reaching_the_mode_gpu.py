"""Which ops of the micro workload reach racefuzz's dispatch mode on the GPU (each such op pays the mode's
round trip through Python) and which the C++ fast path recorded below torch's dispatcher, over 200 ops (a
diagnostic: a fast path that let every op through to the mode would cost what the Python path costs).
Session 7's `trace_fastpath_bail_count_gpu.py` counted the same for the fast path's earlier entry, inside
the mode. Run: PYTHONPATH=. python docs/results/scripts/trace_ops_reaching_the_mode_gpu.py
(`--device cpu` on a machine without a GPU).
"""

import collections
import sys

from racefuzz.trace.capture import _torch_mode_class, recording
from racefuzz.trace.env import TraceEnv
from racefuzz.trace.proof import micro_step
from racefuzz.trace.recorder import Recorder

device = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "cuda"
mode_class = _torch_mode_class()
original = mode_class.__torch_dispatch__
reached: collections.Counter = collections.Counter()


def counted(self, func, types, args=(), kwargs=None):
    reached[str(func)] += 1
    return original(self, func, types, args, kwargs)


mode_class.__torch_dispatch__ = counted
recorder = Recorder(device, snapshot_plan={})
with recording(recorder):
    micro_step(TraceEnv(recorder, device), 200)
recorded = collections.Counter(op.kernel for op in recorder.record.trace.ops if getattr(op, "kind", None) == "torch")
print(f"device={device} torch launches recorded: {dict(recorded)}")
print(f"device={device} ops that reached the dispatch mode: {dict(reached)}")
