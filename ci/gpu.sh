#!/usr/bin/env bash
# The GPU job: on a machine with an NVIDIA GPU, torch (CUDA build) and CuPy already installed, run the
# CUDA tests and the properties on the real backend, in parallel. With several GPUs each pytest-xdist
# worker is pinned to its own GPU (CUDA_VISIBLE_DEVICES, set by racefuzz's pytest plugin); with one GPU
# the workers share it, which leaves race verdicts intact but makes timings meaningless.
# Failures leave replay files, reports and timelines in .racefuzz/ (the workflow uploads it).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
WORKERS=${WORKERS:-4}

if ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "ci/gpu.sh: no usable CUDA GPU here (torch.cuda.is_available() is False); use ci/cpu.sh" >&2
    exit 2
fi
# Install racefuzz without touching the CUDA build of torch that is already there.
# Offline, the editable install cannot fetch its build backend: the source tree goes first on PYTHONPATH
# instead, ahead of whatever the caller put there (an sglang installed with --target, say).
"$PYTHON" -m pip install --quiet --disable-pip-version-check --no-deps -e . || export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

nvidia-smi -L
# -p loads the plugin from the source tree when the install above could not run (no build backend offline).
# tests/cuda measures timing (simulator/GPU agreement, spin lengths): it runs alone, one process on the
# GPUs. The properties judge each run by itself, so they run in parallel, one xdist worker per GPU where
# there are several.
"$PYTHON" -m pytest -p racefuzz.pytest_plugin -p no:xdist tests/cuda --racefuzz-report-dir .racefuzz "$@"
"$PYTHON" -m pytest -p racefuzz.pytest_plugin -n "$WORKERS" properties --racefuzz-backend cuda \
    --racefuzz-report-dir .racefuzz "$@"
