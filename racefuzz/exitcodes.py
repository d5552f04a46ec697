"""The exit codes of the `racefuzz` command, defined once for the CLI, its subcommands and the docs.

| code | name | meaning |
|---|---|---|
| 0 | `CLEAN` | no race found, and the negative control was caught (or not asked for) |
| 1 | `RACE` | a race was found; its report and replay file are on disk before it is printed |
| 2 | `USAGE` | a bad argument, design name, replay file or output path, described in one line on stderr |
| 3 | `INCONCLUSIVE` | no race found, but the negative control was not caught either, so "no race" means nothing |
| 4 | `USER_CODE` | the user's code failed: a design hook raised, has the wrong signature, or misused the device API |
| 5 | `INTERNAL` | a bug in racefuzz: an unexpected exception (its traceback with `-v`) |
| 6 | `TIMEOUT` | one example ran past `--example-timeout` (a hung hook, simulator example or GPU kernel) |
| 130 | `INTERRUPTED` | Ctrl-C (SIGINT) or SIGTERM; a counterexample already found is written and printed first |

Nothing but a race exits 1. The pytest plugin's failures carry the same kinds (`racefuzz.testing`).

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
    USER_CODE = 4
    INTERNAL = 5
    TIMEOUT = 6
    INTERRUPTED = 130


MEANINGS: dict[ExitCode, str] = {
    ExitCode.CLEAN: "no race found, and the negative control was caught",
    ExitCode.RACE: "a race was found (report and replay file written first)",
    ExitCode.USAGE: "usage error: bad argument, design, replay file or output path (one line on stderr)",
    ExitCode.INCONCLUSIVE: "inconclusive: no race found, but the negative control was not caught either",
    ExitCode.USER_CODE: "error in user code: a design hook raised or misused the device API (-v: traceback)",
    ExitCode.INTERNAL: "internal error: a bug in racefuzz (-v: traceback)",
    ExitCode.TIMEOUT: "an example ran past --example-timeout (a hung hook, example or GPU kernel)",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C or SIGTERM); a counterexample found is written and printed first",
}
"""One line per code, for `racefuzz --help` and the README's table."""
