"""How often the C++ fast path records an op, and how often it bails out to the Python path, on the GPU
during 200 ops of the micro workload (a diagnostic: a fast path that bailed every time would cost as much
as the Python path). Run: PYTHONPATH=. python docs/results/scripts/trace_fastpath_bail_count_gpu.py
"""

import collections

from racefuzz.trace import fastpath
from racefuzz.trace.capture import recording
from racefuzz.trace.env import TraceEnv
from racefuzz.trace.proof import micro_step
from racefuzz.trace.recorder import Recorder

real = fastpath.launch_op()
counts: collections.Counter = collections.Counter()


def counted(state, arguments, label, call, args, kwargs):
    out = real(state, arguments, label, call, args, kwargs)
    if out is state[1]:  # the bail sentinel
        kinds = tuple((type(a).__name__, getattr(a, "device", None)) for a in args)
        counts[("bail", label, kinds)] += 1
    else:
        counts[("fast", label)] += 1
    return out


fastpath._loaded[:] = [counted]
recorder = Recorder("cuda", snapshot_plan={})
with recording(recorder):
    micro_step(TraceEnv(recorder, "cuda"), 200)
for key, count in counts.most_common(10):
    print(count, key)
