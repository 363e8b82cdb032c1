#!/usr/bin/env python3
"""calib/torch_vs_plan.py runs only on a GPU; its bookkeeping and report must
not be what fails there. This runs its main() with the GPU measurement
replaced by fixed figures and checks:

- the table: steady allocated 1000 MiB, reserved 1200 MiB, planned 1100 MiB
  -> error +10.0 %; step 0.5 s measured, 0.4 s planned -> -20.0 %; first
  iteration 1100 MiB, eval 300 / 1200 MiB printed as given;
- the deadline: with --deadline 0 no configuration is measured, each is
  recorded as skipped and still planned;
- the planner call itself (argv[2], the memledger binary): every
  configuration's config.json is accepted, the SDPA ones plan less saved
  activation than their eager twins (no T x T scores) except in fp32 with
  grouped-query heads (the math kernel: the same), and the parameter
  counts are the published ones for GPT-2 small (124,439,808) and
  Qwen2-0.5B (494,032,768)."""
import json
import os
import shutil
import sys
import tempfile
import types

MIB = 1 << 20
src_path, ml = sys.argv[1], sys.argv[2]
mod = types.ModuleType("torch_vs_plan")
exec(compile(open(src_path).read(), src_path, "exec"), mod.__dict__)
real_plan = mod.plan
mod.measure = lambda *a: {"first": {"allocated": 1100 * MIB, "reserved": 1200 * MIB},
                          "steady": {"allocated": 1000 * MIB, "reserved": 1200 * MIB},
                          "eval": {"allocated": 300 * MIB, "reserved": 1200 * MIB},
                          "step_time_s": 0.5}
mod.hf_config = lambda case, attn: None
mod.plan = lambda *a, **k: {"bytes": {"peak": 1100 * MIB}, "step_time_s": 0.4}
fails = []
if [c[0] for c in mod.CASES if mod.grouped_heads(c)] != ["llama-0.2b", "llama-1.1b",
                                                        "qwen2-0.5b", "qwen2-1.5b"]:
    fails.append("grouped_heads: not the Llama and Qwen2 cases")
out = tempfile.mkdtemp()
n = len(mod.configurations())
sys.argv = ["torch_vs_plan.py", "--memledger", ml, "--out", out]
mod.main()
rows = [l for l in open(os.path.join(out, "results.md")) if l.startswith("| ") and "MiB" not in l]
recs = [json.loads(l) for l in open(os.path.join(out, "results.jsonl"))][1:]
if len(rows) != n or len(recs) != n or n != 60:
    fails.append("%d rows, %d records for %d configurations" % (len(rows), len(recs), n))
for r in rows:
    cells = [c.strip() for c in r.strip().strip("|").split("|")]
    want = ["1100.0", "1000.0", "1200.0", "300.0", "1200.0", "1100.0", "+10.0%", "0.5000",
            "0.4000", "-20.0%"]
    if cells[6:] != want:
        fails.append("row: " + r)
        break
sys.argv += ["--deadline", "0"]
mod.main()
recs = [json.loads(l) for l in open(os.path.join(out, "results.jsonl"))][1:]
if any(r["measured"] != {"error": "skipped: deadline"} for r in recs):
    fails.append("--deadline 0 measured something")
# the real planner on every configuration's config.json
saved, grouped = {}, {}
for case, attn, ckpt, amp, impl in mod.configurations():
    grouped[case[0]] = mod.grouped_heads(case)
    p = real_plan(ml, case, attn, ckpt, amp, impl, None, out)
    if "bytes" not in p:
        fails.append("%s %s: %s" % (case[0], attn, p))
        continue
    saved[(case[0], attn, ckpt, amp)] = p["bytes"]["activations_saved"]
    if case[0] == "gpt2-small" and p["params"] != 124439808:
        fails.append("gpt2-small: %d params" % p["params"])
    if case[0] == "qwen2-0.5b" and p["params"] != 494032768:
        fails.append("qwen2-0.5b: %d params" % p["params"])
for (name, attn, ckpt, amp), v in saved.items():
    if attn != "sdpa" or ckpt:
        continue
    eager = saved[(name, "eager", ckpt, amp)]
    # fp32 with grouped-query heads: PyTorch runs the math kernel, the
    # eager inventory; otherwise a fused kernel
    math = not amp and grouped[name]
    if (v != eager) if math else not v < eager:
        fails.append("%s %s: sdpa saves %d, eager %d" % (name, "bf16" if amp else "fp32", v, eager))
shutil.rmtree(out)
print("ok" if not fails else "FAIL:\n" + "\n".join(fails))
sys.exit(0 if not fails else 1)
