#!/usr/bin/env python3
"""The committed H200 campaign planned again (calib/h200_report.py, no GPU):
this test holds today's counts of runs within 5 % of the measured peaks, so a
change that moves the planner away from the measurements fails the build
(docs/calibration-h200.md): the steady, first-iteration and evaluation
allocated peaks 60 of 60, reserved with the simulated caching allocator 55
of 60 (today's count, not the target; every run within 12 %), with
expandable segments 24 of 24 (every run within 5 %); and the reserved bytes
once the first iteration has ended, 59 of 60 and 24 of 24; every run
planned from an empty cache instead, 51 of 60 and 24 of 24. (The count
went from 53 to 55, and the span from 14 % to 12 %, when the rotary's cos
and sin became two tensors of one row for the batch, freed at the first
layer's last rotary products, as the H200 trace of Llama-0.2B and the
CPU oracle show them, and a checkpoint's position ids and mask two
tensors: the checkpointed Qwen2-0.5B eager fp32 run from +13.5 to +0.1 %,
Llama-0.2B eager fp32 from -8.9 to +0.0 %; docs/allocator.md names the
gaps.) The reserved runs
after each campaign's first are planned from the cache the first run left in
the process (--allocator-start, calib/campaign_state.py), as they were
measured.

Usage: test_h200_report.py H200_REPORT_PY RESULTS_DIR MEMLEDGER"""
import re
import subprocess
import sys


def section(text, title):
    """The text of the section whose heading starts with title."""
    i = text.find("### " + title)
    if i < 0:
        sys.exit("no section %r in the report" % title)
    j = text.find("\n### ", i + 4)
    return text[i:j if j >= 0 else len(text)]


def count(text, what):
    m = re.search(r"- %s: (\d+) of (\d+) within 5 %%" % re.escape(what), text)
    if not m:
        sys.exit("no count for %r in:\n%s" % (what, text[-1500:]))
    return int(m.group(1)), int(m.group(2))


def main():
    script, results, ml = sys.argv[1:4]
    out = subprocess.run([sys.executable, script, results, ml], capture_output=True, text=True)
    if out.returncode:
        sys.exit("h200_report.py failed: %s" % out.stderr)
    text = out.stdout
    loop = section(text, "The three peaks, planned now with --logits through-backward")
    want = {"first iteration": (60, 60), "steady state": (60, 60), "evaluation": (60, 60)}
    bad = []
    for what, (least, runs) in want.items():
        got, n = count(loop, what)
        print("%s: %d of %d within 5 %% (at least %d)" % (what, got, n, least))
        if n != runs or got < least:
            bad.append(what)
    for alloc, least, runs, span in (("caching", 55, 60, 12.0), ("expandable", 24, 24, 5.0)):
        m = re.search(r"Reserved planned with --allocator %s: (\d+) of (\d+) runs within 5 %% "
                      r"\([^)]*\); all within ([-+0-9.]+) %% to ([-+0-9.]+) %%" % alloc, text)
        if not m:
            sys.exit("no reserved count for %s" % alloc)
        got, n, lo, hi = int(m.group(1)), int(m.group(2)), float(m.group(3)), float(m.group(4))
        print("reserved %s: %d of %d within 5 %% (at least %d), all within %+.1f %% to %+.1f %%"
              % (alloc, got, n, least, lo, hi))
        if n != runs or got < least or max(-lo, hi) > span:
            bad.append("reserved " + alloc)
    # the reserved bytes once the first iteration has ended (reserved.passes),
    # and every run planned from an empty cache, as if its process's first
    for what, line, floors in (
            ("after the first iteration", "After the first iteration", ((59, 60), (24, 24))),
            ("from an empty cache", "Every run from an empty cache", ((51, 60), (24, 24)))):
        found = re.findall(line + r": (\d+) of (\d+) within 5 %", text)
        for (got, n), (least, runs) in zip(found, floors):
            print("reserved %s: %s of %s within 5 %% (at least %d)" % (what, got, n, least))
            if int(n) != runs or int(got) < least:
                bad.append("reserved " + what)
        if len(found) != 2:
            bad.append("no counts " + what)
    if bad:
        sys.exit("below today's counts: %s" % ", ".join(bad))


if __name__ == "__main__":
    main()
