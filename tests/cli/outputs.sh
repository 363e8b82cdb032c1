#!/bin/sh
# Inputs and outputs that are not plain files in a plain folder: a FIFO as
# the model, the replaced file's permissions and the umask, symbolic links
# (to a file, dangling, to standard output), names near NAME_MAX, an -o that
# names the input, and --emit when nothing fits. Each check states what it
# expects; none may hang (each run has a time limit).
set -u
exe=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1
pass=0
fail=0
check() { # name, then a command that succeeds when the expectation holds
    name=$1
    shift
    if "$@"; then
        echo "ok   $name"
        pass=$((pass + 1))
    else
        echo "FAIL $name"
        fail=$((fail + 1))
    fi
}
no_tmp() { ! ls -a | grep -q '\.tmp\.'; }
cat >m.yaml <<'YAML'
name: m
model:
  type: sequential
  input: [4]
  layers:
    - linear: {out: 2}
  loss: mse
YAML

# 4. A bad model read from a FIFO: the error must not re-open it to show the
# line (that open blocks for ever with no writer left).
mkfifo fifo
printf 'model:\n  type: decoder\n  layers: 2\n' >fifo &
timeout 10 "$exe" plan fifo >out 2>err
rc=$?
wait
check "FIFO input with an error: exit 2, no hang (got $rc)" \
    sh -c "[ $rc = 2 ] && grep -q 'fifo:2:3' err"

# 6. Permissions: a replaced file keeps its mode; a new one gets 0666 & ~umask.
echo OLD >p600
chmod 600 p600
"$exe" plan m.yaml -o p600 >/dev/null
check "a 0600 file is replaced and stays 0600 (got $(stat -c %a p600))" \
    sh -c '[ "$(stat -c %a p600)" = 600 ] && grep -q "memledger plan" p600'
(umask 027 && "$exe" plan m.yaml -o new027)
check "a new file under umask 027 is 0640 (got $(stat -c %a new027))" \
    sh -c '[ "$(stat -c %a new027)" = 640 ]'
(umask 002 && "$exe" plan m.yaml -o new002)
check "a new file under umask 002 is 0664 (got $(stat -c %a new002))" \
    sh -c '[ "$(stat -c %a new002)" = 664 ]'

# 7. Symbolic links: the link stays, its target gets the report.
echo OLD >real.txt
ln -s real.txt link.txt
"$exe" plan m.yaml -o link.txt
check "-o a link to a file: the link stays a link, the file is replaced" \
    sh -c '[ -L link.txt ] && grep -q "memledger plan" real.txt'
ln -s missing.txt dangling
"$exe" plan m.yaml -o dangling
check "-o a dangling link: its target is created, the link stays" \
    sh -c '[ -L dangling ] && grep -q "memledger plan" missing.txt'
# a link to standard output (as /dev/stdout is) writes to standard output,
# in place: stdout opened with >> keeps what was there
ln -s /proc/self/fd/1 so
echo PREVIOUS >app.txt
"$exe" plan m.yaml -o so >>app.txt
check "-o a link to /proc/self/fd/1 with >>: appended, link kept" \
    sh -c '[ -L so ] && [ "$(head -1 app.txt)" = PREVIOUS ] && grep -q "memledger plan" app.txt'
echo PREVIOUS >app2.txt
"$exe" plan m.yaml -o /dev/stdout >>app2.txt
check "-o /dev/stdout with >>: appended to the file" \
    sh -c '[ "$(head -1 app2.txt)" = PREVIOUS ] && grep -q "memledger plan" app2.txt'
"$exe" plan m.yaml -o /dev/stdout | cat >piped.txt
check "-o /dev/stdout into a pipe" grep -q "memledger plan" piped.txt
check "no temporary left by the link cases" no_tmp

# 9. Names of 245..255 bytes (NAME_MAX): the temporary's suffix must not
# push its name past the limit.
for n in 245 250 255; do
    name=$(printf "%${n}s" '' | tr ' ' a)
    "$exe" plan m.yaml -o "$name" 2>err
    check "an output name of $n bytes is written (exit $?)" \
        sh -c "[ -f '$name' ] && grep -q 'memledger plan' '$name' && ! ls -a | grep -q '\.tmp\.'"
    rm -f "$name"
done

# 16. -o naming the input, under another name (a hard link): refused, exit 2,
# the input intact.
cp m.yaml in.yaml
ln in.yaml same.yaml
"$exe" plan in.yaml -o same.yaml 2>err
rc=$?
check "-o the input through a hard link: exit 2 (got $rc), input intact" \
    sh -c "[ $rc = 2 ] && cmp -s m.yaml in.yaml && grep -q 'is the input file' err"

# 16b. -o naming the --lengths file (plan, fit, triage): refused, exit 2,
# the lengths intact.
printf 'length,count\n100,5\n200,1\n' >len.csv
cp len.csv len0.csv
for verb in plan fit triage; do
    set -- --lengths len.csv -o len.csv
    [ $verb = fit ] && set -- "$@" --max-tokens auto
    [ $verb = triage ] && set -- "$@" --device 8GiB
    "$exe" $verb m.yaml "$@" 2>err
    rc=$?
    check "$verb -o the --lengths file: exit 2 (got $rc), lengths intact" \
        sh -c "[ $rc = 2 ] && cmp -s len0.csv len.csv && grep -q 'is the input file' err"
done

# 13. --emit with -o when nothing fits: the previous file stays, exit 1.
echo '{"previous": true}' >ds.json
cat >huge.yaml <<'YAML'
name: huge
model: {type: decoder, layers: 32, hidden: 4096, heads: 32, vocab: 32000, position: rope}
training: {micro_batch: 1, seq_len: 4096, precision: bf16-master}
device: {memory: 8GiB}
YAML
"$exe" fit huge.yaml --emit deepspeed -o ds.json 2>err
rc=$?
check "fit --emit -o with nothing that fits: exit 1 (got $rc), file untouched" \
    sh -c "[ $rc = 1 ] && [ \"\$(cat ds.json)\" = '{\"previous\": true}' ] && grep -q 'nothing written' err"

# 14. plan --emit with -o when the plan does not fit: the same, exit 1.
"$exe" plan huge.yaml --emit deepspeed -o ds.json 2>err
rc=$?
check "plan --emit -o with a plan that does not fit: exit 1 (got $rc), file untouched" \
    sh -c "[ $rc = 1 ] && [ \"\$(cat ds.json)\" = '{\"previous\": true}' ] && grep -q 'nothing written' err"

# 15. fit with nothing that fits: the reason once on stdout, once on stderr.
"$exe" fit huge.yaml >out 2>err
rc=$?
check "fit with nothing that fits: exit 1 (got $rc), the reason once on each stream" \
    sh -c "[ $rc = 1 ] && [ \$(grep -c 'DOES NOT FIT' out) = 1 ] && [ \$(wc -l <err) = 1 ] && grep -q 'model states alone' err"
check "no temporary left at the end" no_tmp

echo "$pass passed, $fail failed"
[ $fail = 0 ]
