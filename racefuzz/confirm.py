"""Confirmation: when a manifestation counts, one rule for every caller.

A manifestation -- loads (or, for real code, stored values) that differ from the sequential reference --
depends on the schedule and, on a GPU, on timing. It counts only when it shows in every one of k runs
(k of k); anything less is flaky: recorded with its rate (`Confirmation`), never a verdict. Happens-before
verdicts do not depend on the schedule and need no confirmation.

The callers: the search's k-of-k check of each example and its final re-check of a minimized
counterexample (`racefuzz.search.driver`, `racefuzz.search.outcome.reproduces`), the minimizer's test of
each candidate (`racefuzz.search.minimize`), and the trace's confirmation of a divergence
(`racefuzz.trace.search.fuzz`). Each says what one run is; this module says how runs are counted.

A leaf: it imports nothing of racefuzz, so the model's search and the trace (which may not import the
search) share it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Confirmation:
    """`reproduced` of `runs` runs manifested. `confirmed` (k of k) is the only count that is a verdict."""

    reproduced: int
    runs: int

    def __post_init__(self) -> None:
        if not 0 <= self.reproduced <= self.runs:
            raise ValueError(f"a confirmation reproduces 0 to {self.runs} of its runs, not {self.reproduced}")

    @property
    def confirmed(self) -> bool:
        """Whether every run manifested (and there was at least one): a manifestation that counts."""
        return self.runs > 0 and self.reproduced == self.runs

    def __str__(self) -> str:
        return f"{self.reproduced}/{self.runs}"


def confirm(run: Callable[[], bool], k: int, *, seen: int = 0, stop_at_miss: bool = False) -> Confirmation:
    """Count runs of a manifestation until there are `k`: `run()` makes one fresh run and says whether it
    manifested.

    `seen`: runs already made that manifested (the search's own run of an example), so `k - seen` more are
    made. `stop_at_miss`: stop at the first run that does not manifest (the verdict is then known; the
    minimizer saves its runs so), leaving `runs` at the runs counted; otherwise all `k` are made, so that
    the rate of a flaky manifestation is its rate over k.
    """
    if k < 1:
        raise ValueError(f"confirmation needs k >= 1 runs, got {k}")
    if not 0 <= seen <= k:
        raise ValueError(f"seen must be 0 to k ({k}), got {seen}")
    reproduced = runs = seen
    while runs < k:
        runs += 1
        if run():
            reproduced += 1
        elif stop_at_miss:
            break
    return Confirmation(reproduced, runs)
