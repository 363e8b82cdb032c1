#!/bin/sh
# The Python package as a user installs it: `pip install .` from a
# read-only copy of this checkout (its tracked and unignored files: a shared
# or read-only checkout must be left as it was, so the build happens in a
# temporary directory, and the copy is compared before and after) into a
# throwaway virtual environment (Debian's python3 is
# externally managed, PEP 668: nothing goes into the system's
# site-packages), then its tests (python/tests/, Debian's python3-pytest,
# seen through --system-site-packages) against the installed copy, run from
# outside the checkout so that `import memledger` cannot find python/.
# The build backend needs only the standard library (pyproject.toml), so
# pip fetches nothing. MEMLEDGER_CLI=path also compares with that binary.
set -eu
cd "$(dirname "$0")/.."
root=$PWD
py=/usr/bin/python3
[ -x "$py" ] || py=python3
work=$(mktemp -d)
trap 'chmod -R u+w "$work"; rm -rf "$work"' EXIT INT TERM
src=$work/src
mkdir "$src"
if git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git -C "$root" ls-files -z -co --exclude-standard | (cd "$root" && tar --null -T - -cf -) |
        tar -xf - -C "$src"
else
    cp -a "$root/." "$src"
fi
chmod -R a-w "$src"
snapshot() { (cd "$src" && find . -print0 | sort -z | xargs -0 ls -ld --time-style=+%s.%N); }
snapshot >"$work/before"
"$py" -m venv --system-site-packages "$work/venv"
"$work/venv/bin/python" -m pip install --no-index --quiet --disable-pip-version-check "$src"
snapshot >"$work/after"
if ! cmp -s "$work/before" "$work/after"; then
    echo "python-test: pip install changed the checkout it installed from:" >&2
    diff "$work/before" "$work/after" >&2
    exit 1
fi
cd "$work"
# the verbs run through the command line run the executable the wheel carries
unset MEMLEDGER_EXECUTABLE
"$work/venv/bin/python" -c "
import os, memledger, memledger._cli as c
print('memledger', memledger.__version__, 'from', memledger.__file__)
assert c.executable() == os.path.join(os.path.dirname(memledger.__file__), '_lib', 'memledger')"
PYTHONDONTWRITEBYTECODE=1 "$work/venv/bin/python" -m pytest -q -p no:cacheprovider "$root/python/tests"
