"""`racefuzz compare`: the correctness and the cost of sync designs of one scenario, side by side.

What a comparison measures -- its workloads, its cost model -- is the scenario's: a scenario that has one
offers it as `compare_command(designs, backend, args)` (sglang's overlap loop does:
`racefuzz.scenarios.sglang.compare`). This module loads and checks the designs and hands them over.
"""

from __future__ import annotations

import argparse

from racefuzz.backends import resolve_backend
from racefuzz.commands.run import scenario_hazards
from racefuzz.designs import Design, load_design
from racefuzz.errors import InvalidArgument
from racefuzz.scenarios import DEFAULT_SCENARIO, Scenario, get_scenario

DEFAULT_DESIGNS = "self-event,global-war"
"""What `--designs` compares on the default scenario when not given (another scenario: its built-ins)."""


def parse_designs(text: str, scenario: Scenario | None = None) -> list[Design]:
    """At least two distinct designs of one scenario (built-in names are `scenario`'s), from `--designs A,B,...`."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if len(names) < 2:
        raise InvalidArgument(f"--designs needs at least two designs to compare, got {names or [text]}")
    if len(set(names)) != len(names):
        raise InvalidArgument(f"--designs names a design twice: {names}")
    designs = [load_design(name, scenario) for name in names]
    scenarios = {d.scenario.name for d in designs}
    if len(scenarios) > 1:
        raise InvalidArgument(f"--designs mixes scenarios ({', '.join(sorted(scenarios))}); compare one at a time")
    return designs


def compare_command(args: argparse.Namespace) -> int:
    from racefuzz.outputs import check_output_file

    for option, path in (("--json", args.json), ("--plot", args.plot)):
        if path is not None:
            check_output_file(path, option)
    home = get_scenario(args.scenario)
    default = DEFAULT_DESIGNS if home.name == DEFAULT_SCENARIO else ",".join(home.designs())
    designs = parse_designs(args.designs or default, home)
    scenario = designs[0].scenario
    args.hazards = scenario_hazards(scenario, args.hazards)
    run = getattr(scenario, "compare_command", None)
    if run is None:
        raise InvalidArgument(f"the {scenario.name} scenario has no cost comparison")
    try:
        return run(designs, resolve_backend(args.backend), args)
    except OSError as exc:  # checked before the work, but the disk may fill: say what was not written
        lost = exc.filename or " / ".join(str(p) for p in (args.json, args.plot) if p is not None) or "an output file"
        raise InvalidArgument(f"cannot write {lost}: {exc.strerror or exc} (the table above is complete)") from None
