#!/usr/bin/env python3
"""The tables of docs/parallel.md that memledger's plans make: Korthikanti et
al. 2022 ("Reducing Activation Recomputation in Large Transformer Models"),
Figure 1, per GPU at tensor parallelism 8, reproduced with Megatron-core's
GPT layer (training.engine: megatron).

    parallel-tables.py MEMLEDGER            print the tables
    parallel-tables.py MEMLEDGER --check DOC   exit 1 unless DOC holds them

The paper's figures follow its closed form (its section 4 and Table 2): per
layer sbh(10 + 24/t + 5as/(ht)) bytes of activations with tensor parallelism
alone, sbh(34/t) with sequence parallelism and selective recompute; the
first pipeline stage holds L layers' worth (1F1B), L(1 + (p - 1)/(p v)) with
v virtual stages; 18 bytes per parameter (bf16 weights, fp32 main
gradients, fp32 master weights, Adam's two fp32 states) for the 12 L h^2
parameters of the layers over t p devices. From each plan the script takes
the first stage's in-flight micro-batches and one layer's saved bytes and
parameters; the differences are named in the table."""
import json
import os
import subprocess
import sys
import tempfile

GIB = 1 << 30
BEGIN = "<!-- parallel-tables: begin (scripts/parallel-tables.py) -->"
END = "<!-- parallel-tables: end -->"

# name, h, a, L, PP, b, v; the paper's figures (GiB): parameters + optimizer,
# activations with tensor parallelism alone, with SP + selective recompute
MODELS = [
    ("22B", 6144, 64, 48, 1, 4, 1, 45.5625, 59.25, 9.5625),
    ("175B", 12288, 96, 96, 8, 1, 3, 45.5625, 66.84375, 12.3515625),
    ("530B", 20480, 128, 105, 35, 1, 3, 31.640625, 114.0234375, 23.076171875),
    ("1T", 25600, 160, 128, 64, 1, 1, 32.958984375, 131.25, 26.5625),
]
T, V, TP = 2048, 51200, 8


def micro_batches(pp):
    """At least 64 a step, a multiple of the stages (the interleaved
    schedule's condition): enough that no stage's warmup is cut short."""
    return pp * -(-64 // pp)


def model_yaml(name, h, a, L, pp, b, v, sp, selective):
    par = "parallel:\n  tp: %d\n  sp: %s\n" % (TP, "true" if sp else "false")
    if pp > 1:
        par += "  pp: %d\n" % pp
        if v > 1:
            par += "  vpp: %d\n" % v
    return ("name: gpt-%s\nmodel:\n  type: decoder\n  layers: %d\n  hidden: %d\n  heads: %d\n"
            "  ffn: %d\n  activation: gelu\n  norm: layernorm\n  vocab: %d\n"
            "  max_positions: %d\n  position: learned\n  tied_embeddings: false\n  bias: true\n"
            "  attention: eager\n  dropout: 0.1\ntraining:\n  micro_batch: %d\n  seq_len: %d\n"
            "  grad_accum: %d\n  precision: bf16-master\n  optimizer: adamw\n"
            "  optimizer_impl: fused\n  engine: megatron\n  checkpoint: %s\n%s"
            % (name, L, h, a, 4 * h, V, T, b, T, micro_batches(pp),
               "selective" if selective else "none", par))


def plan(exe, text):
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(text)
        path = f.name
    try:
        out = subprocess.run([exe, "plan", path, "--allocator", "none", "--format", "json"],
                             capture_output=True, text=True)
    finally:
        os.unlink(path)
    if out.returncode:
        sys.exit("FAIL memledger plan exited %d: %s" % (out.returncode, out.stderr.strip()))
    return json.loads(out.stdout)


def first_stage(doc):
    """In-flight micro-batches, layers, one layer's saved bytes and
    parameters on the first stage (its blocks, or the whole model's)."""
    layer = [b for b in doc["blocks"] if b["name"].startswith("block.")][0]
    ranks = doc["ranks"]
    if ranks:
        r = ranks[0]
        return r["in_flight"], r["layer_count"], layer["activations_saved"], layer["params"]
    n = len([b for b in doc["blocks"] if b["name"].startswith("block.")])
    return 1.0, n, layer["activations_saved"], layer["params"]


def rows(exe):
    out = []
    for name, h, a, L, pp, b, v, p_opt, p_base, p_sel in MODELS:
        base = plan(exe, model_yaml(name, h, a, L, pp, b, v, False, False))
        sel = plan(exe, model_yaml(name, h, a, L, pp, b, v, True, True))
        u, n, act_base, params = first_stage(base)
        _, _, act_sel, _ = first_stage(sel)
        # the layers' states at 18 B a parameter; the paper counts 12 h^2 a
        # layer (no biases, no LayerNorms)
        states = 18.0 * params * n / GIB
        states_12 = 18.0 * 12 * h * h // (TP) * n / GIB
        out.append((name, pp, v, b, u, n,
                    states, states_12, p_opt,
                    u * n * act_base / GIB, p_base,
                    u * n * act_sel / GIB, p_sel, h, a, params))
    return out


def megatron_formula(h, a, L, ffn, V, s, b, t, p, v, m, dp, dist_opt, gated, norm_bias):
    """Megatron-LM's estimate (megatron/training/theoretical_memory_usage.py,
    read at commit d98e8a64dd), in our words, for a dense model with
    untied embeddings and sequence parallelism with selective recompute, as
    that file assumes: the weights and optimizer states of the most loaded
    shard (the first stage: its layers and the embedding), and the first
    stage's activations (Korthikanti's Table 2: sbh (18 + 4 ffn / h) a layer,
    the embedding's ids and dropout mask with p micro-batches in flight, the
    interleaved penalty, the output layer and the loss when p is 1), over t.
    Returns (states, activations) in bytes."""
    norm = 2 if norm_bias else 1
    attn = 2 * h * h * 2  # q and o, k and v (no grouped queries here)
    mlp = 2 * h * ffn * (1.5 if gated else 1)
    layer_norms = 2 * h * norm
    embedding = h * V
    sharded = (attn + mlp) * L / p + embedding
    replicated = layer_norms * L / p
    if p == 1:
        sharded += embedding  # the untied output layer on the same stage
    per_param = 6 + 12 / dp if dist_opt else 18
    states = (sharded / t + replicated) * per_param
    act = s * b * h * (18 + 4 * ffn / h) * L
    act += 8 * s * b * p + s * b * h * p
    if v > 1:
        act *= 1 + (p - 1) / (p * v)
    elif p > 1:
        act *= min(1, m / p)
    if p == 1:
        act += s * b * h * 4 * (1 + V / h)
    return states, act / t


def megatron_moe_states(h, heads, groups, L, ffn, E, V, p, dp, ep):
    """The same file's weights and optimizer states for a mixture of experts
    (compute_weight_and_optimizer_memory: every layer an MoE layer, tp and
    etp 1, untied embeddings, RMSNorm, the distributed optimizer): the most
    loaded shard's attention, norms and router (its L / p layers, and the
    embedding) at 6 + 12 / dp bytes a parameter, its experts' (the routed
    experts' over ep) at 6 + 12 / edp with edp = dp / ep, the ranks that
    hold the same experts (world / (etp ep pp))."""
    attn = 2 * h * h * (1 + groups / heads)
    routed = 2 * h * ffn * E * 1.5
    norms, router = 2 * h, h * E
    dense = attn * L / p + h * V + (norms + router) * L / p
    if p == 1:
        dense += h * V  # the output layer
    experts = routed * L / p / ep
    return dense * (6 + 12 / dp) + experts * (6 + 12 / (dp / ep))


def megatron_rows(exe):
    """GPT-3 175B at TP 8, PP 8 (Megatron's layer, SP, selective recompute);
    Llama-2-7B at TP 2, DP 4 with the distributed optimizer (ZeRO stage 1
    here; Hugging Face's eager layers: Megatron's Llama layer is not modelled
    yet)."""
    out = []
    gpt = model_yaml("175B", 12288, 96, 96, 8, 1, 1, True, True)
    d = plan(exe, gpt)
    r0 = d["ranks"][0]
    mf = megatron_formula(12288, 96, 96, 4 * 12288, V, T, 1, TP, 8, 1, micro_batches(8), 1,
                          False, False, True)
    out.append(("GPT-3 175B, tp 8, pp 8, 1F1B, SP + selective, Megatron's layer", d, r0, mf))
    # the same over 16 data-parallel ranks with Megatron's distributed
    # optimizer: 6 + 12/16 bytes a parameter in the formula
    d = plan(exe, gpt + "  dp: 16\n  dist_optimizer: true\n")
    mf = megatron_formula(12288, 96, 96, 4 * 12288, V, T, 1, TP, 8, 1, micro_batches(8), 16,
                          True, False, True)
    out.append(("GPT-3 175B, tp 8, pp 8, dp 16, distributed optimizer, SP + selective, "
                "Megatron's layer", d, d["ranks"][0], mf))
    llama = ("name: llama-2-7b\nmodel:\n  type: decoder\n  layers: 32\n  hidden: 4096\n"
             "  heads: 32\n  ffn: 11008\n  activation: swiglu\n  norm: rmsnorm\n"
             "  vocab: 32000\n  position: rope\n  tied_embeddings: false\n  bias: false\n"
             "  attention: eager\n  dropout: 0\ntraining:\n  micro_batch: 1\n  seq_len: 4096\n"
             "  precision: bf16-master\n  optimizer: adamw\n  optimizer_impl: fused\n"
             "  checkpoint: selective\n  zero: 1\n  zero_grad: zero\n"
             "parallel:\n  tp: 2\n  dp: 4\n")
    d = plan(exe, llama)
    mf = megatron_formula(4096, 32, 32, 11008, 32000, 4096, 1, 2, 1, 1, 1, 4, True, True, False)
    out.append(("Llama-2-7B, tp 2, dp 4, distributed optimizer (ZeRO 1), SP + selective, eager "
                "layers", d, None, mf))
    # Mixtral 8x7B as Megatron's example launches it
    # (examples/mixtral/train_mixtral_8x7b_distributed.sh: tp 1, pp 4, ep 8,
    # the distributed optimizer, micro-batch 1, 4,096 tokens), over 32
    # devices (dp 8): the states only (the formula has no experts' term for
    # the activations)
    mixtral = ("name: mixtral-8x7b\nmodel:\n  type: decoder\n  layers: 32\n  hidden: 4096\n"
               "  heads: 32\n  kv_heads: 8\n  ffn: 14336\n  experts: 8\n"
               "  experts_per_tok: 2\n  activation: swiglu\n  norm: rmsnorm\n"
               "  vocab: 32000\n  position: rope\n  tied_embeddings: false\n  bias: false\n"
               "  attention: eager\n  dropout: 0\ntraining:\n  micro_batch: 1\n"
               "  seq_len: 4096\n  grad_accum: 8\n  precision: bf16-master\n"
               "  optimizer: adamw\n  optimizer_impl: fused\n  checkpoint: selective\n"
               "  zero: 1\n  zero_grad: zero\nparallel:\n  pp: 4\n  ep: 8\n  dp: 8\n")
    d = plan(exe, mixtral)
    ms = megatron_moe_states(4096, 32, 8, 32, 14336, 8, 32000, 4, 8, 8)
    out.append(("Mixtral 8x7B, pp 4, ep 8, dp 8, distributed optimizer (ZeRO 1), eager layers",
                d, None, (ms, None)))
    return out


def megatron_table(exe):
    lines = ["| setup | states, GiB: memledger (Megatron's formula) | activations, GiB: "
             "memledger (formula) |", "|---|---|---|"]
    for name, d, r0, (states, act) in megatron_rows(exe):
        b = d["bytes"]
        ours_states = b["params"] + b["master_params"] + b["grads"] + b["optimizer_states"]
        ours_act = (r0["in_flight"] * r0["activations_saved"]) if r0 else b["activations_saved"]
        if act is None:  # no formula for these activations
            lines.append("| %s | %.6g (%.6g; %s) | %.6g (none) |"
                         % (name, ours_states / GIB, states / GIB, pct(ours_states, states),
                            ours_act / GIB))
            continue
        lines.append("| %s | %.6g (%.6g; %s) | %.6g (%.6g; %s) |"
                     % (name, ours_states / GIB, states / GIB, pct(ours_states, states),
                        ours_act / GIB, act / GIB, pct(ours_act, act)))
    return "\n".join(lines)


def pct(x, y):
    return "%+.3f %%" % (100.0 * (x - y) / y)


def tables(exe):
    r = rows(exe)
    lines = ["| model | PP | v | b | first stage: micro-batches in flight x layers | "
             "parameters + optimizer, GiB (paper) | layers at 12h² | activations, TP alone "
             "(paper) | SP + selective (paper) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for (name, pp, v, b, u, n, st, st12, p_opt, base, p_base, sel, p_sel, h, a, params) in r:
        lines.append("| %s | %d | %d | %d | %.6g x %d | %.6g (%.6g; %s) | %.6g | %.6g (%.6g; %s) | "
                     "%.6g (%.6g; %s) |"
                     % (name, pp, v, b, u, n, st, p_opt, pct(st, p_opt), st12, base, p_base,
                        pct(base, p_base), sel, p_sel, pct(sel, p_sel)))
    return "\n".join(lines)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    text = tables(sys.argv[1]) + "\n\n" + megatron_table(sys.argv[1])
    if len(sys.argv) == 4 and sys.argv[2] == "--check":
        doc = open(sys.argv[3], encoding="utf-8").read()
        want = "%s\n%s\n%s" % (BEGIN, text, END)
        if want not in doc:
            print("FAIL %s does not hold the tables this memledger makes:\n%s" % (sys.argv[3], text))
            sys.exit(1)
        print("ok   %s: the Figure 1 table is what memledger plans today" % sys.argv[3])
        return
    print(text)


if __name__ == "__main__":
    main()
