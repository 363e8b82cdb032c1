#!/bin/sh
# The whole test suite, as CI runs it: installs dependencies, builds with
# warnings as errors, runs every test plainly and again under
# AddressSanitizer + UndefinedBehaviorSanitizer, then prints one summary line.
set -u
cd "$(dirname "$0")/.."
sh scripts/deps.sh || exit 1
# The CUDA toolkit (nvcc, cuBLAS) lives in /usr/local/cuda: CI builds the
# runner's CUDA backend there even though it cannot run it.
cuda=auto
if [ -x /usr/local/cuda/bin/nvcc ]; then
    PATH=/usr/local/cuda/bin:$PATH
    export PATH
    cuda=enabled
fi
status=0
pass=0
fail=0
run() {
    dir=$1
    shift
    if [ ! -f "$dir/build.ninja" ]; then
        meson setup "$dir" -Dwerror=true "$@" >"$dir.setup.log" 2>&1 || {
            cat "$dir.setup.log"
            return 1
        }
    else
        meson setup --reconfigure "$dir" -Dwerror=true "$@" >"$dir.setup.log" 2>&1 || {
            cat "$dir.setup.log"
            return 1
        }
    fi
    ninja -C "$dir" || { echo "FAIL: the build in $dir"; return 1; }
    meson test -C "$dir" --print-errorlogs --num-processes 2
    rc=$?
    log="$dir/meson-logs/testlog.json"
    p=$(grep -c '"result": "OK"' "$log" 2>/dev/null || true)
    t=$(grep -c '"result": ' "$log" 2>/dev/null || true)
    # a skipped test (exit 77, its reason in the log) is neither
    s=$(grep -c '"result": "SKIP"' "$log" 2>/dev/null || true)
    pass=$((pass + p))
    fail=$((fail + t - p - s))
    return $rc
}
echo "== plain build (-Dwerror=true)"
run build-test -Dtorch_crosscheck=enabled -Drender_tests=enabled -Dblas=enabled \
    -Dcuda=$cuda || status=1
echo "== Python package: pip install . into a throwaway venv, pytest"
if MEMLEDGER_CLI="$PWD/build-test/src/memledger" sh scripts/python-test.sh; then
    pass=$((pass + 1))
else
    fail=$((fail + 1))
    status=1
fi
echo "== AddressSanitizer + UndefinedBehaviorSanitizer"
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    run build-sanitize -Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debug \
        -Dtorch_crosscheck=enabled -Drender_tests=enabled -Dblas=enabled -Dcuda=disabled ||
    status=1
echo "== libFuzzer: each target for ${FUZZ_SECONDS:-60} s from its seed corpus"
fuzz() {
    if [ ! -f build-fuzz/build.ninja ]; then
        CC=clang meson setup build-fuzz -Dfuzzing=true -Dtests=false -Dwerror=true \
            -Db_lundef=false -Dcuda=disabled >build-fuzz.setup.log 2>&1 ||
            { cat build-fuzz.setup.log; return 1; }
    fi
    ninja -C build-fuzz >/dev/null || { echo "FAIL: the fuzz build"; return 1; }
    work=$(mktemp -d)
    rc=0
    for t in model hf units profile points trace; do
        cp -r "tests/fuzz/corpus/$t" "$work/$t"
        # a fixed seed keeps the gate reproducible (FUZZ_SEED=0: a random one)
        "$PWD/build-fuzz/tests/fuzz/fuzz_$t" -max_total_time="${FUZZ_SECONDS:-60}" \
            -dict="$PWD/tests/fuzz/dict/$t.dict" \
            -seed="${FUZZ_SEED:-1}" \
            -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 \
            -artifact_prefix="$PWD/build-fuzz/crash-$t-" \
            "$work/$t" >"$work/$t.log" 2>&1
        r=$?
        runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/$t.log")
        rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$work/$t.log")
        if [ $r = 0 ]; then
            pass=$((pass + 1))
            echo "ok   fuzz_$t: ${runs:-?} executions, ${rate:-?}/s, no crash, leak or sanitizer report"
        else
            fail=$((fail + 1))
            rc=1
            echo "FAIL fuzz_$t (exit $r): the input is kept as build-fuzz/crash-$t-*"
            tail -40 "$work/$t.log"
        fi
    done
    rm -rf "$work"
    return $rc
}
fuzz || status=1
[ $status = 0 ] || [ $fail -gt 0 ] || fail=1
echo "$pass passed, $fail failed"
exit $status
