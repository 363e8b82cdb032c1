#!/bin/sh
# The whole test suite, as CI runs it: installs dependencies, builds with
# warnings as errors, runs every test plainly, the C suites again under
# AddressSanitizer + UndefinedBehaviorSanitizer, the libFuzzer targets, then
# prints one summary line. The PyTorch oracles (the torch suite) run once, in
# the plain build: under the sanitizers they would test Python and PyTorch,
# not memledger, whose code they reach only through the CLI, which the
# sanitized cli suites (argv fuzzing, golden cases) run there.
set -u
cd "$(dirname "$0")/.." || exit 1
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
    # $TEST_ARGS: the suites this build runs (all by default)
    # shellcheck disable=SC2086
    meson test -C "$dir" --print-errorlogs --num-processes 2 ${TEST_ARGS:-}
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
# The web page's WebAssembly build needs none of the others: it runs beside
# the plain build and its tests, one compiler at a time, filling the cores
# they leave idle (its test comes after them)
WEB_JOBS=1 sh scripts/web.sh build-web-test >build-web-test.log 2>&1 &
web_pid=$!
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
echo "== Web page: scripts/web.sh (WebAssembly), then the page against the CLI in headless Chromium"
if wait "$web_pid" &&
    python3 tests/web/page_test.py build-web-test build-test/src/memledger --bench; then
    pass=$((pass + 1))
else
    tail -30 build-web-test.log
    fail=$((fail + 1))
    status=1
fi
echo "== AddressSanitizer + UndefinedBehaviorSanitizer"
# -O1, as AddressSanitizer's documentation advises for reasonable speed
# (its reports and UBSan's checks are the same): the sanitized suites take
# about two thirds of their -O0 time, which keeps the whole command within
# ten minutes on two cores
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 TEST_ARGS="--no-suite torch" \
    run build-sanitize -Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debug \
        -Doptimization=1 -Dtorch_crosscheck=enabled -Drender_tests=enabled -Dblas=enabled \
        -Dcuda=disabled ||
    status=1
# The fuzzing budget: FUZZ_BUDGET seconds in all (default 36), shared by
# the six targets in proportion to how much each has to explore (the YAML
# model loader, the slowest and largest, gets the most; the size parser, at
# 234,000 inputs/s, the least: docs/robustness.md), two targets at a time
# (one per core). FUZZ_SECONDS=N gives every target N seconds instead.
budget=${FUZZ_BUDGET:-36}
if [ -n "${FUZZ_SECONDS:-}" ]; then
    echo "== libFuzzer: each target for $FUZZ_SECONDS s from its seed corpus, two at a time"
else
    echo "== libFuzzer: $budget s in all from the seed corpora, two targets at a time"
fi
fuzz_one() { # TARGET SECONDS WORKDIR: one target; its log in WORKDIR/TARGET.log
    cp -r "tests/fuzz/corpus/$1" "$3/$1"
    # a fixed seed keeps the gate reproducible (FUZZ_SEED=0: a random one)
    "$PWD/build-fuzz/tests/fuzz/fuzz_$1" -max_total_time="$2" \
        -dict="$PWD/tests/fuzz/dict/$1.dict" \
        -seed="${FUZZ_SEED:-1}" \
        -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 \
        -artifact_prefix="$PWD/build-fuzz/crash-$1-" \
        "$3/$1" >"$3/$1.log" 2>&1
    echo $? >"$3/$1.rc"
}
fuzz() {
    if [ ! -f build-fuzz/build.ninja ]; then
        CC=clang meson setup build-fuzz -Dfuzzing=true -Dtests=false -Dwerror=true \
            -Db_lundef=false -Dcuda=disabled >build-fuzz.setup.log 2>&1 ||
            { cat build-fuzz.setup.log; return 1; }
    fi
    ninja -C build-fuzz >/dev/null || { echo "FAIL: the fuzz build"; return 1; }
    work=$(mktemp -d)
    rc=0
    # two lanes of equal length, in shares of the budget (per mille):
    # model 250 + hf 167 + units 83 = trace 208 + profile 167 + points 125 = 500
    for lane in "model:250 hf:167 units:83" "trace:208 profile:167 points:125"; do
        (
            for tw in $lane; do
                t=${tw%%:*}
                secs=${FUZZ_SECONDS:-$(((budget * ${tw#*:} + 500) / 1000))}
                [ "$secs" -ge 1 ] || secs=1
                fuzz_one "$t" "$secs" "$work"
            done
        ) &
    done
    wait
    for t in model hf units trace profile points; do
        r=$(cat "$work/$t.rc" 2>/dev/null || echo 1)
        runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/$t.log")
        rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$work/$t.log")
        if [ "$r" = 0 ]; then
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
