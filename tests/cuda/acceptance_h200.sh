#!/usr/bin/env bash
# The GPU acceptance run (its committed outputs: docs/results/run-gpu-h200/ and docs/results/search-gpu-h200/):
# tests/cuda (litmus + overlap scenario), `python -m ci.bench gpu`, and two `racefuzz run --backend cuda`.
# Usage, from the repository root on a machine with a CUDA GPU: OUT=dir RACEFUZZ_COMMIT=sha bash tests/cuda/acceptance_h200.sh
# Every step writes its raw output (with a header: date, GPU, versions) to $OUT; a failing step does not
# stop the next. Each step has its own time limit so that one hang cannot eat the others' time.
set -u -o pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/racefuzz-acceptance-h200}  # copy a file worth keeping into its docs/results/<benchmark>/ folder
COMMIT=${RACEFUZZ_COMMIT:-unknown}
mkdir -p "$OUT"

header() {
    echo "# $1"
    echo "# date (UTC): $(date -u +%Y-%m-%dT%H:%M:%SZ); racefuzz commit: $COMMIT"
    nvidia-smi -L
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
    python3 -c 'import sys, torch, cupy, numpy, hypothesis; print(f"python {sys.version.split()[0]} | torch {torch.__version__} (CUDA {torch.version.cuda}) | cupy {cupy.__version__} | numpy {numpy.__version__} | hypothesis {hypothesis.__version__}")'
    echo
}

step() {  # step FILE LIMIT_S TITLE COMMAND...
    local file=$1 limit=$2 title=$3
    shift 3
    {
        header "$title"
        timeout "$limit" "$@"
        echo "# exit status: $?"
    } 2>&1 | tee "$OUT/$file"
}

step gpu-tests-h200.txt 260 "python3 -m pytest tests/cuda -v -s -p no:cacheprovider" \
    python3 -m pytest tests/cuda -v -s -p no:cacheprovider
step bench-gpu-h200.txt 200 "python3 -m ci.bench gpu --json bench-gpu-h200.json" \
    python3 -m ci.bench gpu --json "$OUT/bench-gpu-h200.json"
step gpu-run-none-h200.txt 40 "python3 -m racefuzz.cli run --backend cuda --design none" \
    bash -c "python3 -m racefuzz.cli run --backend cuda --design none --report-dir /tmp/rf-none --json /tmp/rf-none.json; rc=\$?; echo '## --json'; cat /tmp/rf-none.json; echo '## report files'; cat /tmp/rf-none/*.txt /tmp/rf-none/*.json; exit \$rc"
step gpu-run-war-after-launch-h200.txt 70 "python3 -m racefuzz.cli run --backend cuda --design war-after-launch --examples 2000" \
    bash -c "python3 -m racefuzz.cli run --backend cuda --design war-after-launch --examples 2000 --report-dir /tmp/rf-wal --json /tmp/rf-wal.json; rc=\$?; echo '## --json'; cat /tmp/rf-wal.json; exit \$rc"
