#!/usr/bin/env python3
"""memledger from Python, notebook style: each block is a cell.

Run after `pip install .` from the checkout's root:
    python3 python/examples/plan_in_python.py
"""
import os

import memledger

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GPT2 = os.path.join(ROOT, "models", "gpt2-small.yaml")

# %% Will GPT-2 small train at micro-batch 4 on an 8 GiB card, every block checkpointed?
r = memledger.plan(GPT2, micro_batch=4, device="8GiB", budget="6.5GiB", checkpoint="full")
print("params", r["params"])
print("peak total %.2f GiB during %s, at %s" % (r["bytes"]["peak_total"] / 2**30,
                                                r["peak"]["phase"], r["peak"]["step"]))
print("fits:", r["device"]["fits"], " headroom %.2f GiB" % (r["device"]["headroom"] / 2**30))
if r["advice"]:
    print("advice: %s fits too (%s)" % (r["advice"]["cheaper_fits"], r["advice"]["plan"]))

# %% The largest micro-batch under bf16 autocast, and the accumulation for 64 samples a step
f = memledger.fit(GPT2, precision="amp-bf16", device="8GiB", budget="6.5GiB",
                  global_batch=64, checkpoint="auto")
print("micro-batch %d x %d accumulation steps, plan %s" % (f["micro_batch"], f["grad_accum"],
                                                           f["plan"]))

# %% Checkpoint policies side by side
for row in memledger.compare(GPT2, micro_batch=2, device="8GiB", budget="6.5GiB"):
    print("%-12s peak total %6.2f GiB  recompute %5.1f%%  fits %s" % (
        row["checkpoint"], row["peak_total"] / 2**30, row["recompute_pct"], row["fits"]))

# %% The memory curve: live bytes after every event (plot it with matplotlib if you have it)
events = memledger.timeline(GPT2, micro_batch=1, seq_len=256)
live = [sum(e["live"].values()) for e in events]
print("%d events, highest %.2f GiB" % (len(events), max(live) / 2**30))

# %% A Hugging Face config: a config.json path, its dict, or a PretrainedConfig
hf = os.path.join(ROOT, "models", "hf", "qwen2-0.5b", "config.json")
print("qwen2-0.5b params", memledger.plan(hf, micro_batch=1, seq_len=2048)["params"])

# %% Your own measured peaks (torch.cuda.max_memory_allocated) fitted to fixed + per-sample
c = memledger.calibrate_points([(1, "1.5GiB"), (2, "2GiB"), (4, "3GiB")], budget="6.5GiB")
print("fixed %.2f GiB + %.2f GiB per sample; largest micro-batch %d" % (
    c["fixed_bytes"] / 2**30, c["per_sample_bytes"] / 2**30, c["max_micro_batch"]))

# %% Mistakes raise memledger.Error with the library's code, position and message
try:
    memledger.plan(GPT2, micro_batch=0)
except memledger.Error as e:
    print(e.code, "-", e.message)
