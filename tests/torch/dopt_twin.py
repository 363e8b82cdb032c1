#!/usr/bin/python3
"""Megatron's distributed optimizer, laid out and allocated in real PyTorch.

A second derivation of memledger's `--engine megatron --precision
bf16-master --dist-optimizer` figures (bytes.params, bytes.grads,
bytes.master_params, bytes.optimizer_states; ranks[].params with
pipelines), made without memledger's code: the layout rules are restated
here from Megatron-LM's sources, applied to the parameters of torch.nn
models built in Megatron-core's GPT layout, and the bytes are read off the
tensors that result.

The model (megatron/core/models/gpt/gpt_model.py, GPTModel.__init__, and
the modules it builds). Registration order, which is the order DDP takes
the parameters in (distributed_data_parallel.py: module.named_parameters(),
requires_grad only):

  embedding.word_embeddings.weight        Vp/tp x D  (VocabParallelEmbedding)
  embedding.position_embeddings.weight    P x D      (torch.nn.Embedding)
  decoder.layers.i (TransformerLayer, in this order):
    input_layernorm.weight, .bias                          D, D
    self_attention.linear_qkv.weight, .bias                3D/tp x D, 3D/tp
    self_attention.linear_proj.weight, .bias               D x D/tp, D
    pre_mlp_layernorm.weight, .bias                        D, D
    mlp.linear_fc1.weight, .bias                           F/tp x D, F/tp
    mlp.linear_fc2.weight, .bias                           D x F/tp, D
  decoder.final_layernorm.weight, .bias                    D, D
  output_layer.weight                     Vp/tp x D  (untied; or the last
                                          stage's copy of a tied table)

  Only the first stage (pre_process) has the embedding, only the last
  (post_process) the final norm and the output layer; with tied
  embeddings and one stage the output layer allocates no weight
  (skip_weight_param_allocation) and named_parameters() sees the table
  once. Vp is the vocabulary padded to a multiple of
  make_vocab_size_divisible_by * tp (megatron/training/vocab_utils.py),
  with make_vocab_size_divisible_by 1 as memledger's --emit megatron
  writes it. Column-parallel weights and biases are split over tp,
  row-parallel weights over their input; row-parallel biases and the norms
  are whole.

  This follows the local spec (get_gpt_layer_local_spec: separate
  input_layernorm and pre_mlp_layernorm modules), which plain torch.nn
  can build. The Transformer Engine spec fuses the norms into linear_qkv
  and linear_fc1 (TELayerNormColumnParallelLinear), whose __init__
  registers layer_norm_weight and layer_norm_bias before weight and bias
  (transformer_engine/pytorch/module/layernorm_linear.py), and Megatron's
  local spec maps "input_layernorm." to "linear_qkv.layer_norm_" in its
  sharded_state_dict_keys_map: the flat order of tensors and sizes is the
  same either way, so the layout is too.

The layout (megatron/core/optimizer/distrib_optimizer.py,
_compute_per_buffer_param_layout; megatron/core/optimizer/param_layout.py),
per model chunk (each virtual stage is its own GPTModel under its own DDP,
so its own buffers), for the one buffer of bf16 params with fp32 grads
(--bf16 sets accumulate_allreduce_grads_in_fp32, megatron/training/
arguments.py):

  - walk the parameters in reverse registration order; each starts at its
    predecessor's end rounded up to a multiple of 64 (pad_param_start);
  - overlap_grad_reduce off (Megatron's default) makes bucket_size None, so
    the buffer is one bucket, except that a parameter marked
    shared_embedding closes the bucket before it (when the bucket holds
    anything) and after it: it gets a bucket of its own, and the next
    parameter starts at that bucket's padded end;
  - a bucket's end is its last parameter's end rounded up to a multiple of
    lcm(dp, 128) (pad_bucket_end, bucket_end_divisor with
    pad_buckets_for_high_nccl_busbw off);
  - shared_embedding (megatron/core/models/common/language_module/
    language_module.py, setup_embeddings_and_output_layer): only with tied
    embeddings and pp > 1: the first stage's word embedding (pre_process,
    not post_process, first virtual chunk) and the last stage's output
    layer copy (post_process, not pre_process).

The shards (_build_model_gbuf_range, _build_model_gbuf_param_range_map):
rank r of dp owns [r*n/dp, (r+1)*n/dp) of each bucket of n elements (at the
bucket's offset); for each parameter overlapping it, the overlap is a
piece. _build_model_and_main_param_groups makes each bf16 piece's fp32
master as shard_model_param.clone().float(), shard_model_param being
model_param.detach().view(-1)[start:end] (a view into the param buffer,
param_and_grad_buffer.py having rebound each param's data there).

What this script allocates, per model chunk: the param buffer
(torch.zeros(numel, bfloat16), as _ParamAndGradBuffer does with the
distributed optimizer) and the grad buffer (torch.zeros(numel, float32));
every parameter rebound as a view into the first and given a main_grad
view into the second; then for every dp rank its fp32 master pieces and an
AdamW (torch.optim, on the CPU) over them, stepped once with the pieces'
grads pointing into the grad buffer (as _copy_model_grads_to_main_grads
does), which creates exp_avg and exp_avg_sq per piece. Bytes are the
tensors' storages' nbytes (each storage once). torch.optim's per-parameter
'step' tensor (a 4-byte scalar in 1.13) is not counted: Megatron's step is
FusedAdam's (Transformer Engine's or Apex's), which keeps the step count in
the param group as a Python int. The fullest rank is the one with the most
parameter elements over all the stage's chunks (the lowest among equals);
the shards of all ranks must also cover every parameter element exactly
once.

Compared with `memledger plan MODEL --format json --allocator none`:
  bytes.params            = the stage's param buffers' bytes
  bytes.grads             = the stage's grad buffers' bytes
  bytes.master_params     = the fullest rank's fp32 master pieces' bytes
  bytes.optimizer_states  = the fullest rank's exp_avg + exp_avg_sq bytes
  params                  = the stage's parameter count
and, with pipelines (--ranks all), for every stage i: ranks[i].params
against stage i's count, ranks[i].chunks against Megatron's layer
assignment (even stages, or --pp-layers; chunk c of stage r of an
interleaved pipeline holds layers c*L/v + r*L/(p*v) onwards), and
ranks[i].bytes.params, .grads, .master_params and .optimizer_states
against stage i's figures as above (its buffers, its fullest rank); the
top-level bytes and params against the stage worst_rank names. The cases
make both a first stage and a last stage the planned one.

Each compared figure is also recomputed under rival rules (RIVALS: no
64-element starts, registration order instead of reverse, no bucket of its
own for a shared embedding, bucket ends padded to dp instead of
lcm(dp, 128), each virtual chunk's fullest rank summed instead of the
fullest device), and a check fails unless some case's figures differ under
each rival (the shared embedding's on a planned first and a planned last
stage): a figure every rival also gives would prove nothing about the rule.
The guard looks at the worst_rank stage's figures only (its ranks[] entry
repeats them); the other stages' ranks[].bytes are checked without one.

One case by hand (the script's figures), dopt-a (L 4, D 72, F 288, V 101,
P 40, tied) at dp 8 on one stage: 52 tensors, 262,872 elements. Walked in
reverse with 64-element starts they leave gaps of 32, 40 and 56 elements
after the 72-element norms and biases and the 216- and 288-element qkv and
fc1 biases (1,744 in all); the word table, last, ends at 264,616, padded to
a multiple of lcm(8, 128) = 128: 264,704 elements, 529,408 B of bf16
params and 1,058,816 B of fp32 grads. Each rank owns 33,088 of them and
holds 32,888, 32,712, 33,056, 32,712, 33,056, 32,712, 33,056 and 32,680
parameter elements: rank 2 is the fullest, 132,224 B of master weights and
264,448 B of Adam states. In all 1,984,896 B, where 6 + 12/8 bytes a
parameter (no padding) would be 1,971,540.

A self-test first: the hand-derived example of docs/parallel.md (100, 64
and 30 elements over 4 ranks: [128, 228), [64, 128), [0, 30) of 256; the
ranks hold 30, 64, 64, 36).

usage: dopt_twin.py MEMLEDGER
Prints one line per check ('ok ...' or 'FAIL ...') and ends with
"N passed, N failed"; exits 1 on any failure.
"""
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn as nn
import yaml

torch.manual_seed(0)


# --------------------------------------------------------------------------
# The models: Megatron-core's GPT layout in torch.nn

class Attention(nn.Module):
    def __init__(self, D, heads, tp):
        super().__init__()
        self.heads = heads // tp
        self.linear_qkv = nn.Linear(D, 3 * D // tp)          # column-parallel
        self.linear_proj = nn.Linear(D // tp, D)             # row-parallel (bias whole)

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = self.linear_qkv(x).chunk(3, dim=-1)
        sh = lambda t: t.view(B, T, self.heads, -1).transpose(1, 2)
        q, k, v = sh(q), sh(k), sh(v)
        a = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)
        a = a.masked_fill(mask, float("-inf")).softmax(-1)
        return self.linear_proj((a @ v).transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, D, F, tp):
        super().__init__()
        self.linear_fc1 = nn.Linear(D, F // tp)              # column-parallel
        self.linear_fc2 = nn.Linear(F // tp, D)              # row-parallel (bias whole)

    def forward(self, x):
        return self.linear_fc2(nn.functional.gelu(self.linear_fc1(x)))


class TransformerLayer(nn.Module):
    def __init__(self, D, heads, F, tp):
        super().__init__()
        self.input_layernorm = nn.LayerNorm(D)
        self.self_attention = Attention(D, heads, tp)
        self.pre_mlp_layernorm = nn.LayerNorm(D)
        self.mlp = MLP(D, F, tp)

    def forward(self, x):
        x = x + self.self_attention(self.input_layernorm(x))
        return x + self.mlp(self.pre_mlp_layernorm(x))


class Embedding(nn.Module):
    def __init__(self, Vr, P, D):
        super().__init__()
        self.word_embeddings = nn.Embedding(Vr, D)
        self.position_embeddings = nn.Embedding(P, D)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1])
        return self.word_embeddings(ids) + self.position_embeddings(pos)


class Decoder(nn.Module):
    def __init__(self, n_layers, D, heads, F, tp, post):
        super().__init__()
        self.layers = nn.ModuleList(TransformerLayer(D, heads, F, tp) for _ in range(n_layers))
        self.final_layernorm = nn.LayerNorm(D) if post else None

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.final_layernorm(x) if self.final_layernorm is not None else x


class GPTChunk(nn.Module):
    """One model chunk (GPTModel with pre_process / post_process)."""

    def __init__(self, m, tp, n_layers, pre, post, vp_first):
        super().__init__()
        D, Vr = m["hidden"], vocab_rows(m, tp)
        self.tied = m["tied_embeddings"]
        if pre:
            self.embedding = Embedding(Vr, m["max_positions"], D)
        self.decoder = Decoder(n_layers, D, m["heads"], m["ffn"], tp, post)
        if post and not (pre and self.tied):
            # the untied head, or the last stage's copy of a tied table
            self.output_layer = nn.Linear(D, Vr, bias=False)
        self.shared = set()
        if self.tied and not (pre and post):
            if pre and vp_first:
                self.embedding.word_embeddings.weight.shared_embedding = True
                self.shared.add(self.embedding.word_embeddings.weight)
            if post:
                self.output_layer.weight.shared_embedding = True
                self.shared.add(self.output_layer.weight)

    def forward(self, ids):
        h = self.decoder(self.embedding(ids))
        w = self.embedding.word_embeddings.weight if self.tied else self.output_layer.weight
        return h @ w.t()


def vocab_rows(m, tp):
    vp = -(-m["vocab"] // tp) * tp          # make_vocab_size_divisible_by 1 * tp
    return vp // tp


# --------------------------------------------------------------------------
# The layout (distrib_optimizer.py, param_layout.py), in this script's words

def round_up(x, d):
    return -(-x // d) * d


# Megatron's rules; RIVALS below are plausible misreadings of them, which the
# cases must tell apart (a figure that one of them would also give proves
# nothing about that rule)
RULES = {"align": 64, "reverse": True, "split_shared": True, "lcm128": True,
         "fullest": "device"}
RIVALS = {"no 64-element starts": {"align": 1},
          "registration order instead of reverse": {"reverse": False},
          "no bucket of its own for the shared embedding": {"split_shared": False},
          "bucket ends padded to dp instead of lcm(dp, 128)": {"lcm128": False},
          "each chunk's fullest rank, summed": {"fullest": "chunk"}}


def layout(params, dp, shared, rules=RULES):
    """params in registration order -> ({param: (start, end)}, [(bstart, bend)])."""
    div = dp * 128 // math.gcd(dp, 128) if rules["lcm128"] else dp
    if not rules["split_shared"]:
        shared = set()
    where, buckets = {}, []
    start = bstart = 0
    open_bucket = False
    end = 0
    for p in (reversed(params) if rules["reverse"] else params):
        start = round_up(start, rules["align"])
        if p in shared and open_bucket:          # close the bucket before it
            bend = round_up(start, div)
            buckets.append((bstart, bend))
            bstart = start = bend
            open_bucket = False
        end = start + p.numel()
        where[p] = (start, end)
        open_bucket = True
        if p in shared:                           # and after it
            bend = round_up(end, div)
            buckets.append((bstart, bend))
            bstart = start = bend
            open_bucket = False
        else:
            start = end
    if open_bucket:
        buckets.append((bstart, round_up(end, div)))
    return where, buckets


def shard_pieces(where, buckets, dp, r):
    """Rank r's pieces: (param, lo, hi) with lo:hi the slice of param.view(-1)."""
    out = []
    for bs, be in buckets:
        n = (be - bs) // dp
        rs, re = bs + r * n, bs + (r + 1) * n
        for p, (ps, pe) in where.items():
            lo, hi = max(ps, rs), min(pe, re)
            if hi > lo:
                out.append((p, lo - ps, hi - ps))
    return out


def storage_bytes(tensors):
    seen, total = set(), 0
    for t in tensors:
        s = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
        if s.data_ptr() not in seen:
            seen.add(s.data_ptr())
            total += s.nbytes()
    return total


def self_test():
    ps = [torch.empty(100), torch.empty(64), torch.empty(30)]
    where, buckets = layout(ps, 4, set())
    got = ([where[p] for p in ps], buckets,
           [sum(hi - lo for _, lo, hi in shard_pieces(where, buckets, 4, r)) for r in range(4)])
    want = ([(128, 228), (64, 128), (0, 30)], [(0, 256)], [30, 64, 64, 36])
    return got == want, "docs/parallel.md's example: %s (want %s)" % (got, want)


# --------------------------------------------------------------------------
# A stage, allocated

def stage_chunks(m, p, v, r, pp_layers):
    """[(first layer, end layer, pre, post, vp_first)] for stage r."""
    L = m["layers"]
    if v > 1:
        per = L // (p * v)
        return [(c * L // v + r * per, c * L // v + r * per + per,
                 r == 0 and c == 0, r == p - 1 and c == v - 1, c == 0) for c in range(v)]
    counts = pp_layers or [L // p] * p
    first = sum(counts[:r])
    return [(first, first + counts[r], r == 0, r == p - 1, True)]


def allocate_stage(m, tp, dp, chunks, rules=RULES):
    """Builds the chunks, allocates the buffers and every rank's shard."""
    nc = len(chunks)
    res = {"params": 0, "param_bytes": 0, "grad_bytes": 0, "covered": True, "buckets": [],
           "elems": [[0] * dp for _ in range(nc)], "master": [[0] * dp for _ in range(nc)],
           "states": [[0] * dp for _ in range(nc)]}
    rank_pieces = [[] for _ in range(dp)]       # (chunk, fp32 master piece)
    for c, (first, end, pre, post, vp_first) in enumerate(chunks):
        model = GPTChunk(m, tp, end - first, pre, post, vp_first).to(torch.bfloat16)
        params = [q for q in model.parameters() if q.requires_grad]
        res["params"] += sum(q.numel() for q in params)
        where, buckets = layout(params, dp, model.shared, rules)
        res["buckets"].append(buckets)
        numel = buckets[-1][1]
        param_data = torch.zeros(numel, dtype=torch.bfloat16)
        grad_data = torch.zeros(numel, dtype=torch.float32)
        for q, (s, e) in where.items():
            param_data[s:e].copy_(q.data.view(-1))
            q.data = param_data[s:e].view(q.shape)
            q.main_grad = grad_data[s:e].view(q.shape)
        grad_data.normal_()                       # a backward's fake gradients
        res["param_bytes"] += storage_bytes([param_data])
        res["grad_bytes"] += storage_bytes([grad_data])
        seen = {q: 0 for q in params}
        for r in range(dp):
            for q, lo, hi in shard_pieces(where, buckets, dp, r):
                seen[q] += hi - lo
                master = q.detach().view(-1)[lo:hi].clone().float()
                master.grad = q.main_grad.view(-1)[lo:hi]
                rank_pieces[r].append((c, master))
                res["elems"][c][r] += hi - lo
        res["covered"] &= all(seen[q] == q.numel() for q in params)
    for r in range(dp):
        pieces = [x for _, x in rank_pieces[r]]
        if pieces:
            opt = torch.optim.AdamW(pieces, lr=1e-3, foreach=False)
            opt.step()
        for c in range(nc):
            mine = [x for cc, x in rank_pieces[r] if cc == c]
            res["master"][c][r] = storage_bytes(mine)
            res["states"][c][r] = storage_bytes(
                [opt.state[x][k] for x in mine for k in ("exp_avg", "exp_avg_sq")])
    return res


def fullest(elems, dp):
    """The rank with the most parameter elements, the lowest among equals."""
    return max(range(dp), key=lambda r: (elems[r], -r))


def figures(s, rules=RULES):
    """The plan's four model-state figures of a stage, as the twin measured them:
    the fullest device (its elements summed over the stage's chunks), or, for
    the rival rule, each chunk's fullest rank summed."""
    dp = len(s["elems"][0])
    nc = len(s["elems"])
    if rules["fullest"] == "device":
        r = fullest([sum(s["elems"][c][q] for c in range(nc)) for q in range(dp)], dp)
        pick = [r] * nc
    else:
        pick = [fullest(s["elems"][c], dp) for c in range(nc)]
    return {"params": s["param_bytes"], "grads": s["grad_bytes"],
            "master_params": sum(s["master"][c][pick[c]] for c in range(nc)),
            "optimizer_states": sum(s["states"][c][pick[c]] for c in range(nc))}


def fullest_info(s):
    """Where a stage's fullest device is, for a failing check's message."""
    dp = len(s["elems"][0])
    per_rank = [sum(e[q] for e in s["elems"]) for q in range(dp)]
    r = fullest(per_rank, dp)
    return "fullest dp rank %d of %d: %d elements; buckets %s" % (
        r, dp, per_rank[r], s["buckets"])


def smoke(m):
    """The single-stage model runs forward and backward, every parameter used."""
    model = GPTChunk(m, 1, m["layers"], True, True, True)
    ids = torch.randint(0, m["vocab"], (2, 7))
    loss = nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
    loss.backward()
    missing = [n for n, q in model.named_parameters() if q.grad is None]
    return not missing and torch.isfinite(loss).item(), "unused: %s" % missing


# --------------------------------------------------------------------------
# The plan

def write_yaml(d, m, dp):
    path = os.path.join(d, "%s-dp%d.yaml" % (m["name"], dp))
    doc = {"name": m["name"],
           "model": {"type": "decoder", "layers": m["layers"], "hidden": m["hidden"],
                     "heads": m["heads"], "ffn": m["ffn"], "activation": "gelu",
                     "norm": "layernorm", "vocab": m["vocab"], "position": "learned",
                     "max_positions": m["max_positions"],
                     "tied_embeddings": m["tied_embeddings"], "bias": True,
                     "attention": "eager", "dropout": 0},
           "training": {"micro_batch": 2, "seq_len": 16, "precision": "bf16-master",
                        "optimizer": "adamw", "engine": "megatron"},
           "parallel": {"dp": dp, "dist_optimizer": True}}
    with open(path, "w") as f:
        yaml.safe_dump(doc, f, sort_keys=False)
    return path


def plan(memledger, path, extra):
    args = [memledger, "plan", path, "--format", "json", "--allocator", "none"] + extra
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode not in (0, 1):
        return None, "%s exited %d: %s" % (" ".join(args[1:]), out.returncode,
                                            out.stderr.strip()[:300])
    try:
        return json.loads(out.stdout), ""
    except ValueError as e:
        return None, "output not JSON (%s)" % e


# hidden 72 and 80 are not multiples of 64: every bias and norm leaves a gap
MODELS = {
    "a": {"name": "dopt-a", "layers": 4, "hidden": 72, "heads": 4, "ffn": 288,
          "vocab": 101, "max_positions": 40, "tied_embeddings": True},
    "b": {"name": "dopt-b", "layers": 3, "hidden": 80, "heads": 4, "ffn": 200,
          "vocab": 257, "max_positions": 33, "tied_embeddings": False},
    "c": {"name": "dopt-c", "layers": 4, "hidden": 72, "heads": 4, "ffn": 288,
          "vocab": 1999, "max_positions": 64, "tied_embeddings": True},
}

# (model, dp, tp, pp, vpp, pp_layers, micro-batches, micro-batch size or None).
# The pipeline cases are chosen so that each rule is seen (the RIVALS check):
# odd dp (lcm 640, 896) makes the shared embedding's own bucket change the
# figures; --pp-layers 1,3 and dopt-c's large vocabulary at micro-batch 8
# make the last stage the planned one; dopt-c at dp 6 over two virtual
# chunks has a fullest device (rank 1, 45,280 elements) that is not each
# chunk's fullest rank (45,312 summed).
CASES = [(k, dp, 1, 1, 1, None, 1, None) for k in "ab" for dp in (1, 2, 3, 8, 64)] + [
    ("a", 2, 1, 2, 1, None, 1, None),
    ("a", 5, 1, 2, 1, None, 8, None),
    ("a", 8, 1, 2, 1, [1, 3], 1, None),
    ("a", 7, 1, 2, 1, [1, 3], 1, None),
    ("a", 3, 1, 2, 2, None, 4, None),
    ("a", 7, 1, 2, 2, None, 4, None),
    ("c", 6, 1, 2, 2, None, 2, 8),
    ("a", 64, 1, 4, 1, None, 1, None),
    ("a", 2, 2, 2, 1, None, 1, None),
    ("b", 3, 1, 3, 1, None, 1, None),
    ("b", 2, 2, 1, 1, None, 1, None),
    ("b", 8, 2, 3, 1, None, 1, None),
]


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    memledger = sys.argv[1]
    t0 = time.time()
    results = []

    def check(ok, what):
        results.append(bool(ok))
        print(("ok   " if ok else "FAIL ") + what, flush=True)

    check(*self_test())
    for k, m in MODELS.items():
        ok, why = smoke(m)
        check(ok, "%s: forward and backward reach every parameter%s" % (
            m["name"], "" if ok else " (" + why + ")"))

    planned_stages = set()
    told = {rival: [] for rival in RIVALS}
    with tempfile.TemporaryDirectory() as d:
        for k, dp, tp, p, v, pp_layers, mb, B in CASES:
            m = MODELS[k]
            path = write_yaml(d, m, dp)
            extra = ["--micro-batch", str(B)] if B else []
            if tp > 1:
                extra += ["--tp", str(tp)]
            if p > 1:
                extra += ["--pp", str(p), "--ranks", "all", "--micro-batches", str(mb)]
            if v > 1:
                extra += ["--vpp", str(v)]
            if pp_layers:
                extra += ["--pp-layers", ",".join(map(str, pp_layers))]
            name = "%s dp %d%s%s%s%s" % (m["name"], dp, " tp %d" % tp if tp > 1 else "",
                                         " pp %d" % p if p > 1 else "",
                                         " vpp %d" % v if v > 1 else "",
                                         " pp-layers %s" % pp_layers if pp_layers else "")
            j, err = plan(memledger, path, extra)
            if j is None:
                check(False, "%s: %s" % (name, err))
                continue
            stages = [allocate_stage(m, tp, dp, stage_chunks(m, p, v, r, pp_layers))
                      for r in range(p)]
            for r, s in enumerate(stages):
                check(s["covered"], "%s stage %d: the dp shards cover every parameter "
                      "element once" % (name, r))
            w = 0
            if p > 1:
                ranks = j.get("ranks") or []
                check(len(ranks) == p, "%s: ranks[] lists %d stages (want %d)" % (
                    name, len(ranks), p))
                for r, s in enumerate(stages[:len(ranks)]):
                    want_chunks = [[a, b] for a, b, *_ in stage_chunks(m, p, v, r, pp_layers)]
                    got_chunks = ranks[r].get("chunks")
                    check(got_chunks == want_chunks, "%s stage %d: chunks %s (Megatron's %s)" % (
                        name, r, got_chunks, want_chunks))
                    check(ranks[r].get("params") == s["params"],
                          "%s stage %d: params %s (twin %d)" % (name, r, ranks[r].get("params"),
                                                                s["params"]))
                    rb = ranks[r].get("bytes")
                    rb = rb if isinstance(rb, dict) else {}
                    for key, mine in figures(s).items():
                        ok = rb.get(key) == mine
                        check(ok, "%s stage %d: ranks[%d].bytes.%s %s (twin %d)%s" % (
                            name, r, r, key, rb.get(key), mine,
                            "" if ok else "; " + fullest_info(s)))
                w = j.get("worst_rank")
                if not isinstance(w, int) or not 0 <= w < p:
                    check(False, "%s: worst_rank %r" % (name, w))
                    continue
                planned_stages.add((w == 0, w == p - 1))
            s = stages[w]
            b = j.get("bytes", {})
            where = "%s%s" % (name, " stage %d (worst_rank)" % w if p > 1 else "")
            check(j.get("params") == s["params"], "%s: params %s (twin %d)" % (
                where, j.get("params"), s["params"]))
            figs = figures(s)
            for key, mine in figs.items():
                ok = b.get(key) == mine
                check(ok, "%s: bytes.%s %s (twin %d)%s" % (
                    where, key, b.get(key), mine, "" if ok else "; " + fullest_info(s)))
            kind = (w == 0, w == p - 1) if p > 1 else None
            for rival, change in RIVALS.items():
                rules = dict(RULES, **change)
                alt = figures(allocate_stage(m, tp, dp, stage_chunks(m, p, v, w, pp_layers),
                                             rules), rules)
                if alt != figs:
                    told[rival].append(("%s (%s)" % (name, ", ".join(
                        "%s %d" % (f, alt[f]) for f in alt if alt[f] != figs[f])), kind))
    check((True, False) in planned_stages and (False, True) in planned_stages,
          "the pipeline cases plan a first stage and a last stage (worst_rank): %s" %
          sorted(planned_stages))
    for rival, seen in told.items():
        want = [(True, False), (False, True)] if "shared" in rival else [None]
        for kind in want:
            hits = [n for n, k in seen if kind is None or k == kind]
            check(hits, "the cases tell Megatron's rule from '%s'%s: %s" % (
                rival, {None: "", (True, False): " on a planned first stage",
                        (False, True): " on a planned last stage"}[kind],
                "; ".join(hits[:3]) + (" ..." if len(hits) > 3 else "") if hits else "none"))
    bad = results.count(False)
    print("%d passed, %d failed (%.1f s)" % (len(results) - bad, bad, time.time() - t0))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
