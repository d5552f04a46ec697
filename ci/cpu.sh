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

"$PYTHON" -m ruff check .
"$PYTHON" -m ruff format --check .
# The README's test command:
"$PYTHON" -m pytest -n auto
