"""The exceptions racefuzz raises on purpose.

Every error a user can cause (a bad program, a bad argument, a missing GPU, a bad replay file) is a
`RacefuzzError`; the CLI prints its message on one line and exits with its `exit_code` (2, usage, unless
the class says otherwise). Anything else escaping racefuzz is a bug in racefuzz (exit 5).

A verdict that fails a user's test is an `AssertionError` instead (`RaceFound`, `Inconclusive`, raised by
`racefuzz.testing` and the pytest fixtures), carrying the CLI's exit code for the same verdict.
"""

from __future__ import annotations

from racefuzz.exitcodes import ExitCode


class RacefuzzError(Exception):
    """Base class: a problem the user can fix, described in one line."""

    exit_code: ExitCode = ExitCode.USAGE


class InvalidProgram(RacefuzzError):
    """The host program broke a rule of the device API (unknown event, empty range, use after finish)."""


class InvalidArgument(RacefuzzError):
    """A configuration value, schedule or command-line argument is out of range or malformed."""


class BackendUnavailable(RacefuzzError):
    """The requested backend cannot run here (no GPU, torch or CuPy missing, kernel failed to compile)."""


class ReplayError(RacefuzzError):
    """A replay file is malformed, from another format version, or names something unknown."""


class UserCodeError(RacefuzzError):
    """The user's code failed: a design hook raised (or could not be called), or a design lint error under
    `--strict`. The message names the hook and the user's own frame; `details` holds the full traceback,
    which the CLI prints only with `-v`."""

    exit_code = ExitCode.USER_CODE

    def __init__(self, message: str, details: str = "") -> None:
        super().__init__(message)
        self.details = details


class ExampleTimeout(RacefuzzError):
    """One example (its hooks, its run) took longer than the per-example watchdog allows."""

    exit_code = ExitCode.TIMEOUT


class RaceFound(AssertionError):
    """A race was found (the CLI's exit code 1); the message is the report, written to disk first."""

    exit_code = ExitCode.RACE


class Inconclusive(AssertionError):
    """No race, but the negative control was not caught either (the CLI's exit code 3)."""

    exit_code = ExitCode.INCONCLUSIVE
