#!/usr/bin/env python3
"""calib/trace_diff.py on a hand-made plan and trace (no GPU, no memledger):
one iteration whose trace differs from the plan by a tensor the plan lacks,
a size and an order, each divergence written out by hand.

    test_trace_diff.py TRACE_DIFF
"""
import importlib.util
import io
import os
import subprocess
import sys
import tempfile
import unittest

TRACE_DIFF = None

# The plan (memledger timeline's columns that trace_diff reads): residents,
# two blocks that save 100,000 and 200,000 B, the loss keeping the output
# (400,000 B of logits and a 4 B loss), the backward's gradients of block.1
# (300,000 B) then block.0 (100,000 B), the step's temporaries, zero_grad.
PLAN_ROWS = [
    ("forward", "resident", "params", 400000),
    ("forward", "resident", "batch", 64),
    ("forward", "block.0", "activations_saved", 100000),
    ("forward", "block.0", "workspace", 5000),
    ("forward", "block.0", "workspace", -5000),
    ("forward", "block.1", "activations_saved", 200000),
    ("loss", "loss", "activations_saved", 400004),
    ("backward", "loss", "workspace", 400000),
    ("backward", "loss", "workspace", -400000),
    ("backward", "block.1", "grads", 300000),
    ("backward", "block.1", "activations_saved", -200000),
    ("backward", "block.0", "grads", 100000),
    ("backward", "block.0", "activations_saved", -100000),
    ("optimizer", "optimizer.step", "workspace", 400000),
    ("optimizer", "optimizer.step", "workspace", -400000),
    ("optimizer", "optimizer.step", "activations_saved", -400004),
    ("optimizer", "optimizer.step", "grads", -400000),
]

# The trace (torch_vs_plan.py's format): the same iteration, except that
# block.0 saves 120,000 B (a size), block.1 saves an 8,192 B tensor more (a
# tensor the plan lacks) and block.0's gradient comes before block.1's (an
# order). The loop drops the output after the backward, before the step.
TRACE = [
    ("alloc", "p1", 100000), ("alloc", "p2", 300000), ("alloc", "ids", 64),  # setup
    ("alloc", "a1", 120000), ("alloc", "t", 5000), ("free", "t"),        # forward
    ("alloc", "a2", 200000), ("alloc", "x", 8192),
    ("alloc", "logits", 400000), ("alloc", "loss", 4),
    ("alloc", "dl", 400000), ("free", "dl"),                             # backward
    ("alloc", "g1", 100000), ("free", "a2"), ("free", "x"),
    ("alloc", "g2", 300000), ("free", "a1"),
    ("free", "logits"), ("free", "loss"),                                # del out
    ("alloc", "s1", 100000), ("alloc", "s2", 300000),                        # step
    ("free", "s2"), ("free", "s1"), ("free", "g1"), ("free", "g2"),      # zero_grad
    ("alloc", "e", 500), ("free", "e"),                                  # eval
]
MARKS = "start=0,first=3,steady=3,eval=14"
ADDR = {}


def plan_csv():
    out = ["index,micro_batch,phase,step,category,delta_bytes,total"]
    total = 0
    for i, (phase, step, cat, delta) in enumerate(PLAN_ROWS):
        total += delta
        out.append("%d,0,%s,%s,%s,%d,%d" % (i, phase, step, cat, delta, total))
    return "\n".join(out) + "\n"


def trace_csv():
    out, sizes = ["action,addr,size,stream"], {}
    for ev in TRACE:
        addr = ADDR.setdefault(ev[1], 0x1000 * (len(ADDR) + 1))
        if ev[0] == "alloc":
            sizes[ev[1]] = ev[2]
            out.append("alloc,%d,%d,0" % (addr, ev[2]))
        else:
            out.append("free_requested,%d,%d,0" % (addr, sizes[ev[1]]))
            out.append("free_completed,%d,%d,0" % (addr, sizes[ev[1]]))
    return "\n".join(out) + "\n"


def load():
    spec = importlib.util.spec_from_file_location("trace_diff", TRACE_DIFF)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


class TraceDiff(unittest.TestCase):
    def setUp(self):
        self.td = load()

    def divergences(self):
        td = self.td
        plan = td.read_timeline(plan_csv(), "plan.csv")
        events, parts = td.cut(td.read_trace(trace_csv(), "trace.csv"), td.parse_marks(MARKS))
        out = io.StringIO()
        divs = td.report("hand-made", plan, events, parts, "steady", 10, out)
        return divs, out.getvalue()

    def test_phases(self):
        td = self.td
        events, parts = td.cut(td.read_trace(trace_csv(), "t"), td.parse_marks(MARKS))
        td.split_iteration(events, parts["steady"])
        got = [(e.kind, e.bytes, e.phase) for e in (events[i] for i in parts["steady"])]
        # by hand: the forward ends with the loss, the backward starts with
        # the logits' gradient, the step with its first temporary
        self.assertEqual([p for _, _, p in got],
                         ["forward"] * 7 + ["backward"] * 9 + ["optimizer"] * 6)

    def test_divergences(self):
        divs, text = self.divergences()
        got = [(d.kind, d.life, [e.bytes for e in d.trace_evs],
                d.plan_ev.label if d.plan_ev else None) for d in divs]
        self.assertEqual(got, [
            # block.0's saved tensors: 120,000 B where the plan has 100,000 B
            ("size", ("forward", "backward"), [120000], "block.0 activations_saved"),
            # the 8,192 B tensor block.1 keeps for the backward
            ("lacks", ("forward", "backward"), [8192], None),
            # block.0's gradient, made before block.1's
            ("order", ("backward", "optimizer"), [100000], "block.0 grads"),
        ], text)
        self.assertIn("size differs: plan block.0 activations_saved 100000 B, trace 1 "
                      "tensor(s) 120000 B (+20000 B", text)
        # the running totals at the size divergence: 400,064 B of residents
        # + 120,000 B in the trace, + 100,000 B in the plan
        self.assertIn("trace line 5: sizes 120000; allocated then 0.5 MiB", text)
        self.assertIn("plan  plan row 4 (block.0 activations_saved); allocated then 0.5 MiB",
                      text)
        self.assertIn("order differs: 100000 B, the plan has it in block.0 grads", text)
        self.assertEqual(sum(d.unexplained() for d in divs), 20000 + 8192 + 0)

    def test_totals(self):
        _, text = self.divergences()
        # forward->backward: plan 100,000 + 200,000 + 400,004; trace 120,000 +
        # 200,000 + 8,192 + 400,000 + 4
        self.assertIn("forward->backward:   plan 0.7 MiB in 3 event(s), trace 0.7 MiB in "
                      "5 tensor(s) (+0.0 MiB)", text)
        self.assertIn("optimizer->optimizer: plan 0.4 MiB in 1 event(s), trace 0.4 MiB in "
                      "2 tensor(s) (+0.0 MiB)", text)

    def test_cli(self):
        with tempfile.TemporaryDirectory() as d:
            p, t = os.path.join(d, "plan.csv"), os.path.join(d, "trace.csv")
            with open(p, "w") as f:
                f.write(plan_csv())
            with open(t, "w") as f:
                f.write(trace_csv())
            r = subprocess.run([sys.executable, TRACE_DIFF, "--timeline", p, "--trace", t,
                                "--marks", MARKS, "-n", "2"], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("first 2 of 3 divergences", r.stdout)
            with open(t, "w") as f:
                f.write("action,where\n")
            r = subprocess.run([sys.executable, TRACE_DIFF, "--timeline", p, "--trace", t,
                                "--marks", MARKS], capture_output=True, text=True)
            self.assertEqual(r.returncode, 2)
            self.assertIn("trace.csv:1: the header must be", r.stderr)


if __name__ == "__main__":
    TRACE_DIFF = sys.argv[1]
    unittest.main(argv=sys.argv[:1], verbosity=2)
