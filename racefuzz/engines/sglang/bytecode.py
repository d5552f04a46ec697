"""A bytecode cache for the harness's subprocesses, on hosts whose Python writes none.

Every harness process imports torch (with `torch._dynamo` and `torch._inductor`, which the stubs import
first: `stubs._settle_torch_before_triton_stub`) and sglang's modules: some 4,000 source files. Where
`PYTHONDONTWRITEBYTECODE` is set, as on the H200 host, no `.pyc` is ever written, so each process compiles
all of them again: on the H200, 12.6 s of a 19 s cold harness process was `compile()` (cProfile), and a
cold `racefuzz sglang --version 0.5.15 --device cuda --no-control` harness process took 21.7 s; with the
cache below, 9.7-9.9 s from the second process on (docs/results/sglang-sync-cost-h200/time-to-race.txt).

`subprocess_env(env)` returns `env` for a harness subprocess: where `PYTHONDONTWRITEBYTECODE` is set it is
dropped and `PYTHONPYCACHEPREFIX` (unless set) points at `CACHE_DIR` under the racefuzz cache, so the
bytecode goes there, not next to any source (what the host's setting keeps clean). Where it is not set,
Python already caches bytecode beside the sources and nothing changes (a prefix would make Python ignore
those caches). `RACEFUZZ_BYTECODE_CACHE=0` keeps the host's setting as it is.
"""

from __future__ import annotations

import os

OPT_OUT = "RACEFUZZ_BYTECODE_CACHE"
"""`0`: the harness's subprocesses keep the host's `PYTHONDONTWRITEBYTECODE` (no bytecode cache)."""


def cache_dir() -> str:
    """Where the subprocesses' bytecode goes: `$XDG_CACHE_HOME/racefuzz/pycache` (default `~/.cache`)."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "racefuzz", "pycache")


def subprocess_env(env: dict[str, str]) -> dict[str, str]:
    """`env` with a bytecode cache where the host writes none (module doc); a new dict."""
    env = dict(env)
    if not env.get("PYTHONDONTWRITEBYTECODE") or env.get(OPT_OUT) == "0":
        return env
    del env["PYTHONDONTWRITEBYTECODE"]
    env.setdefault("PYTHONPYCACHEPREFIX", cache_dir())
    return env
