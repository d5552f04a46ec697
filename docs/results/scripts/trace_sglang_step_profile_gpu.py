"""Where recording sglang's step (`global-war`) spends its time on the GPU: the median of 50 runs each of
the step unrecorded, recorded as a trace (`run_once`, as the proof's COST lines time it), and an empty
step recorded (a recording's fixed cost: recorder, env, mode, `finish`); then a cProfile of 100 recorded
steps, the top functions by own time. Needs sglang 0.5.23 importable (standalone, as the proof loads it).
Run: PYTHONPATH=.:<sglang> python docs/results/scripts/trace_sglang_step_profile_gpu.py
"""

import cProfile
import pstats
import statistics
import time

from racefuzz.trace import sglang_overlap
from racefuzz.trace.proof import _plain_env
from racefuzz.trace.search import run_once

sglang_overlap.load_sglang()
step = sglang_overlap.step_for("global-war")


def empty(env):
    return {}


def recorded(what):
    return lambda: run_once(what, "cuda", evaluate_annotations=False, snapshot_plan={})


env = _plain_env()


def median_us(run, n=50):
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        run()
        samples.append((time.perf_counter() - start) * 1e6)
    return statistics.median(samples)


for _ in range(10):  # kernels compiled, caches warm
    step(env)
    recorded(step)()
    recorded(empty)()
launches = len(recorded(step)().launch_ops)
figures = {
    "step unrecorded": median_us(lambda: step(env)),
    "step recorded": median_us(recorded(step)),
    "empty step recorded": median_us(recorded(empty)),
}
for name, us in figures.items():
    print(f"{name}: median {us:.1f} us")
print(f"launches per step: {launches}")
print(
    f"recorded minus unrecorded: {(figures['step recorded'] - figures['step unrecorded']) / launches:.1f} us per "
    f"launch, of which the empty recording's {figures['empty step recorded'] / launches:.1f}"
)
profiler = cProfile.Profile()
profiler.runcall(lambda: [recorded(step)() for _ in range(100)])
pstats.Stats(profiler).sort_stats("tottime").print_stats(35)
