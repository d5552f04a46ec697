"""Makes the test-only scenarios importable by name (`ring_scenario:SCENARIO`), as a user's would be."""

from __future__ import annotations

import os
import sys
from pathlib import Path

SCENARIOS = Path(__file__).parent / "scenarios"
if str(SCENARIOS) not in sys.path:
    sys.path.insert(0, str(SCENARIOS))

# `racefuzz run` keeps failures in ./.hypothesis/examples by default; this suite's CLI runs must not
# depend on what earlier runs saved there (tests of the database pass their own).
os.environ.setdefault("RACEFUZZ_DATABASE", "none")
