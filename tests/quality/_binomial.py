"""Binomial arithmetic for the detection-probability tests: confidence bounds and the margin they imply."""

from __future__ import annotations

import math


def binomial_tail(n: int, p: float, at_least: int) -> float:
    """P(Binomial(n, p) >= at_least)."""
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(at_least, n + 1))


def lower_bound(successes: int, trials: int, confidence: float = 0.95) -> float:
    """One-sided Clopper-Pearson lower bound: the least p with P(Bin(trials, p) >= successes) >= 1 - confidence."""
    if successes == 0:
        return 0.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if binomial_tail(trials, mid, successes) < 1 - confidence:
            lo = mid
        else:
            hi = mid
    return hi


def least_successes(trials: int, p: float, risk: float = 0.01) -> int:
    """The largest t with P(Bin(trials, p) < t) <= risk: what a rate of at least p all but guarantees."""
    t = 0
    while t < trials and 1 - binomial_tail(trials, p, t + 1) <= risk:
        t += 1
    return t
