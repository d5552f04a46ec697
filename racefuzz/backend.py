# TRANSITIONAL SHIM: remove after imports are updated (everything here now lives in racefuzz.backends).
from racefuzz.backends import *  # noqa: F403
from racefuzz.backends import __all__  # noqa: F401
