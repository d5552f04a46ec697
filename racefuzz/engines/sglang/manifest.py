"""Does a race of sglang's own loop make the forward read a wrong page table? (the harness's `--manifest`)

The harness's verdict is happens-before: an unordered pair is a race whatever the timing. On a GPU the
stronger question has an answer too: under some delay, does the fake forward's read of `req_to_token`
(sglang's `create_flashinfer_kv_indices_triton` inside it) gather different page-table entries than the
serialized run did? This mode fuzzes the harness's step (sglang's loop on one workload, the WAR barrier as
the version has it) with `racefuzz.trace.search.fuzz`, watching `req_to_token` (the stores of every launch
that reads or writes it are compared with the serialized reference's), and tries first the delays aimed at
each happens-before race: a spin on the reading launch's stream just before it, long enough for the host to
issue the racing write first. Then the search's own draws. A divergence counts only when the delays
reproduce it k of k (`racefuzz.confirm`) and serialized runs without them do not (the trace's
nondeterminism rule).

On the CPU the step executes eagerly and no delay can reorder anything: the mode is for `--device cuda`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

AIMED_DELAYS_US = (20_000.0, 100_000.0)
"""How long to hold the reading launch back: the host code between a forward's launch and the result
processing that writes the row runs for milliseconds under the recorder (20 ms), or longer (100 ms)."""

WATCHED = ("req_to_token",)
"""The storage whose readers' and writers' stores the value oracle compares."""


class AimedDelays:
    """Delay sets to try before the search's draws (the `saved` seam of `fuzz`): one per race's reader, per
    length in `AIMED_DELAYS_US`. Kept in memory only: nothing is saved between runs."""

    def __init__(self, sets: Sequence[list[tuple[str, int, float]]]) -> None:
        self._sets = [list(s) for s in sets]

    def saved(self) -> list[list[tuple[str, int, float]]]:
        return [list(s) for s in self._sets]

    def save(self, delays: Sequence[tuple[str, int, float]]) -> None:
        """Nothing to keep: the aimed sets are recomputed from each run's races."""

    def delete(self, delays: Sequence[tuple[str, int, float]]) -> None:
        """Nothing kept, nothing to delete."""


def aimed_delays(reference: Any, races: Sequence[Any]) -> list[list[tuple[str, int, float]]]:
    """For each race, a spin on its first access's stream just before that launch: (stream, n-th launch on
    it, microseconds), n counted as the search counts delay points (`launch_points_by_op`); a race whose
    first access is no delay point (a free, a copy, a host access) gets none."""
    from racefuzz.trace.search import launch_points_by_op

    points = launch_points_by_op(reference)
    sets: list[list[tuple[str, int, float]]] = []
    for race in races:
        point = points.get(race.first.index)
        if point is None:
            continue
        for us in AIMED_DELAYS_US:
            candidate = [(point[0], point[1], us)]
            if candidate not in sets:
                sets.append(candidate)
    return sets


def manifest_workload(
    workload: Any, sgl: Any, adapter: Any, read_done: str, device: str, examples: int = 50, confirm: int = 3
) -> dict[str, Any]:
    """Fuzz sglang's loop on `workload` (the WAR barrier as the version has it) on `device`: the
    happens-before races of a serialized run, the aimed delays, and what `fuzz` found (divergence,
    delays, k of k, runs, seconds) as JSON. `sgl` and `adapter` as the harness's `main` made them."""
    from racefuzz.engines.sglang.scheduler import build_and_run, configure
    from racefuzz.trace.judge import trace_races
    from racefuzz.trace.search import fuzz, run_once

    configure(sgl, adapter, workload, device)

    def step(env: Any) -> None:
        build_and_run(env, sgl, adapter, workload, True, read_done=read_done)

    began = time.perf_counter()
    reference = run_once(step, device, serialize=True)
    races = trace_races(reference.program)
    aimed = aimed_delays(reference, races)
    result = fuzz(
        step,
        device=device,
        watch=WATCHED,
        examples=examples,
        max_delays=1,
        confirm=confirm,
        seed=0,
        saved=AimedDelays(aimed),
    )
    confirmation = result.confirmation
    return {
        "workload": workload.describe(),
        "races": len(races),
        "aimed": [[list(point) for point in s] for s in aimed],
        "divergence": str(result.divergence) if result.divergence is not None else None,
        "delays": [list(point) for point in result.delays],
        "confirmed": result.confirmed,
        "confirm_runs": result.confirm_runs,
        "manifested": bool(confirmation is not None and confirmation.confirmed),
        "aimed_tried": result.replayed,
        "examples": result.examples,
        "serialized_runs": result.serialized_runs,
        "skipped": result.skipped,
        "nondeterministic": _describe_nondeterminism(result.nondeterministic),
        "seconds": round(time.perf_counter() - began, 3),
    }


def _describe_nondeterminism(found: Any) -> dict[str, Any] | None:
    if found is None:
        return None
    return {"stores": len(found.stores), "outputs": sorted(found.outputs), "unstable": found.unstable}
