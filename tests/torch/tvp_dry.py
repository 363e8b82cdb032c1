#!/usr/bin/env python3
"""calib/torch_vs_plan.py runs only on a GPU; its bookkeeping and report must
not be what fails there. This runs its main() with the GPU measurement and
the planner call replaced by fixed figures and checks the table:
allocated 1000 B, reserved 1200 B, predicted 1100 B -> error +10.0 %,
fragmentation 1200/1000 - 1 = 0.200; step 0.5 s measured, 0.4 s predicted
-> -20.0 %."""
import json
import os
import shutil
import sys
import tempfile
import types

src_path = sys.argv[1]
mod = types.ModuleType("torch_vs_plan")
exec(compile(open(src_path).read(), src_path, "exec"), mod.__dict__)
mod.models = lambda: [("m", None, None, 64, [1, 2])]
mod.measure = lambda *a: {"max_allocated": 1000, "max_reserved": 1200, "step_time_s": 0.5}
mod.plan = lambda ml, cfg, T, B, amp, ckpt, calib, tmp: {"bytes": {"peak": 1100},
                                                         "step_time_s": 0.4}
out = tempfile.mkdtemp()
sys.argv = ["torch_vs_plan.py", "--memledger", "memledger", "--out", out, "--calib", "p.yaml"]
mod.main()
rows = [l for l in open(os.path.join(out, "results.md")) if l.startswith("| m |")]
recs = [json.loads(l) for l in open(os.path.join(out, "results.jsonl"))]
ok = len(rows) == 8 and len(recs) == 8
for r in rows:
    cells = [c.strip() for c in r.strip().strip("|").split("|")]
    ok = ok and cells[4:] == ["1000", "1100", "+10.0%", "0.5000 s", "0.4000 s", "-20.0%", "0.200"]
shutil.rmtree(out)
print("ok" if ok else "FAIL:\n" + "".join(rows))
sys.exit(0 if ok else 1)
