"""The built-in sync designs of the vLLM KV-reuse scenario, one module each, each citing the vLLM code it models.

none            no fence at all
immediate-free  `prepare_inputs_event` guards the pinned block table; finished requests' blocks return to the
                pool at once (vLLM's path without `defer_block_free`: before #45357, or with no KV consumer);
                the negative control, #45357's racy design
deferred-free   that, plus #45357's deferral: blocks return once the last step that used them was processed
                (vLLM 0.33.0 with async scheduling and a KV consumer)
step-event      blocks return at once, every step records an event, and the host waits for the event of the
                last step that used a block before the connector writes it (not vLLM's code: the alternative)
"""

from __future__ import annotations

from racefuzz.scenarios.vllm.designs import deferred_free, immediate_free, none, step_event

BUILTIN: dict[str, object] = {
    module.design.name: module.design  # type: ignore[attr-defined]
    for module in (none, immediate_free, deferred_free, step_event)
}
"""The built-in designs by name."""
