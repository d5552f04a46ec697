"""`racefuzz compare` and the cost measures it reads off timelines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from racefuzz import Device, simulate
from racefuzz.cli import main
from racefuzz.exitcodes import ExitCode
from racefuzz.scenarios.sglang.costs import measure


def test_costs_from_a_hand_built_timeline() -> None:
    device = Device()
    forward = device.stream("forward_stream")
    table = device.buffer("req_to_token", 2, 8)
    forward.launch("verify_forward", reads=[table[0, 0:2]], cost_us=100, info={"iteration": 0})
    done = forward.record_event("verify_done")
    done.synchronize()  # issued at 10 (two 5 us enqueues), the forward ends at 105
    device.host_delay(50)  # GPU idles while the host works
    forward.launch("verify_forward", reads=[table[0, 0:2]], cost_us=100, info={"iteration": 1})
    program = device.finish()
    costs = measure(program, simulate(program), iterations=2)
    assert costs.host_blocked_us == pytest.approx(95.0)
    assert costs.blocked_on == {"verify_done": pytest.approx(95.0)}
    assert costs.gpu_idle_us == pytest.approx(55.0)  # 105 -> 160 (50 host work + 5 launch)
    assert costs.forwards == 2 and costs.gpu_idle_us_per_forward_gap == pytest.approx(55.0)


def test_compare_sim_reports_verdicts_and_the_decode_stall(capsys, tmp_path: Path) -> None:
    code = main(
        [
            "compare",
            "--backend",
            "sim",
            "--workloads",
            "40",
            "--json",
            str(tmp_path / "c.json"),
            "--plot",
            str(tmp_path / "c.png"),
        ]
    )
    out = capsys.readouterr().out
    assert code == ExitCode.CLEAN
    result = json.loads((tmp_path / "c.json").read_text())
    self_event, global_war = result["designs"]["self-event"], result["designs"]["global-war"]
    # Correctness: global-war never has a race self-event lacks; self-event has more.
    assert result["workloads_with_races_only_in"]["global-war not self-event"] == 0
    assert result["workloads_with_races_only_in"]["self-event not global-war"] > 0
    assert self_event["unordered"] > global_war["unordered"]
    # Cost, steady decode: self-event stalls on verify_done and leaves the GPU idle; global-war does not.
    steady = result["steady_decode"]
    assert steady["self-event"]["host_blocked_us_per_iteration_on"]["verify_done"] > 1500
    assert "verify_done" not in steady["global-war"]["host_blocked_us_per_iteration_on"]
    assert (
        steady["self-event"]["gpu_idle_us_per_forward_gap"] > 10 * steady["global-war"]["gpu_idle_us_per_forward_gap"]
    )
    assert steady["global-war"]["iterations_per_s"] > steady["self-event"]["iterations_per_s"]
    assert "steady decode" in out
    if (tmp_path / "c.png").exists():
        assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    ("designs", "message"),
    [
        ("self-event", "at least two designs"),
        ("self-event,nope", "unknown design 'nope'"),
        ("none,none", "names a design twice"),
    ],
)
def test_bad_designs_are_a_one_line_error(capsys, designs: str, message: str) -> None:
    assert main(["compare", "--backend", "sim", "--designs", designs]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_what_self_event_orders_that_none_does_not_is_masked_columns_of_wide_reads() -> None:
    # The comparison the project exists for, on 300 drawn workloads: self-event's fence orders some pairs
    # `none` leaves unordered, only under the wide read extents, and only on masked columns.
    from racefuzz.designs import load_design
    from racefuzz.scenarios.sglang.compare import compare

    result = compare(
        [load_design("none"), load_design("self-event")],
        backend="sim",
        workloads=300,
        seed=0,
        hazards=("recycled-row-prefill", "chunked-stash", "post-launch-rewrite", "plan-stream"),
        plan_stream=None,
        forward_us=3000.0,
        host_us=600.0,
        prep_us=300.0,
    )
    only = result["workloads_with_races_only_in"]["none not self-event"]
    per_extent = result["workloads_with_races_only_in_per_read_extent"]
    assert only > 0, "self-event orders something none does not"
    assert per_extent["exact"]["none not self-event"] == 0, "exact reads are column-disjoint (model 2.4)"
    assert result["workloads_with_races_only_in_all_on_masked_columns"]["none not self-event"] == only
    assert result["workloads_with_races_only_in"]["self-event not none"] == 0
