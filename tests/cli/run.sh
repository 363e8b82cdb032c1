#!/bin/sh
# Golden CLI cases: each folder under tests/cli/cases holds
#   args      the command line after 'memledger' (one line; @MODELS@ = models/)
#   status    the expected exit status
#   stdout    lines that must appear in standard output (fixed strings), optional
#   stderr    lines that must appear in standard error (fixed strings), optional
#   stdin     fed to the command, optional (a model file named -)
# Expected values are derived by hand in each case's README, never pasted
# from the program's output.
set -u
exe=$1
dir=$2
models=$3
pass=0
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for case in "$dir"/cases/*/; do
    name=$(basename "$case")
    args=$(sed "s|@MODELS@|$models|g; s|@CASE@|$case|g" "$case/args")
    want=$(cat "$case/status")
    # shellcheck disable=SC2086
    eval "\"$exe\" $args" >"$tmp/out" 2>"$tmp/err"
    got=$?
    ok=1
    if [ "$got" != "$want" ]; then
        echo "FAIL $name: exit status $got, expected $want"
        ok=0
    fi
    for stream in stdout stderr; do
        [ -f "$case/$stream" ] || continue
        f="$tmp/out"
        [ "$stream" = stderr ] && f="$tmp/err"
        while IFS= read -r line || [ -n "$line" ]; do
            [ -z "$line" ] && continue
            line=$(printf '%s' "$line" | sed "s|@MODELS@|$models|g; s|@CASE@|$case|g")
            if ! grep -qF -- "$line" "$f"; then
                echo "FAIL $name: $stream lacks: $line"
                ok=0
            fi
        done <"$case/$stream"
    done
    if [ $ok = 1 ]; then
        pass=$((pass + 1))
        echo "ok   $name"
    else
        fail=$((fail + 1))
        echo "--- stdout:"; head -c 3000 "$tmp/out"; echo "--- stderr:"; cat "$tmp/err"
    fi
done
echo "$pass passed, $fail failed"
[ $fail = 0 ]
