#!/usr/bin/env python3
"""calib/snapshot_to_trace.py on hand-made snapshots (no torch, no GPU), and
`memledger allocator` on what it writes.

    test_snapshot_to_trace.py CONVERTER MEMLEDGER_EXE
"""
import collections
import json
import os
import pickle
import subprocess
import sys
import tempfile
import unittest

CONVERTER = MEMLEDGER = None
MIB = 1 << 20
A, B, C, OLD = 0x7F0000000000, 0x7F0000200000, 0x7F0000400000, 0x7EFF00000000


def entry(action, addr, size):
    # the keys torch.cuda.memory._snapshot() gives each device_traces entry
    return {"action": action, "addr": addr, "size": size, "stream": 0,
            "time_us": 0, "frames": []}


EVENTS = [
    entry("segment_alloc", A, 2 * MIB),
    entry("alloc", A, 100),
    entry("segment_alloc", B, 20 * MIB),
    entry("alloc", B, 3000000),
    entry("free_requested", A, 100),
    entry("free_completed", A, 100),
    entry("free_requested", OLD, 64),
    entry("free_completed", OLD, 64),  # allocated before the recording began
    entry("alloc", A, 200),            # the address again, after its free
    entry("snapshot", 0, 0),
    entry("free_completed", B, 3000000),
]
WANT = ["action,id,bytes", "alloc,0x%x,100" % A, "alloc,0x%x,3000000" % B,
        "free,0x%x,100" % A, "alloc,0x%x,200" % A, "free,0x%x,3000000" % B]


def run(*args):
    return subprocess.run(list(args), capture_output=True, text=True)


class Convert(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def path(self, name):
        return os.path.join(self.dir.name, name)

    def write_pickle(self, obj):
        p = self.path("snap.pickle")
        with open(p, "wb") as f:
            pickle.dump(obj, f)
        return p

    def convert(self, src):
        out = self.path("trace.csv")
        r = run(sys.executable, CONVERTER, src, "-o", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(out) as f:
            return f.read().splitlines(), r.stderr

    def test_snapshot(self):
        lines, err = self.convert(self.write_pickle(
            {"segments": [], "device_traces": [EVENTS], "allocator_settings": {}}))
        self.assertEqual(lines, WANT)
        self.assertIn("1 frees of blocks allocated before the recording dropped", err)
        self.assertIn("segment_alloc 2 (%d B)" % (22 * MIB), err)
        self.assertIn("free_requested 2", err)

    def test_campaign_csv(self):
        src = self.path("events.csv")
        with open(src, "w") as f:
            f.write("action,addr,size,stream\n")
            for e in EVENTS:
                f.write("%s,%d,%d,0\n" % (e["action"], e["addr"], e["size"]))
        lines, _ = self.convert(src)
        self.assertEqual(lines, WANT)

    def test_replay(self):
        lines, _ = self.convert(self.write_pickle({"device_traces": [EVENTS]}))
        r = run(MEMLEDGER, "allocator", self.path("trace.csv"), "--format", "json")
        self.assertEqual(r.returncode, 0, r.stderr)
        got = json.loads(r.stdout)
        # 100 B rounds to 512 B (kMinBlockSize), a small-pool request: a 2 MiB
        # segment; 3,000,000 B rounds to 5860 * 512 = 3,000,320 B, over 1 MiB
        # and under 10 MiB: a 20 MiB segment. Both live at once; the 200 B
        # request after the first free reuses the 512 B block.
        self.assertEqual(got["allocated_peak"], 512 + 5860 * 512)
        self.assertEqual(got["reserved_peak"], 22 * MIB)  # = the segment_alloc sum above
        self.assertEqual(got["segments_peak"], 2)
        self.assertIsNone(got["oom_at"])
        self.assertEqual(got["events"], 5)

    def test_refusals(self):
        bad = [
            (collections.OrderedDict(device_traces=[EVENTS]), "OrderedDict"),  # code, not data
            ({"segments": []}, "device_traces"),
            ({"device_traces": [[entry("alloc", A, 1), entry("alloc", A, 2)]]}, "inconsistent"),
        ]
        for obj, words in bad:
            r = run(sys.executable, CONVERTER, self.write_pickle(obj))
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn(words, r.stderr)
        p = self.path("junk")
        with open(p, "wb") as f:
            f.write(b"\x00\x01not a pickle")
        r = run(sys.executable, CONVERTER, p)
        self.assertEqual(r.returncode, 2)
        self.assertIn("not a readable pickle", r.stderr)
        r = run(sys.executable, CONVERTER, self.write_pickle({"device_traces": [EVENTS]}),
                "--device", "1")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--device 1", r.stderr)


if __name__ == "__main__":
    CONVERTER, MEMLEDGER = sys.argv[1], sys.argv[2]
    unittest.main(argv=sys.argv[:1], verbosity=2)
