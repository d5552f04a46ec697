"""A small step for `racefuzz trace` and the README: a forward reads rows of a table that the scheduler
then rewrites, with and without the WAR barrier. Runs on the GPU (`env.device == "cuda"`) or, recorded on
virtual streams, on the CPU:

    racefuzz trace racefuzz.trace.example:racy_step            # exit 1: WAR on req_to_token[1, 0:8]
    racefuzz trace racefuzz.trace.example:synced_step --control racefuzz.trace.example:racy_step
"""

from __future__ import annotations

from typing import Any


def overlap(env: Any, barrier: bool) -> dict[str, Any]:
    import torch

    table = env.name(torch.arange(4 * 64, dtype=torch.int32, device=env.device).reshape(4, 64), "req_to_token")
    schedule, forward = env.stream("schedule"), env.stream("forward")
    forward.wait_stream(env.current_stream())
    schedule.wait_stream(env.current_stream())
    with env.use(forward):
        rows = torch.tensor([1, 2], device=env.device)
        kv_indices = table[rows, :32].flatten()  # the forward's read of the table
    if barrier:
        schedule.wait_stream(forward)  # the WAR barrier
    with env.use(schedule):
        table[1, 0:8] = -1  # the next iteration reuses row 1
        table[3, 32:] = 0  # columns outside the forward's view `table[:, :32]`: never a conflict
    env.synchronize()
    return {"kv_indices": kv_indices}


def racy_step(env: Any) -> dict[str, Any]:
    return overlap(env, barrier=False)


def synced_step(env: Any) -> dict[str, Any]:
    return overlap(env, barrier=True)
