#!/usr/bin/env python3
"""Checks that includes under src/ point down the layers:
util, alloc < model < profile < graph, ledger < plan < report < cli, with each
public header (include/memledger/) at the layer that defines it.

usage: layers.py SRC_DIR      (exit 1 and one line per violation)
       layers.py --self-test  (a made-up tree with one violation must fail)
"""
import os
import re
import sys
import tempfile

RANK = {"util": 0, "alloc": 0, "model": 1, "profile": 2, "graph": 3, "ledger": 3, "plan": 4,
        "report": 5, "cli": 6}
PUBLIC = {"error.h": 0, "export.h": 0, "model.h": 1, "calib.h": 2, "ledger.h": 3,
          "plan.h": 4, "lengths.h": 4, "report.h": 5, "json.h": 5, "memledger.h": 6, "version.h": 0}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def rank_of_header(name):
    top, _, rest = name.partition("/")
    if top == "memledger":
        return PUBLIC.get(rest)
    return RANK.get(top)


def check(src):
    bad = []
    for dirpath, _, files in os.walk(src):
        layer = os.path.relpath(dirpath, src).split(os.sep)[0]
        if layer not in RANK:
            continue
        for f in sorted(files):
            if not f.endswith((".c", ".h")):
                continue
            path = os.path.join(dirpath, f)
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
            for m in INCLUDE.finditer(text):
                r = rank_of_header(m.group(1))
                line = text.count("\n", 0, m.start()) + 1
                if r is None:
                    bad.append("%s:%d: includes \"%s\", which belongs to no known layer"
                               % (path, line, m.group(1)))
                elif r > RANK[layer]:
                    bad.append("%s:%d: %s includes \"%s\" from a higher layer"
                               % (path, line, layer, m.group(1)))
    return bad


def self_test():
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(os.path.join(d, "ledger"))
        os.makedirs(os.path.join(d, "report"))
        with open(os.path.join(d, "report", "ok.c"), "w") as f:
            f.write('#include "ledger/chain.h"\n#include "memledger/report.h"\n')
        if check(d):
            return "a downward include was reported"
        with open(os.path.join(d, "ledger", "up.c"), "w") as f:
            f.write('#include "util/grow.h"\n#include "memledger/report.h"\n')
        found = check(d)
        if len(found) != 1 or "up.c:2:" not in found[0]:
            return "the upward include in ledger/up.c was not reported exactly once: %r" % found
    return None


def main():
    if sys.argv[1:] == ["--self-test"]:
        why = self_test()
        if why:
            print("self-test failed:", why)
            return 1
        return 0
    bad = check(sys.argv[1])
    for b in bad:
        print(b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
