#!/usr/bin/env python3
"""memledger's time per configuration beside llm-analysis's, on the same grid.

usage: vs-llm-analysis.py LLM_ANALYSIS_DIR [MEMLEDGER_BENCH]

LLM_ANALYSIS_DIR is a checkout of github.com/cli99/llm-analysis (it is not
shipped here); it runs with Debian's python3-fire (apt-get install
python3-fire), so run this script with /usr/bin/python3. MEMLEDGER_BENCH
defaults to build/bench/memledger-bench.

The grid, for GPT-2 small and Llama-2-7B: micro-batch 1..8 x sequence 256,
512, 1024 x no recompute or full recompute (48 configurations), one
micro-batch a step on both sides (gradient_accumulation_steps=1; the
bench sets the presets' accumulation to 1). llm-analysis:
one LLMAnalysis per model, its training() per configuration, logging off.
memledger: `memledger-bench --grid MODEL.yaml`, a whole plan per
configuration (the node-level replay of one iteration, the first iteration,
the checks), through a prepared planner (the chain built once per setting
and derived for each micro-batch, docs/ledger.md) and each plan on its own
(ml_ledger_evaluate). Prints each tool's time per configuration and the
ratios: for each tool, the best of three runs (a shared machine's noise
only ever adds time).
Prints figures only: nothing here is a pass or a fail.
"""
import logging
import os
import re
import subprocess
import sys
import time


def llm_analysis_time(root, model, seconds=2.0):
    sys.path.insert(0, root)
    from llm_analysis.analysis import LLMAnalysis, ActivationRecomputation
    from llm_analysis.config import (ParallelismConfig, get_dtype_config_by_name,
                                     get_gpu_config_by_name, get_model_config_by_name)
    logging.disable(logging.CRITICAL)
    a = LLMAnalysis(get_model_config_by_name(model), get_gpu_config_by_name("a100-sxm-80gb"),
                    get_dtype_config_by_name("w16a16e16"), ParallelismConfig())
    n, t0 = 0, time.perf_counter()
    while True:
        for b in range(1, 9):
            for T in (256, 512, 1024):
                for rc in (0, 4):  # NONE, FULL
                    a.training(batch_size_per_gpu=b, seq_len=T, gradient_accumulation_steps=1,
                               activation_recomputation=ActivationRecomputation(rc))
                    n += 1
        t = time.perf_counter() - t0
        if t >= seconds:
            return t / n


RUNS = 3


def memledger_times(bench, yaml):
    """(prepared planner, each on its own), seconds per configuration: the
    best of RUNS runs of the bench"""
    runs = [memledger_run(bench, yaml) for _ in range(RUNS)]
    return min(r[0] for r in runs), min(r[1] for r in runs)


def memledger_run(bench, yaml):
    """(prepared planner, each on its own), seconds per configuration"""
    out = subprocess.run([bench, "--grid", yaml], capture_output=True, text=True, check=True)
    times = {}
    for kind, us in re.findall(r", (prepared planner|each on its own): .*?\(([0-9.]+) us each",
                               out.stdout):
        times[kind] = float(us) * 1e-6
    if len(times) != 2:
        sys.exit("memledger-bench printed no grid figures: %r" % out.stdout)
    return times["prepared planner"], times["each on its own"]


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    root = sys.argv[1]
    bench = sys.argv[2] if len(sys.argv) > 2 else "build/bench/memledger-bench"
    if not os.path.isdir(os.path.join(root, "llm_analysis")):
        sys.exit("%s: not a checkout of llm-analysis (no llm_analysis/ in it)" % root)
    print("%-12s %15s %15s %8s %15s %8s" % ("model", "llm-analysis", "prepared", "ratio",
                                             "on its own", "ratio"))
    for name, la_model, yaml in (("gpt2-small", "gpt2", "models/gpt2-small.yaml"),
                                 ("llama-2-7b", "NousResearch_Llama-2-7b-hf",
                                  "models/llama-2-7b.yaml")):
        la = min(llm_analysis_time(root, la_model) for _ in range(RUNS))
        prep, own = memledger_times(bench, yaml)
        print("%-12s %12.1f us %12.1f us %7.1fx %12.1f us %7.1fx" % (
            name, la * 1e6, prep * 1e6, la / prep, own * 1e6, la / own))


if __name__ == "__main__":
    main()
