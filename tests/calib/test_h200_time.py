#!/usr/bin/env python3
"""The per-op step time against the committed H200 campaign (docs/time.md):
calib/h200_time.py plans the 60 runs with memledger's defaults and this
test holds the errors it prints, so a change that moves the model away from
the measurements fails the build. The bounds are the targets (fp32: median
within 5 %, worst within 10 %; bf16: median within 15 %) and, for bf16's
worst run, which has no target, 40 % (35 % today with the defaults, 39.7 %
held out). It also checks that the band the text report prints beside a
datasheet estimate is what calib/h200_time.py --datasheet measures.

Usage: test_h200_time.py H200_TIME_PY RESULTS_DIR MEMLEDGER"""
import os
import re
import subprocess
import sys


def main():
    script, results, ml = sys.argv[1:4]
    out = subprocess.run([sys.executable, script, results, ml], capture_output=True, text=True)
    if out.returncode:
        sys.exit("h200_time.py failed: %s" % out.stderr)
    rows = [l for l in out.stdout.splitlines() if l.startswith("| ") and not l.startswith("| model")]
    if len(rows) != 60:
        sys.exit("expected 60 runs in the table, found %d" % len(rows))
    summary = {k: (float(a), float(b)) for k, a, b in re.findall(
        r"^- (fp32|bf16 autocast): median \|error\| ([0-9.]+) %, worst ([0-9.]+) %",
        out.stdout, re.M)}
    bounds = {"fp32": (5.0, 10.0), "bf16 autocast": (15.0, 40.0)}
    bad = []
    for k, (med, worst) in bounds.items():
        if k not in summary:
            sys.exit("no summary line for %s in:\n%s" % (k, out.stdout[-2000:]))
        m, w = summary[k]
        print("%s: median %.1f %% (bound %.1f), worst %.1f %% (bound %.1f)" % (k, m, med, w, worst))
        if m > med or w > worst:
            bad.append(k)
    # every run has a bound and a positive planned time
    for l in rows:
        cells = [c.strip() for c in l.strip("|").split("|")]
        if cells[9] not in ("gpu", "host") or not float(cells[7]) > 0:
            bad.append("row: " + l)
    # the band the text report prints beside a datasheet estimate (fp32 and
    # bf16 plans on a named device) is what --datasheet measures
    out = subprocess.run([sys.executable, script, results, ml, "--datasheet"], capture_output=True,
                         text=True)
    ds = {k: (float(a), float(b)) for k, a, b in re.findall(
        r"^- (fp32|bf16 autocast): median \|error\| ([0-9.]+) %, worst ([0-9.]+) %",
        out.stdout, re.M)}
    model = os.path.join(os.path.dirname(os.path.abspath(script)), "..", "models",
                         "gpt2-small.yaml")
    for k, precision in (("fp32", "fp32"), ("bf16 autocast", "amp-bf16")):
        text = subprocess.run([ml, "plan", model, "--device", "h200", "--precision", precision],
                              capture_output=True, text=True).stdout
        m = re.search(r"datasheet estimate: within a median ([0-9.]+) % \(worst ([0-9.]+) %\)",
                      text)
        printed = (float(m.group(1)), float(m.group(2))) if m else None
        print("datasheet %s: measured %s, printed %s" % (k, ds.get(k), printed))
        if not printed or k not in ds or any(abs(x - y) > 0.05 for x, y in zip(ds[k], printed)):
            bad.append("datasheet band " + k)
    if bad:
        sys.exit("outside the bounds: %s" % ", ".join(bad))


if __name__ == "__main__":
    main()
