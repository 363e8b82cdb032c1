#!/usr/bin/env python3
"""The plan's event stream against a real allocator trace: where they part.

    trace_diff.py --timeline PLAN.csv --trace TRACE.csv --marks MARKS
                  [--iteration steady|first] [-n N]
    trace_diff.py --campaign DIR --memledger MEMLEDGER [-n N] [--iteration ...]

PLAN.csv is `memledger timeline ... --format csv` for the run's settings (one
steady iteration, docs/cli.md); TRACE.csv the run's allocator events, either
as calib/torch_vs_plan.py --traces writes them (`action,addr,size,stream`) or
as calib/snapshot_to_trace.py converts them (`action,id,bytes`); MARKS the
run's cumulative allocation counts at the phase boundaries
(`start=0,first=151,steady=1337,eval=2224`, the record's
`trace.alloc_count_marks`). --campaign does every trace in DIR's
traces*.tar.gz: the run's record (results.jsonl, or results-expandable.jsonl
for traces-expandable.tar.gz) by the trace's index, the plan by running
MEMLEDGER's `timeline` on the run's settings as calib/h200_report.py plans a
run (the default `--logits kept`: the campaign's loop holds the output
through the backward and drops it before the step, so the plan's step holds
the logits the trace has freed).

How the two are aligned (docs/calibration-h200.md, "Trace diff"):

- The trace is cut at the marks into model creation, the first iteration,
  the steady one and the evaluation pass. Inside an iteration the optimizer
  step starts at the run of allocations that ends the iteration (foreach
  temporaries, the first step's states); the gradients are what the final
  frees (zero_grad) release that was allocated before it; the backward starts
  after the last allocation, before the first gradient, of a tensor the loop
  frees after the last gradient (the loss and logits the output holds).
- Every allocation, on both sides, gets a lifetime: the phase that allocates
  it and the phase that frees it (a plan free releases the latest live
  allocation of its category and size, as the planner's allocator
  simulation does). Tensors that outlive their phase (saved for the
  backward, gradients, the step's states) and the step's temporaries are
  matched per lifetime, in order: a dynamic programme partitions the trace's
  tensors into groups, one per plan event, a plan aggregate (a block's saved
  tensors) matching the group whose sizes add up to it. Sizes are equal when
  they differ by less than the allocator's 512 B rounding per tensor.
  Transients freed in the phase that made them are not matched one by one
  (the plan counts them as a block's allowance); the summary compares the
  phases' peaks instead.
- A divergence is a trace tensor the plan lacks, a plan event the trace
  lacks (extra), a group whose sizes differ, or, where a lacking tensor and
  an extra event have the same size, an order that differs. Each is printed
  with the phase, the plan's step and category, the trace's file lines and
  sizes, and the running allocated totals (requested bytes, all live tensors)
  of both at that point.

Exit status 0, 2 on bad input (message on stderr). Needs Python 3 only.
"""
import argparse
import csv
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import types

ROUND = 512
MIB = 1 << 20
PHASES = ("forward", "backward", "optimizer")


class InputError(Exception):
    pass


def rounded(n):
    """The caching allocator's round_size: at least 512 B, a multiple of it."""
    return max(ROUND, -(-n // ROUND) * ROUND)


def same_size(a, b, n=1):
    """a and b (sums of n tensors) are the same allocation up to rounding."""
    return rounded(a) == rounded(b) or abs(a - b) < ROUND * max(n, 1)


class Event:
    __slots__ = ("kind", "bytes", "phase", "label", "where", "total", "mate", "pos")

    def __init__(self, kind, nbytes, phase, label, where):
        self.kind, self.bytes, self.phase, self.label, self.where = kind, nbytes, phase, label, where
        self.total = 0
        self.mate = None  # alloc: the index of its free; free: of its alloc
        self.pos = 0


# ---------------------------------------------------------------- the trace

def read_trace(text, name):
    """(kind, id, bytes, line) of a trace in either format; frees of blocks
    allocated before the recording are dropped."""
    rows = csv.reader(io.StringIO(text))
    header = next(rows, None)
    raw = header == ["action", "addr", "size", "stream"]
    if not raw and header != ["action", "id", "bytes"]:
        raise InputError("%s:1: the header must be action,addr,size,stream or action,id,bytes"
                         % name)
    live, out = {}, []
    for line, row in enumerate(rows, start=2):
        if not row or row[0].startswith("#"):
            continue
        act = row[0]
        if raw and act not in ("alloc", "free_completed"):
            continue
        try:
            ident = row[1]
            size = int(row[2]) if len(row) > 2 and row[2] != "" else None
        except (IndexError, ValueError):
            raise InputError("%s:%d: expected action, id and a byte count" % (name, line))
        if act == "alloc":
            if ident in live:
                raise InputError("%s:%d: alloc of %s, which is live" % (name, line, ident))
            live[ident] = size
            out.append(("alloc", ident, size, line))
        elif act in ("free", "free_completed"):
            if ident not in live:
                if raw:
                    continue
                raise InputError("%s:%d: free of %s, which is not live" % (name, line, ident))
            out.append(("free", ident, live.pop(ident), line))
        else:
            raise InputError("%s:%d: unknown action %r" % (name, line, act))
    return out


def parse_marks(s):
    marks = {}
    for part in s.split(","):
        k, _, v = part.partition("=")
        try:
            marks[k.strip()] = int(v)
        except ValueError:
            raise InputError("--marks: %r is not NAME=COUNT" % part)
    for k in ("first", "steady", "eval"):
        if k not in marks:
            raise InputError("--marks: no %s= (the allocation count before that phase)" % k)
    return marks


def cut(trace, marks):
    """The trace's events by part: setup, first, steady, eval (a free goes
    with the part of the allocation before it)."""
    base = marks.get("start", 0)
    parts = {k: [] for k in ("setup", "first", "steady", "eval")}
    live, events, n, part = {}, [], 0, "setup"
    for kind, ident, size, line in trace:
        if kind == "alloc":
            n += 1
            c = base + n
            part = ("setup" if c <= marks["first"] else "first" if c <= marks["steady"]
                    else "steady" if c <= marks["eval"] else "eval")
            live[ident] = len(events)
            ev = Event("alloc", size, None, "", "line %d" % line)
        else:
            ev = Event("free", size, None, "", "line %d" % line)
            ev.mate = live.pop(ident)
            events[ev.mate].mate = len(events)
        ev.pos = len(events)
        events.append(ev)
        parts[part].append(ev.pos)
    total = 0
    for ev in events:
        total += ev.bytes if ev.kind == "alloc" else -ev.bytes
        ev.total = total
    return events, parts


def split_iteration(events, idx):
    """Assigns forward/backward/optimizer to the events idx of one training
    iteration; returns (b1, b2), the positions where the backward and the
    step start (docstring)."""
    if not idx:
        return None, None
    lo, hi = idx[0], idx[-1]
    allocs = [i for i in idx if events[i].kind == "alloc"]
    last = allocs[-1] if allocs else lo
    tail_freed = {events[i].mate for i in idx if i > last and events[i].kind == "free"}

    def stays(i):  # freed by the final frees, or not in this iteration
        m = events[i].mate
        return i in tail_freed or m is None or m > hi

    b2 = last + 1
    i = last
    while i >= lo and events[i].kind == "alloc" and stays(i):
        b2 = i
        i -= 1
    grads = [i for i in allocs if i < b2 and i in tail_freed]
    b1 = lo
    if grads:
        g0, glast = grads[0], grads[-1]
        # not a gradient's size: a tied weight's partial gradient is also
        # freed after the last gradient is made
        gsizes = {events[i].bytes for i in grads}
        held = [i for i in allocs if i < g0 and events[i].mate is not None
                and glast < events[i].mate < b2 and events[i].bytes not in gsizes]
        b1 = held[-1] + 1 if held else g0
    for i in idx:
        events[i].phase = "forward" if i < b1 else "backward" if i < b2 else "optimizer"
    return b1, b2


# ----------------------------------------------------------------- the plan

def read_timeline(text, name):
    """The plan's events: residents (step `resident`) as setup; the loss
    phase goes with the forward up to its backward rows."""
    rows = csv.DictReader(io.StringIO(text))
    need = {"phase", "step", "category", "delta_bytes", "total"}
    if not rows.fieldnames or not need <= set(rows.fieldnames):
        raise InputError("%s:1: not a memledger timeline CSV (no %s)" % (
            name, ", ".join(sorted(need - set(rows.fieldnames or [])))))
    events, live = [], {}
    for line, r in enumerate(rows, start=2):
        if r.get("micro_batch", "0") not in ("0", ""):
            continue  # one micro-batch: the first
        try:
            delta, total = int(r["delta_bytes"]), int(r["total"])
        except ValueError:
            raise InputError("%s:%d: delta_bytes and total must be whole numbers" % (name, line))
        if not delta:
            continue
        phase = {"loss": "forward"}.get(r["phase"], r["phase"])
        if r["step"] == "resident":
            phase = "setup"
        if phase not in PHASES and phase != "setup":
            raise InputError("%s:%d: unknown phase %r" % (name, line, r["phase"]))
        ev = Event("alloc" if delta > 0 else "free", abs(delta), phase,
                   "%s %s" % (r["step"], r["category"]), "plan row %d" % line)
        ev.total, ev.pos = total, len(events)
        cat = r["category"]
        stack = live.setdefault(cat, [])
        if ev.kind == "alloc":
            stack.append(ev.pos)
        else:
            # the planner's allocator simulation: the latest live allocation of
            # that category and size, else the latest ones until covered
            hit = [k for k in range(len(stack) - 1, -1, -1) if events[stack[k]].bytes == ev.bytes]
            if hit:
                events[stack.pop(hit[0])].mate = ev.pos
            else:
                left = ev.bytes
                while stack and left > 0:
                    j = stack.pop()
                    events[j].mate = ev.pos
                    left -= events[j].bytes
        events.append(ev)
    return events


# ---------------------------------------------------------------- alignment

def lifetime(events, i, order):
    """(allocating phase, freeing phase) of allocation i; `end` when it
    outlives the events."""
    ev = events[i]
    m = ev.mate
    life = ev.phase, events[m].phase if m is not None and events[m].phase in order else "end"
    # the plan's loop (logits kept) frees the output in the step, the
    # campaign's after the backward: the same tensors, compared as one class
    return ("forward", "backward") if life == ("forward", "optimizer") else life


def matched_classes(order):
    """The lifetimes matched tensor by tensor: those that outlive their phase,
    and the step's temporaries."""
    keep = []
    for a in PHASES:
        for b in PHASES[PHASES.index(a):] + ("end",):
            if a != b or a == "optimizer":
                keep.append((a, b))
    return keep


def align(plan, trace, window=512):
    """Partitions trace (byte counts) into one group per plan aggregate, in
    order, with trace tensors left over (the plan lacks them) and plan
    aggregates left without a group (extra). Returns a list of
    (op, plan index or None, [trace indices]) with op one of match, size,
    extra, lacks."""
    m, n = len(plan), len(trace)
    INF = (1 << 62, 0)
    cost = [[INF] * (n + 1) for _ in range(m + 1)]
    back = [[None] * (n + 1) for _ in range(m + 1)]
    cost[0][0] = (0, 0)
    for i in range(m + 1):
        for j in range(n + 1):
            if i == 0 and j == 0:
                continue
            best, how = INF, None
            if j:
                c = cost[i][j - 1]
                c = (c[0] + 1, c[1] + trace[j - 1])
                if c < best:
                    best, how = c, ("lacks", j - 1)
            if i:
                c = cost[i - 1][j]
                c = (c[0] + 1, c[1] + plan[i - 1])
                if c < best:
                    best, how = c, ("extra", j)
                a, s = plan[i - 1], 0
                for k in range(j - 1, max(-1, j - 1 - window), -1):
                    s += trace[k]
                    if s > 2 * a + ROUND:
                        break
                    eq = same_size(s, a, j - k)
                    if not eq and 2 * s < a:
                        continue
                    base = cost[i - 1][k]
                    # a group whose size differs costs a byte more than
                    # leaving its tensors unmatched, at equal counts
                    c = (base[0] + (0 if eq else 1), base[1] + (0 if eq else abs(s - a) + 1))
                    if c < best:
                        best, how = c, ("match" if eq else "size", k)
            cost[i][j], back[i][j] = best, how
    ops, i, j = [], m, n
    while i or j:
        op, k = back[i][j]
        if op == "lacks":
            ops.append(("lacks", None, [k]))
            j -= 1
        elif op == "extra":
            ops.append(("extra", i - 1, []))
            i -= 1
        else:
            ops.append((op, i - 1, list(range(k, j))))
            i, j = i - 1, k
    ops.reverse()
    return ops


class Divergence:
    def __init__(self, kind, life, plan_ev, trace_evs, key, note=""):
        self.kind, self.life, self.plan_ev, self.trace_evs = kind, life, plan_ev, trace_evs
        self.key, self.note = key, note

    def unexplained(self):
        t = sum(e.bytes for e in self.trace_evs)
        p = self.plan_ev.bytes if self.plan_ev else 0
        return abs(t - p)


def diff(plan, events, idx):
    """The divergences between the plan's events and the trace's events
    idx (one iteration, phases assigned), in the trace's order."""
    classes = matched_classes(PHASES)
    pa = [i for i, e in enumerate(plan) if e.kind == "alloc" and e.phase in PHASES]
    ta = [i for i in idx if events[i].kind == "alloc"]
    order = PHASES
    out, matched, totals = [], [], []
    for life in classes:
        P = [i for i in pa if lifetime(plan, i, order) == life]
        T = [i for i in ta if lifetime(events, i, order) == life]
        if not P and not T:
            continue
        totals.append((life, sum(plan[i].bytes for i in P), sum(events[i].bytes for i in T),
                       len(P), len(T)))
        ops = align([plan[i].bytes for i in P], [events[i].bytes for i in T])
        prev = ta[0] if ta else 0
        for op, pi, tis in ops:
            pev = plan[P[pi]] if pi is not None else None
            tevs = [events[T[k]] for k in tis]
            if tevs:
                prev = tevs[0].pos
            if op == "match":
                matched.append((pev, tevs))
                continue
            out.append(Divergence(op, life, pev, tevs, prev + (0.5 if not tevs else 0)))
    # a lacking tensor and an extra plan event of one size: the order differs
    lacks = [d for d in out if d.kind == "lacks"]
    for d in [d for d in out if d.kind == "extra"]:
        for l in lacks:
            if l.kind == "lacks" and same_size(l.trace_evs[0].bytes, d.plan_ev.bytes):
                l.kind, l.plan_ev = "order", d.plan_ev
                l.note = "the plan has it in %s" % (d.plan_ev.label)
                d.kind = None
                break
    out = [d for d in out if d.kind]
    out.sort(key=lambda d: d.key)
    return out, matched, totals


# ------------------------------------------------------------------- report

def mib(n):
    return "%.1f MiB" % (n / MIB)


def phase_peaks(evs):
    peaks = {}
    for e in evs:
        if e.phase in PHASES:
            peaks[e.phase] = max(peaks.get(e.phase, 0), e.total)
    return peaks


def transients(evs, idx=None):
    """Per phase: the largest transient (freed in its phase) and the bytes
    of transients allocated."""
    out = {}
    seq = evs if idx is None else [evs[i] for i in idx]
    for e in seq:
        if e.kind != "alloc" or e.phase not in PHASES:
            continue
        m = e.mate
        if m is not None and evs[m].phase == e.phase and e.phase != "optimizer":
            big, tot = out.get(e.phase, (0, 0))
            out[e.phase] = (max(big, e.bytes), tot + e.bytes)
    return out


def describe(d, plan_total):
    t = d.trace_evs
    sizes = ", ".join(str(e.bytes) for e in t[:6]) + (", ..." if len(t) > 6 else "")
    where = ("%s..%s" % (t[0].where, t[-1].where.split()[-1]) if len(t) > 1
             else t[0].where if t else "-")
    life = "%s->%s" % d.life
    p = d.plan_ev
    if d.kind == "lacks":
        head = "plan lacks a %s tensor of %d B (%s)" % (life, t[0].bytes, mib(t[0].bytes))
    elif d.kind == "extra":
        head = "plan has extra %s: %d B (%s) that the trace does not allocate" % (
            p.label, p.bytes, mib(p.bytes))
    elif d.kind == "order":
        head = "order differs: %d B, %s" % (t[0].bytes, d.note)
    else:
        s = sum(e.bytes for e in t)
        head = "size differs: plan %s %d B, trace %d tensor(s) %d B (%+d B, %s)" % (
            p.label, p.bytes, len(t), s, s - p.bytes, mib(s - p.bytes))
    phase = t[0].phase if t else p.phase
    lines = ["  [%s] %s" % (phase, head)]
    if t:
        lines.append("      trace %s: sizes %s; allocated then %s" % (where, sizes, mib(t[0].total)))
    if p:
        lines.append("      plan  %s (%s); allocated then %s" % (p.where, p.label, mib(p.total)))
    elif plan_total is not None:
        lines.append("      plan  allocated at that point %s" % mib(plan_total))
    return "\n".join(lines)


def plan_total_near(matched, key):
    """The plan's running total at the last matched event before key."""
    best = None
    for pev, tevs in matched:
        if tevs[0].pos <= key and (best is None or tevs[0].pos > best[0]):
            best = (tevs[0].pos, pev.total)
    return best[1] if best else None


def report(name, plan, events, parts, iteration, n, out=sys.stdout):
    idx = parts[iteration]
    b1, b2 = split_iteration(events, idx)
    if parts["first"] is not idx:
        split_iteration(events, parts["first"])
    for i in parts["eval"]:
        events[i].phase = "eval"
    for i in parts["setup"]:
        events[i].phase = "setup"
    divs, matched, totals = diff(plan, events, idx)
    tpk, ppk = phase_peaks([events[i] for i in idx]), phase_peaks(plan)
    start_total = events[idx[0] - 1].total if idx and idx[0] else 0
    resident = max((e.total for e in plan if e.phase == "setup"), default=0)
    print("== %s (%s iteration)" % (name, iteration), file=out)
    print("  trace: %d events in the iteration (forward from %s, backward from %s, step "
          "from %s); allocated at its start %s, plan's residents %s (%+.1f MiB)" % (
              len(idx), events[idx[0]].where if idx else "-",
              events[b1].where if b1 is not None and b1 <= idx[-1] else "-",
              events[b2].where if b2 is not None and b2 <= idx[-1] else "-",
              mib(start_total), mib(resident), (start_total - resident) / MIB), file=out)
    tt, pt = transients(events, idx), transients(plan)
    for ph in PHASES:
        a, b = tpk.get(ph, 0), ppk.get(ph, 0)
        line = "  %-9s peak: trace %s, plan %s (%+.1f MiB, %+.1f %%)" % (
            ph, mib(a), mib(b), (b - a) / MIB, 100.0 * (b - a) / a if a else 0.0)
        if ph in tt or ph in pt:
            line += "; largest transient: trace %s, plan %s" % (
                mib(tt.get(ph, (0, 0))[0]), mib(pt.get(ph, (0, 0))[0]))
        print(line, file=out)
    for life, p, t, np_, nt in totals:
        print("  %-20s plan %s in %d event(s), trace %s in %d tensor(s) (%+.1f MiB)" % (
            "%s->%s:" % life, mib(p), np_, mib(t), nt, (t - p) / MIB), file=out)
    by = {}
    for d in divs:
        k = by.setdefault(d.kind, [0, 0])
        k[0] += 1
        k[1] += d.unexplained()
    mbytes = sum(sum(e.bytes for e in t) for _, t in matched)
    print("  matched: %d plan events to %d trace tensors (%s); divergences: %s; bytes "
          "unexplained: %s" % (
              len(matched), sum(len(t) for _, t in matched), mib(mbytes),
              ", ".join("%s %d (%s)" % (k, v[0], mib(v[1])) for k, v in sorted(by.items()))
              or "none", mib(sum(d.unexplained() for d in divs))), file=out)
    if divs:
        print("  first %d of %d divergences, in the trace's order:" % (min(n, len(divs)),
                                                                      len(divs)), file=out)
        for d in divs[:n]:
            print(describe(d, plan_total_near(matched, d.key)), file=out)
    print(file=out)
    return divs


# ------------------------------------------------------------ the campaign

def load_tvp():
    here = os.path.dirname(os.path.abspath(__file__))
    m = types.ModuleType("torch_vs_plan")
    src = os.path.join(here, "torch_vs_plan.py")
    exec(compile(open(src).read(), src, "exec"), m.__dict__)
    return m


def timeline_for(ml, tvp, rec, tmp, fmt="csv", extra=()):
    """`memledger timeline` with the run's settings, as h200_report.py
    plans a run (in format fmt, with the flags extra after them)."""
    case = {c[0]: c for c in tvp.CASES}[rec["model"]]
    path = os.path.join(tmp, "config.json")
    with open(path, "w") as f:
        json.dump(tvp.config_json(case, rec["attn"]), f)
    args = [ml, "timeline", "--hf", path, "--micro-batch", str(case[4]), "--seq-len",
            str(case[3]), "--precision", "amp-bf16" if rec["amp"] else "fp32", "--optimizer",
            "adamw", "--optimizer-impl", rec["impl"], "--checkpoint",
            "full" if rec["ckpt"] else "none", "--device", "141GB", "--format", fmt] + list(extra)
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode not in (0, 1):
        raise InputError("%s: %s" % (" ".join(args), r.stderr.strip()))
    return r.stdout


def campaign(d, ml, iteration, n):
    tvp = load_tvp()
    tmp = tempfile.mkdtemp()
    try:
        for tarname, recname in (("traces.tar.gz", "results.jsonl"),
                                 ("traces-expandable.tar.gz", "results-expandable.jsonl")):
            tp = os.path.join(d, tarname)
            if not os.path.exists(tp):
                continue
            recs = [json.loads(l) for l in open(os.path.join(d, recname))]
            recs = [r for r in recs if "model" in r]
            with tarfile.open(tp) as tf:
                for mem in sorted(tf.getmembers(), key=lambda m: m.name):
                    mt = re.match(r"(\d+)-", os.path.basename(mem.name))
                    if not mem.isfile() or not mt:
                        continue
                    # the records follow the configurations' order, the
                    # trace's number (torch_vs_plan.py names it so)
                    k = int(mt.group(1))
                    rec = recs[k] if k < len(recs) else None
                    want = "%02d-%s-%s-%s-%s.csv" % (k, rec["model"], rec["attn"], "full"
                                                     if rec["ckpt"] else "none", "bf16"
                                                     if rec["amp"] else "fp32") if rec else None
                    if want != os.path.basename(mem.name):
                        raise InputError("%s: record %d of %s is not that run" % (
                            mem.name, k, recname))
                    text = tf.extractfile(mem).read().decode()
                    plan = read_timeline(timeline_for(ml, tvp, rec, tmp), "timeline")
                    events, parts = cut(read_trace(text, mem.name),
                                        rec["measured"]["trace"]["alloc_count_marks"])
                    name = "%s %s" % (os.path.basename(mem.name)[:-4],
                                      "(expandable segments)" if "expandable" in tarname else "")
                    report(name.strip(), plan, events, parts, iteration, n)
    finally:
        for f in os.listdir(tmp):
            os.unlink(os.path.join(tmp, f))
        os.rmdir(tmp)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--timeline", help="memledger timeline CSV of the run's settings")
    ap.add_argument("--trace", help="the run's allocator trace")
    ap.add_argument("--marks", help="start=N,first=N,steady=N,eval=N (allocation counts)")
    ap.add_argument("--campaign", help="a campaign folder (traces*.tar.gz, results*.jsonl)")
    ap.add_argument("--memledger", help="the memledger binary (with --campaign)")
    ap.add_argument("--iteration", choices=("steady", "first"), default="steady")
    ap.add_argument("-n", type=int, default=10, help="divergences printed per run (10)")
    a = ap.parse_args(argv)
    try:
        if a.campaign:
            if not a.memledger:
                ap.error("--campaign needs --memledger")
            campaign(a.campaign, a.memledger, a.iteration, a.n)
            return 0
        if not (a.timeline and a.trace and a.marks):
            ap.error("give --timeline, --trace and --marks, or --campaign")
        texts = []
        for p in (a.timeline, a.trace):
            try:
                with open(p) as f:
                    texts.append(f.read())
            except OSError as e:
                raise InputError("%s: %s" % (p, e.strerror))
        plan = read_timeline(texts[0], a.timeline)
        events, parts = cut(read_trace(texts[1], a.trace), parse_marks(a.marks))
        report(os.path.basename(a.trace), plan, events, parts, a.iteration, a.n)
    except InputError as e:
        print("trace_diff: error: %s" % e, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
