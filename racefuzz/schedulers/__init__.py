"""Delay strategies, one module each (as Shuttle keeps one file per scheduler), behind one registry.

A delay strategy turns a Hypothesis-drawn byte string into a `Schedule` for one program, so the search
shrinks it like any other draw and a counterexample replays like any other. The CLI's `--strategy` and
the search take their choices from `STRATEGIES`.

    random   up to `max_delays` delays, each on a drawn launch (the default; `racefuzz.schedulers.random`)
    pct      PCT-style stream priorities and change points (`racefuzz.schedulers.pct`)
    orders   forced orders of racing pairs, realized by gates, no spin (`racefuzz.schedulers.orders`)
    interleave  forced orders of any unordered launch pairs: tests the checker and the gates
    none     no injected delay: a plain stress loop, the baseline (`racefuzz.schedulers.none`)

To add one: a module with `NAME`, `DESCRIPTION` and a class taking the keyword options below (ignoring
those it does not use), with `strategy()` and `decode(data, program)`; then one line in `_MODULES`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Protocol

from racefuzz.errors import InvalidArgument

if TYPE_CHECKING:
    from hypothesis import strategies as st

    from racefuzz.program import Program
    from racefuzz.schedule import Schedule

_MODULES = {
    "random": "RandomDelays",
    "pct": "PctDelays",
    "orders": "ForcedOrders",
    "interleave": "ForcedInterleaving",
    "none": "NoDelays",
}

STRATEGIES: tuple[str, ...] = tuple(_MODULES)
"""The delay strategies by name, the default first."""

DEFAULT_STRATEGY = "random"


class DelayStrategy(Protocol):
    """Draws and decodes schedules. `decode` must be deterministic and put delays on launches only, so that
    designs of one workload (which add sync ops but no launches) share a schedule."""

    name: str

    def strategy(self) -> st.SearchStrategy[bytes]: ...

    def decode(self, data: bytes, program: Program) -> Schedule: ...


def delay_strategy(
    name: str, *, max_delays: int = 4, pct_depth: int | None = None, min_delay_us: float = 0.0
) -> DelayStrategy:
    """The delay strategy `name`, configured (`max_delays` for random, `pct_depth` for pct)."""
    if name not in _MODULES:
        raise InvalidArgument(f"unknown delay strategy {name!r}; choose from {', '.join(STRATEGIES)}")
    module = importlib.import_module(f"racefuzz.schedulers.{name}")
    options: dict[str, object] = {"max_delays": max_delays, "min_delay_us": min_delay_us}
    if pct_depth is not None:
        options["depth"] = pct_depth
    return getattr(module, _MODULES[name])(**options)


def describe(name: str) -> str:
    """The one-line description of strategy `name` (for `--help`)."""
    return importlib.import_module(f"racefuzz.schedulers.{name}").DESCRIPTION
