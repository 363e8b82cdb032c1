#!/usr/bin/env python3
"""Every global symbol of the static library is API or internal by its name.

usage: symbols.py LIBMEMLEDGER.a INCLUDE_DIR [INCLUDE_DIR...]

A symbol the library defines (nm -g --defined-only) is either named in a
public header under include/memledger/ (ml_ with one underscore) or has the
internal prefix ml__ (libuv's uv__ convention: shared between the library's
files, not exported). Anything else is a name a program linking the static
library could collide with or mistake for API: listed, and the test fails.
"""
import os
import re
import subprocess
import sys


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    lib, dirs = sys.argv[1], sys.argv[2:]
    public = set()
    for d in dirs:
        for root, _, files in os.walk(d):
            for f in files:
                if f.endswith(".h"):
                    with open(os.path.join(root, f)) as fh:
                        public.update(re.findall(r"\bml_[A-Za-z0-9_]+\b", fh.read()))
    out = subprocess.run(["nm", "-g", "--defined-only", lib], capture_output=True, text=True,
                         check=True).stdout
    syms = set()
    for line in out.splitlines():
        parts = line.split()
        # names the compiler or a sanitizer makes (__odr_asan.*, __asan_*,
        # __sancov_*) are not the library's
        if len(parts) == 3 and parts[1] in "TDBRCGSV" and not parts[2].startswith("__"):
            syms.add(parts[2])
    bad = sorted(s for s in syms if s not in public and not s.startswith("ml__"))
    exported = sorted(s for s in syms if s in public)
    internal = sorted(s for s in syms if s.startswith("ml__"))
    for s in bad:
        print("FAIL %s: neither in a public header nor ml__-prefixed" % s)
    print("%d public, %d internal (ml__), %d other" % (len(exported), len(internal), len(bad)))
    if not exported or not internal:
        print("FAIL no symbols read from %s" % lib)
        return 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
