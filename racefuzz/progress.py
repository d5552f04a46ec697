"""Progress bars for long runs (`racefuzz run`, `racefuzz bench`): tqdm on stderr, only on a terminal."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def progress(total: int, label: str, *, quiet: bool = False) -> Iterator[Callable[[int], None] | None]:
    """Yield a per-example callback that advances a bar of `total` examples, or None when there is no bar
    (`quiet`, or stderr is not a terminal: CI logs get no carriage-return noise)."""
    if quiet or not sys.stderr.isatty():
        yield None
        return
    from tqdm import tqdm

    with tqdm(total=total, desc=label, unit="ex", file=sys.stderr, leave=False) as bar:
        yield lambda _n: bar.update(1)
