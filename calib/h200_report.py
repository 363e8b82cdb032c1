#!/usr/bin/env python3
"""Tables for docs/calibration-h200.md from the campaign's raw records
(calib/run-gpu.sh -> results*.jsonl): the planned-vs-measured table, the
error ranges per group, reserved over allocated with the default and the
expandable-segments allocator, and the loop that keeps the logits.

Usage: h200_report.py DIR [MEMLEDGER]   (DIR holds results.jsonl,
results-kept.jsonl, results-expandable.jsonl); prints Markdown. With a
memledger binary, also plans every run again with it (from the cases'
config keys; no GPU needed), lists the runs whose planned peak changed, and
counts the runs within 5 % of the measured peak now: what the planner
says today against the same measurements."""
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
sys.path.insert(0, here)
import campaign_state  # noqa: E402
CASES = {c[0]: c for c in tvp.CASES}
err = tvp.error_pct


def load(path):
    if not os.path.exists(path):
        return []
    recs = [json.loads(l) for l in open(path)]
    return [r for r in recs if "model" in r and "steady" in r["measured"]]


def peak_err(r, plan=None):
    return err((plan or r["plan"])["bytes"]["peak"], r["measured"]["steady"]["allocated"])


def step_errs(rs):
    return [err(r["plan"]["step_time_s"], r["measured"]["step_time_s"]) for r in rs
            if r["plan"].get("step_time_s")]


def group(r):
    """The groups the errors are reported by: the SDPA fp32 runs of the
    grouped-query models run PyTorch's math kernel (sdpa_probe.py), which the
    plan of the day counted as a fused kernel."""
    if r["attn"] == "sdpa" and not r["amp"] and tvp.grouped_heads(CASES[r["model"]]):
        return "SDPA, fp32, grouped-query heads (math kernel)"
    return "%s, checkpoint %s" % ("eager" if r["attn"] == "eager" else "SDPA (fused kernel)",
                                 "full" if r["ckpt"] else "none")


def span(v):
    return "%+.1f %% to %+.1f %%" % (min(v), max(v)) if v else "-"


def median(v):
    v = sorted(v)
    n = len(v)
    return (v[n // 2] + v[(n - 1) // 2]) / 2


def table(title, header):
    print("\n### %s\n" % title)
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))


def errors_by_group(base):
    table("Errors of the planned allocator peak against the measured steady-state "
          "`max_memory_allocated`, by group",
          ["group", "runs", "error range", "median abs. error", "step-time error range"])
    groups = {}
    for r in base:
        groups.setdefault(group(r), []).append(r)
    for g in sorted(groups):
        rs = groups[g]
        e = [peak_err(r) for r in rs]
        print("| %s | %d | %s | %.1f %% | %s |" % (g, len(rs), span(e),
                                                  median([abs(x) for x in e]),
                                                  span(step_errs(rs))))
    table("Step time by precision (plan: FLOPs at the profile's best GEMM rate)",
          ["precision", "runs", "error range", "median planned / measured"])
    for amp in (False, True):
        rs = [r for r in base if r["amp"] == amp and r["plan"].get("step_time_s")]
        ratio = [r["plan"]["step_time_s"] / r["measured"]["step_time_s"] for r in rs]
        print("| %s | %d | %s | %.2f |" % ("amp-bf16" if amp else "fp32", len(rs),
                                           span(step_errs(rs)), median(ratio)))


def reserved(base, exp):
    table("Reserved over allocated (steady state), default allocator and "
          "`expandable_segments:True`",
          ["model", "attention", "precision", "default: reserved / allocated - 1",
           "expandable: reserved / allocated - 1"])
    ex = {tvp.key(r): r for r in exp}
    excess = {"default": [], "expandable": []}
    for r in base:
        if r["ckpt"] or r["impl"] != "foreach":
            continue
        m = r["measured"]["steady"]
        d = m["reserved"] / m["allocated"] - 1
        excess["default"].append(d)
        x = ex.get(tvp.key(r))
        xs = "-"
        if x:
            xm = x["measured"]["steady"]
            excess["expandable"].append(xm["reserved"] / xm["allocated"] - 1)
            xs = "%.3f" % excess["expandable"][-1]
        print("| %s | %s | %s | %.3f | %s |" % (r["model"], r["attn"], tvp.precision(r), d, xs))
    print()
    for k, v in excess.items():
        if v:
            print("%s: %.1f %% to %.1f %%, median %.1f %% (%d runs)." % (
                k, 100 * min(v), 100 * max(v), 100 * median(v), len(v)))


def logits_kept(base, kept):
    table("The loop that keeps the logits to the end of the iteration",
          ["model", "attention", "precision", "first iteration: kept - released MiB",
           "steady: kept - released MiB"])
    rel = {tvp.key(r): r for r in base}
    for k in kept:
        b = rel.get(tvp.key(k))
        if not b:
            continue
        km, bm = k["measured"], b["measured"]
        print("| %s | %s | %s | %+.1f | %+.1f |" % (
            k["model"], k["attn"], tvp.precision(k),
            (km["first"]["allocated"] - bm["first"]["allocated"]) / MIB,
            (km["steady"]["allocated"] - bm["steady"]["allocated"]) / MIB))


def replan(ml, base):
    """Plans every run again with memledger ml; lists those whose planned
    peak changed, then counts the runs now within 5 % of the measured
    peak."""
    tmp = tempfile.mkdtemp()
    table("Planned again with this memledger (runs whose planned peak changed)",
          ["model", "B×T", "attention", "ckpt", "precision", "AdamW", "measured MiB",
           "planned then MiB", "error", "planned now MiB", "error"])
    calib = {False: os.path.join(here, "profiles", "h200-fp32.yaml"),
             True: os.path.join(here, "profiles", "h200-bf16.yaml")}
    now = []
    for r in base:
        p = tvp.plan(ml, CASES[r["model"]], r["attn"], r["ckpt"], r["amp"], r["impl"],
                     calib[r["amp"]], tmp)
        now.append(peak_err(r, p))
        if p["bytes"]["peak"] != r["plan"]["bytes"]["peak"]:
            print(tvp.label(r) + " %.1f | %.1f | %+.1f %% | %.1f | %+.1f %% |" % (
                r["measured"]["steady"]["allocated"] / MIB, r["plan"]["bytes"]["peak"] / MIB,
                peak_err(r), p["bytes"]["peak"] / MIB, now[-1]))
    shutil.rmtree(tmp)
    close = [e for e in now if abs(e) <= 5]
    print("\nPlanned now: %d of %d runs within 5 %% of the measured peak (%s); "
          "the others: %s." % (len(close), len(now), span(close),
        ", ".join("%+.1f %%" % e for e in now if abs(e) > 5) or "none"))


def three_peaks(ml, runs, title, logits):
    """Plans each run with an evaluation pass at its own shape and the
    given --logits; prints the first-iteration, steady and evaluation
    errors against the measured max_memory_allocated of each phase."""
    tmp = tempfile.mkdtemp()
    table(title, ["model", "B×T", "attention", "ckpt", "precision", "AdamW",
                  "first iteration", "steady", "evaluation"])
    calib = {False: os.path.join(here, "profiles", "h200-fp32.yaml"),
             True: os.path.join(here, "profiles", "h200-bf16.yaml")}
    errs = {"first_iteration": [], "steady": [], "eval": []}
    meas_key = {"first_iteration": "first", "steady": "steady", "eval": "eval"}
    for r in runs:
        case = CASES[r["model"]]
        p = tvp.plan(ml, case, r["attn"], r["ckpt"], r["amp"], r["impl"], calib[r["amp"]], tmp,
                     extra=("--logits", logits, "--eval-batch", str(case[4]),
                            "--eval-seq-len", str(case[3])))
        row = []
        for k in ("first_iteration", "steady", "eval"):
            e = err(p["peaks"][k], r["measured"][meas_key[k]]["allocated"])
            errs[k].append(e)
            row.append("%+.1f %%" % e)
        print(tvp.label(r) + " " + " | ".join(row) + " |")
    shutil.rmtree(tmp)
    print()
    for k, name in (("first_iteration", "first iteration"), ("steady", "steady state"),
                    ("eval", "evaluation")):
        v = errs[k]
        close = [e for e in v if abs(e) <= 5]
        print("- %s: %d of %d within 5 %% (%s); the others: %s." % (
            name, len(close), len(v), span(close),
            ", ".join("%+.1f %%" % e for e in v if abs(e) > 5) or "none"))
    print()


def reserved_planned(ml, runs, alloc, traces):
    """Plans each run with --allocator ALLOC (and its evaluation pass) and
    compares the simulated reserved peak with the measured
    max_memory_reserved over the run (first iteration, steady state and
    evaluation: the cache keeps its segments, so it is the steady value).
    The campaign measured its runs one after the other in one process: each
    run after the first is planned from the cache the first one left
    (--allocator-start, calib/campaign_state.py, from the first run's trace
    in the archive TRACES). Each run is also planned from an empty cache,
    as if its process's first, and those errors counted apart."""
    tmp = tempfile.mkdtemp()
    start = os.path.join(tmp, "start.csv")
    first_name, first_text = next(iter(campaign_state.read_traces(traces)))
    with open(start, "w") as f:
        f.write(campaign_state.state_trace(first_text, first_name)[0])
    calib = {False: os.path.join(here, "profiles", "h200-fp32.yaml"),
             True: os.path.join(here, "profiles", "h200-bf16.yaml")}
    errs, firsts, empty = [], [], []
    table("Reserved, planned now with --allocator %s (simulated on the plan's events; "
          "--logits through-backward, the campaign's loop; each run after the first from "
          "the cache the first left, --allocator-start)" % alloc,
          ["model", "B×T", "attention", "ckpt", "precision", "AdamW", "measured MiB",
           "planned MiB", "error", "first iteration: measured MiB", "planned MiB", "error",
           "from an empty cache: error"])
    # the runs give the device by its size (tvp.plan: 141GB); the H200 is
    # Hopper, sm90: PyTorch's cuBLAS workspace there is 32 MiB a handle
    # (docs/devices.md, "cuBLAS's workspace")
    for i, r in enumerate(runs):
        case = CASES[r["model"]]
        after = ("--allocator-start", start) if i else ()
        p = tvp.plan(ml, case, r["attn"], r["ckpt"], r["amp"], r["impl"], calib[r["amp"]], tmp,
                     extra=("--allocator", alloc, "--blas-workspace", "32MiB",
                            "--logits", "through-backward",
                            "--eval-batch", str(case[4]),
                            "--eval-seq-len", str(case[3])) + after)
        m = r["measured"]
        meas = max(m["first"]["reserved"], m["steady"]["reserved"], m["eval"]["reserved"])
        errs.append(err(p["reserved"]["peak"], meas))
        # the same run planned from an empty cache, as if it had been its
        # process's first (the campaign's were not)
        pe = p if not i else tvp.plan(ml, case, r["attn"], r["ckpt"], r["amp"], r["impl"],
                                      calib[r["amp"]], tmp, extra=(
                                          "--allocator", alloc, "--blas-workspace", "32MiB",
                                          "--logits", "through-backward",
                                          "--eval-batch", str(case[4]),
                                          "--eval-seq-len", str(case[3])))
        empty.append(err(pe["reserved"]["peak"], meas))
        # max_memory_reserved once the first iteration has ended: the plan's
        # running peak then (reserved.passes)
        first = p["reserved"]["passes"]["first_iteration"]
        firsts.append(err(first, m["first"]["reserved"]))
        print(tvp.label(r) + " %.1f | %.1f | %+.1f %% | %.1f | %.1f | %+.1f %% | %+.1f %% |" % (
            meas / MIB, p["reserved"]["peak"] / MIB, errs[-1], m["first"]["reserved"] / MIB,
            first / MIB, firsts[-1], empty[-1]))
    shutil.rmtree(tmp)
    close = [e for e in errs if abs(e) <= 5]
    srt = sorted(abs(e) for e in errs)
    print("\nReserved planned with --allocator %s: %d of %d runs within 5 %% (%s); "
          "all within %s; median |error| %.1f %%." % (
              alloc, len(close), len(errs), span(close), span(errs), srt[len(srt) // 2]))
    close = [e for e in firsts if abs(e) <= 5]
    print("After the first iteration: %d of %d within 5 %% (all within %s)." % (
        len(close), len(firsts), span(firsts)))
    close = [e for e in empty if abs(e) <= 5]
    srt = sorted(abs(e) for e in empty)
    print("Every run from an empty cache: %d of %d within 5 %% (all within %s; median "
          "|error| %.1f %%).\n" % (len(close), len(empty), span(empty), srt[len(srt) // 2]))


def main():
    d = sys.argv[1]
    base = load(os.path.join(d, "results.jsonl"))
    print("### Every configuration (steady state unless named)\n")
    print(tvp.HEADER, end="")
    for r in base:
        print(tvp.row(r))
    errors_by_group(base)
    reserved(base, load(os.path.join(d, "results-expandable.jsonl")))
    kept = load(os.path.join(d, "results-kept.jsonl"))
    if kept:
        logits_kept(base, kept)
    if len(sys.argv) > 2:
        replan(sys.argv[2], base)
        if kept:
            three_peaks(sys.argv[2], kept, "The three peaks, planned now with --logits kept: "
                        "the loop that keeps the output", "kept")
        three_peaks(sys.argv[2], base, "The three peaks, planned now with --logits "
                    "through-backward: the campaign's loop (output deleted between backward "
                    "and step)", "through-backward")
        reserved_planned(sys.argv[2], base, "caching", os.path.join(d, "traces.tar.gz"))
        expandable = load(os.path.join(d, "results-expandable.jsonl"))
        if expandable:
            reserved_planned(sys.argv[2], expandable, "expandable",
                             os.path.join(d, "traces-expandable.tar.gz"))


if __name__ == "__main__":
    main()
