"""Which designs race on get_last_loc: every built-in and the mutant that drops the plan stream's entry wait
(the control), on the same 2000 byte strings decoded under every default hazard plus paged-get-last-loc."""

import random

from racefuzz.designs import load_design
from racefuzz.hb import find_races
from racefuzz.scenarios.sglang import ALL_HAZARDS, build_program, decode_workload
from racefuzz.scenarios.sglang.designs import BUILTIN

rng = random.Random(0)
datas = [bytes(rng.randrange(256) for _ in range(rng.randrange(11, 60))) for _ in range(2000)]
workloads = [decode_workload(d, hazards=frozenset(ALL_HAZARDS), max_iterations=8, plan_stream=None) for d in datas]
paged = [w for w in workloads if w.page_size > 1]
print(
    f"{len(workloads)} workloads (seeded byte strings, hazards {'+'.join(ALL_HAZARDS)}); "
    f"{len(paged)} with page_size 2, {sum(w.plan_stream for w in paged)} of those on the plan stream"
)
for name in [*BUILTIN, "mutant-plan-no-wait-schedule"]:
    hooks = load_design(name).hooks
    reads = hit = anyrace = 0
    for w in paged:
        program = build_program(w, hooks)
        reads += sum(op.kernel == "get_last_loc" for op in program.launches)
        races = find_races(program)
        anyrace += bool(races)
        hit += any("get_last_loc" in (r.first.kernel, r.second.kernel) for r in races)
    print(
        f"{name:32s} get_last_loc launches {reads:5d}  workloads racing on get_last_loc {hit:4d}  "
        f"workloads with any race {anyrace:4d}"
    )
