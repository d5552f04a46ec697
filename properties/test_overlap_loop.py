"""The properties racefuzz checks on sglang's overlap loop over req_to_token.

(a) what every forward reads equals the sequential reference (manifested corruption);
(b) no conflicting accesses are left unordered (happens-before);
(c) no new unordered pair: on the same workload (every drawn read extent, with and without the plan
    stream), every unordered conflicting pair of the global WAR barrier's program (sglang #29556) -- by
    kind, kernels, iterations and cells -- is one of the self-event program it replaced too. It is a
    statement about the orderings of the model's programs: not about corruption under a schedule, and not
    about cost (#29556 moved host waits, see `racefuzz compare`). self-event has more such pairs (masked
    columns of wide reads, prefill iterations), so (c) is strict;
(d) the negative control: the unfenced design is caught by the same strategies in the same run, else a
    clean (a)/(b) would mean nothing.

Each clean claim is parametrized over the hazards under which that design is race-free. A failure
names the replay file it wrote (`racefuzz replay FILE` re-runs it) and Hypothesis prints the
`@reproduce_failure` blob that replays the example in this test.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from racefuzz.backends import executor
from racefuzz.designs import load_design
from racefuzz.hb import find_races
from racefuzz.oracle import find_corruptions
from racefuzz.scenarios.sglang import (
    ALL_HAZARDS,
    HAZARDS,
    LATER_HAZARDS,
    PRE_LAUNCH_HAZARDS,
    build_program,
    workloads,
)
from racefuzz.schedule import NO_DELAYS
from racefuzz.schedulers.random import decode_schedule
from racefuzz.search import search
from racefuzz.testing import write_replay_file

CLEAN = [
    ("war-after-launch", HAZARDS),
    ("global-war", PRE_LAUNCH_HAZARDS),
    ("read-done", PRE_LAUNCH_HAZARDS),
    ("read-done-post-replay", ALL_HAZARDS + LATER_HAZARDS),
]
"""(design, hazards under which it is race-free): each clean claim of (a) and (b)."""


def _settings(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        database=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow],
    )


def _id(case: tuple[str, tuple[str, ...]]) -> str:
    names = {HAZARDS: "all", ALL_HAZARDS + LATER_HAZARDS: "all+opt-in"}
    return f"{case[0]}[{names.get(case[1], '+'.join(case[1]))}]"


@pytest.mark.parametrize("case", CLEAN, ids=_id)
def test_a_reads_equal_the_sequential_reference(case, run_program, backend_name, racefuzz_config, examples) -> None:
    design, hazards = load_design(case[0]), case[1]

    @_settings(examples)
    @given(workload=workloads(hazards=hazards), delays=st.binary(max_size=16))
    def reads_are_sequential(workload, delays: bytes) -> None:
        program = build_program(workload, design.hooks)
        schedule = decode_schedule(delays, program)
        execution = run_program(program, schedule)
        corruptions = find_corruptions(program, execution.observations, execution.writers)
        if corruptions:
            path = write_replay_file(design, workload, schedule, "corruption", backend_name, racefuzz_config)
            raise AssertionError(
                f"{design.name}: {corruptions[0].read.describe()} read clobbered cells; replay: racefuzz replay {path}"
            )

    reads_are_sequential()


@pytest.mark.parametrize("case", CLEAN, ids=_id)
def test_b_no_unordered_conflicting_access(case, backend_name, racefuzz_config, examples) -> None:
    design, hazards = load_design(case[0]), case[1]

    @_settings(examples)
    @given(workload=workloads(hazards=hazards))
    def all_conflicts_ordered(workload) -> None:
        races = find_races(build_program(workload, design.hooks))
        if races:
            path = write_replay_file(design, workload, NO_DELAYS, "happens-before", backend_name, racefuzz_config)
            raise AssertionError(f"{races[0].missing_edge()}; replay: racefuzz replay {path}")

    all_conflicts_ordered()


def _race_keys(workload, design) -> set[tuple[object, ...]]:
    return {race.across_designs for race in find_races(build_program(workload, design.hooks))}


@pytest.mark.parametrize("plan_stream", [False, True], ids=["no-plan-stream", "plan-stream"])
def test_c_global_war_adds_no_race_over_self_event(plan_stream: bool, examples: int) -> None:
    old, new = load_design("self-event"), load_design("global-war")

    @_settings(examples)
    @given(workload=workloads(plan_stream=plan_stream))
    def no_new_race(workload) -> None:
        added = _race_keys(workload, new) - _race_keys(workload, old)
        assert not added, f"global-war races that self-event does not: {sorted(added)[:3]}"

    no_new_race()


@pytest.mark.parametrize("hazards", [HAZARDS, PRE_LAUNCH_HAZARDS], ids=["all", "pre-launch"])
def test_d_negative_control_is_caught(hazards, backend_name: str, examples: int) -> None:
    # The same strategies as (a)-(c) must catch the unfenced design, by both oracles.
    result = search(
        load_design("none"),
        executor(backend_name),
        backend=backend_name,
        examples=examples,
        hazards=hazards,
        shrink=False,
    )
    assert result.found, f"the negative control `none` was not caught in {examples} examples: inconclusive run"
    assert result.counterexample is not None and result.counterexample.races
    assert result.manifested_examples >= 1, "no corruption manifested: the delay strategy is not biting"
