#!/bin/sh
# Hostile inputs (docs/robustness.md): each file of this folder is refused
# with the exit status of its line in `expect` (2: bad input) and one message
# that names the file at a line and column, nothing on stdout. Then two
# faults that must give exit 3 (out of memory) and leave no damage:
#   - libyaml's own allocation failing, under memory limits from 16 to 64 MiB
#     around a 12 MiB scalar: exit 3 "out of memory" or a schema error,
#     never "YAML syntax" (it was "YAML syntax: unknown problem", exit 2);
#   - a calibration whose every point is skipped (out of memory at
#     B x T = 4096 x 65536): exit 3, the existing -o file left as it was (it
#     was replaced by a profile of "layers: {}", exit 0).
# A memory limit (ulimit -v) cannot run under AddressSanitizer, which maps
# terabytes of shadow: there the scan is skipped and the calibration is
# limited by ASan's max_allocation_size instead.
# usage: run.sh MEMLEDGER HOSTILE_DIR MODELS_DIR
set -u
exe=$1
dir=$2
models=$3
pass=0
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() {
    fail=$((fail + 1))
    echo "FAIL $1"
    echo "--- stdout:"; head -c 2000 "$tmp/out"; echo "--- stderr:"; head -c 2000 "$tmp/err"
}

# every file here has its line in expect
for f in "$dir"/*; do
    name=$(basename "$f")
    case $name in run.sh | expect | README.md) continue ;; esac
    grep -q "^$name|" "$dir/expect" || { echo "FAIL $name: no line in expect"; fail=$((fail + 1)); }
done

while IFS='|' read -r name want text; do
    case $name in '' | '#'*) continue ;; esac
    f=$dir/$name
    case $name in
    points-*) "$exe" calibrate --points "$f" >"$tmp/out" 2>"$tmp/err" ;;
    profile-*) "$exe" plan "$models/gpt2-small.yaml" --calib "$f" >"$tmp/out" 2>"$tmp/err" ;;
    model-*) "$exe" plan "$f" >"$tmp/out" 2>"$tmp/err" ;;
    *) echo "FAIL $name: no rule for this name"; fail=$((fail + 1)); continue ;;
    esac
    got=$?
    if [ "$got" != "$want" ]; then
        bad "$name: exit status $got, expected $want"
    elif ! grep -qF -- "memledger: error: $f$text" "$tmp/err"; then
        bad "$name: stderr lacks: memledger: error: $f$text"
    elif [ "$(grep -c 'error:' "$tmp/err")" != 1 ] || [ -s "$tmp/out" ]; then
        bad "$name: not exactly one error, or something on stdout"
    else
        ok "$name"
    fi
done <"$dir/expect"

# Is the program built with AddressSanitizer (it cannot start under ulimit -v)?
asan=0
(ulimit -v 200000 && "$exe" --version) >/dev/null 2>&1 || asan=1

# libyaml out of memory: a 12 MiB double-quoted scalar needs libyaml's own
# buffers (its scalar doubles to 16 MiB) beside memledger's 16 MiB copy of the
# file; some limit in the scan fails inside libyaml.
big=$tmp/big-scalar.yaml
{ printf 'model:\n  type: sequential\n  name: "'; head -c 12582912 /dev/zero | tr '\0' x; printf '"\n'; } >"$big"
if [ $asan = 1 ]; then
    echo "skip libyaml-nomem: a sanitizer build cannot run under ulimit -v"
else
    scan_ok=1
    kib=16384
    while [ $kib -le 65536 ]; do
        (ulimit -v $kib && exec "$exe" plan "$big") >"$tmp/out" 2>"$tmp/err"
        got=$?
        if grep -q 'YAML syntax' "$tmp/err" ||
            { [ $got = 3 ] && ! grep -q 'out of memory$' "$tmp/err"; } ||
            { [ $got != 2 ] && [ $got != 3 ]; } || ! grep -qF "$big" "$tmp/err"; then
            bad "libyaml-nomem: under ulimit -v $kib: exit $got"
            scan_ok=0
            break
        fi
        kib=$((kib + 1024))
    done
    [ $scan_ok = 1 ] && ok "libyaml-nomem (ulimit -v 16 to 64 MiB)"
fi

# A calibration whose every point is skipped leaves the previous profile.
# (the runner and its CPU backend exist when they reach the --layers check)
# (a runner linked with cuBLAS maps more than the address-space limit used
# below just to start: that build skips this check; the sanitizer build,
# which has no CUDA, runs it through ASan's allocation limit)
runner="$(dirname "$exe")/../calib/memledger-calibrate"
if [ $asan = 0 ] && [ -x "$runner" ] && ldd "$runner" 2>/dev/null | grep -q cublas; then
    echo "skip calibrate-all-skipped: the runner links cuBLAS (checked in the sanitizer build)"
elif "$exe" calibrate --backend cpu --layers none-such 2>&1 | grep -q "unknown kind 'none-such'"; then
    mkdir "$tmp/cal"
    printf 'a measured profile\n' >"$tmp/cal/prev.yaml"
    cp "$tmp/cal/prev.yaml" "$tmp/prev.copy"
    set -- calibrate --backend cpu --points 4096x65536 --layers linear --hidden 64 --heads 4 \
        -o "$tmp/cal/prev.yaml"
    if [ $asan = 1 ]; then
        OPENBLAS_NUM_THREADS=1 \
            ASAN_OPTIONS="${ASAN_OPTIONS:-}:allocator_may_return_null=1:max_allocation_size=268435456" \
            "$exe" "$@" >"$tmp/out" 2>"$tmp/err"
    else
        (ulimit -v 600000 && OPENBLAS_NUM_THREADS=1 exec "$exe" "$@") >"$tmp/out" 2>"$tmp/err"
    fi
    got=$?
    if [ $got != 3 ]; then
        bad "calibrate-all-skipped: exit status $got, expected 3"
    elif ! grep -q 'no measured point' "$tmp/err"; then
        bad "calibrate-all-skipped: stderr lacks 'no measured point'"
    elif ! cmp -s "$tmp/cal/prev.yaml" "$tmp/prev.copy" || [ "$(ls "$tmp/cal")" != prev.yaml ]; then
        bad "calibrate-all-skipped: the previous file was changed or a temporary left"
    else
        ok "calibrate-all-skipped"
    fi
else
    echo "skip calibrate-all-skipped: the calibration runner was not built"
fi

echo "$pass passed, $fail failed"
[ $fail = 0 ]
