"""Makes the test-only scenarios importable by name (`ring_scenario:SCENARIO`), as a user's would be."""

from __future__ import annotations

import sys
from pathlib import Path

SCENARIOS = Path(__file__).parent / "scenarios"
if str(SCENARIOS) not in sys.path:
    sys.path.insert(0, str(SCENARIOS))
