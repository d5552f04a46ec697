"""No injected delay: a plain stress loop, the baseline that shows what delay injection adds."""

from __future__ import annotations

from hypothesis import strategies as st

from racefuzz.program import Program
from racefuzz.schedule import NO_DELAYS, Schedule

NAME = "none"
DESCRIPTION = "no injected delay (a plain stress loop: the baseline)"


class NoDelays:
    """Every schedule is empty; the drawn byte string is the constant b"" (nothing for Hypothesis to shrink)."""

    name = NAME

    def __init__(self, **_: object) -> None:
        pass

    def strategy(self) -> st.SearchStrategy[bytes]:
        return st.just(b"")

    def decode(self, data: bytes, program: Program) -> Schedule:
        return NO_DELAYS
