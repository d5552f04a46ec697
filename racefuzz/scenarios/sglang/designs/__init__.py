"""The built-in sync designs of the overlap scenario, one module each, each citing the sglang code it models.

none              no WAR fence (EAGLE between `baeac179f` and #26380): the negative control
self-event        DFLASH's own `verify_done` fence (before #29556)
global-war        the scheduler's global WAR barrier at the loop top (#29556)
read-done         the barrier with DFLASH's read-done fast path (#29541)
war-after-launch  the barrier moved after the launch (#31687)
read-done-post-replay  that barrier on a read_done recorded after the verify graph replay (#30261's fix)
record-stream     that, plus `record_stream` of the gathered `mix_running_indices` (#34076, sglang 0.5.23)
"""

from __future__ import annotations

from racefuzz.scenarios.sglang.designs import (
    global_war,
    none,
    read_done,
    read_done_post_replay,
    record_stream,
    self_event,
    war_after_launch,
)

BUILTIN: dict[str, object] = {
    module.design.name: module.design  # type: ignore[attr-defined]
    for module in (none, self_event, global_war, read_done, war_after_launch, read_done_post_replay, record_stream)
}
"""The built-in designs by name."""
