#!/usr/bin/env python3
"""A calibration profile whose transformer blocks measured more saved bytes
than the op graph counts (the shipped CPU profile's points, saved_bytes
times 1.1): the ledger counts the measured inventory, and the allocator
simulation must make at least that much, never the graph's own tensors
(docs/allocator.md, "On the plan"), so the simulated reserved peak is at
or above the allocated peak, as on a GPU. Run from the source root:

    calib_reserved_check.py MEMLEDGER"""
import json
import os
import re
import subprocess
import sys
import tempfile

exe = sys.argv[1]
src = open("calib/profiles/cpu-fp32.yaml").read()
head, block = src.split("  transformer_block:\n", 1)


def scale(m):
    return "saved_bytes: %d" % round(int(m.group(1)) * 1.1)


# only the transformer block's points (up to the next layer kind's key)
m = re.search(r"\n  [a-z_]+:\n", block)
tb, after = (block[:m.start()], block[m.start():]) if m else (block, "")
scaled = head + "  transformer_block:\n" + re.sub(r"saved_bytes: (\d+)", scale, tb) + after
fails = 0
with tempfile.TemporaryDirectory() as d:
    prof = os.path.join(d, "scaled.yaml")
    with open(prof, "w") as f:
        f.write(scaled)
    for ckpt in ("none", "full"):
        out = subprocess.run([exe, "plan", "models/gpt2-small.yaml", "--calib", prof, "--device",
                              "40GiB", "--checkpoint", ckpt, "--format", "json"],
                             capture_output=True, text=True)
        j = json.loads(out.stdout)
        measured = j["calibration"]["measured_blocks"]
        alloc, rsv = j["bytes"]["peak"], j["reserved"]["peak"]
        ok = measured > 0 and rsv >= alloc
        fails += not ok
        print("%s checkpoint %s: %d blocks measured, allocated peak %d, reserved %d" % (
            "ok  " if ok else "FAIL", ckpt, measured, alloc, rsv))
sys.exit(1 if fails else 0)
