#!/usr/bin/env python3
"""The allocator simulation's tensors against a real run's, pass by pass.

    sim_diff.py --campaign DIR --memledger MEMLEDGER [-n N] [--pass P]
    sim_diff.py --sim PLAN.csv --trace TRACE.csv --marks MARKS [-n N] [--pass P]

PLAN.csv is `memledger timeline ... --format trace`: every tensor the
simulation allocates and frees, a `#` line starting each pass (the
residents, the first iteration, two steady ones, the evaluation pass;
docs/allocator.md, "On the plan"). TRACE.csv a run's allocator events
(`action,addr,size,stream` as calib/torch_vs_plan.py --traces records them,
or `action,id,bytes`), cut into the same passes at MARKS, its cumulative
allocation counts (`start=0,first=151,steady=1337,eval=2224`, the record's
`trace.alloc_count_marks`). --campaign does every trace in DIR's
traces*.tar.gz, each planned as calib/h200_report.py plans the run (each
after the campaign's first from the cache the first left).

Where calib/trace_diff.py matches the plan's aggregates (its timeline) to
groups of tensors, this compares tensor to tensor, in order: each pass of
both becomes a sequence of tokens, `+SIZE` an allocation and `-SIZE` a free
(the size of the allocation it frees), sizes as the allocator rounds them
(512 B), and difflib's longest matching blocks align the two. It prints,
per pass, how many events of each side the alignment matches, and the
first N places where they part: the plan's events and the run's there,
with the running allocated bytes of both. The order of a pass's events is
what decides which cached blocks a request takes, so the first divergence
of a pass is where to look first.

Exit status 0, 2 on bad input (message on stderr). Needs Python 3 only.
"""
import argparse
import difflib
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import trace_diff as td  # noqa: E402

PASSES = ("setup", "first", "steady", "eval")
MIB = 1 << 20


def read_sim(text, name):
    """The simulation's trace by pass: (token, bytes, line) lists; the
    second steady iteration is left out (the run measured one)."""
    cur, parts, live = None, {p: [] for p in PASSES}, {}
    marks = {"residents": "setup", "first": "first", "steady": "steady", "evaluation": "eval"}
    for line, row in enumerate(text.splitlines(), start=1):
        if line == 1:
            if row != "action,id,bytes":
                raise td.InputError("%s:1: the header must be action,id,bytes" % name)
            continue
        if row.startswith("#"):
            word = row[1:].split()[0] if row[1:].split() else ""
            cur = None if "second" in row else marks.get(word)
            continue
        f = row.split(",")
        if f[0] == "alloc" and len(f) == 3 and f[2].isdigit():
            live[f[1]] = int(f[2])
            ev = ("+%d" % td.rounded(int(f[2])), int(f[2]), line)
        elif f[0] == "free" and len(f) > 1 and f[1] in live:
            b = live.pop(f[1])
            ev = ("-%d" % td.rounded(b), -b, line)
        else:
            raise td.InputError("%s:%d: not an event of the simulation" % (name, line))
        if cur:
            parts[cur].append(ev)
    return parts


def cut_trace(trace, marks):
    """A run's events (trace_diff.read_trace) by pass at the allocation
    counts of marks; a free goes with the pass it happens in."""
    base = marks.get("start", 0)
    parts = {p: [] for p in PASSES}
    n, part = 0, "setup"
    for kind, _ident, size, line in trace:
        if kind == "alloc":
            n += 1
            c = base + n
            part = ("setup" if c <= marks["first"] else "first" if c <= marks["steady"]
                    else "steady" if c <= marks["eval"] else "eval" if c <= marks.get(
                        "end", 1 << 62) else None)
        if part:
            sign = "+" if kind == "alloc" else "-"
            parts[part].append(("%s%d" % (sign, td.rounded(size)),
                                size if kind == "alloc" else -size, line))
    return parts


def running(evs):
    total, out = 0, []
    for _tok, d, _line in evs:
        total += d
        out.append(total)
    return out


def show(evs, tot, i, j, limit=6):
    toks = ["%s@%d" % (e[0], e[2]) for e in evs[i:min(j, i + limit)]]
    more = " ... (%d more)" % (j - i - limit) if j - i > limit else ""
    at = " (allocated after: %.1f MiB)" % (tot[j - 1] / MIB) if j > i else ""
    return (" ".join(toks) + more + at) if j > i else "nothing"


def report(name, sim, run, n, only, out=sys.stdout):
    out.write("== %s\n" % name)
    for p in PASSES:
        if only and p != only:
            continue
        a, b = sim[p], run[p]
        sm = difflib.SequenceMatcher(None, [e[0] for e in a], [e[0] for e in b], autojunk=False)
        matched = sum(blk.size for blk in sm.get_matching_blocks())
        out.write("  %-6s plan %5d events, run %5d: %5d matched in order (%.0f %% of the run's)\n"
                  % (p, len(a), len(b), matched, 100.0 * matched / max(len(b), 1)))
        ta, tb = running(a), running(b)
        shown = 0
        for op, i1, i2, j1, j2 in sm.get_opcodes():
            if op == "equal" or shown >= n:
                continue
            shown += 1
            out.write("    [%s] plan #%d: %s\n" % (op, i1, show(a, ta, i1, i2)))
            out.write("    %s run  #%d: %s\n" % (" " * len(op), j1, show(b, tb, j1, j2)))


def sim_for(ml, tvp, rec, tmp, start):
    """`memledger timeline --format trace` as calib/h200_report.py plans
    the run (the campaign's loop, cuBLAS's 32 MiB workspaces on Hopper)."""
    case = {c[0]: c for c in tvp.CASES}[rec["model"]]
    extra = ["--blas-workspace", "32MiB", "--logits", "through-backward", "--eval-batch",
             str(case[4]), "--eval-seq-len", str(case[3])]
    return td.timeline_for(ml, tvp, rec, tmp, "trace",
                           extra + (["--allocator-start", start] if start else []))


def campaign(d, ml, n, only):
    import campaign_state
    tvp = td.load_tvp()
    with tempfile.TemporaryDirectory() as tmp:
        tp = os.path.join(d, "traces.tar.gz")
        recs = [json.loads(l) for l in open(os.path.join(d, "results.jsonl"))]
        recs = [r for r in recs if "model" in r]
        first_name, first_text = next(iter(campaign_state.read_traces(tp)))
        start = os.path.join(tmp, "start.csv")
        with open(start, "w") as f:
            f.write(campaign_state.state_trace(first_text, first_name)[0])
        for name, text in campaign_state.read_traces(tp):
            k = int(re.match(r"(\d+)-", name).group(1))
            rec = recs[k]
            sim = read_sim(sim_for(ml, tvp, rec, tmp, start if k else None), "plan")
            run = cut_trace(td.read_trace(text, name),
                            rec["measured"]["trace"]["alloc_count_marks"])
            report(name[:-4], sim, run, n, only)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--campaign")
    ap.add_argument("--memledger")
    ap.add_argument("--sim")
    ap.add_argument("--trace")
    ap.add_argument("--marks")
    ap.add_argument("-n", type=int, default=5, help="divergences shown per pass (5)")
    ap.add_argument("--pass", dest="only", choices=PASSES)
    a = ap.parse_args(argv)
    try:
        if a.campaign:
            if not a.memledger:
                raise td.InputError("--campaign needs --memledger")
            campaign(a.campaign, a.memledger, a.n, a.only)
        elif a.sim and a.trace and a.marks:
            sim = read_sim(open(a.sim).read(), a.sim)
            run = cut_trace(td.read_trace(open(a.trace).read(), a.trace), td.parse_marks(a.marks))
            report(os.path.basename(a.trace), sim, run, a.n, a.only)
        else:
            raise td.InputError("give --campaign DIR --memledger BIN, or --sim, --trace and "
                                "--marks")
    except (td.InputError, OSError) as e:
        sys.stderr.write("sim_diff.py: %s\n" % e)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
