#!/usr/bin/env bash
# vLLM's own GPUModelRunner on a GPU host without network (racefuzz vllm --device cuda, docs/vllm.md).
#
# Run from the repository root, with what `racefuzz vllm pack` made here carried along in .carry/:
#   .carry/vllm-X.tar.gz     one slim source archive per version (racefuzz vllm pack --version X --out ...)
#   .carry/vllm-whl/*.whl    the packages vLLM's config and runner modules need real (a bare torch host lacks
#                            them), at the versions the CPU CI runs:
#       python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#           --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#           -d .carry/vllm-whl pydantic==2.13.4 pydantic_core==2.46.4 annotated_types==0.7.0 \
#           typing_inspection==0.4.2 typing_extensions==4.15.0 msgspec==0.23.0 psutil==7.2.2 \
#           cloudpickle==2.1.0 regex==2026.5.9 packaging==26.2
# It unpacks the archives into a fresh cache, runs every carried version (prepare_inputs_event as the version
# has it, and its control: the event's synchronize a no-op; the fixed workload), writes the JSON and the log
# under $OUT, then runs tests/cuda/test_vllm_harness_gpu.py's checks on that JSON (no second harness run).
# Then the speculative-decoding workloads (--workload spec, --workload spec-condense: docs/vllm.md) on the
# carried versions from 0.17.0 on (EAGLE under async scheduling), each with its own JSON and log, and their
# 0.33.0 checks (spec clean beside its control; spec-condense racing only on the accepted counts against
# condense, #51571).
# Exits with the fixed workload's racefuzz vllm code (1: a race in some version, as 0.10.2 has; 5: the
# harness failed), or a spec run's code where that is neither 0 nor 1. What it shares with
# ci/sglang_gpu.sh is in ci/engine_gpu.sh, which it sources.
#   DEVICE=cpu ci/vllm_gpu.sh     the same on the CPU (a dry run of the script itself)
#   STUB_ALL=1                    stub every light package below even where installed (a dry run as bare as
#                                 the GPU host)
#   VERSIONS="0.33.0"             only these of the carried versions
#   SPEC=0                        skip the speculative-decoding workloads
#   SLOT_MAPPING=vllm             the version's own Triton slot-mapping kernel (GPU; default torch)
#   ARGS="--workload drawn --examples 50"   more arguments to racefuzz vllm (then the checks, written for
#                                 the fixed workload, are skipped); NAME names the outputs
#   TIMEOUT=300 (seconds per version), OUT, CARRY, WHEELS, SITE, RACEFUZZ_VLLM_CACHE: where things go
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
SLOT_MAPPING=${SLOT_MAPPING:-torch}
OUT=${OUT:-.racefuzz/vllm-$DEVICE}
NAME=${NAME:-vllm-$DEVICE-$SLOT_MAPPING}
read -r -a extra <<<"${ARGS:-}"
CARRY=${CARRY:-.carry}
WHEELS=${WHEELS:-$CARRY/vllm-whl}
SITE=${SITE:-/tmp/racefuzz-vllm-site}
export RACEFUZZ_VLLM_CACHE=${RACEFUZZ_VLLM_CACHE:-/tmp/racefuzz-vllm-cache}
mkdir -p "$OUT" "$SITE" "$RACEFUZZ_VLLM_CACHE"
source ci/engine_gpu.sh

install_carried_wheels
export PYTHONWARNINGS=ignore VLLM_LOGGING_LEVEL=ERROR
"$PYTHON" -c "import pydantic, msgspec, psutil, cloudpickle, regex, packaging, torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" \
    || { echo "ci/vllm_gpu.sh: pydantic, msgspec, psutil, cloudpickle, regex or packaging missing (carry them in $WHEELS)" >&2; exit 2; }
# Light packages vLLM imports at module level but the runner's step never calls, not in
# racefuzz/engines/vllm/stubs.py's STUBBED: stubbed where absent (STUB_ALL=1: everywhere; 0.10.2 and 0.33.0
# give the same verdicts on the CPU with all of them stubbed).
light=PIL,requests,yaml,tqdm,dill,boto3,botocore,s3transfer,jmespath,scipy,dateutil,six,certifi,charset_normalizer,idna,urllib3,colorama,more_itertools,jaraco,backports
if [ -n "${STUB_ALL:-}" ]; then
    absent=$light
else
    absent=$(absent_of "$light")
fi
export RACEFUZZ_VLLM_STUB="${RACEFUZZ_VLLM_STUB:+$RACEFUZZ_VLLM_STUB,}$absent"
echo "stubbed besides STUBBED: ${absent:-none}"
if [ "$DEVICE" = cuda ]; then nvidia-smi -L || true; fi

unpack_carried vllm
run_engine vllm "${TIMEOUT:-300}" --device "$DEVICE" --slot-mapping "$SLOT_MAPPING" "${version_args[@]}" "${extra[@]}"

# A version the harness failed on: its traceback (the harness subprocess with --traceback).
if [ -f "$OUT/$NAME.json" ]; then
    failed=$("$PYTHON" -c "import json,sys; print(' '.join(r.get('label') or '' for r in json.load(open(sys.argv[1])) if r.get('status') != 'ok'))" "$OUT/$NAME.json")
    for version in $failed; do
        print_traceback vllm "$RACEFUZZ_VLLM_CACHE" "$version" "${TIMEOUT:-300}" \
            --device "$DEVICE" --slot-mapping "$SLOT_MAPPING" --vllm-version "$version" --no-control
    done
fi

if [ -n "${ARGS:-}" ]; then
    echo "checks skipped: they are written for the fixed workload (ARGS=$ARGS)" | tee "$OUT/$NAME.checks.log"
    exit "$rc"
fi
# The GPU test's checks on this run's JSON, without pytest (as the CUDA test runs them).
run_checks tests/cuda/test_vllm_harness_gpu.py label "$OUT/$NAME.checks.log" 0.10.2:check_0_10_2 0.33.0:check_0_33_0

if [ "${SPEC:-1}" != 0 ]; then
    spec_args=()
    for version in "${versions[@]}"; do
        if [ "$(printf '%s\n' 0.17.0 "$version" | sort -V | head -1)" = 0.17.0 ]; then spec_args+=(--version "$version"); fi
    done
    if [ ${#spec_args[@]} -eq 0 ]; then
        echo "speculative decoding skipped: no carried version from 0.17.0 on" | tee "$OUT/$NAME-spec.checks.log"
    fi
    for workload in spec spec-condense; do
        [ ${#spec_args[@]} -gt 0 ] || break
        echo "racefuzz vllm --device $DEVICE --slot-mapping $SLOT_MAPPING ${spec_args[*]} --workload $workload"
        start=$(date +%s)
        "$PYTHON" -m racefuzz vllm --device "$DEVICE" --slot-mapping "$SLOT_MAPPING" "${spec_args[@]}" \
            --workload "$workload" --timeout "${TIMEOUT:-300}" --json "$OUT/$NAME-$workload.json" 2>&1 \
            | tee "$OUT/$NAME-$workload.log"
        spec_rc=${PIPESTATUS[0]}
        echo "racefuzz vllm --workload $workload exit $spec_rc ($(($(date +%s) - start)) s)" | tee -a "$OUT/$NAME-$workload.log"
        if [ "$spec_rc" -ne 0 ] && [ "$spec_rc" -ne 1 ]; then rc=$spec_rc; fi
        if [ -f "$OUT/$NAME-$workload.json" ]; then  # run_checks reads $OUT/$NAME.json
            check=check_${workload//-/_}_0_33_0
            NAME="$NAME-$workload" run_checks tests/cuda/test_vllm_harness_gpu.py label \
                "$OUT/$NAME-$workload.checks.log" "0.33.0:$check"
        fi
    done
fi

run_gpu_pytest RACEFUZZ_VLLM_GPU_JSON tests/cuda/test_vllm_harness_gpu.py "$OUT/$NAME.pytest.log"
exit "$rc"
