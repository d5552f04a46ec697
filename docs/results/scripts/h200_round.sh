#!/usr/bin/env bash
# One device call's worth of the GPU runs whose raw output is committed under docs/results/ (the folder each
# step feeds is named beside it). A call has at most 10 minutes and brings back at most 8 files, so each part
# writes its logs under /tmp/h200/logs and packs them into $OUT/results.tgz after every step (a part killed
# at its limit still brings back what had finished). Run from the repository root on the H200:
#   COMMIT=<sha> OUT=<dir> bash docs/results/scripts/h200_round.sh suite     ci/gpu.sh, ci.bench gpu
#   COMMIT=<sha> OUT=<dir> bash docs/results/scripts/h200_round.sh sglang    CARRY=.carry-sg: 0.5.14-0.5.16, 0.5.23
#   COMMIT=<sha> OUT=<dir> bash docs/results/scripts/h200_round.sh engines   CARRY=.carry-x: 0.5.21/0.5.22, vLLM
#   COMMIT=<sha> OUT=<dir> bash docs/results/scripts/h200_round.sh rerun     CARRY=.carry-r: vLLM 0.17.0+, sglang_loop
#   COMMIT=<sha> OUT=<dir> bash docs/results/scripts/h200_round.sh short     CARRY=.carry: sglang 0.5.15/0.5.23, vLLM 0.10.2/0.33.0
#   COMMIT=<sha> OUT=<dir> bash docs/results/scripts/h200_round.sh trace     CARRY=.carry (0.5.23): ci.bench trace
#   COMMIT=<sha> OUT=<dir> bash docs/results/scripts/h200_round.sh loop      CARRY=.carry: ci.bench sglang_loop
# Each step has its own time limit so that one hang cannot eat the others' time; a failing step does not stop
# the next. The last lines printed are each step's exit status and its test summary.
set -u -o pipefail
part=${1:?usage: h200_round.sh suite|sglang|engines|rerun|short|trace|loop}
export PYTHONUNBUFFERED=1 PIP_NO_INDEX=1 PYTHONWARNINGS=ignore
LOGS=/tmp/h200/logs
mkdir -p "$LOGS" "$OUT"
summary=()

step() {  # step NAME LIMIT_S COMMAND...: the command's output, with a header, in $LOGS/NAME.txt
    local name=$1 limit=$2 start rc
    shift 2
    start=$(date +%s)
    {
        echo "# $*"
        echo "# commit ${COMMIT:-unknown} (the tree as committed); $(date -u +%Y-%m-%dT%H:%M:%SZ); limit ${limit}s"
        nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
        python3 -c 'import sys, torch; print(f"python {sys.version.split()[0]} | torch {torch.__version__} (CUDA {torch.version.cuda})")'
        timeout "$limit" "$@"
        rc=$?
        echo "# exit status: $rc; $(($(date +%s) - start)) s"
    } >"$LOGS/$name.txt" 2>&1
    rc=$(sed -n 's/^# exit status: \([0-9]*\);.*/\1/p' "$LOGS/$name.txt" | tail -1)
    summary+=("$name: exit $rc, $(($(date +%s) - start)) s; $(grep -E '^(=+ )?[0-9]+ (passed|failed|skipped|error)' "$LOGS/$name.txt" | tail -2 | tr '\n' ' ')")
    echo "${summary[-1]}"
    tar czf "$OUT/results.tgz" -C "$(dirname "$LOGS")" logs
}

sglang_env() {  # the carried sglang archives of $CARRY into a cache, as ci/sglang_gpu.sh does
    export RACEFUZZ_SGLANG_CACHE=/tmp/racefuzz-sglang-cache
    mkdir -p /tmp/racefuzz-sglang-site
    python3 -m pip install -q --no-index --no-deps --target /tmp/racefuzz-sglang-site "$CARRY"/whl/*.whl
    export PYTHONPATH="$PWD:/tmp/racefuzz-sglang-site"
    export RACEFUZZ_SGLANG_STUB=transformers,huggingface_hub,tokenizers,safetensors,IPython,pydantic,pydantic_core,annotated_types,typing_inspection
    for archive in "$CARRY"/sglang-*.tar.gz; do
        version=$(basename "$archive" .tar.gz)
        python3 -m racefuzz sglang fetch --version "${version#sglang-}" --archive "$archive"
    done
}

case $part in
suite)
    # docs/results/gpu-ci-h200/, trace-tests-h200/ (tests/cuda's trace and orders tests print what they saw)
    step gpu-ci 400 bash ci/gpu.sh -q -rfEs -p no:randomly -s
    # docs/results/search-gpu-h200/
    step bench-gpu 100 python3 -m ci.bench gpu --json "$LOGS/bench-gpu.json"
    ;;
sglang)
    CARRY=${CARRY:-.carry-sg}
    sglang_env >"$LOGS/setup.txt" 2>&1
    # docs/results/sglang-own-loop-h200/: the fixed workload, ci/sglang_gpu.sh's checks and its pytest
    step sglang-fixed 130 env CARRY="$CARRY" VERSIONS="0.5.15 0.5.16 0.5.23" OUT="$LOGS/sglang-fixed" bash ci/sglang_gpu.sh
    # --cuda-graph on and --page-size 16 on the GPU (docs/sglang-workloads.md)
    step sglang-cuda-graph 70 env CARRY="$CARRY" VERSIONS="0.5.15 0.5.23" ARGS="--cuda-graph on" NAME=cuda-graph OUT="$LOGS/sglang-cuda-graph" bash ci/sglang_gpu.sh
    step sglang-page-size 70 env CARRY="$CARRY" VERSIONS="0.5.15 0.5.23" ARGS="--page-size 16" NAME=page-size-16 OUT="$LOGS/sglang-page-size" bash ci/sglang_gpu.sh
    # docs/results/sglang-loop-speed-h200/: the recording cost per loop iteration
    step bench-sglang-loop 110 python3 -m ci.bench sglang_loop --device cuda --examples 10 --json "$LOGS/bench-sglang-loop-cuda.json"
    # docs/results/sglang-sync-cost-h200/
    step bench-sglang-sync-cost 50 python3 -m ci.bench sglang_sync_cost --device cuda --json "$LOGS/bench-sglang-sync-cost-cuda.json"
    # docs/results/trace-cost-h200/ and trace-sglang-step-cost-h200/ (its sglang row takes 0.5.23's sources)
    step bench-trace 60 python3 -m ci.bench trace --json "$LOGS/bench-trace.json"
    # tests/cuda's sglang tests that take the sources themselves (the harness's is run by sglang-fixed)
    step sglang-gpu-tests 70 python3 -m pytest -q -rfEs -p no:randomly -p no:xdist -s tests/cuda/test_sglang_dflash_gpu.py tests/cuda/test_sglang_sync_cost_gpu.py
    ;;
engines)
    CARRY=${CARRY:-.carry-x}
    sglang_env >"$LOGS/setup.txt" 2>&1
    # sglang #34076 under the allocator the pull request saw corrupt (docs/results/sglang-own-loop-h200/)
    step sglang-mixed-chunk 150 env CARRY="$CARRY" VERSIONS="0.5.21 0.5.22" ARGS="--workload mixed-chunk" NAME=mixed-chunk \
        PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True OUT="$LOGS/sglang-mixed-chunk" bash ci/sglang_gpu.sh
    # docs/results/vllm-own-code-h200/: every carried version, fixed and spec workloads, their checks
    step vllm 260 env CARRY="$CARRY" OUT="$LOGS/vllm" bash ci/vllm_gpu.sh
    step vllm-multimodal 100 env CARRY="$CARRY" VERSIONS="0.13.0 0.14.0" SPEC=0 ARGS="--workload multimodal" NAME=multimodal \
        OUT="$LOGS/vllm-multimodal" bash ci/vllm_gpu.sh
    ;;
short)
    # One version either side of each engine's historic fix, fixed workload and checks: sglang 0.5.15 (races)
    # and 0.5.23; vLLM 0.10.2 (races) and 0.33.0 (docs/results/sglang-own-loop-h200/, vllm-own-code-h200/)
    CARRY=${CARRY:-.carry}
    sglang_env >"$LOGS/setup.txt" 2>&1
    step sglang-fixed 130 env CARRY="$CARRY" VERSIONS="0.5.15 0.5.23" OUT="$LOGS/sglang-fixed" bash ci/sglang_gpu.sh
    step vllm 130 env CARRY="$CARRY" VERSIONS="0.10.2 0.33.0" SPEC=0 OUT="$LOGS/vllm" bash ci/vllm_gpu.sh
    ;;
trace)
    # docs/results/trace-cost-h200/ and trace-sglang-step-cost-h200/ (its sglang row takes 0.5.23's sources)
    CARRY=${CARRY:-.carry}
    sglang_env >"$LOGS/setup.txt" 2>&1
    # the sglang step imports sglang itself: 0.5.23's unpacked sources on the path
    PYTHONPATH="$PYTHONPATH:$RACEFUZZ_SGLANG_CACHE/0.5.23/python" step bench-trace 200 \
        python3 -m ci.bench trace --json "$LOGS/bench-trace.json"
    ;;
loop)
    # docs/results/sglang-loop-speed-h200/: sglang's own loop's examples/s and recording cost per iteration
    CARRY=${CARRY:-.carry}
    sglang_env >"$LOGS/setup.txt" 2>&1
    step bench-sglang-loop 230 python3 -m ci.bench sglang_loop --device cuda --examples 10 --version 0.5.15 --version 0.5.23 \
        --json "$LOGS/bench-sglang-loop-cuda.json"
    ;;
rerun)
    # What the parts above ran out of time for: vLLM from 0.17.0 on (fixed and spec workloads), and the
    # recording cost per sglang loop iteration.
    CARRY=${CARRY:-.carry-r}
    sglang_env >"$LOGS/setup.txt" 2>&1
    step vllm-0.17-0.33 300 env CARRY="$CARRY" VERSIONS="0.17.0 0.18.0 0.19.0 0.33.0" OUT="$LOGS/vllm-0.17-0.33" bash ci/vllm_gpu.sh
    step bench-sglang-loop 230 python3 -m ci.bench sglang_loop --device cuda --examples 10 --version 0.5.15 --version 0.5.23 \
        --json "$LOGS/bench-sglang-loop-cuda.json"
    ;;
*)
    echo "h200_round.sh: no part $part (suite, sglang, engines, rerun, short, trace, loop)" >&2
    exit 2
    ;;
esac
printf '%s\n' "${summary[@]}"
