#!/usr/bin/env python3
"""The planner against a real GPU: torch.cuda.max_memory_allocated/reserved.

Builds Hugging Face decoders from config dicts (random weights, nothing
downloaded): GPT-2 small and medium, two Llama-style and two Qwen2-style
sizes. For each, eager and SDPA attention, checkpointing none and full
(non-reentrant, every layer), fp32 and bf16 autocast, AdamW foreach (and
fused for a subset), it measures:

- first iteration: from a fresh model and optimizer (states created lazily
  in the first step()), the peak allocated and reserved bytes;
- steady state: the second iteration, peaks reset before it;
- evaluation: model.eval() under no_grad, same batch, loss computed;
- step time: the mean of two further iterations.

The loop is the one the planner models: forward with labels (the model's
own loss), backward, the output dropped, optimizer.step(),
zero_grad(set_to_none=True). Beside each run, `memledger plan --hf` for the
same configuration (config.json with attn_implementation), with the
calibration profile of the same precision for the step time.

With --traces I,J,... those configurations (indices into the matrix) are
also recorded with
torch.cuda.memory._record_memory_history(): every allocator event from an
empty cache (model creation, first, steady and eval passes) as a CSV
`action,addr,size,stream`, with the cumulative allocation count at each
phase boundary, to replay through an allocator simulation.

Writes results.jsonl (one record per configuration, as it goes),
results.md and traces/ under --out. --deadline S stops starting new
configurations after S seconds (the rest are recorded as skipped).
"""
import argparse
import json
import os
import subprocess
import time

MIB = 1 << 20

# (name, family, HF config keys, seq_len, micro_batch). GPT-2 uses
# gelu_pytorch_tanh, the single-op GELU the planner models (gelu_new is a
# composite of elementwise ops that saves more).
CASES = [
    ("gpt2-small", "gpt2", dict(n_embd=768, n_layer=12, n_head=12, vocab_size=50257,
                                n_positions=1024, activation_function="gelu_pytorch_tanh",
                                resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1,
                                tie_word_embeddings=True), 1024, 8),
    ("gpt2-medium", "gpt2", dict(n_embd=1024, n_layer=24, n_head=16, vocab_size=50257,
                                 n_positions=1024, activation_function="gelu_pytorch_tanh",
                                 resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1,
                                 tie_word_embeddings=True), 1024, 4),
    ("llama-0.2b", "llama", dict(hidden_size=1024, num_hidden_layers=8, num_attention_heads=16,
                                 num_key_value_heads=4, intermediate_size=2816, vocab_size=32000,
                                 max_position_embeddings=2048, hidden_act="silu",
                                 tie_word_embeddings=False, attention_dropout=0.0), 2048, 2),
    ("llama-1.1b", "llama", dict(hidden_size=2048, num_hidden_layers=22, num_attention_heads=32,
                                 num_key_value_heads=4, intermediate_size=5632, vocab_size=32000,
                                 max_position_embeddings=2048, hidden_act="silu",
                                 tie_word_embeddings=False, attention_dropout=0.0), 2048, 2),
    ("qwen2-0.5b", "qwen2", dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                                 num_key_value_heads=2, intermediate_size=4864,
                                 vocab_size=151936, max_position_embeddings=32768,
                                 hidden_act="silu", tie_word_embeddings=True,
                                 attention_dropout=0.0, use_sliding_window=False), 1024, 4),
    ("qwen2-1.5b", "qwen2", dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12,
                                 num_key_value_heads=2, intermediate_size=8960,
                                 vocab_size=151936, max_position_embeddings=32768,
                                 hidden_act="silu", tie_word_embeddings=True,
                                 attention_dropout=0.0, use_sliding_window=False), 1024, 2),
]


def configurations():
    """The matrix, most informative first, so a deadline cuts the least:
    checkpoint none for every model, then full, then fused AdamW."""
    out = []
    for ckpt in (False, True):
        for case in CASES:
            for attn in ("sdpa", "eager"):
                for amp in (False, True):
                    out.append((case, attn, ckpt, amp, "foreach"))
    for case in CASES:
        for amp in (False, True):
            out.append((case, "sdpa", False, amp, "fused"))
    return out


def grouped_heads(case):
    """Fewer key/value heads than query heads (the Llama and Qwen2 cases):
    in fp32, PyTorch's SDPA runs its math kernel for them."""
    keys = case[2]
    heads = keys.get("num_attention_heads", keys.get("n_head"))
    return keys.get("num_key_value_heads", heads) < heads


def precision(rec):
    return "amp-bf16" if rec["amp"] else "fp32"


def key(rec):
    """A run's configuration, the same across the campaign's result files."""
    return (rec["model"], rec["attn"], rec["ckpt"], rec["amp"], rec["impl"])


def error_pct(pred, meas):
    return 100.0 * (pred - meas) / meas


def hf_config(case, attn):
    """The transformers config object for a case (imported lazily: the dry
    run of this script has no transformers)."""
    import transformers
    name, family, keys, _, _ = case
    cls = {"gpt2": transformers.GPT2Config, "llama": transformers.LlamaConfig,
           "qwen2": transformers.Qwen2Config}[family]
    cfg = cls(**keys)
    cfg._attn_implementation = attn
    return cfg


def config_json(case, attn, cfg=None):
    """What memledger reads: the config as transformers holds it (or the
    case's keys), with model_type and the attention implementation."""
    d = dict(cfg.to_dict()) if cfg is not None else dict(case[2])
    d["model_type"] = case[1]
    d["attn_implementation"] = attn
    return d


def alloc_count(torch):
    s = torch.cuda.memory_stats()
    return s.get("allocation.all.allocated", 0)


def peaks(torch):
    return {"allocated": torch.cuda.max_memory_allocated(),
            "reserved": torch.cuda.max_memory_reserved()}


def measure(case, attn, ckpt, amp, impl, trace_path=None, loop="released"):
    import torch
    from transformers import AutoModelForCausalLM
    name, family, keys, T, B = case
    torch.manual_seed(0)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    marks = {}
    if trace_path:
        try:
            torch.cuda.memory._record_memory_history(enabled="all", context=None,
                                                     stacks="python", max_entries=4000000)
            marks["start"] = alloc_count(torch)
        except Exception as e:  # an API change: the measurement goes on untraced
            marks["error"] = repr(e)
            trace_path = None
    cfg = hf_config(case, attn)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn)
    model.train()
    if ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=(impl == "foreach"),
                            fused=(impl == "fused"))
    ids = torch.randint(0, keys["vocab_size"], (B, T), device="cuda")
    r = {"param_dtype": str(next(model.parameters()).dtype),
         "params": sum(p.numel() for p in model.parameters()),
         "attn_used": getattr(model.config, "_attn_implementation", None),
         "resident_before": torch.cuda.memory_allocated() - base}

    def step():
        ph = {}
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            out = model(input_ids=ids, labels=ids)
        ph["forward"] = torch.cuda.max_memory_allocated()
        out.loss.backward()
        ph["backward"] = torch.cuda.max_memory_allocated()
        if loop == "released":
            del out
        opt.step()
        ph["step"] = torch.cuda.max_memory_allocated()
        opt.zero_grad(set_to_none=True)
        return ph  # loop "kept": the output (logits) lives until here

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    marks["first"] = alloc_count(torch)
    r["first_phases"] = step()
    torch.cuda.synchronize()
    r["first"] = peaks(torch)
    torch.cuda.reset_peak_memory_stats()
    marks["steady"] = alloc_count(torch)
    r["steady_phases"] = step()
    torch.cuda.synchronize()
    r["steady"] = peaks(torch)
    r["steady"]["end_allocated"] = torch.cuda.memory_allocated() - base
    r["num_alloc_retries"] = torch.cuda.memory_stats().get("num_alloc_retries", 0)
    model.eval()
    torch.cuda.reset_peak_memory_stats()
    marks["eval"] = alloc_count(torch)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
        out = model(input_ids=ids, labels=ids)
        loss = float(out.loss)
        del out
    torch.cuda.synchronize()
    r["eval"] = peaks(torch)
    marks["end"] = alloc_count(torch)
    r["trace"] = {"alloc_count_marks": marks}
    if trace_path:
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        n = 0
        with open(trace_path, "w") as f:
            f.write("action,addr,size,stream\n")
            for e in snap["device_traces"][0]:
                f.write("%s,%d,%d,%d\n" % (e["action"], e["addr"], e["size"], e.get("stream", 0)))
                n += 1
        r["trace"]["events"] = n
    model.train()
    t0 = time.time()
    for _ in range(2):
        step()
    torch.cuda.synchronize()
    r["step_time_s"] = (time.time() - t0) / 2
    r["eval_loss"] = loss
    del model, opt, ids
    torch.cuda.empty_cache()
    return r


def plan(ml, case, attn, ckpt, amp, impl, calib, tmp, cfg=None, extra=()):
    path = os.path.join(tmp, "config.json")
    with open(path, "w") as f:
        json.dump(config_json(case, attn, cfg), f)
    args = [ml, "plan", "--hf", path, "--micro-batch", str(case[4]), "--seq-len", str(case[3]),
            "--precision", "amp-bf16" if amp else "fp32", "--optimizer", "adamw",
            "--optimizer-impl", impl, "--checkpoint", "full" if ckpt else "none",
            "--format", "json"]
    if "--device" not in extra:  # (memledger refuses a flag given twice)
        args += ["--device", "141GB"]
    if calib:
        args += ["--calib", calib]
    args += list(extra)
    out = subprocess.run(args, capture_output=True, text=True)
    if out.stdout:
        return json.loads(out.stdout)
    return {"error": out.stderr.strip(), "exit": out.returncode}


def pct(pred, meas):
    return "%+.1f%%" % error_pct(pred, meas) if meas and pred is not None else "-"


def label(rec):
    return "| %s | %d×%d | %s | %s | %s | %s |" % (
        rec["model"], rec["B"], rec["T"], rec["attn"], "full" if rec["ckpt"] else "none",
        precision(rec), rec["impl"])


def row(rec):
    """One line of the table: measured steady-state peaks, the plan's
    allocator peak and step time, and the errors (plan - measured) /
    measured."""
    m, p = rec["measured"], rec["plan"]
    if "error" in m or "bytes" not in p:
        why = m.get("error") or p.get("error", "no plan")
        return label(rec) + " %s |" % why.replace("|", "/").splitlines()[0] + " |" * 9
    meas, res, pred = m["steady"]["allocated"], m["steady"]["reserved"], p["bytes"]["peak"]
    tp, tm = p.get("step_time_s"), m["step_time_s"]
    return label(rec) + " %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %s | %.4f | %s | %s |" % (
        m["first"]["allocated"] / MIB, meas / MIB, res / MIB, m["eval"]["allocated"] / MIB,
        m["eval"]["reserved"] / MIB, pred / MIB, pct(pred, meas), tm,
        "%.4f" % tp if tp else "-", pct(tp, tm))


HEADER = ("| model | B×T | attention | ckpt | precision | AdamW | first iter. allocated MiB | "
          "steady allocated MiB | steady reserved MiB | eval allocated MiB | "
          "eval reserved MiB | planned peak MiB | error | step s | planned step s | error |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--memledger", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--calib-fp32")
    ap.add_argument("--calib-bf16")
    ap.add_argument("--traces", default="",
                    help="comma-separated indices of the configurations to trace")
    ap.add_argument("--deadline", type=float, default=1e9)
    ap.add_argument("--tag", default="", help="suffix of the results files' names")
    ap.add_argument("--only", default="",
                    help="comma-separated indices: measure only these configurations")
    ap.add_argument("--loop", choices=("released", "kept"), default="released",
                    help="released: the loop drops the model output after backward; "
                         "kept: it holds it until the iteration ends (a plain loop)")
    a = ap.parse_args()
    t_start = time.time()
    traced = {int(x) for x in a.traces.split(",") if x.strip()}
    only = {int(x) for x in a.only.split(",") if x.strip()}
    os.makedirs(os.path.join(a.out, "traces"), exist_ok=True)
    try:
        import torch
        import transformers
        env = {"torch": torch.__version__, "transformers": transformers.__version__,
               "device": torch.cuda.get_device_name(0), "cuda": torch.version.cuda,
               "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}
    except Exception as e:  # the dry run
        torch, env = None, {"error": repr(e)}
    rows = []
    tag = a.tag or ""
    with open(os.path.join(a.out, "results%s.jsonl" % tag), "w") as jl:
        jl.write(json.dumps({"environment": env}) + "\n")
        for i, (case, attn, ckpt, amp, impl) in enumerate(configurations()):
            if only and i not in only:
                continue
            rec = {"index": i, "model": case[0], "B": case[4], "T": case[3], "attn": attn,
                   "ckpt": ckpt, "amp": amp, "impl": impl, "loop": a.loop,
                   "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}
            cfg = None
            if time.time() - t_start > a.deadline:
                m = {"error": "skipped: deadline"}
            else:
                tp = os.path.join(a.out, "traces", "%02d-%s-%s-%s-%s.csv" % (
                    i, case[0], attn, "full" if ckpt else "none",
                    "bf16" if amp else "fp32")) if i in traced else None
                try:
                    m = measure(case, attn, ckpt, amp, impl, tp, a.loop)
                    cfg = hf_config(case, attn)
                except Exception as e:  # OOM or an API difference: recorded, not fatal
                    m = {"error": "%s: %s" % (type(e).__name__, str(e)[:300])}
                    if torch is not None:
                        try:
                            torch.cuda.memory._record_memory_history(enabled=None)
                        except Exception:
                            pass
                        torch.cuda.empty_cache()
            calib = a.calib_bf16 if amp else a.calib_fp32
            rec["measured"] = m
            rec["plan"] = plan(a.memledger, case, attn, ckpt, amp, impl, calib, a.out, cfg)
            jl.write(json.dumps(rec) + "\n")
            jl.flush()
            rows.append(rec)
            print(row(rec), flush=True)
    with open(os.path.join(a.out, "results%s.md" % tag), "w") as md:
        md.write(HEADER)
        for r in rows:
            md.write(row(r) + "\n")


if __name__ == "__main__":
    main()
