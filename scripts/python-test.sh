#!/bin/sh
# The Python package as a user installs it: `pip install .` from this
# checkout into a throwaway virtual environment (Debian's python3 is
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
trap 'rm -rf "$work"' EXIT INT TERM
"$py" -m venv --system-site-packages "$work/venv"
"$work/venv/bin/python" -m pip install --no-index --quiet --disable-pip-version-check "$root"
cd "$work"
"$work/venv/bin/python" -c "import memledger; print('memledger', memledger.__version__, 'from', memledger.__file__)"
PYTHONDONTWRITEBYTECODE=1 "$work/venv/bin/python" -m pytest -q -p no:cacheprovider "$root/python/tests"
