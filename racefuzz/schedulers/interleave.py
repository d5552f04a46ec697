"""Forced orders among all unordered launches: any interleaving of the streams, gates only, no spin.

Like `racefuzz.schedulers.orders`, but each 2 bytes pick among *every* pair of launches on different
streams that happens-before leaves unordered, conflicting or not, and force the later-issued one first.
Every racing pair left undecided is then forced in issue order (so the loads still do not depend on
timing). On a program the checker calls race-free no forced order may change a load: a search with this
strategy tests the checker and the backends rather than the design (a load that differs means a conflict
the checker did not see, or a gate that did not hold), and on the GPU it measures what gates cost.
"""

from __future__ import annotations

from hypothesis import strategies as st

from racefuzz.errors import InvalidArgument
from racefuzz.hb import analysis
from racefuzz.program import Program, per_program
from racefuzz.schedule import Order, Schedule
from racefuzz.schedulers.orders import ForcedSet

NAME = "interleave"
DESCRIPTION = "forced orders among all unordered launch pairs, conflicting or not (gates; tests the checker)"

_ORDER = 2


class ForcedInterleaving:
    """Up to `max_delays` forced orders among the program's unordered launch pairs."""

    name = NAME

    def __init__(self, *, max_delays: int = 4, **_: object) -> None:
        if max_delays < 0:
            raise InvalidArgument(f"interleave: max_delays must be >= 0, got {max_delays}")
        self.max_orders = max_delays

    def strategy(self) -> st.SearchStrategy[bytes]:
        return st.binary(max_size=_ORDER * self.max_orders)

    def decode(self, data: bytes, program: Program) -> Schedule:
        return decode_interleaving(data, program)


@per_program
def unordered_launch_pairs(program: Program) -> list[Order]:
    """Every (earlier, later) pair of launches on different streams with no happens-before edge, in issue order
    (by the later launch, then the earlier).

    Launch a (the k-th of its stream t, 1-based) is ordered before a later launch b iff k <= b's clock[t]
    (`hb.Analysis.ordered`), so the launches of t left unordered with b are the suffix of t's launches
    issued so far from position clock[t] on: a slice per stream rather than a test per pair.
    """
    clocks = analysis(program).clocks
    issued: list[list[int]] = [[] for _ in program.streams]  # per stream, its launches issued so far
    pairs: list[Order] = []
    for b, (s, _, seen) in clocks.items():  # in issue order
        earlier: list[int] = []
        for t, launches in enumerate(issued):
            if t != s and len(launches) > seen[t]:
                earlier.extend(launches[seen[t] :])
        if earlier:
            earlier.sort()
            pairs.extend([(a, b) for a in earlier])
        issued[s].append(b)
    return pairs


def decode_interleaving(data: bytes, program: Program) -> Schedule:
    """The forced orders a byte string stands for on `program` (see the module docstring)."""
    pairs = unordered_launch_pairs(program)
    if not pairs:
        return Schedule()
    facts = analysis(program)
    forced = ForcedSet(facts)
    for at in range(0, len(data) - _ORDER + 1, _ORDER):
        first, second = pairs[(data[at] | data[at + 1] << 8) % len(pairs)]
        forced.add(second, first)
    for race in facts.races:
        forced.add(race.first.index, race.second.index)
    return Schedule(orders=tuple(forced.orders))
