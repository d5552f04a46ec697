# TRANSITIONAL SHIM: remove after imports are updated (everything here now lives in racefuzz.backends).
from racefuzz.backends import *  # noqa: F403
