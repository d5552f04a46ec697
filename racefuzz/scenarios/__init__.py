"""Scenarios: the host programs racefuzz searches, each a small protocol the generic layers go through.

A scenario is what a search knows about one system: which workloads there are (drawn from bytes that
Hypothesis draws and shrinks), how a workload and a sync design make a `Program`, which simpler workloads
the structural minimizer should try, how a report describes a workload, which design hooks there are and
which designs are built in. `racefuzz.search`, `racefuzz.report`, `racefuzz.designs`, `racefuzz.testing`
and the CLI reach a scenario only through `Scenario`; adding one touches none of them.

Scenarios are found by name (`get_scenario("sglang-overlap")`) or by `module:attr` (a scenario outside
racefuzz, e.g. one in a user's test suite); replay files record the spec they were found by.

    sglang-overlap   sglang's overlap event loop over req_to_token (`racefuzz.scenarios.sglang`)
    vllm-kv-reuse    vLLM V1's engine loop over the KV block pool under async scheduling (`racefuzz.scenarios.vllm`)
"""

from __future__ import annotations

import importlib
from collections.abc import Hashable, Iterator, Mapping
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from racefuzz.errors import InvalidArgument

if TYPE_CHECKING:
    from hypothesis import strategies as st

    from racefuzz.program import Launch, Program

DEFAULT_SCENARIO = "sglang-overlap"

BUILTIN: dict[str, str] = {
    "sglang-overlap": "racefuzz.scenarios.sglang:SCENARIO",
    "vllm-kv-reuse": "racefuzz.scenarios.vllm:SCENARIO",
}
"""Built-in scenarios by name -> `module:attr`, imported on first use."""


@runtime_checkable
class Workload(Protocol):
    """A scenario's input: immutable, hashable, and plain data (`to_json` round-trips through its scenario)."""

    def to_json(self) -> dict[str, object]: ...


@runtime_checkable
class WorkloadSpace(Protocol):
    """The workloads one search draws from: a byte strategy and its decoder.

    Hypothesis pays per draw, so a search draws one byte string per workload and decodes it; shrinking the
    bytes toward zero and toward empty must move every field toward its simplest value.
    """

    def strategy(self) -> st.SearchStrategy[bytes]: ...

    def decode(self, data: bytes) -> Workload: ...


@runtime_checkable
class Scenario(Protocol):
    """What the generic layers need of a scenario.

    Attributes:
        name: the scenario's name, recorded in replay files.
        table: the shared table its races are about (reports name it when no race does).
        hazards: the hazards a search draws by default; `opt_in_hazards` are drawn only when named.
        hook_names: the design hooks it calls (a design attribute close to one of these is a typo).
        control_design: a built-in design known to race: the negative control of every "no race".
        default_design: the design `racefuzz run` searches when none is named.
    """

    name: str
    table: str
    hazards: tuple[str, ...]
    opt_in_hazards: tuple[str, ...]
    hook_names: tuple[str, ...]
    control_design: str
    default_design: str

    def designs(self) -> Mapping[str, object]:
        """The built-in designs by name."""
        ...

    def mutants(self) -> Mapping[str, object]:
        """Deliberately broken designs by name (loadable like built-ins, not listed as such)."""
        ...

    def check_design(self, design: object, spec: str) -> None:
        """Raise `InvalidArgument` for scenario-specific problems of a design (the generic checks are done)."""
        ...

    def workload_space(self, hazards: frozenset[str], **options: object) -> WorkloadSpace:
        """The workloads to draw under `hazards` (already checked); unknown `options` are an InvalidArgument."""
        ...

    def build_program(self, workload: Workload, design: object) -> Program:
        """The host program of `workload` under `design` (its hook object). Deterministic."""
        ...

    def workload_from_json(self, data: object) -> Workload:
        """The inverse of `Workload.to_json`; malformed data is an InvalidArgument."""
        ...

    def simpler_workloads(self, workload: Workload) -> Iterator[Workload]:
        """Structurally simpler workloads for the minimizer to try, most promising first."""
        ...

    def launch_identity(self, launch: Launch) -> Hashable:
        """What identifies a launch across the programs of simpler workloads (delays follow it)."""
        ...

    def describe(self, workload: Workload) -> str:
        """The workload in a few words for a report ("1 request(s), 3 iteration(s), ...")."""
        ...


_LOADED: dict[str, Scenario] = {}


def get_scenario(spec: str | Scenario | None = None) -> Scenario:
    """A scenario by built-in name or `module:attr`; a Scenario object is returned as is; None: the default."""
    if spec is None:
        spec = DEFAULT_SCENARIO
    if not isinstance(spec, str):
        return spec
    if spec in _LOADED:
        return _LOADED[spec]
    target = BUILTIN.get(spec, spec)
    module_name, _, attr = target.partition(":")
    if not attr:
        raise InvalidArgument(f"unknown scenario {spec!r}; built-in: {', '.join(BUILTIN)} (or module:attr)")
    try:
        obj: object = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise InvalidArgument(f"cannot load scenario {spec!r}: {exc}") from None
    if not isinstance(obj, Scenario):
        raise InvalidArgument(f"{spec!r} is not a scenario (see racefuzz.scenarios.Scenario)")
    _LOADED[spec] = obj
    return obj


def scenario_spec(scenario: Scenario) -> str:
    """How a replay file names `scenario`: its built-in name, else `module:attr` of where it was loaded from."""
    if scenario.name in BUILTIN:
        return scenario.name
    for spec, loaded in _LOADED.items():
        if loaded is scenario:
            return spec
    spec = getattr(scenario, "spec", None)
    if isinstance(spec, str):
        return spec
    raise InvalidArgument(
        f"scenario {scenario.name!r} cannot be named in a replay file: give it a `spec` attribute (module:attr)"
    )


def check_hazards(scenario: Scenario, hazards: object) -> frozenset[str]:
    """`hazards` as a set, or an InvalidArgument naming the unknown ones and the choices."""
    known = (*scenario.hazards, *scenario.opt_in_hazards)
    names = frozenset(hazards)  # type: ignore[arg-type]
    unknown = names - set(known)
    if unknown:
        raise InvalidArgument(f"unknown hazard(s) {sorted(unknown)}; choose from {', '.join(known)}")
    return names
