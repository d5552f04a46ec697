"""The search: Hypothesis draws workloads and delay schedules, a backend runs them, two oracles judge.

    driver.py    `search()` and the `Search` it runs: the Hypothesis test, what it counts and found
    pipeline.py  one batch of examples, run while the host works ahead of the device (the GPU pipeline)
    corpus.py    failures saved in a Hypothesis example database, tried first on the next run
    finish.py    shrinking a failure, the k-of-k re-check, the minimal happens-before witness
    minimize.py  structural minimization (fewer delays, simpler workloads from the scenario)
    outcome.py   `judge` (one example by both oracles), `reproduces` (k of k), `explain`

What the search produces (`Outcome`, `Flaky`, `SearchResult`) is plain data in `racefuzz.results`.

The delay strategies are `racefuzz.schedulers`; the workloads come from the design's scenario.
"""

from racefuzz.results import Flaky, Outcome, SearchResult
from racefuzz.search.driver import (
    COLLECT_EVERY,
    DEFAULT_GPU_BATCH,
    DEFAULT_GPU_REPEAT,
    GPU_MIN_DELAY_US,
    MAX_BUILT,
    Search,
    search,
)
from racefuzz.search.minimize import minimize, transfer
from racefuzz.search.outcome import explain, judge, reproduces
from racefuzz.search.pipeline import LOOKAHEAD

__all__ = [
    "COLLECT_EVERY",
    "DEFAULT_GPU_BATCH",
    "DEFAULT_GPU_REPEAT",
    "GPU_MIN_DELAY_US",
    "LOOKAHEAD",
    "MAX_BUILT",
    "Flaky",
    "Outcome",
    "Search",
    "SearchResult",
    "explain",
    "judge",
    "minimize",
    "reproduces",
    "search",
    "transfer",
]
