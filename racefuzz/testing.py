"""Assertions for users' own test suites: "guard your sync refactor" in a few lines of pytest.

    from racefuzz.testing import assert_race_free, assert_no_new_race

    def test_my_barrier(racefuzz_config):          # fixture from racefuzz's pytest plugin
        assert_race_free("mypkg.sync:design", racefuzz_config)

    def test_refactor_adds_no_race(racefuzz_config):
        assert_no_new_race("mypkg.sync:new_design", "mypkg.sync:old_design", racefuzz_config)

`assert_race_free` runs the same search as `racefuzz run`, beside the negative control: a race fails the
test with the report in the message and the replay file, report and timeline written to
`config.report_dir` first; a control that is not caught fails it as inconclusive.

The failures carry the kinds of the CLI's exit codes (`racefuzz.exitcodes`): `RaceFound` (1) and
`Inconclusive` (3) are `AssertionError`s; a usage problem (a bad design name, 2) is an `InvalidArgument`
and a failing design hook (4) a `UserCodeError`, both `RacefuzzError`s with an `exit_code`. The pytest
plugin shows each as one line, `racefuzz: <kind>: <message>` (the traceback with `-vv`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import seed as hypothesis_seed

from racefuzz.backends import executor, resolve_backend
from racefuzz.commands.argtypes import DEFAULT_EXAMPLE_TIMEOUT_S
from racefuzz.designs import Design, load_design, raise_hook_error
from racefuzz.errors import Inconclusive, InvalidArgument, RaceFound
from racefuzz.hb import find_races
from racefuzz.report import save_counterexample
from racefuzz.scenarios import check_hazards
from racefuzz.schedule import Schedule
from racefuzz.search import SearchResult, search
from racefuzz.watchdog import WatchedExecutor, watched


@dataclass(frozen=True)
class Config:
    """How much to search, where, and where failures go.

    Args:
        backend: `auto` (the GPU when usable), `sim` or `cuda`.
        examples: examples per search.
        seed: the Hypothesis seed: the same seed draws the same examples.
        report_dir: where replay files, reports and timelines of failures are written.
        repeat: k of k runs a manifested race must reproduce in; None: 5 on the GPU, 1 on the simulator.
        database: a Hypothesis `ExampleDatabase` where failures are saved and tried first next time
            (`racefuzz.search.corpus`); None keeps nothing. The pytest fixture passes the active
            Hypothesis profile's database (`.hypothesis/examples` unless the profile says otherwise).
        example_timeout: seconds one example (a design hook, a run) may take, as `racefuzz run
            --example-timeout`: past it the assertion fails with `ExampleTimeout`, and a hook that never
            returns ends the process with exit code 6 (`racefuzz.watchdog`); None: no watchdog.
        on_abandon: called with the one-line message just before a hung example ends the process (the
            pytest plugin writes it to the terminal, where pytest's output capture would swallow it).
    """

    backend: str = "auto"
    examples: int = 200
    seed: int = 0
    report_dir: Path = field(default_factory=lambda: Path(".racefuzz"))
    repeat: int | None = None
    database: object | None = None
    example_timeout: float | None = DEFAULT_EXAMPLE_TIMEOUT_S
    on_abandon: Callable[[str], None] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.examples < 1:
            raise InvalidArgument(f"examples must be a positive integer, got {self.examples}")
        if self.seed < 0:
            raise InvalidArgument(f"seed must be a non-negative integer, got {self.seed}")
        if self.repeat is not None and self.repeat < 1:
            raise InvalidArgument(f"repeat must be a positive integer, got {self.repeat}")
        if self.example_timeout is not None and not 0 < self.example_timeout < float("inf"):
            raise InvalidArgument(f"example_timeout must be a positive number of seconds, got {self.example_timeout}")

    @property
    def resolved_backend(self) -> str:
        return resolve_backend(self.backend)


def _design(design: str | Design) -> Design:
    return design if isinstance(design, Design) else load_design(design)


def _search(design: Design, config: Config, backend: str, hazards, options, *, shrink: bool) -> SearchResult:
    return search(
        design,
        WatchedExecutor(executor(backend), backend),
        backend=backend,
        examples=config.examples,
        seed=config.seed,
        hazards=hazards,
        shrink=shrink,
        repeat=config.repeat,
        database=config.database,  # type: ignore[arg-type]
        **options,
    )


class _Control(Enum):
    SCENARIO = "the negative control of the design's scenario"


SCENARIO_CONTROL = _Control.SCENARIO
"""`control`'s default: the negative control of the design's scenario (`Scenario.control_design`)."""


def assert_race_free(
    design: str | Design,
    config: Config | None = None,
    *,
    hazards: Collection[str] | None = None,
    control: str | Design | _Control | None = SCENARIO_CONTROL,
    **workload_options: object,
) -> SearchResult:
    """Fail unless `design` shows no race over `config.examples` examples while `control` is caught.

    `hazards` default to the scenario's; `workload_options` go to its workload space (for sglang's overlap
    loop, e.g. `plan_stream=True`). `control` defaults to the scenario's negative control; `control=None`
    skips it, and a "no race" then proves nothing, so only do that when a control runs elsewhere in the
    same session.
    """
    from racefuzz.outputs import check_output_dir

    config = config or Config()
    check_output_dir(config.report_dir, "report_dir")  # before the search: a race found must have a place to go
    backend = config.resolved_backend
    with watched(config.example_timeout, config.on_abandon):
        return _assert_race_free(design, config, backend, hazards, control, workload_options)


def _assert_race_free(
    design: str | Design,
    config: Config,
    backend: str,
    hazards: Collection[str] | None,
    control: str | Design | _Control | None,
    workload_options: dict[str, object],
) -> SearchResult:
    target = _design(design)
    if control is SCENARIO_CONTROL:
        control = target.scenario.control_design
    if control is not None:
        control_design = control if isinstance(control, Design) else load_design(control, target.scenario)
        caught = _search(control_design, config, backend, hazards, workload_options, shrink=False)
        if not caught.found:
            raise Inconclusive(
                f"racefuzz: INCONCLUSIVE: the negative control `{caught.design.name}` was not caught in "
                f"{caught.examples} examples on {backend}; widen the hazards or raise the examples"
            )
    result = _search(target, config, backend, hazards, workload_options, shrink=True)
    raise_hook_error(target)  # a hook that raised once inside the search, even if not again
    if result.found:
        try:
            path, text, _ = save_counterexample(result, config.seed, config.report_dir)
            where = ""
        except OSError as exc:  # the report directory went bad during the search: keep the race anyway
            from racefuzz.outputs import fallback_dir

            elsewhere = fallback_dir()
            path, text, _ = save_counterexample(result, config.seed, elsewhere)
            where = f"; {config.report_dir} could not be written ({exc.strerror or exc}), so it went to {elsewhere}"
        raise RaceFound(f"racefuzz found a race in design {target.name} (replay file {path}{where}):\n{text}")
    return result


def write_replay_file(
    design: Design, workload: object, schedule: Schedule, oracle: str, backend: str, config: Config
) -> Path:
    """Write a replay file of one failing example (for a property test's failure message) and return its path.

    For properties that draw their own examples: `racefuzz replay PATH` re-runs the example, as it re-runs
    a search's counterexample."""
    from racefuzz import __version__
    from racefuzz.report import ReplayFile, write_replay

    replay = ReplayFile(
        design.spec,
        backend,
        config.seed,
        workload,
        schedule,
        oracle,
        __version__,
        design.scenario,  # type: ignore[arg-type]
    )
    return write_replay(replay, config.report_dir)


def assert_no_new_race(
    new: str | Design,
    old: str | Design,
    config: Config | None = None,
    *,
    hazards: Collection[str] | None = None,
    **workload_options: object,
) -> None:
    """Fail if, on some drawn workload, `new` has a happens-before race that `old` does not have.

    Both designs must be of one scenario. Races are compared by `Race.across_designs` (kind, kernels,
    iterations, cells).
    """
    config = config or Config()
    new_design, old_design = _design(new), _design(old)
    scenario = new_design.scenario
    if old_design.scenario is not scenario:
        raise InvalidArgument(
            f"designs {new_design.name} and {old_design.name} are of different scenarios "
            f"({scenario.name}, {old_design.scenario.name})"
        )
    space = scenario.workload_space(
        check_hazards(scenario, scenario.hazards if hazards is None else hazards), **workload_options
    )

    def keys(workload, design: Design) -> set[tuple[object, ...]]:
        return {race.across_designs for race in find_races(scenario.build_program(workload, design.hooks))}

    @hypothesis_seed(config.seed)
    @settings(max_examples=config.examples, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
    @given(space.strategy().map(space.decode))
    def no_new_race(workload) -> None:
        added = keys(workload, new_design) - keys(workload, old_design)
        if added:
            raise RaceFound(
                f"racefuzz: design {new_design.name} has races that {old_design.name} does not: "
                f"{sorted(added)[:3]} on workload {workload.to_json()}"
            )

    try:
        with watched(config.example_timeout, config.on_abandon):
            no_new_race()
    finally:
        raise_hook_error(new_design)
        raise_hook_error(old_design)
