#!/usr/bin/env bash
# sglang's own overlap loop on a GPU host without network (racefuzz sglang --device cuda, docs/sglang-gpu.md).
#
# Run from the repository root, with what `racefuzz sglang pack` made here carried along in .carry/:
#   .carry/sglang-X.tar.gz   one slim source archive per version (racefuzz sglang pack --version X --out ...)
#   .carry/whl/*.whl         msgspec, psutil, dill, regex (sglang needs them real; a bare torch host lacks them):
#       python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#           --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#           -d .carry/whl msgspec psutil dill regex
# It unpacks the archives into a fresh cache, runs every carried version (barrier and control, the fixed
# workload), writes the JSON, the log and each failed version's traceback under $OUT, then runs
# tests/cuda/test_sglang_harness_gpu.py on that JSON (no second harness run). Exits with racefuzz
# sglang's code (1: a race in some version, as 0.5.15 has; 5: the harness failed on a version). What it
# shares with ci/vllm_gpu.sh is in ci/engine_gpu.sh, which it sources.
#   DEVICE=cpu ci/sglang_gpu.sh     the same on the CPU (a dry run of the script itself)
#   VERSIONS="0.5.16 0.5.23"        only these of the carried versions
#   ARGS="--workload drawn --examples 2000 --jobs 12"   more arguments to racefuzz sglang (then the checks,
#                                   written for the fixed workload, are skipped); NAME names the outputs
#   ARGS="--workload mixed-chunk" VERSIONS="0.5.21 0.5.22"   sglang #34076 (mixed chunked prefill), checked
#                                   by tests/cuda/test_sglang_mixed_chunk_gpu.py's check_mixed_chunk; run it
#                                   with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (the harness's
#                                   subprocesses inherit it), the allocator the pull request saw corrupt
#   TIMEOUT=240 (seconds per version), OUT, CARRY, WHEELS, SITE, RACEFUZZ_SGLANG_CACHE: where things go
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
OUT=${OUT:-.racefuzz/sglang-$DEVICE}
NAME=${NAME:-sglang-$DEVICE}
read -r -a extra <<<"${ARGS:-}"
CARRY=${CARRY:-.carry}
WHEELS=${WHEELS:-$CARRY/whl}
SITE=${SITE:-/tmp/racefuzz-sglang-site}
export RACEFUZZ_SGLANG_CACHE=${RACEFUZZ_SGLANG_CACHE:-/tmp/racefuzz-sglang-cache}
mkdir -p "$OUT" "$SITE" "$RACEFUZZ_SGLANG_CACHE"
source ci/engine_gpu.sh

install_carried_wheels
export PYTHONWARNINGS=ignore
"$PYTHON" -c "import msgspec, psutil, dill, regex, torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" \
    || { echo "ci/sglang_gpu.sh: msgspec, psutil, dill or regex missing (carry them in $WHEELS)" >&2; exit 2; }
# Light packages sglang imports at module level but its loop never calls, absent from a bare torch host and
# not in racefuzz/engines/sglang/stubs.py's STUBBED: stubbed where absent (each checked on the CPU with all
# of them stubbed: 0.5.14, 0.5.15, 0.5.16, 0.5.23 give the same verdicts). regex must be real (0.5.23
# compiles patterns from it at import): it is carried.
absent=$(absent_of IPython,PIL,requests,yaml,tqdm,pydantic,pydantic_core,annotated_types,typing_inspection,certifi,charset_normalizer,idna,urllib3)
# transformers and its hub, tokenizers and safetensors are stubbed even where installed, as the CPU CI
# (which installs none of them) has them: a host's newer transformers already registers model configs that
# sglang 0.5.14-0.5.16 register again at import ("'qwen3_asr' is already used by a Transformers config"),
# and a real huggingface_hub under a stubbed transformers refuses sglang's config classes ("must be a
# dataclass before applying @strict"). The loop calls none of them.
export RACEFUZZ_SGLANG_STUB="${RACEFUZZ_SGLANG_STUB:+$RACEFUZZ_SGLANG_STUB,}transformers,huggingface_hub,tokenizers,safetensors${absent:+,$absent}"
echo "stubbed where absent: ${absent:-none}"
if [ "$DEVICE" = cuda ]; then nvidia-smi -L || true; fi

unpack_carried sglang
run_engine sglang "${TIMEOUT:-240}" --device "$DEVICE" "${version_args[@]}" "${extra[@]}"

# A version the harness failed on: its traceback (the harness subprocess with --traceback).
if [ -f "$OUT/$NAME.json" ]; then
    failed=$("$PYTHON" -c "import json,sys; print(' '.join(r['version'] if r.get('version') not in (None, 'unknown') else r['label'] for r in json.load(open(sys.argv[1])) if r.get('status') == 'error'))" "$OUT/$NAME.json")
    for version in $failed; do
        print_traceback sglang "$RACEFUZZ_SGLANG_CACHE" "$version" "${TIMEOUT:-240}" --device "$DEVICE" --sglang-version "$version"
    done
fi

if [ "${ARGS:-}" = "--workload mixed-chunk" ]; then
    echo "PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-}" | tee "$OUT/$NAME.checks.log"
    "$PYTHON" - "$OUT/$NAME.json" "$DEVICE" <<'EOF' 2>&1 | tee -a "$OUT/$NAME.checks.log"
import json, runpy, sys
checks = runpy.run_path("tests/cuda/test_sglang_mixed_chunk_gpu.py")
results = {r.get("version"): r for r in json.load(open(sys.argv[1]))}
try:
    checks["check_mixed_chunk"](results, device=sys.argv[2])
    print("check_mixed_chunk: passed")
except (AssertionError, KeyError) as exc:
    print(f"check_mixed_chunk: FAILED: {type(exc).__name__}: {exc}")
EOF
    exit "$rc"
fi
if [ -n "${ARGS:-}" ]; then
    echo "checks skipped: they are written for the fixed workload (ARGS=$ARGS)" | tee "$OUT/$NAME.checks.log"
    exit "$rc"
fi
# The GPU test's checks on this run's JSON, without pytest (its cuda marker skips where CuPy is missing).
run_checks tests/cuda/test_sglang_harness_gpu.py version "$OUT/checks.log" 0.5.15:check_0_5_15 0.5.23:check_0_5_23
# The GPU test's expectations on this run's JSON, on a GPU (on the CPU they are the CUDA test's, which skips).
run_gpu_pytest RACEFUZZ_SGLANG_GPU_JSON tests/cuda/test_sglang_harness_gpu.py "$OUT/pytest.log"
exit "$rc"
