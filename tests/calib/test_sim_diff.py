#!/usr/bin/env python3
"""calib/sim_diff.py on a hand-made simulation and run, then `memledger
timeline --format trace` against the allocator verb.

1. The simulation's trace (four passes and the second steady iteration,
   which sim_diff leaves out) and a run's raw trace written by hand: in the
   steady iteration the run makes a 4,096 B tensor the plan lacks and frees
   two tensors in the other order; the passes' tokens and the alignment's
   counts are worked out below, by hand.
2. A plan's simulated trace replayed by `memledger allocator` reaches the
   plan's own reserved peak, segments and allocated bytes at that peak
   (the trace is every event the simulation ran, each free naming its
   allocation): caching and expandable, from an empty cache and from a
   start state (given to both).

    test_sim_diff.py SIM_DIFF MEMLEDGER
"""
import importlib.util
import io
import json
import os
import subprocess
import sys
import tempfile
import unittest

SIM_DIFF = MEMLEDGER = None

SIM = """action,id,bytes
# residents (parameters, master weights)
alloc,1,1000
# first iteration
alloc,2,3000
free,2
# steady iteration
alloc,3,5000
alloc,4,600
free,3
free,4
# steady iteration (the second)
alloc,5,5000
free,5
# evaluation
alloc,6,700
free,6
"""

# The run: action,addr,size,stream; its allocation counts at the marks:
# setup 1 (the parameter), first 1, steady 3, eval 1 (start=0, first=1,
# steady=2, eval=5, end=6). Sizes as the allocator rounds them (512 B).
RUN = """action,addr,size,stream
alloc,100,1024,0
alloc,200,3072,0
free_requested,200,3072,0
free_completed,200,3072,0
alloc,300,5120,0
alloc,400,1024,0
alloc,500,4096,0
free_completed,500,4096,0
free_completed,400,1024,0
free_completed,300,5120,0
alloc,600,1024,0
free_completed,600,1024,0
"""
MARKS = {"start": 0, "first": 1, "steady": 2, "eval": 5, "end": 6}


class Passes(unittest.TestCase):
    def test_tokens_by_pass(self):
        sim = SIM_DIFF.read_sim(SIM, "sim")
        # sizes rounded up to 512: 1000 -> 1024, 3000 -> 3072, 5000 -> 5120,
        # 600 -> 1024, 700 -> 1024; the second steady iteration left out
        self.assertEqual([e[0] for e in sim["setup"]], ["+1024"])
        self.assertEqual([e[0] for e in sim["first"]], ["+3072", "-3072"])
        self.assertEqual([e[0] for e in sim["steady"]], ["+5120", "+1024", "-5120", "-1024"])
        self.assertEqual([e[0] for e in sim["eval"]], ["+1024", "-1024"])
        run = SIM_DIFF.cut_trace(SIM_DIFF.td.read_trace(RUN, "run"), MARKS)
        self.assertEqual([e[0] for e in run["setup"]], ["+1024"])
        self.assertEqual([e[0] for e in run["first"]], ["+3072", "-3072"])
        self.assertEqual([e[0] for e in run["steady"]],
                         ["+5120", "+1024", "+4096", "-4096", "-1024", "-5120"])
        self.assertEqual([e[0] for e in run["eval"]], ["+1024", "-1024"])

    def test_report(self):
        sim = SIM_DIFF.read_sim(SIM, "sim")
        run = SIM_DIFF.cut_trace(SIM_DIFF.td.read_trace(RUN, "run"), MARKS)
        out = io.StringIO()
        SIM_DIFF.report("hand", sim, run, 5, None, out)
        text = out.getvalue()
        # steady: the longest common subsequence of (+5120 +1024 -5120
        # -1024) and (+5120 +1024 +4096 -4096 -1024 -5120) has 3 tokens
        # (+5120 +1024 then one of the frees); the other passes match whole
        self.assertIn("setup  plan     1 events, run     1:     1 matched in order (100 %", text)
        self.assertIn("first  plan     2 events, run     2:     2 matched in order (100 %", text)
        self.assertIn("steady plan     4 events, run     6:     3 matched in order (50 %", text)
        self.assertIn("eval   plan     2 events, run     2:     2 matched in order (100 %", text)
        # (3 of the run's 6 steady events: 50 %). The first divergence: the
        # run's 4,096 B tensor and its free, the run's steady events #2 and
        # #3 (counted from 0), on RUN's lines 8 and 9 (the header line 1),
        # after the plan's first two allocations
        self.assertIn("run  #2: +4096@8 -4096@9", text)

    def test_bad_input(self):
        with self.assertRaises(SIM_DIFF.td.InputError):
            SIM_DIFF.read_sim("action,id,bytes\nfree,9\n", "sim")
        with self.assertRaises(SIM_DIFF.td.InputError):
            SIM_DIFF.read_sim("id,action\n", "sim")
        with self.assertRaises(SIM_DIFF.td.InputError):
            SIM_DIFF.read_sim("action,id,bytes\nalloc,1\n", "sim")


class TimelineTrace(unittest.TestCase):
    def plan(self, extra):
        args = [MEMLEDGER, "plan", "models/gpt2-small.yaml", "--micro-batch", "2", "--device",
                "24GiB", "--format", "json"] + extra
        return json.loads(subprocess.run(args, capture_output=True, text=True, check=True,
                                         cwd=ROOT).stdout)["reserved"]

    def replay(self, extra, start):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.csv")
            subprocess.run([MEMLEDGER, "timeline", "models/gpt2-small.yaml", "--micro-batch",
                            "2", "--device", "24GiB", "--format", "trace", "-o", path] + extra,
                           check=True, cwd=ROOT)
            args = [MEMLEDGER, "allocator", path, "--format", "json"]
            if "--allocator" in extra:
                args += ["--allocator", extra[extra.index("--allocator") + 1]]
            if start:
                args += ["--allocator-start", start]
            return json.loads(subprocess.run(args, capture_output=True, text=True, check=True,
                                             cwd=ROOT).stdout)

    def test_replays_to_the_plans_peak(self):
        with tempfile.TemporaryDirectory() as d:
            start = os.path.join(d, "start.csv")
            with open(start, "w") as f:
                f.write("action,id,bytes\nalloc,a,300000000\nalloc,b,40000000\nfree,a\n")
            for extra, st in (([], None), (["--allocator", "expandable"], None),
                              (["--allocator-start", start], start)):
                with self.subTest(extra=extra):
                    p = self.plan(extra)
                    r = self.replay(extra, st)
                    self.assertEqual(r["reserved_peak"], p["peak"])
                    self.assertEqual(r["segments_peak"], p["segments"])
                    self.assertGreater(r["allocs"], 1000)

    def test_needs_the_simulation(self):
        r = subprocess.run([MEMLEDGER, "timeline", "models/gpt2-small.yaml", "--allocator",
                            "none", "--format", "trace"], capture_output=True, text=True,
                           cwd=ROOT)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--format trace", r.stderr)
        self.assertEqual(r.stdout, "")


if __name__ == "__main__":
    spec = importlib.util.spec_from_file_location("sim_diff", sys.argv[1])
    SIM_DIFF = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(SIM_DIFF)
    MEMLEDGER = os.path.abspath(sys.argv[2])
    ROOT = os.path.dirname(os.path.dirname(os.path.abspath(sys.argv[1])))
    unittest.main(argv=sys.argv[:1], verbosity=2)
