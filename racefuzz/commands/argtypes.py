"""argparse types with ranges: every numeric option of every subcommand is bounded, and a value outside its
range is one line (`racefuzz: error: argument --examples: expected a positive integer, got 0`), exit 2."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path


def int_at_least(minimum: int, what: str) -> Callable[[str], int]:
    """An argparse type: an integer >= `minimum`, else a one-line error naming `what` was expected."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
        return value

    return parse


def bounded_int(minimum: int, maximum: int, what: str) -> Callable[[str], int]:
    """An argparse type: an integer in [minimum, maximum]."""
    at_least = int_at_least(minimum, what)

    def parse(text: str) -> int:
        value = at_least(text)
        if value > maximum:
            raise argparse.ArgumentTypeError(f"expected {what} up to {maximum}, got {value}")
        return value

    return parse


def finite_float(minimum: float, maximum: float, what: str) -> Callable[[str], float]:
    """An argparse type: a finite float in [minimum, maximum] (rejects inf and nan)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not math.isfinite(value) or not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(f"expected {what} in [{minimum:g}, {maximum:g}], got {text!r}")
        return value

    return parse


def hazard_list(text: str) -> tuple[str, ...]:
    """An argparse type: comma-separated hazard names; which exist is the scenario's, checked once the design
    is loaded (`racefuzz.scenarios.check_hazards`), since `--scenario` may come after `--hazards`."""
    names = tuple(h.strip() for h in text.split(",") if h.strip())
    if not names:
        raise argparse.ArgumentTypeError(f"unknown hazard(s) [{text!r}]: name at least one")
    return names


def path(text: str) -> Path:
    """An argparse type: a non-empty path (`Path("")` would be the working directory, unasked)."""
    if not text:
        raise argparse.ArgumentTypeError("expected a path, got an empty string")
    return Path(text)


MAX_EXAMPLES = 10**8
"""The largest --examples (and --workloads) accepted: a bound, so that a typo is not a search for ever."""

examples = bounded_int(1, MAX_EXAMPLES, "a positive integer")
repeat = bounded_int(1, 1000, "a positive integer")
seed = bounded_int(0, 2**32 - 1, "a non-negative integer")
max_delays = bounded_int(0, 64, "a non-negative integer")
DEFAULT_EXAMPLE_TIMEOUT_S = 120.0
"""The per-example watchdog's default (`--example-timeout`, `--racefuzz-example-timeout`): far above any
example's run (ms on the simulator, a GPU kernel compile on the first CUDA example takes seconds)."""

microseconds = finite_float(0.0, 1e7, "microseconds (a finite number)")
timeout = finite_float(0.1, 86400.0, "seconds")
