"""`none`: no fence at all.

No `prepare_inputs_event` (the host rewrites the pinned block table while the previous step's non-blocking
copy may still read it) and no deferral of block frees (a connector may write a block an in-flight step
still writes). No vLLM release runs like this with async scheduling; it races on every hazard, the pinned
block table included, where the scenario's negative control (`immediate-free`, #45357's racy design) races
only where a connector loads into reused blocks.
"""

from types import SimpleNamespace

design = SimpleNamespace(
    name="none",
    description=("No fence: no prepare_inputs_event, blocks freed at once (races on the pinned block table too)."),
)
