"""`none`: no WAR fence at all. The negative control.

Which sglang ran like this: EAGLE's overlap loop between `baeac179f` (which dropped its
`verify_done.wait`) and #26380 (`163b97012`, the first loop-top barrier). DFLASH never did: it arrived
(#23000) with its own `verify_done` fence (`self-event`). See docs/model/model-audit.md.
"""

from types import SimpleNamespace

design = SimpleNamespace(
    name="none",
    description=(
        "No WAR fence (EAGLE between baeac179f and sglang #26380); the negative control every clean run must catch."
    ),
)
