#!/bin/sh
# Installs what memledger needs to build and test on Debian 12 (python3-torch:
# the PyTorch cross-check, tests/torch/; xmllint, rsvg-convert, chromium: the
# rendering tests, tests/render/; clang and its runtime: the libFuzzer targets;
# OpenBLAS: the calibration runner's CPU backend; python3-pytest and
# python3-venv: the Python package's tests, scripts/python-test.sh;
# emscripten and curl: the web page, scripts/web.sh).
# Idempotent: apt-get runs only when a package is missing.
set -eu
pkgs="meson ninja-build pkg-config gcc libc6-dev libyaml-dev libcmocka-dev python3-torch python3-yaml
libxml2-utils librsvg2-bin chromium fonts-dejavu-core clang libclang-rt-14-dev
libopenblas-dev python3-pytest python3-venv emscripten curl"
missing=""
for p in $pkgs; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done
[ -z "$missing" ] && exit 0
echo "memledger: installing:$missing" >&2
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"
$SUDO apt-get update -qq
# shellcheck disable=SC2086
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
