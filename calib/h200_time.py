#!/usr/bin/env python3
"""The per-op step-time model against the H200 campaign (docs/calibration-h200.md,
"Step time"; docs/time.md).

Usage: h200_time.py DIR MEMLEDGER [--fit | --datasheet]

Plans every run of DIR/results.jsonl again with MEMLEDGER on the H200 preset
(`--device h200`, the campaign's calibration profile of its precision: its
GEMM rates) and prints planned against measured step time as Markdown, with
the median and worst error per precision and the bound of every run.

The host's dispatch costs are the one part fitted on these runs: with --fit,
for each model the costs are fitted on the other models' runs (coordinate
descent on the mean |log(planned / measured)|) and that model's runs are
planned with them -- leave-one-model-out, so every error printed is a
held-out one. The fit on all runs, the way memledger's defaults were
fitted, is printed last. Without --fit, the runs are planned with memledger's own
defaults (which were fitted on all of them: not held-out). With --datasheet,
the runs are planned without the profiles: the datasheet estimate every
named device gets, whose errors here are the band the text report quotes.

No GPU is needed: the measurements are the campaign's records."""
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import types

here = os.path.dirname(os.path.abspath(__file__))
tvp = types.ModuleType("torch_vs_plan")
src = os.path.join(here, "torch_vs_plan.py")
exec(compile(open(src).read(), src, "exec"), tvp.__dict__)
CASES = {c[0]: c for c in tvp.CASES}
PROFILES = {False: os.path.join(here, "profiles", "h200-fp32.yaml"),
            True: os.path.join(here, "profiles", "h200-bf16.yaml")}
# the profile's host keys, microseconds, in the order fitted
KEYS = ("forward_op_us", "backward_op_us", "forward_block_us", "backward_block_us",
        "recompute_block_us", "step_call_us", "step_tensor_us")
START = (10.0, 6.0, 0.0, 0.0, 150.0, 20.0, 1.0)


def load(d):
    recs = [json.loads(l) for l in open(os.path.join(d, "results.jsonl"))]
    return [r for r in recs if "model" in r and "step_time_s" in r.get("measured", {})]


class Planner:
    def __init__(self, ml):
        self.ml, self.tmp, self.cache = ml, tempfile.mkdtemp(), {}
        self.datasheet = False

    def profile(self, amp, host):
        if host is None:
            return None if self.datasheet else PROFILES[amp]
        path = os.path.join(self.tmp, "p%d-%s.yaml" % (amp, "-".join("%g" % h for h in host)))
        if not os.path.exists(path):
            text = open(PROFILES[amp]).read()
            sec = "host:\n" + "".join("  %s: %g\n" % kv for kv in zip(KEYS, host))
            open(path, "w").write(text.replace("\nlayers:\n", "\n" + sec + "layers:\n", 1))
        return path

    def time(self, r, host=None):
        k = (tvp.key(r), host)
        if k not in self.cache:
            p = tvp.plan(self.ml, CASES[r["model"]], r["attn"], r["ckpt"], r["amp"], r["impl"],
                         self.profile(r["amp"], host), self.tmp,
                         extra=("--device", "h200", "--allocator", "none"))
            if "time" not in p:
                sys.exit("memledger failed on %s: %s" % (tvp.key(r), p.get("error")))
            self.cache[k] = p["time"]
        return self.cache[k]

    def close(self):
        shutil.rmtree(self.tmp)


def loss(pl, runs, host):
    return sum(abs(math.log(pl.time(r, host)["step_s"] / r["measured"]["step_time_s"]))
               for r in runs) / len(runs)


def fit(pl, runs):
    """Coordinate descent over the host keys from START, each step scaling
    one key by a factor (or setting a zero one), the factors shrinking."""
    h = list(START)
    best = loss(pl, runs, tuple(h))
    for f in (2.0, 1.5, 1.2, 1.1, 1.05):
        improved = True
        while improved:
            improved = False
            for i in range(len(h)):
                for cand in ((h[i] * f, h[i] / f) if h[i] > 0 else (5.0, 50.0, 500.0)):
                    t = list(h)
                    t[i] = round(cand, 2)
                    v = loss(pl, runs, tuple(t))
                    if v < best - 1e-9:
                        h, best, improved = t, v, True
    return tuple(h)


def err(r, t):
    m = r["measured"]["step_time_s"]
    return 100.0 * (t["step_s"] - m) / m


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    runs = load(sys.argv[1])
    pl = Planner(sys.argv[2])
    fitting = "--fit" in sys.argv[3:]
    pl.datasheet = "--datasheet" in sys.argv[3:] and not fitting
    host = {}
    if fitting:
        for m in sorted({r["model"] for r in runs}):
            host[m] = fit(pl, [r for r in runs if r["model"] != m])
    print("| model | B×T | attention | ckpt | precision | AdamW | measured s | planned s | "
          "error | bound | GPU s | host s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    errs = {False: [], True: []}
    for r in runs:
        t = pl.time(r, host.get(r["model"]))
        e = err(r, t)
        errs[r["amp"]].append(e)
        print(tvp.label(r) + " %.4f | %.4f | %+.1f %% | %s | %.4f | %.4f |" % (
            r["measured"]["step_time_s"], t["step_s"], e, t["bound"], t["gpu_s"], t["host_s"]))
    print()
    for amp in (False, True):
        a = [abs(e) for e in errs[amp]]
        print("- %s: median |error| %.1f %%, worst %.1f %% over %d runs%s." % (
            "bf16 autocast" if amp else "fp32", statistics.median(a), max(a), len(a),
            " (held out: each model's host costs fitted on the other models)" if fitting else
            " (datasheet estimate: no profile, the default host costs)" if pl.datasheet else
            " (memledger's default host costs)"))
    if fitting:
        print("\nHost costs (µs) fitted on all runs: " +
              ", ".join("%s %g" % kv for kv in zip(KEYS, fit(pl, runs))))
    pl.close()


if __name__ == "__main__":
    main()
