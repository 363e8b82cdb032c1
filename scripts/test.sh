#!/bin/sh
# The whole test suite, as CI runs it: installs dependencies, builds with
# warnings as errors, runs every test plainly and again under
# AddressSanitizer + UndefinedBehaviorSanitizer, then prints one summary line.
set -u
cd "$(dirname "$0")/.."
sh scripts/deps.sh || exit 1
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
        meson configure "$dir" -Dwerror=true "$@" >/dev/null || return 1
    fi
    ninja -C "$dir" || return 1
    meson test -C "$dir" --print-errorlogs --num-processes 2
    rc=$?
    log="$dir/meson-logs/testlog.json"
    p=$(grep -c '"result": "OK"' "$log" 2>/dev/null || true)
    t=$(grep -c '"result": ' "$log" 2>/dev/null || true)
    pass=$((pass + p))
    fail=$((fail + t - p))
    return $rc
}
echo "== plain build (-Dwerror=true)"
run build-test -Dtorch_crosscheck=enabled -Drender_tests=enabled || status=1
echo "== AddressSanitizer + UndefinedBehaviorSanitizer"
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    run build-sanitize -Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debug \
        -Dtorch_crosscheck=enabled -Drender_tests=enabled || status=1
[ $status = 0 ] || [ $fail -gt 0 ] || fail=1
echo "$pass passed, $fail failed"
exit $status
