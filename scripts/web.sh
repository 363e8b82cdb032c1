#!/bin/sh
# Builds the web page into build-web/ (docs/web.md): libmemledger and libyaml
# compiled to WebAssembly with Emscripten (Debian's emscripten package),
# web/memledger_web.c over them, the page (web/), and the shipped models as
# presets. libyaml comes from Debian's source package (its pinned
# orig tarball from deb.debian.org, checked against its SHA-256). Open it
# with: python3 -m http.server -d build-web   (then http://localhost:8000/)
# Usage: sh scripts/web.sh [OUTDIR]   (default build-web)
set -eu
cd "$(dirname "$0")/.." || exit 1
out=${1:-build-web}
if ! command -v emcc >/dev/null 2>&1; then
    echo "memledger: scripts/web.sh needs Emscripten: apt-get install emscripten" >&2
    exit 1
fi
# Debian's emscripten runs its JavaScript tools with Debian's node modules
# (acorn), which a Node.js from elsewhere does not look for by itself
NODE_PATH=${NODE_PATH:-/usr/share/nodejs}
export NODE_PATH
deps="$out/.deps"
obj="$out/.obj"
mkdir -p "$deps" "$obj/yaml" "$obj/lib" "$out/inc/memledger"

# libyaml 0.2.5, Debian 12's (libyaml_0.2.5.orig.tar.gz of source package
# libyaml 0.2.5-1)
yaml_tar="$deps/libyaml_0.2.5.orig.tar.gz"
yaml_sha=fa240dbf262be053f3898006d502d514936c818e422afdcf33921c63bed9bf2e
if [ ! -f "$yaml_tar" ]; then
    curl -fsS -o "$yaml_tar.part" \
        http://deb.debian.org/debian/pool/main/liby/libyaml/libyaml_0.2.5.orig.tar.gz
    mv "$yaml_tar.part" "$yaml_tar"
fi
echo "$yaml_sha  $yaml_tar" | sha256sum -c --quiet - || {
    echo "memledger: $yaml_tar is not Debian's libyaml 0.2.5 (SHA-256 differs)" >&2
    rm -f "$yaml_tar"
    exit 1
}
yaml_src="$deps/libyaml-0.2.5"
[ -d "$yaml_src" ] || tar xzf "$yaml_tar" -C "$deps"

cflags="-O2 -std=c11 -D_POSIX_C_SOURCE=200809L"
# compile SRC OBJ FLAGS...: only when the source is newer than the object
compile() {
    src=$1
    o=$2
    shift 2
    if [ ! -f "$o" ] || [ "$src" -nt "$o" ]; then
        # shellcheck disable=SC2086
        emcc $cflags "$@" -c "$src" -o "$o"
    fi
}
for f in "$yaml_src"/src/*.c; do
    compile "$f" "$obj/yaml/$(basename "$f" .c).o" -I"$yaml_src/include" \
        -DYAML_VERSION_MAJOR=0 -DYAML_VERSION_MINOR=2 -DYAML_VERSION_PATCH=5 \
        '-DYAML_VERSION_STRING="0.2.5"'
done

# the library's sources: src/meson.build's lib_src, one list for both builds
version=$(sed -n "s/^project('memledger', 'c',.*version *: *'\([^']*\)'.*/\1/p" meson.build)
[ -n "$version" ] || version=$(sed -n "s/^ *version *: *'\([^']*\)'.*/\1/p" meson.build | head -1)
sed "s/@VERSION@/$version/" include/memledger/version.h.in > "$out/inc/memledger/version.h.new"
cmp -s "$out/inc/memledger/version.h.new" "$out/inc/memledger/version.h" ||
    mv "$out/inc/memledger/version.h.new" "$out/inc/memledger/version.h"
rm -f "$out/inc/memledger/version.h.new"
srcs=$(awk '/^lib_src = files\(/{on=1; next} on && /^\)/{on=0} on' src/meson.build |
    sed -n "s/^ *'\([^']*\.c\)',*$/src\/\1/p")
[ -n "$srcs" ] || { echo "memledger: no sources found in src/meson.build" >&2; exit 1; }
# two at a time (the machine's cores); each object named by its path
echo "$srcs" | tr ' ' '\n' | while read -r s; do
    [ -n "$s" ] && printf '%s %s\n' "$s" "$obj/lib/$(echo "$s" | tr / _).o"
done > "$obj/list"
CFLAGS_ALL="$cflags -DML_BUILDING -Wall -Wextra -Iinclude -Isrc -I$out/inc -I$yaml_src/include"
export CFLAGS_ALL
xargs -P "${WEB_JOBS:-2}" -n 2 sh -c '
    if [ ! -f "$2" ] || [ "$1" -nt "$2" ] || [ -n "$(find src include -name "*.h" -newer "$2" | head -1)" ]; then
        emcc $CFLAGS_ALL -c "$1" -o "$2" || exit 255
    fi' sh < "$obj/list"
emcc $cflags -Wall -Wextra -Iinclude -Isrc -I"$out/inc" -c web/memledger_web.c -o "$obj/web.o"
# shellcheck disable=SC2046
emcc -O2 "$obj/web.o" $(cut -d' ' -f2 "$obj/list") "$obj"/yaml/*.o -o "$out/memledger.js" \
    -sMODULARIZE=1 -sEXPORT_NAME=createMemledger -sALLOW_MEMORY_GROWTH=1 \
    -sENVIRONMENT=web -sEXPORTED_FUNCTIONS=_mlw_run,_mlw_free,_mlw_devices,_mlw_version \
    -sEXPORTED_RUNTIME_METHODS=ccall,UTF8ToString
cp web/index.html web/app.js web/style.css "$out/"
python3 scripts/web-presets.py models "$out/presets.js"
echo "memledger: the page is in $out/ ($(wc -c < "$out/memledger.wasm") bytes of WebAssembly);" \
    "open it with: python3 -m http.server -d $out"
