"""`none`: no fence at all. The negative control.

No `prepare_inputs_event` (the host rewrites the pinned block table while the previous step's non-blocking
copy may still read it) and no deferral of block frees (a connector may write a block an in-flight step
still writes). No vLLM release runs like this with async scheduling; it is what every clean verdict is
judged beside.
"""

from types import SimpleNamespace

design = SimpleNamespace(
    name="none",
    description=(
        "No fence: no prepare_inputs_event, blocks freed at once; the negative control every clean run must catch."
    ),
)
