"""`none`: no WAR fence at all -- the overlap loop before sglang #26380. The negative control."""

from types import SimpleNamespace

design = SimpleNamespace(
    name="none",
    description="No WAR fence (before sglang #26380); the negative control every clean run must catch.",
)
