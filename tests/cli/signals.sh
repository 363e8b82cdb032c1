#!/bin/sh
# An output interrupted mid-write (SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2,
# SIGALRM, SIGPIPE) leaves the previous file intact and no temporary behind;
# the exit status says it was killed. A signal ignored by the caller (nohup)
# stays ignored, and a file over RLIMIT_FSIZE (SIGXFSZ) is an output failure.
set -u
exe=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/big.yaml" <<'YAML'
name: big
model:
  type: decoder
  layers: 30000
  hidden: 64
  heads: 4
  vocab: 100
  position: none
training:
  micro_batch: 1
  seq_len: 16
YAML
pass=0
fail=0
for sig in TERM INT HUP USR1 USR2 ALRM PIPE; do
    caught=0
    for attempt in 1 2 3 4 5 6 7 8 9 10; do
        echo OLD >"$tmp/out.csv"
        # a background job of a non-interactive shell starts with SIGINT
        # ignored, and an ignored signal stays ignored: restore the default
        # (the allocated view: the write, not the allocator simulation, is
        # what this times)
        env --default-signal="$sig" "$exe" timeline "$tmp/big.yaml" --allocator none \
            -o "$tmp/out.csv" &
        pid=$!
        # wait until the temporary file exists: the write has begun
        i=0
        while [ $i -lt 400 ] && ! ls "$tmp"/out.csv.tmp.* >/dev/null 2>&1; do
            sleep 0.01
            i=$((i + 1))
        done
        if ls "$tmp"/out.csv.tmp.* >/dev/null 2>&1; then
            kill -s "$sig" "$pid"
            wait "$pid"
            rc=$?
            caught=1
            break
        fi
        wait "$pid"
    done
    if [ $caught = 0 ]; then
        echo "FAIL SIG$sig: never caught the write in progress"
        fail=$((fail + 1))
        continue
    fi
    if [ "$(cat "$tmp/out.csv")" = OLD ] && ! ls "$tmp"/out.csv.tmp.* >/dev/null 2>&1 &&
        [ "$rc" -gt 128 ]; then
        echo "ok   SIG$sig mid-write: previous file intact, no temporary left, exit $rc"
        pass=$((pass + 1))
    else
        echo "FAIL SIG$sig: exit $rc, file now $(head -c 60 "$tmp/out.csv"), temporaries: $(ls "$tmp")"
        fail=$((fail + 1))
    fi
done
# the calibration runner interrupted while it measures: the previous profile stays
if [ -n "${2:-}" ]; then
    echo OLD >"$tmp/prof.yaml"
    "$exe" calibrate --backend cpu --points 8x256,8x512,8x1024 --layers transformer_block \
        -o "$tmp/prof.yaml" 2>/dev/null &
    pid=$!
    sleep 0.3
    kill -s TERM "$pid" 2>/dev/null
    wait "$pid"
    rc=$?
    if [ "$(cat "$tmp/prof.yaml")" = OLD ] && ! ls "$tmp"/prof.yaml.tmp.* >/dev/null 2>&1 &&
        [ "$rc" -gt 128 ]; then
        echo "ok   SIGTERM during calibrate -o: previous profile intact, exit $rc"
        pass=$((pass + 1))
    else
        echo "FAIL SIGTERM during calibrate -o: exit $rc, file $(head -c 40 "$tmp/prof.yaml")"
        fail=$((fail + 1))
    fi
fi
# SIGHUP ignored at the start (nohup, a scheduler): the run survives it and
# completes the write
caught=0
for attempt in 1 2 3 4 5 6 7 8 9 10; do
    echo OLD >"$tmp/out.csv"
    (trap '' HUP && exec "$exe" timeline "$tmp/big.yaml" --allocator none -o "$tmp/out.csv") &
    pid=$!
    i=0
    while [ $i -lt 400 ] && ! ls "$tmp"/out.csv.tmp.* >/dev/null 2>&1; do
        sleep 0.01
        i=$((i + 1))
    done
    if ls "$tmp"/out.csv.tmp.* >/dev/null 2>&1; then
        kill -s HUP "$pid"
        wait "$pid"
        rc=$?
        caught=1
        break
    fi
    wait "$pid"
done
if [ $caught = 1 ] && [ "$rc" = 0 ] && head -1 "$tmp/out.csv" | grep -q '^index,' &&
    ! ls "$tmp"/out.csv.tmp.* >/dev/null 2>&1; then
    echo "ok   SIGHUP ignored at the start stays ignored: the write completes"
    pass=$((pass + 1))
else
    echo "FAIL SIGHUP ignored at the start: caught $caught, exit $rc, file $(head -c 40 "$tmp/out.csv")"
    fail=$((fail + 1))
fi
# a file-size limit (ulimit -f, 512-byte blocks) under the timeline's size:
# SIGXFSZ must not kill the run and leave the temporary; the write fails
echo OLD >"$tmp/out.csv"
(ulimit -f 64 && exec "$exe" timeline "$tmp/big.yaml" --allocator none -o "$tmp/out.csv") 2>"$tmp/err"
rc=$?
if [ "$rc" = 3 ] && [ "$(cat "$tmp/out.csv")" = OLD ] && grep -q 'File too large' "$tmp/err" &&
    ! ls "$tmp"/out.csv.tmp.* >/dev/null 2>&1; then
    echo "ok   past RLIMIT_FSIZE: exit 3, 'File too large', previous file intact, no temporary"
    pass=$((pass + 1))
else
    echo "FAIL RLIMIT_FSIZE: exit $rc, file $(head -c 40 "$tmp/out.csv"), $(cat "$tmp/err"), $(ls "$tmp")"
    fail=$((fail + 1))
fi
# a completed write replaces the file whole
echo OLD >"$tmp/out.csv"
if "$exe" timeline "$tmp/big.yaml" --allocator none -o "$tmp/out.csv" && head -1 "$tmp/out.csv" | grep -q '^index,' &&
    ! ls "$tmp"/out.csv.tmp.* >/dev/null 2>&1; then
    echo "ok   a completed write replaces the file"
    pass=$((pass + 1))
else
    echo "FAIL the completed write"
    fail=$((fail + 1))
fi
echo "$pass passed, $fail failed"
[ $fail = 0 ]
