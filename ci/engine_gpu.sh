# What ci/sglang_gpu.sh and ci/vllm_gpu.sh share, sourced by both (not run on its own): an engine's harness
# on a GPU host without network, from what `racefuzz <engine> pack` made here carried along in $CARRY.
# Each script sets PYTHON, DEVICE, OUT, NAME, CARRY, WHEELS and SITE, then calls these in order; what differs
# between the engines (their light packages, the harness's options, which checks the JSON gets) stays there.

# The carried wheels, into a directory of their own (no pip network: --no-index; without pip, a wheel is a
# zip of its files); then the source tree first on PYTHONPATH (an editable install needs its build backend,
# offline), then the wheels.
install_carried_wheels() {
    if compgen -G "$WHEELS/*.whl" >/dev/null; then
        if "$PYTHON" -m pip --version >/dev/null 2>&1; then
            "$PYTHON" -m pip install -q --disable-pip-version-check --no-index --no-deps --target "$SITE" "$WHEELS"/*.whl
        else
            for wheel in "$WHEELS"/*.whl; do "$PYTHON" -m zipfile -e "$wheel" "$SITE"; done
        fi
    fi
    export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}"
}

# absent_of NAMES: those of the comma-separated import names that $PYTHON cannot find, comma-separated.
absent_of() {
    "$PYTHON" -c "
import importlib.util, sys
print(','.join(n for n in sys.argv[1].split(',') if importlib.util.find_spec(n) is None))
" "$1"
}

# unpack_carried ENGINE: each $CARRY/ENGINE-X.tar.gz (of VERSIONS, if set) unpacked into the engine's cache
# by `racefuzz ENGINE fetch --archive`; sets `versions` (sorted) and `version_args` (--version X ...). Exits
# 2 when nothing is carried or none of VERSIONS is.
unpack_carried() {
    local engine=$1 archive version
    versions=()
    for archive in "$CARRY"/"$engine"-*.tar.gz; do
        [ -e "$archive" ] || { echo "ci/${engine}_gpu.sh: no $CARRY/$engine-X.tar.gz archives" >&2; exit 2; }
        version=$(basename "$archive" .tar.gz)
        version=${version#"$engine"-}
        if [ -n "${VERSIONS:-}" ] && [[ " $VERSIONS " != *" $version "* ]]; then continue; fi
        "$PYTHON" -m racefuzz "$engine" fetch --version "$version" --archive "$archive" || exit 2
        versions+=("$version")
    done
    [ ${#versions[@]} -gt 0 ] || { echo "ci/${engine}_gpu.sh: none of VERSIONS=$VERSIONS is carried" >&2; exit 2; }
    IFS=$'\n' versions=($(printf '%s\n' "${versions[@]}" | sort -V)); unset IFS
    version_args=()
    for version in "${versions[@]}"; do version_args+=(--version "$version"); done
}

# run_engine ENGINE TIMEOUT OPTION...: `racefuzz ENGINE OPTION... --timeout TIMEOUT --json $OUT/$NAME.json`,
# its output in $OUT/$NAME.log; sets rc to its exit code.
run_engine() {
    local engine=$1 seconds=$2 start
    shift 2
    echo "racefuzz $engine $*"
    start=$(date +%s)
    "$PYTHON" -m racefuzz "$engine" "$@" --timeout "$seconds" --json "$OUT/$NAME.json" 2>&1 | tee "$OUT/$NAME.log"
    rc=${PIPESTATUS[0]}
    echo "racefuzz $engine exit $rc ($(($(date +%s) - start)) s)" | tee -a "$OUT/$NAME.log"
}

# print_traceback ENGINE CACHE VERSION TIMEOUT OPTION...: the harness subprocess again on VERSION's sources in
# CACHE with --traceback (its JSON and stderr under $OUT), and the traceback it reports, or its stderr's tail.
print_traceback() {
    local engine=$1 cache=$2 version=$3 seconds=$4
    shift 4
    timeout "$seconds" "$PYTHON" -m "racefuzz.engines.$engine.harness" --python-dir "$cache/$version/python" \
        "$@" --traceback >"$OUT/traceback-$version.json" 2>"$OUT/traceback-$version.stderr"
    "$PYTHON" -c "import json,sys; r=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); print(r.get('traceback') or r.get('error'))" \
        "$OUT/traceback-$version.json" || tail -20 "$OUT/traceback-$version.stderr"
}

# run_checks TEST_FILE KEY LOG VERSION:CHECK...: the GPU test's checks on this run's JSON, without pytest (its
# cuda marker skips where CuPy is missing): each CHECK of TEST_FILE on the result whose KEY (version, label)
# is VERSION, where there is one; output in LOG.
run_checks() {
    local test_file=$1 key=$2 log=$3
    shift 3
    "$PYTHON" - "$OUT/$NAME.json" "$DEVICE" "$test_file" "$key" "$@" <<'EOF' 2>&1 | tee "$log"
import json, runpy, sys
path, device, test_file, key, *pairs = sys.argv[1:]
checks = runpy.run_path(test_file)
results = {r.get(key): r for r in json.load(open(path))}
for version, check in (pair.split(":") for pair in pairs):
    if version in results:
        try:
            checks[check](results[version], device=device)
            print(f"{check}: passed")
        except AssertionError as exc:
            print(f"{check}: FAILED: {exc}")
EOF
}

# run_gpu_pytest JSON_ENV TEST_FILE LOG: on a GPU, TEST_FILE under pytest reading this run's JSON (named by the
# environment variable JSON_ENV); output in LOG.
run_gpu_pytest() {
    local json_env=$1 test_file=$2 log=$3
    [ "$DEVICE" = cuda ] || return 0
    env "$json_env=$OUT/$NAME.json" "$PYTHON" -m pytest -q -p no:randomly -p no:xdist "$test_file" -rs 2>&1 | tee "$log"
    echo "pytest exit ${PIPESTATUS[0]}" | tee -a "$log"
}
