# TRANSITIONAL SHIM: remove once cli.py, commands/ and bench/ import from their new homes.
from racefuzz.scenarios.sglang.strategies import *  # noqa: F403
from racefuzz.scenarios.sglang.strategies import ALL_HAZARDS, HAZARDS, MAX_ITERATIONS, OPT_IN_HAZARDS  # noqa: F401
from racefuzz.schedulers.random import decode_schedule, schedule_bytes  # noqa: F401
