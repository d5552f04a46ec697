"""The exit codes of the `racefuzz` command, defined once for the CLI and its subcommands.

| code | name | meaning |
|---|---|---|
| 0 | `CLEAN` | no race found, and the negative control was caught (or not asked for) |
| 1 | `RACE` | a race was found; its report and replay file are on disk before it is printed |
| 2 | `USAGE` | usage or configuration error, described in one line on stderr |
| 3 | `INCONCLUSIVE` | no race found, but the negative control was not caught either, so "no race" means nothing |

This module imports nothing from racefuzz: `racefuzz.cli` and `racefuzz.commands.*` both import it, and
nothing but the console entry point imports `racefuzz.cli`.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """What `racefuzz` returns; an `int`, so `sys.exit(code)` and `code == 1` work as they read."""

    CLEAN = 0
    RACE = 1
    USAGE = 2
    INCONCLUSIVE = 3
