"""The exceptions racefuzz raises on purpose.

Every error a user can cause (a bad program, a bad argument, a missing GPU, a bad replay file) is a
`RacefuzzError`; the CLI prints its message on one line and exits 2. Anything else escaping racefuzz is a
bug in racefuzz.
"""

from __future__ import annotations


class RacefuzzError(Exception):
    """Base class: a problem the user can fix, described in one line."""


class InvalidProgram(RacefuzzError):
    """The host program broke a rule of the device API (unknown event, empty range, use after finish)."""


class InvalidArgument(RacefuzzError):
    """A configuration value, schedule or command-line argument is out of range or malformed."""


class BackendUnavailable(RacefuzzError):
    """The requested backend cannot run here (no GPU, torch or CuPy missing, kernel failed to compile)."""


class ReplayError(RacefuzzError):
    """A replay file is malformed, from another format version, or names something unknown."""
