"""Defaults shared by the CLI, the pytest plugin and `racefuzz.testing`, each defined once.

A leaf module: it imports nothing, so anything (the pytest plugin at load time included) may import it.
"""

from __future__ import annotations

CONTROL_DESIGN = "none"
"""The negative control: the unfenced design, which every "no race" verdict must see caught in the same run
(`racefuzz run`, `racefuzz.testing.assert_race_free`)."""
