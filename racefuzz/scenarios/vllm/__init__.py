"""The vLLM KV-reuse scenario: vLLM V1's engine loop over the KV block pool under async scheduling (#45357).

    workload.py    what a workload is (requests, steps, block size, pool size, async scheduling, connector)
    strategies.py  workloads decoded from Hypothesis-drawn bytes; the hazards
    loop.py        the engine loop as a host program; the design hooks and the context they see
    designs/       the built-in sync designs (none, immediate-free, deferred-free, step-event)
    mutants.py     deliberately broken designs
    minimize.py    structurally simpler workloads for the minimizer
    costs.py       what a design costs: host time blocked, blocks held back by the deferral
    compare.py     `racefuzz compare --scenario vllm-kv-reuse`

`SCENARIO` is what the generic layers use (`racefuzz.scenarios.Scenario`). docs/vllm-kv-model.md is the model.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Mapping

from racefuzz.errors import InvalidArgument
from racefuzz.program import Launch, Program
from racefuzz.scenarios.vllm.loop import KV_STREAM, TABLE, Hooks, StepContext, build_program
from racefuzz.scenarios.vllm.minimize import simpler_workloads
from racefuzz.scenarios.vllm.strategies import HAZARDS, OPT_IN_HAZARDS, VllmWorkloads, decode_workload
from racefuzz.scenarios.vllm.workload import RequestSpec, Workload

__all__ = [
    "HAZARDS",
    "OPT_IN_HAZARDS",
    "SCENARIO",
    "Hooks",
    "RequestSpec",
    "StepContext",
    "VllmKvReuse",
    "VllmWorkloads",
    "Workload",
    "build_program",
    "decode_workload",
]


class VllmKvReuse:
    """vLLM V1's engine loop over the KV block pool (see `racefuzz.scenarios.vllm.loop`)."""

    name = "vllm-kv-reuse"
    table = TABLE
    hazards = HAZARDS
    opt_in_hazards = OPT_IN_HAZARDS
    hook_names = Hooks.NAMES
    control_design = "immediate-free"  # the racy design of #45357: every "no race" is judged beside it
    default_design = "deferred-free"

    def designs(self) -> Mapping[str, object]:
        from racefuzz.scenarios.vllm.designs import BUILTIN

        return BUILTIN

    def mutants(self) -> Mapping[str, object]:
        from racefuzz.scenarios.vllm.mutants import MUTANTS

        return MUTANTS

    def check_design(self, design: object, spec: str) -> None:
        slack = getattr(design, "fence_slack", 0)
        if isinstance(slack, bool) or not isinstance(slack, int) or slack < 0:
            raise InvalidArgument(f"{spec}: fence_slack must be a non-negative int, got {slack!r}")

    def workload_space(self, hazards: frozenset[str], **options: object) -> VllmWorkloads:
        unknown = sorted(set(options) - set(VllmWorkloads.OPTIONS))
        if unknown:
            raise InvalidArgument(
                f"the {self.name} scenario has no workload option(s) {unknown}; "
                f"options: {', '.join(VllmWorkloads.OPTIONS)}"
            )
        return VllmWorkloads(hazards, **options)  # type: ignore[arg-type]

    def build_program(self, workload: Workload, design: object) -> Program:  # type: ignore[override]
        return build_program(workload, design)

    def workload_from_json(self, data: object) -> Workload:
        return Workload.from_json(data)

    def simpler_workloads(self, workload: Workload) -> Iterator[Workload]:  # type: ignore[override]
        return simpler_workloads(workload)

    def launch_identity(self, launch: Launch) -> Hashable:
        # (stream, kernel, step) is unique per step but for the connector's transfers, one per request.
        request = launch.info.get("requests") if launch.stream.name == KV_STREAM else None
        return (launch.stream.name, launch.kernel, launch.info.get("step"), request)

    def compare_command(self, designs: list, backend: str, args: object) -> int:
        """`racefuzz compare` for this scenario (`racefuzz.scenarios.vllm.compare`)."""
        from racefuzz.scenarios.vllm.compare import compare_command

        return compare_command(designs, backend, args)  # type: ignore[arg-type]

    def describe(self, workload: Workload) -> str:  # type: ignore[override]
        w = workload
        remote = sum(r.remote for r in w.requests)
        eos = sum(r.eos for r in w.requests)
        return (
            f"{len(w.requests)} request(s) ({remote} remote, {eos} stopping on EOS), {w.steps} step(s), "
            f"B={w.block_size}, {w.num_blocks} block(s), async scheduling {'on' if w.async_scheduling else 'off'}"
            + (f", {w.connector} connector" if remote or w.connector != "nixl" else "")
        )


SCENARIO = VllmKvReuse()
