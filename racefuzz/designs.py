"""Sync designs: where the fences go. Loading a built-in or a user's design for a scenario.

A design is any object -- a module, a class instance, a `types.SimpleNamespace` -- with a `name` and
some of its scenario's hooks (`Scenario.hook_names`), each called at the point of the scenario's host
program where that system's sync code sits. Nothing to subclass. A design names its scenario with a
`scenario` attribute (a built-in name such as "sglang-overlap", `module:attr`, or the scenario object);
without one it belongs to the default scenario, sglang's overlap loop, whose hooks are documented in
`racefuzz.scenarios.sglang.loop` and whose built-ins live in `racefuzz.scenarios.sglang.designs`.

`load_design` also knows a scenario's deliberately broken designs (`mutant-...`) by name; they are not
built-ins (`racefuzz designs --mutants` lists them).
"""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass

from racefuzz.errors import InvalidArgument
from racefuzz.scenarios import Scenario, get_scenario


@dataclass(frozen=True)
class Design:
    """A loaded design: its name, one-line description, where it came from, its hook object and scenario."""

    name: str
    description: str
    spec: str
    hooks: object
    scenario: Scenario


def describe(obj: object) -> str:
    """The first line of a design's `description` (or docstring)."""
    doc = getattr(obj, "description", None) or (getattr(obj, "__doc__", None) or "").strip()
    return doc.splitlines()[0] if doc else "(no description)"


def check_design(obj: object, spec: str, scenario: Scenario) -> None:
    """Raise `InvalidArgument` unless `obj` looks like a design of `scenario`: a name, callable hooks, and no
    attribute that looks like a misspelt hook (a typo would silently leave that fence out)."""
    name = getattr(obj, "name", None)
    if not isinstance(name, str) or not name:
        raise InvalidArgument(f"{spec} is not a design: it has no `name` string attribute")
    hook_names = scenario.hook_names
    for attr in dir(obj):
        if attr.startswith("_") or attr in hook_names or not callable(getattr(obj, attr, None)):
            continue
        close = difflib.get_close_matches(attr, hook_names, n=1, cutoff=0.8)
        if close:
            raise InvalidArgument(f"{spec}: {attr!r} is not a design hook; did you mean {close[0]!r}?")
    for hook in hook_names:
        if getattr(obj, hook, None) is not None and not callable(getattr(obj, hook)):
            raise InvalidArgument(f"{spec}: hook {hook!r} is not callable")
    scenario.check_design(obj, spec)


def scenario_of(obj: object, default: Scenario | str | None = None) -> Scenario:
    """The scenario a design object belongs to: its `scenario` attribute, else `default`."""
    declared = getattr(obj, "scenario", None)
    return get_scenario(declared if declared is not None else default)  # type: ignore[arg-type]


def load_design(spec: str, scenario: Scenario | str | None = None) -> Design:
    """A built-in design or a mutant of `scenario` (default: sglang's overlap loop) by name, or
    `package.module:attribute` (a design object or a module), whose own `scenario` attribute wins."""
    home = get_scenario(scenario)
    builtin = home.designs()
    if spec in builtin:
        obj = builtin[spec]
        return Design(spec, describe(obj), spec, obj, home)
    if spec.startswith("mutant-") and spec in home.mutants():
        obj = home.mutants()[spec]
        return Design(spec, describe(obj), spec, obj, home)
    if ":" not in spec and "." not in spec:
        raise InvalidArgument(
            f"unknown design {spec!r}; built-in designs: {', '.join(builtin)} (or module:attr; the deliberately "
            "broken `mutant-*` designs are listed by `racefuzz designs --mutants`)"
        )
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidArgument(f"cannot import design module {module_name!r}: {exc}") from None
    except Exception as exc:  # the user's module raised while importing
        raise InvalidArgument(f"importing design module {module_name!r} failed: {type(exc).__name__}: {exc}") from None
    obj = module
    if attr:
        try:
            for part in attr.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            raise InvalidArgument(f"module {module_name!r} has no attribute {attr!r}") from None
    owner = scenario_of(obj, home)
    check_design(obj, spec, owner)
    return Design(str(obj.name), describe(obj), spec, obj, owner)  # type: ignore[attr-defined]
