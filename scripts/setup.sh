#!/bin/sh
# One command on a fresh Debian machine: install the build dependencies, build
# memledger, and plan a shipped model (GPT-2 small on a 24 GiB device).
set -eu
cd "$(dirname "$0")/.."
sh scripts/deps.sh
[ -f build/build.ninja ] || meson setup build --buildtype=release >/dev/null
ninja -C build >/dev/null
./build/src/memledger plan "${1:-models/gpt2-small.yaml}"
