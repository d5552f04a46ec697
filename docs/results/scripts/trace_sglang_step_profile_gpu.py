"""Where recording sglang's step (`global-war`) spends its time on the GPU: the median of 50 runs each of
the step unrecorded, recorded as a trace (`run_once`, as the proof's COST lines time it), and an empty
step recorded (a recording's fixed cost: recorder, env, mode, `finish`), with Python's switch interval as
it is and at 0.1 s (the Python threads listed); then a cProfile of 100 recorded steps, the top functions by
own time. Needs sglang 0.5.23 importable (standalone, as the proof loads it).
Run: PYTHONPATH=.:<sglang> python docs/results/scripts/trace_sglang_step_profile_gpu.py
"""

import cProfile
import pstats
import statistics
import sys
import threading
import time

from ci.bench.proof import _plain_env
from racefuzz.scenarios.sglang import real_kernels as sglang_overlap
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
# Other Python threads take the GIL whenever the step's thread lets it go (a blocking copy releases it),
# and keep it for up to the switch interval: the step's times with the interval as it is and at 0.1 s.
print(f"Python threads: {[thread.name for thread in threading.enumerate()]}")
original_interval = sys.getswitchinterval()
for interval in (original_interval, 0.1):
    sys.setswitchinterval(interval)
    figures = {
        "step unrecorded": median_us(lambda: step(env)),
        "step recorded": median_us(recorded(step)),
        "empty step recorded": median_us(recorded(empty)),
    }
    print(f"switch interval {interval} s: " + ", ".join(f"{name} median {us:.1f} us" for name, us in figures.items()))
    print(
        f"  launches per step {launches}; recorded minus unrecorded "
        f"{(figures['step recorded'] - figures['step unrecorded']) / launches:.1f} us per launch, of which the empty "
        f"recording's {figures['empty step recorded'] / launches:.1f}"
    )
sys.setswitchinterval(original_interval)
profiler = cProfile.Profile()
profiler.runcall(lambda: [recorded(step)() for _ in range(100)])
pstats.Stats(profiler).sort_stats("tottime").print_stats(35)
