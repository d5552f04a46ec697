"""The sglang overlap scenario: the event loop's writers and readers of `req_to_token` on its streams.

    workload.py    what a workload is (requests, iterations, block size, rows, plan stream, page size)
    strategies.py  workloads decoded from Hypothesis-drawn bytes; the hazards
    loop.py        the overlap loop as a host program; the design hooks and the context they see
    designs/       the built-in sync designs (none, self-event, global-war, read-done, war-after-launch,
                   read-done-post-replay, record-stream)
    mutants.py     deliberately broken designs, each planting one bug sglang has had or could have
    minimize.py    structurally simpler workloads for the minimizer
    costs.py       what a design costs, read off a run's timeline (host blocked, GPU idle)
    compare.py     `racefuzz compare`: verdicts and costs of designs on the same workloads

`SCENARIO` is what the generic layers use (`racefuzz.scenarios.Scenario`).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Mapping

from racefuzz.errors import InvalidArgument
from racefuzz.program import Launch, Program
from racefuzz.scenarios.sglang.loop import TABLE, Hooks, LoopContext, build_program
from racefuzz.scenarios.sglang.minimize import simpler_workloads
from racefuzz.scenarios.sglang.strategies import (
    ALL_HAZARDS,
    HAZARDS,
    LATER_HAZARDS,
    LIFETIME_HAZARDS,
    MAX_ITERATIONS,
    OPT_IN_HAZARDS,
    PRE_LAUNCH_HAZARDS,
    OverlapWorkloads,
    decode_workload,
    workload_bytes,
    workloads,
)
from racefuzz.scenarios.sglang.workload import RequestSpec, Workload

__all__ = [
    "ALL_HAZARDS",
    "HAZARDS",
    "LATER_HAZARDS",
    "LIFETIME_HAZARDS",
    "MAX_ITERATIONS",
    "OPT_IN_HAZARDS",
    "PRE_LAUNCH_HAZARDS",
    "SCENARIO",
    "Hooks",
    "LoopContext",
    "OverlapWorkloads",
    "RequestSpec",
    "SglangOverlap",
    "Workload",
    "build_program",
    "decode_workload",
    "workload_bytes",
    "workloads",
]


class SglangOverlap:
    """sglang's overlap event loop over `req_to_token` (see `racefuzz.scenarios.sglang.loop`)."""

    name = "sglang-overlap"
    table = TABLE
    hazards = HAZARDS
    opt_in_hazards = OPT_IN_HAZARDS + LATER_HAZARDS + LIFETIME_HAZARDS
    hook_names = Hooks.NAMES
    control_design = "none"
    default_design = "global-war"

    def designs(self) -> Mapping[str, object]:
        from racefuzz.scenarios.sglang.designs import BUILTIN

        return BUILTIN

    def mutants(self) -> Mapping[str, object]:
        from racefuzz.scenarios.sglang.mutants import MUTANTS

        return MUTANTS

    def check_design(self, design: object, spec: str) -> None:
        headroom = getattr(design, "headroom_blocks", 2)
        if isinstance(headroom, bool) or not isinstance(headroom, int) or headroom < 0:
            raise InvalidArgument(f"{spec}: headroom_blocks must be a non-negative int, got {headroom!r}")

    def workload_space(self, hazards: frozenset[str], **options: object) -> OverlapWorkloads:
        unknown = sorted(set(options) - set(OverlapWorkloads.OPTIONS))
        if unknown:
            raise InvalidArgument(
                f"the {self.name} scenario has no workload option(s) {unknown}; "
                f"options: {', '.join(OverlapWorkloads.OPTIONS)}"
            )
        return OverlapWorkloads(hazards, **options)  # type: ignore[arg-type]

    def build_program(self, workload: Workload, design: object) -> Program:  # type: ignore[override]
        return build_program(workload, design)

    def workload_from_json(self, data: object) -> Workload:
        return Workload.from_json(data)

    def simpler_workloads(self, workload: Workload) -> Iterator[Workload]:  # type: ignore[override]
        return simpler_workloads(workload)

    def launch_identity(self, launch: Launch) -> Hashable:
        # (stream, kernel, iteration) is unique per iteration in the overlap loop.
        return (launch.stream.name, launch.kernel, launch.info.get("iteration"))

    def compare_command(self, designs: list, backend: str, args: object) -> int:
        """`racefuzz compare` for this scenario (`racefuzz.scenarios.sglang.compare`)."""
        from racefuzz.scenarios.sglang.compare import compare_command

        return compare_command(designs, backend, args)  # type: ignore[arg-type]

    def describe(self, workload: Workload) -> str:  # type: ignore[override]
        w = workload
        return (
            f"{len(w.requests)} request(s), {w.iterations} iteration(s), B={w.block_size}, {w.rows} row(s), "
            f"plan stream {'on' if w.plan_stream else 'off'}"
            + (f", page size {w.page_size}" if w.page_size > 1 else "")
            + (f", {w.read_extent} reads" if w.read_extent != "exact" else "")
            + (", verify replay re-reads R" if w.replay_reads else "")
            + (", mixed chunks" if w.mixed_chunk else "")
        )


SCENARIO = SglangOverlap()
