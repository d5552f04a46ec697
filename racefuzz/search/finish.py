"""Finishing a search's failure: shrink it, simplify its structure, re-check it k of k, explain it.

* A manifested failure: Hypothesis shrinks the draw (inside the search for a batch of one; else the
  failing member alone, `shrink_alone`), `racefuzz.search.minimize` simplifies the structure, and the
  minimized form is kept only if it still reproduces k/k in fresh runs; `explain` completes it.
* A happens-before failure only (nothing manifested): `shrink_unordered` finds a minimal workload with an
  unordered conflicting pair, the minimizer simplifies it, and it is judged without a run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from hypothesis import HealthCheck, Phase, Verbosity, find, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from racefuzz.backends import Executor
from racefuzz.designs import Design
from racefuzz.scenarios import Workload
from racefuzz.schedule import NO_DELAYS
from racefuzz.search.minimize import minimize
from racefuzz.search.outcome import Outcome, explain, judge, reproduces
from racefuzz.search.pipeline import Draw

MINIMIZED_MIN_DELAY_US = 20.0
"""The minimizer never shortens a delay below this (nor below the search's own minimum)."""

HEADROOM = 2.0
"""On a GPU a shrunk counterexample's delays are reported at this many times the shortest that was seen to
manifest. Shrinking (Hypothesis's, then the minimizer's halving) stops at the shortest delays that still
manifest k of k, which on real hardware is the edge of the window: there a fresh replay may miss (seen on
the H200: a shrunk `none` counterexample confirmed 5/5 replayed 4/5). Twice the shortest keeps the window
wide open; the widened form is kept only if it too reproduces k of k."""


def search_settings(max_examples: int, *, shrink: bool = True) -> settings:
    """Hypothesis settings of racefuzz's own searches: quiet, no deadline, no database (see `corpus`)."""
    return settings(
        max_examples=max_examples,
        database=None,
        deadline=None,
        derandomize=False,
        suppress_health_check=list(HealthCheck),
        # Without shrinking, Hypothesis stops at the first failure instead of re-running variants of it.
        phases=[Phase.generate, Phase.shrink] if shrink else [Phase.generate],
        report_multiple_bugs=False,
        verbosity=Verbosity.quiet,
        print_blob=False,
    )


def finish_manifested(
    failure: Outcome, design: Design, run: Executor, backend: str, *, shrink: bool, repeat: int, min_delay_us: float
) -> Outcome:
    """The counterexample of a manifested failure: minimized (if `shrink`) where that still reproduces k/k."""
    if shrink:  # Hypothesis shrank the bytes; now shrink the structure (see racefuzz.search.minimize)
        workload, schedule = minimize(
            failure.workload,
            failure.schedule,
            design,
            run,
            repeat=repeat,
            min_delay_us=max(min_delay_us, MINIMIZED_MIN_DELAY_US),
        )
        minimized = judge(workload, design, schedule, run)
        # Guard: keep the minimized form only if it still reproduces k/k in fresh runs.
        if repeat == 1 or reproduces(minimized, run, repeat):
            failure = minimized
        if repeat > 1:
            failure = _with_headroom(failure, design, run, repeat)
    return explain(failure, backend)


def _with_headroom(failure: Outcome, design: Design, run: Executor, repeat: int) -> Outcome:
    """`failure` with its delays times `HEADROOM` (see there) if that reproduces k of k, else `failure`."""
    widened = failure.schedule.scaled(HEADROOM)
    if widened == failure.schedule:  # no delays (orders alone, or a race with no injected delay)
        return failure
    candidate = judge(failure.workload, design, widened, run)
    return candidate if reproduces(candidate, run, repeat) else failure


def finish_unordered(
    witness: Workload, design: Design, workloads: st.SearchStrategy[Workload], seed: int, *, shrink: bool
) -> Outcome:
    """The counterexample of a happens-before failure, from a known racy workload `witness`."""
    if shrink:
        witness = shrink_unordered(design, witness, workloads, seed).workload
        witness, _ = minimize(witness, NO_DELAYS, design, None)
    return judge(witness, design, None, None)


class _Unordered(Exception):
    """Raised inside `shrink_unordered` when a workload has an unordered conflicting pair."""


def shrink_unordered(design: Design, witness: Workload, workloads: st.SearchStrategy[Workload], seed: int) -> Outcome:
    """A small workload with an unordered conflicting pair: the first racy one a short Hypothesis search of
    `workloads` finds, shrunk; `witness` (a workload known to race) when that search finds none.

    The witness is the fallback, not an explicit `@example`: racefuzz's search settings run no explicit
    phase, and an explicit example that fails is reported as it is, never shrunk. A rare race (one
    workload in thousands) is often not met again in the short search, and a race found is never lost to
    that: the minimizer still simplifies the witness's structure.
    """
    found: list[Outcome] = []

    @hypothesis_seed(seed)
    @search_settings(200)
    @given(workloads)
    def unordered(workload: Workload) -> None:
        outcome = judge(workload, design, None, None)
        if outcome.races or outcome.violations:
            found[:] = [outcome]
            raise _Unordered

    with contextlib.suppress(_Unordered):
        unordered()
    return found[0] if found else judge(witness, design, None, None)


def shrink_alone(
    fails: Callable[[Draw], bool], failing: Draw, pair: st.SearchStrategy[Draw], *, constant_schedule: bool
) -> None:
    """Let Hypothesis shrink one failing draw (workload bytes, schedule bytes) on its own.

    Hypothesis shrinks a failure it finds in its example database before anything else; the draw is put
    into a private in-memory database, serialized as Hypothesis serializes its own entries (one choice per
    binary() draw; none for a constant schedule such as the `none` strategy's), under the key of the
    non-minimal ("secondary") corpus, which Hypothesis replays and then shrinks. `fails` records each
    failure it sees, so the caller's last recorded failure is the minimal one. If this Hypothesis cannot
    replay the entry (its database format changed) or the draw no longer fails, nothing is shrunk here:
    `racefuzz.search.minimize` still simplifies the failure found.

    Why a private name (`hypothesis.database.choices_to_bytes`): Hypothesis has no public way to start
    shrinking from a given failing example -- explicit `@example`s are reported, never shrunk, and `find`
    takes no starting point -- and the alternative, shrinking the whole batch the failure came from,
    costs ten times the runs (measured on the simulator). The import is guarded, and
    tests/unit/test_search_batches.py checks that the hand-over really shrinks, so a Hypothesis upgrade
    that breaks it fails CI rather than silently shrinking nothing.

    No seed: Hypothesis turns its database off for seeded tests. Its shrinker is deterministic in effect
    (the same failure shrank to the same counterexample in separate processes, checked on the simulator).
    """
    from hypothesis.database import InMemoryExampleDatabase
    from hypothesis.errors import NoSuchExample

    try:
        from hypothesis.database import choices_to_bytes
    except ImportError:  # not public API: a future Hypothesis may move it
        return
    database = InMemoryExampleDatabase()
    key = b"racefuzz-shrink"
    choices = failing[:1] if constant_schedule else failing
    database.save(key + b".secondary", choices_to_bytes(choices))
    shrink_settings = settings(search_settings(1000), database=database, phases=[Phase.reuse, Phase.shrink])
    with contextlib.suppress(NoSuchExample):
        find(pair, fails, settings=shrink_settings, database_key=key)
