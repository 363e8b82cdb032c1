#!/usr/bin/env python3
"""Tables for docs/calibration-h200.md from the campaign's raw records
(calib/run-gpu.sh -> results*.jsonl): the planned-vs-measured table, the
error ranges per group, reserved over allocated with the default and the
expandable-segments allocator, and the loop that keeps the logits.

Usage: h200_report.py DIR [MEMLEDGER]   (DIR holds results.jsonl,
results-kept.jsonl, results-expandable.jsonl); prints Markdown. With a
memledger binary, also plans every run again with it (from the cases'
config keys; no GPU needed) and lists the runs whose planned peak changed:
what the planner now says against the same measurements."""
import json
import os
import shutil
import sys
import tempfile
import types

MIB = 1 << 20
here = os.path.dirname(os.path.abspath(__file__))
tvp = types.ModuleType("torch_vs_plan")
src = os.path.join(here, "torch_vs_plan.py")
exec(compile(open(src).read(), src, "exec"), tvp.__dict__)


def load(path):
    if not os.path.exists(path):
        return []
    recs = [json.loads(l) for l in open(path)]
    return [r for r in recs if "model" in r and "steady" in r["measured"]]


def err(pred, meas):
    return 100.0 * (pred - meas) / meas


def gqa(r):
    return r["model"].startswith(("llama", "qwen2"))


def group(r):
    """The groups the errors are reported by: the SDPA fp32 runs of the GQA
    models dispatch to the math kernel (sdpa_probe.py), which the plan's
    SDPA inventory does not describe."""
    if r["attn"] == "sdpa" and not r["amp"] and gqa(r):
        return "SDPA, fp32, grouped-query heads (math kernel)"
    return "%s, checkpoint %s" % ("eager" if r["attn"] == "eager" else "SDPA (fused kernel)",
                                 "full" if r["ckpt"] else "none")


def span(v):
    return "%+.1f %% to %+.1f %%" % (min(v), max(v)) if v else "-"


def replan(ml, base):
    """The runs whose plan differs with this memledger: first checks that the
    cases' keys reproduce the recorded plan where nothing changed."""
    tmp = tempfile.mkdtemp()
    print("\n### Planned again with this memledger (runs whose planned peak changed)\n")
    print("| model | B×T | attention | ckpt | precision | AdamW | measured MiB | "
          "planned then MiB | error | planned now MiB | error |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    cases = {c[0]: c for c in tvp.CASES}
    calib = {False: os.path.join(here, "profiles", "h200-fp32.yaml"),
             True: os.path.join(here, "profiles", "h200-bf16.yaml")}
    same = 0
    for r in base:
        p = tvp.plan(ml, cases[r["model"]], r["attn"], r["ckpt"], r["amp"], r["impl"],
                     calib[r["amp"]], tmp)
        then, now = r["plan"]["bytes"]["peak"], p["bytes"]["peak"]
        meas = r["measured"]["steady"]["allocated"]
        if then == now:
            same += 1
            continue
        print(tvp.label(r) + " %.1f | %.1f | %+.1f %% | %.1f | %+.1f %% |" % (
            meas / MIB, then / MIB, err(then, meas), now / MIB, err(now, meas)))
    print("\n%d of %d runs plan the same peak as on the day." % (same, len(base)))
    shutil.rmtree(tmp)


def main():
    d = sys.argv[1]
    base = load(os.path.join(d, "results.jsonl"))
    kept = load(os.path.join(d, "results-kept.jsonl"))
    exp = load(os.path.join(d, "results-expandable.jsonl"))
    print("### Every configuration (steady state unless named)\n")
    print(tvp.HEADER, end="")
    for r in base:
        print(tvp.row(r))
    print("\n### Errors of the planned allocator peak against the measured steady-state "
          "`max_memory_allocated`, by group\n")
    print("| group | runs | error range | median abs. error | step-time error range |")
    print("|---|---|---|---|---|")
    groups = {}
    for r in base:
        groups.setdefault(group(r), []).append(r)
    for g in sorted(groups):
        rs = groups[g]
        e = sorted(err(r["plan"]["bytes"]["peak"], r["measured"]["steady"]["allocated"])
                   for r in rs)
        med = sorted(abs(x) for x in e)[len(e) // 2]
        t = [err(r["plan"]["step_time_s"], r["measured"]["step_time_s"]) for r in rs
             if r["plan"].get("step_time_s")]
        print("| %s | %d | %s | %.1f %% | %s |" % (g, len(rs), span(e), med, span(t)))
    print("\n### Step time by precision (plan: FLOPs at the profile's best GEMM rate)\n")
    print("| precision | runs | error range |")
    print("|---|---|---|")
    for amp in (False, True):
        t = [err(r["plan"]["step_time_s"], r["measured"]["step_time_s"]) for r in base
             if r["amp"] == amp and r["plan"].get("step_time_s")]
        print("| %s | %d | %s |" % ("amp-bf16" if amp else "fp32", len(t), span(t)))
    print("\n### Reserved over allocated (steady state), default allocator and "
          "`expandable_segments:True`\n")
    print("| model | attention | precision | default: reserved / allocated - 1 | "
          "expandable: reserved / allocated - 1 |")
    print("|---|---|---|---|---|")
    ex = {(r["index"]): r for r in exp}
    for r in base:
        if r["ckpt"] or r["impl"] != "foreach":
            continue
        i = tvp.configurations().index(next(c for c in tvp.configurations()
                                            if c[0][0] == r["model"] and c[1] == r["attn"]
                                            and c[2] == r["ckpt"] and c[3] == r["amp"]
                                            and c[4] == r["impl"]))
        m = r["measured"]["steady"]
        x = ex.get(i)
        xs = "%.3f" % (x["measured"]["steady"]["reserved"] /
                       x["measured"]["steady"]["allocated"] - 1) if x else "-"
        print("| %s | %s | %s | %.3f | %s |" % (r["model"], r["attn"],
                                               "amp-bf16" if r["amp"] else "fp32",
                                               m["reserved"] / m["allocated"] - 1, xs))
    if kept:
        print("\n### The loop that keeps the logits to the end of the iteration\n")
        print("| model | attention | precision | first iteration: kept - released MiB | "
              "steady: kept - released MiB |")
        print("|---|---|---|---|---|")
        rel = {(r["model"], r["attn"], r["ckpt"], r["amp"], r["impl"]): r for r in base}
        for k in kept:
            b = rel.get((k["model"], k["attn"], k["ckpt"], k["amp"], k["impl"]))
            if not b:
                continue
            km, bm = k["measured"], b["measured"]
            print("| %s | %s | %s | %+.1f | %+.1f |" % (
                k["model"], k["attn"], "amp-bf16" if k["amp"] else "fp32",
                (km["first"]["allocated"] - bm["first"]["allocated"]) / MIB,
                (km["steady"]["allocated"] - bm["steady"]["allocated"]) / MIB))


    if len(sys.argv) > 2:
        replan(sys.argv[2], base)


if __name__ == "__main__":
    main()
