"""Forced orders: for racing pairs of launches, which one goes first -- exactly, with no clock involved.

The happens-before checker lists the program's races: conflicting launches on different streams with no
edge between them. Each 2 bytes of the drawn string pick one of those pairs (by position, modulo their
number) and force its *second* launch (in issue order) to finish before its first starts: the order a
race manifests in, which the plain run almost never takes. The simulator realizes a forced order with a
gate, and so does the GPU (a wait kernel before the later launch, a signal kernel after the earlier one):
the race manifests deterministically, 1 of 1, instead of when a spin happens to be long enough.

Every forced order is checked against the program's own edges and the orders forced before it: one that
would close a cycle (the gates would wait for each other) is skipped, one already implied is dropped. All
orders of a schedule therefore hold in one linear extension of happens-before, and the gates never
deadlock. Then, with `complete` (the default), every race left undecided is forced in issue order, so
that every conflicting pair has one order and the run's loads do not depend on timing at all: the
simulator and the GPU agree by construction, and a counterexample replays 1 of 1.

This is PCT's idea (Burckhardt et al., ASPLOS 2010) with depth counted in ordering constraints: a bug of
depth d needs d particular orders, and a schedule forces up to `max_delays` of them, each among the
program's racing pairs rather than among all steps. Shrinking the bytes toward empty means fewer forced
pairs; toward zero, the first racing pairs. A program with no race gets no order: nothing to force.
"""

from __future__ import annotations

from hypothesis import strategies as st

from racefuzz.errors import InvalidArgument
from racefuzz.hb import Analysis, analysis
from racefuzz.program import Program
from racefuzz.schedule import Order, Schedule

NAME = "orders"
DESCRIPTION = "forced orders: up to --max-delays racing pairs run in their racing order (gates; no spin)"

_ORDER = 2  # bytes per forced order: which racing pair (little-endian)


class ForcedOrders:
    """Up to `max_delays` forced orders on the program's racing pairs (the option keeps its name so that the
    CLI's `--max-delays` bounds forced orders too); `complete` forces every undecided race in issue order."""

    name = NAME

    def __init__(self, *, max_delays: int = 4, complete: bool = True, **_: object) -> None:
        if max_delays < 0:
            raise InvalidArgument(f"forced orders: max_delays must be >= 0, got {max_delays}")
        self.max_orders = max_delays
        self.complete = complete

    def strategy(self) -> st.SearchStrategy[bytes]:
        return st.binary(max_size=_ORDER * self.max_orders)

    def decode(self, data: bytes, program: Program) -> Schedule:
        return decode_orders(data, program, complete=self.complete)


def decode_orders(data: bytes, program: Program, *, complete: bool = True) -> Schedule:
    """The forced orders a byte string stands for on `program` (see the module docstring)."""
    facts = analysis(program)
    pairs = list(dict.fromkeys((race.first.index, race.second.index) for race in facts.races))
    if not pairs:
        return Schedule()
    forced = ForcedSet(facts)
    for at in range(0, len(data) - _ORDER + 1, _ORDER):
        first, second = pairs[(data[at] | data[at + 1] << 8) % len(pairs)]
        forced.add(second, first)
    if complete:
        for first, second in pairs:
            forced.add(first, second)
    return Schedule(orders=tuple(forced.orders))


class ForcedSet:
    """Forced orders kept consistent with happens-before: `add(a, b)` forces launch a before launch b unless
    that is already implied (dropped) or would close a cycle (skipped); `orders` lists those added.

    Reachability over happens-before plus the forced edges: b is after a when some chain a <=hb f1 -> t1
    <=hb f2 -> t2 ... <=hb b exists, with each fi -> ti a forced order. There are few forced orders, so a
    search over them from a is cheap; `Analysis.ordered` answers each <=hb in constant time.
    """

    def __init__(self, facts: Analysis) -> None:
        self.facts = facts
        self.orders: list[Order] = []

    def after(self, a: int, b: int) -> bool:
        """Whether every run that keeps the forced orders applies launch a before launch b (or a is b)."""
        ordered = self.facts.ordered
        reached = [a]
        frontier = [a]
        while frontier:
            if any(ordered(u, b) for u in frontier):
                return True
            frontier = [
                then for first, then in self.orders if then not in reached and any(ordered(u, first) for u in frontier)
            ]
            reached.extend(frontier)
        return False

    def add(self, a: int, b: int) -> bool:
        """Force a before b; False when it was implied already or would close a cycle."""
        if self.after(a, b) or self.after(b, a):
            return False
        self.orders.append((a, b))
        return True
