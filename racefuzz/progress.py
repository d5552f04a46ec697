"""Progress of long runs (`racefuzz run`, `racefuzz bench`), on stderr: a tqdm bar on a terminal, and off a
terminal (a CI log) one plain line every `LINE_EVERY_S` seconds, so that a long run is never silent."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

LINE_EVERY_S = float(os.environ.get("RACEFUZZ_PROGRESS_SECONDS", "10"))
"""Seconds between progress lines off a terminal (RACEFUZZ_PROGRESS_SECONDS overrides it)."""


def progress_line(label: str, done: int, total: int, elapsed: float) -> str:
    """One progress line: `racefuzz: LABEL: DONE/TOTAL (P%), S s`."""
    percent = 100 * done / total if total else 100.0
    return f"racefuzz: {label}: {done}/{total} ({percent:.0f}%), {elapsed:.0f} s"


@contextmanager
def progress(total: int, label: str, *, quiet: bool = False) -> Iterator[Callable[[int], None] | None]:
    """Yield a callback taking the number of examples done so far (None when `quiet`): it advances a bar on a
    terminal, and elsewhere prints a line at most every LINE_EVERY_S seconds (none for a short run)."""
    if quiet:
        yield None
        return
    if not sys.stderr.isatty():
        start = time.monotonic()
        next_line = start + LINE_EVERY_S

        def line(done: int) -> None:
            nonlocal next_line
            now = time.monotonic()
            if now >= next_line:
                next_line = now + LINE_EVERY_S
                print(progress_line(label, done, total, now - start), file=sys.stderr, flush=True)

        yield line
        return
    from tqdm import tqdm

    with tqdm(total=total, desc=label, unit="ex", file=sys.stderr, leave=False) as bar:

        def advance(done: int) -> None:
            bar.update(done - bar.n)

        yield advance
