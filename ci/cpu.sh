#!/usr/bin/env bash
# The CPU job: install racefuzz with its test extra on the CPU build of torch, lint, check the formatting,
# and run the README's test command. torch is optional (racefuzz's core and its tests run without it); it is
# installed here so that the tests that use it on the CPU are covered too. GPU-only tests (marker `cuda`)
# skip with a reason on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

# Pin the CPU build of torch first: an unpinned `torch` would pull a multi-GB CUDA build.
"$PYTHON" -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
"$PYTHON" -m pip install --quiet --disable-pip-version-check -e ".[test]"
# The sglang harness (tests/engines, docs/sglang.md): sglang's own Python sources for 0.5.23 and 0.5.15
# (each wheel downloaded with --no-deps, only its .py files unpacked into ~/.cache/racefuzz/sglang/), and
# the packages sglang's imports call at module level (msgspec, psutil, dill, pydantic: none depends on torch).
# Everything else sglang imports is stubbed in the harness's subprocess (racefuzz/engines/sglang/stubs.py).
"$PYTHON" -m pip install --quiet --disable-pip-version-check msgspec psutil dill pydantic
"$PYTHON" -m racefuzz.cli sglang fetch --version 0.5.23 --version 0.5.15 --version 0.5.14
# The vLLM harness (tests/engines/test_vllm_harness.py, docs/vllm.md): vLLM 0.33.0's Python sources (the wheel
# downloaded with --no-deps, only its .py files unpacked into ~/.cache/racefuzz/vllm/), and regex, which vLLM's
# imports call at module level (msgspec and pydantic, installed above, too); the rest is stubbed
# (racefuzz/engines/vllm/stubs.py). 0.13.0 and 0.14.0: either side of #31841 / #31373
# (tests/engines/test_vllm_multimodal.py).
"$PYTHON" -m pip install --quiet --disable-pip-version-check regex
"$PYTHON" -m racefuzz.cli vllm fetch --version 0.33.0 --version 0.13.0 --version 0.14.0

"$PYTHON" -m ruff check .
"$PYTHON" -m ruff format --check .
# The README's test command:
"$PYTHON" -m pytest -n auto
