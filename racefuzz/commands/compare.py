"""`racefuzz compare`: the correctness and the cost of sync designs of one scenario, side by side.

What a comparison measures -- its workloads, its cost model -- is the scenario's: a scenario that has one
offers it as `compare_command(designs, backend, args)` (sglang's overlap loop does:
`racefuzz.scenarios.sglang.compare`). This module loads and checks the designs and hands them over.
"""

from __future__ import annotations

import argparse

from racefuzz.backends import BACKENDS, resolve_backend
from racefuzz.commands import ParserFactory, argtypes
from racefuzz.commands.run import SCENARIO_HELP, hazards_help, scenario_hazards
from racefuzz.designs import Design, load_design
from racefuzz.errors import InvalidArgument
from racefuzz.scenarios import DEFAULT_SCENARIO, Scenario, get_scenario

DEFAULT_DESIGNS = "self-event,global-war"
"""What `--designs` compares on the default scenario when not given (another scenario: its built-ins)."""


def add_parser(command: ParserFactory) -> None:
    """Add the `compare` subcommand through the CLI's subcommand factory."""
    compare = command("compare", "correctness and cost of sync designs side by side")
    compare.add_argument("--scenario", default=None, help=SCENARIO_HELP)
    compare.add_argument(
        "--designs",
        default=None,
        help="comma-separated designs, at least two (default self-event,global-war for sglang-overlap, every "
        "built-in design of another --scenario)",
    )
    compare.add_argument("--backend", choices=BACKENDS, default="auto", help="auto: cuda if a GPU is usable")
    plan = compare.add_mutually_exclusive_group()
    plan.add_argument("--plan-stream", dest="plan_stream", action="store_true", default=None)
    plan.add_argument("--no-plan-stream", dest="plan_stream", action="store_false")
    compare.add_argument("--hazards", type=argtypes.hazard_list, default=None, help=hazards_help())
    compare.add_argument(
        "--workloads",
        type=argtypes.bounded_int(1, 100_000, "a positive integer"),
        default=100,
        help="drawn workloads, 1 to 100,000 (default 100)",
    )
    compare.add_argument("--seed", type=argtypes.seed, default=0)
    compare.add_argument(
        "--forward-us",
        type=argtypes.microseconds,
        default=3000.0,
        help="forward compute per iteration in us (default 3000, a decode step)",
    )
    compare.add_argument(
        "--host-us",
        type=argtypes.microseconds,
        default=600.0,
        help="host scheduling work per iteration before decode prep, in us (default 600)",
    )
    compare.add_argument(
        "--prep-us",
        type=argtypes.microseconds,
        default=300.0,
        help="host work between decode prep and the forward launch, in us (default 300)",
    )
    compare.add_argument("--json", type=argtypes.path, help="write the results here")
    compare.add_argument("--plot", type=argtypes.path, help="write a PNG: cost bars and one timeline per design")


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
