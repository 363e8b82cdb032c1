#!/usr/bin/env python3
"""The worked examples in the docs are real: every block that opens with
'$ memledger ...' (or '$ build/src/memledger ...') inside a code fence must be followed by exactly what that
command prints today. Run from the source root:

    examples.py MEMLEDGER_EXE DOC.md [DOC.md ...]

A block whose output is elided with a '...' line, or whose command names a
file the repository does not ship (the reader's own), is skipped."""
import difflib
import os
import shlex
import subprocess
import sys


def blocks(path):
    lines = open(path, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        cmd = lines[i]
        if (cmd.startswith("$ memledger ") or cmd.startswith("$ build/src/memledger ")) and \
                i > 0 and lines[i - 1].startswith("```"):
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            yield i + 1, lines[i][2:], lines[i + 1:j]
            i = j
        i += 1


def main():
    exe, docs = sys.argv[1], sys.argv[2:]
    fails = checked = 0
    for doc in docs:
        for line, cmd, want in blocks(doc):
            argv = [exe] + shlex.split(cmd)[1:]
            missing = [a for a in argv[1:] if a.endswith((".yaml", ".json", ".csv"))
                       and not a.startswith("-") and not os.path.exists(a)]
            if "..." in want or missing:
                print(f"skip {doc}:{line}: {cmd} ({'elided' if not missing else missing[0] + ' is the reader' + chr(39) + 's own'})")
                continue
            got = subprocess.run(argv, capture_output=True, text=True).stdout
            got = got.rstrip("\n").split("\n")
            checked += 1
            if got != want:
                fails += 1
                print(f"FAIL {doc}:{line}: {cmd}")
                print("\n".join(difflib.unified_diff(want, got, "doc", "now", lineterm="", n=1)))
            else:
                print(f"ok   {doc}:{line}: {cmd}")
    print(f"{checked - fails} passed, {fails} failed")
    if checked == 0:
        print("no examples found: the test would check nothing")
        return 1
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
