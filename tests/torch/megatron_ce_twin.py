#!/usr/bin/python3
"""Megatron's vocab-parallel cross-entropy, run in real PyTorch for one rank.

What is compared. With `--engine megatron` memledger plans the loss as
Megatron-LM's unfused vocab-parallel cross-entropy
(megatron/core/tensor_parallel/cross_entropy.py, _VocabParallelCrossEntropy,
called by LanguageModule.compute_language_model_loss on the output layer's
bf16 logits) and its JSON `blocks[]` entry "loss" gives `activations_saved`
= B*T*(4*V/t + 9) bytes, V/t = ceil(V/tp) being the rank's vocabulary rows
(memledger's --emit megatron writes --make-vocab-size-divisible-by 1, so
the padded vocabulary is split evenly). This script restates that
autograd.Function for one tensor-parallel rank, without Megatron or
memledger code, runs it on bf16 logits of the rank's shape (seq-first
(T, B, V/t), as Megatron feeds it, and batch-first (B, T, V/t)) with int64
targets, and records what it saves with
torch.autograd.graph.saved_tensors_hooks: each saved tensor's storage
bytes, counted once per storage (the flattened masked targets are a view).
The total is compared with the plan's figure for the same small GPT model
(vocab 1000 and 1001, tp 1, 2, 4).

Why a twin: the figure is derived by reading Megatron's source; running
the same steps on real tensors checks that reading (that the fp32 copy of
the logits becomes the softmax in place and is what is kept, beside the
1-byte mask and the 8-byte masked targets, and that nothing else is).

One rank's view: the three all-reduces (the row max, the picked logits, the
sums of exps) work in place on tensors of the rank's own shape, so what is
saved does not depend on their results; for the byte count they are the
identity. A second run replaces them by their true results, computed from
the whole vocabulary's logits, and checks the twin's losses and gradients
against F.cross_entropy: the restatement computes the right thing.

The backward, observed (not in the plan's JSON, which does not list the
loss block's transients): the allocations of the CPU allocator are read
from torch.profiler's memory events (profile_memory=True; in 1.13 the event
tree gives each one's pointer, signed size and time). The gradient the
Function returns must be the saved softmax's own storage (same data_ptr,
changed in place: no fp32 logits-sized allocation in backward), and the
autograd engine's cast of that fp32 gradient to the bf16 input's dtype
must be one logits-sized bf16 allocation, made while the softmax is still
alive (the softmax's storage is freed after it), the one that becomes the
logits' .grad. Printed as 'info' lines, not checked: the peak of live
bytes during backward over its start, and the forward's peak beyond the
storages it saves, beside memledger's workspace formulas for this block
(src/ledger/chain_head.c, megatron_loss: ws_bwd = logits*2, the cast;
ws_fwd = rows*20, rows = B*T).

Usage: megatron_ce_twin.py MEMLEDGER. Prints 'ok ...' or 'FAIL ...' per
check and a summary; exits 1 on any failure.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

torch.manual_seed(0)
torch.set_num_threads(1)  # every allocation on the profiled (main) thread

B, T = 2, 32  # micro-batch and sequence
VOCABS = (1000, 1001)
TPS = (1, 2, 4)
LAYOUTS = ("T,B", "B,T")  # seq-first (Megatron's), batch-first

MODEL_YAML = """\
name: megatron-ce-v{vocab}-tp{tp}
model:
  type: decoder
  layers: 2
  hidden: 64
  heads: 4
  ffn: 256
  activation: gelu
  norm: layernorm
  vocab: {vocab}
  max_positions: {seq}
  position: learned
  tied_embeddings: false
  bias: true
  attention: eager
  dropout: 0.1
training:
  micro_batch: {batch}
  seq_len: {seq}
  precision: bf16-master
  optimizer: adamw
  engine: megatron
parallel:
  tp: {tp}
"""


# --------------------------------------------------------------------------
# The twin: one rank's vocab-parallel cross-entropy

def no_reduce(kind, t):
    """A single rank's view: the all-reduces leave their tensors as they are."""
    return t


def _shift_pick_exp(probs, top, target, lo, hi):
    """Shift by the row max and exponentiate, in place; pick each token's logit.

    A function of its own as Megatron's calculate_predicted_logits is: its
    temporaries (the row ids among them) go when it returns.
    """
    probs.sub_(top.unsqueeze(-1))
    # tokens whose class some other rank holds
    elsewhere = (target < lo) | (target >= hi)
    local = target.clone() - lo
    local[elsewhere] = 0
    local_flat = local.view(-1)
    width = probs.size(-1)
    table = probs.view(-1, width)
    row_ids = torch.arange(table.size(0), device=table.device)
    picked = table[row_ids, local_flat].clone().view_as(target)
    picked[elsewhere] = 0.0
    torch.exp(probs, out=probs)
    total = probs.sum(dim=-1)
    return elsewhere, local_flat, picked, total


class RankVocabCE(torch.autograd.Function):
    """Cross-entropy over one rank's slice [lo, hi) of the vocabulary.

    `reduce(kind, t)` stands for the in-place all-reduce over the tensor-
    parallel group (kind 'max', 'picked' or 'sumexp').
    """

    seen = []  # (returned gradient's data_ptr, saved softmax's data_ptr)

    @staticmethod
    def forward(ctx, logits, target, lo, hi, reduce):
        # the fp32 copy that every later step works on in place
        probs = logits.float()
        top = probs.max(dim=-1)[0]
        reduce("max", top)
        elsewhere, local_flat, picked, total = _shift_pick_exp(probs, top, target, lo, hi)
        reduce("picked", picked)
        reduce("sumexp", total)
        loss = torch.log(total) - picked
        probs.div_(total.unsqueeze(-1))  # now the softmax
        ctx.save_for_backward(probs, elsewhere, local_flat)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        probs, elsewhere, local_flat = ctx.saved_tensors
        grad = probs  # d loss / d logits = softmax - one-hot, made in place
        table = grad.view(-1, grad.size(-1))
        row_ids = torch.arange(table.size(0), device=table.device)
        hit = 1.0 - elsewhere.view(-1).float()
        table[row_ids, local_flat] -= hit
        grad.mul_(grad_loss.unsqueeze(-1))
        RankVocabCE.seen.append((grad.data_ptr(), probs.data_ptr()))
        return grad, None, None, None, None


def storage_of(t):
    """(data_ptr, nbytes) of the tensor's whole (untyped) storage."""
    if hasattr(t, "untyped_storage"):
        s = t.untyped_storage()
    else:
        s = t.storage()
        s = s.untyped() if hasattr(s, "untyped") else s
    return s.data_ptr(), s.nbytes()


def rank_slice(V, tp, r):
    """Rank r's vocabulary rows [lo, hi): ceil(V/tp) each, the last padded."""
    part = -(-V // tp)
    return r * part, (r + 1) * part


def make_inputs(V, tp, layout):
    part = -(-V // tp)
    shape = (T, B) if layout == "T,B" else (B, T)
    full = torch.randn(shape + (part * tp,)).to(torch.bfloat16)
    target = torch.randint(0, V, shape, dtype=torch.int64).contiguous()
    return full, target


def measure_saved(V, tp, r, layout):
    """What the rank's loss saves: {storage ptr: (nbytes, dtype)}."""
    full, target = make_inputs(V, tp, layout)
    lo, hi = rank_slice(V, tp, r)
    logits = full[..., lo:hi].clone().requires_grad_()
    saved = {}

    def pack(t):
        ptr, n = storage_of(t)
        saved.setdefault(ptr, (n, t.dtype))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = RankVocabCE.apply(logits, target, lo, hi, no_reduce)
    loss.sum().backward()  # the graph runs with what was packed
    return saved


def oracle_check(V, tp, layout):
    """All ranks with the true reductions against F.cross_entropy."""
    full, target = make_inputs(V, tp, layout)
    weight = torch.rand(target.shape)
    ref = full.float().requires_grad_()
    want = F.cross_entropy(ref.view(-1, ref.size(-1)), target.view(-1),
                           reduction="none").view_as(target)
    (want * weight).sum().backward()
    x = full.float()
    gmax = x.max(dim=-1)[0]
    truth = {"max": gmax,
             "picked": x.gather(-1, target.unsqueeze(-1)).squeeze(-1) - gmax,
             "sumexp": (x - gmax.unsqueeze(-1)).exp().sum(dim=-1)}

    def reduce(kind, t):
        return t.copy_(truth[kind])

    worst_loss, grads = 0.0, []
    for r in range(tp):
        lo, hi = rank_slice(V, tp, r)
        logits = full[..., lo:hi].clone().requires_grad_()
        loss = RankVocabCE.apply(logits, target, lo, hi, reduce)
        (loss * weight).sum().backward()
        worst_loss = max(worst_loss, (loss - want.detach()).abs().max().item())
        grads.append(logits.grad.float())
    worst_grad = (torch.cat(grads, dim=-1) - ref.grad).abs().max().item()
    return worst_loss, worst_grad


# --------------------------------------------------------------------------
# The backward, observed through the CPU allocator's events

class Mark:
    """A profiler range that allocates nothing (1.13's record_function does)."""

    def __init__(self, name):
        self.name = name

    def __enter__(self):
        self.h = torch.ops.profiler._record_function_enter_new(self.name, None)

    def __exit__(self, *a):
        torch.ops.profiler._record_function_exit._RecordFunction(self.h)


def allocations(prof):
    """[(time, ptr, signed size, ops around it)] in time order, and ranges."""
    events, ranges = [], {}

    def walk(node, around):
        ef = node.extra_fields
        if type(ef).__name__ == "_ExtraFields_Allocation":
            events.append((node.start_time_ns, ef.ptr, ef.alloc_size, around))
        elif node.name.startswith("twin."):
            ranges[node.name] = (node.start_time_ns, node.end_time_ns)
        for c in node.children:
            walk(c, around + (node.name,))

    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root, ())
    events.sort(key=lambda e: e[0])
    return events, ranges


def observe_backward(V, tp, r, layout):
    """Run one rank's loss under the profiler; return the facts seen."""
    from torch.profiler import ProfilerActivity, profile
    RankVocabCE.seen.clear()
    lo, hi = rank_slice(V, tp, r)
    packed, kept = {}, {}

    def pack(t):
        packed.setdefault(t.dtype, t.data_ptr())
        ptr, nbytes = storage_of(t)
        kept[ptr] = nbytes
        return t

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        full, target = make_inputs(V, tp, layout)
        logits = full[..., lo:hi].clone().requires_grad_()
        del full
        with Mark("twin.forward"):
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                loss = RankVocabCE.apply(logits, target, lo, hi, no_reduce)
        grad_loss = torch.ones_like(loss)
        with Mark("twin.backward"):
            loss.backward(grad_loss)
        grad_ptr = logits.grad.data_ptr()
        grad_facts = (logits.grad.dtype, logits.grad.shape == logits.shape)
        del loss, logits, target, grad_loss
    events, ranges = allocations(prof)
    n = 1
    for s in logits_shape(V, tp, layout):
        n *= s
    f0, f1 = ranges["twin.forward"]
    b0, b1 = ranges["twin.backward"]
    live, start, peak, bwd = 0, {}, {}, []
    for t, ptr, size, around in events:
        for k, (lo_t, hi_t) in (("f", (f0, f1)), ("b", (b0, b1))):
            if lo_t <= t and k not in start:
                start[k] = live
        live += size
        for k, (lo_t, hi_t) in (("f", (f0, f1)), ("b", (b0, b1))):
            if lo_t <= t <= hi_t:
                peak[k] = max(peak.get(k, 0), live)
        if b0 <= t <= b1:
            bwd.append((ptr, size, around, live))
    soft = packed.get(torch.float32)
    casts = [(i, p, a) for i, (p, s, a, _) in enumerate(bwd) if s == 2 * n]
    frees = [i for i, (p, s, a, _) in enumerate(bwd) if p == soft and s == -4 * n]
    # live bytes over the backward's start before the cast: the Function's
    # own temporaries (arange, float mask, 1 - mask, the gathered entries)
    before = [lv for _, _, _, lv in bwd[:casts[0][0]]] if casts else []
    return {
        "n": n, "rows": n // logits_shape(V, tp, layout)[-1],
        "same_ptr": RankVocabCE.seen == [(soft, soft)] and soft is not None,
        "big_fp32": [s for p, s, a, _ in bwd if s >= 4 * n],
        "casts": casts, "softmax_freed": frees,
        "cast_is_grad": len(casts) == 1 and casts[0][1] == grad_ptr,
        "cast_ops": casts[0][2] if casts else (),
        "grad": grad_facts, "bwd_peak": peak.get("b", 0) - start.get("b", 0),
        "temps": max(before, default=start.get("b", 0)) - start.get("b", 0),
        # the forward's peak beyond the storages it saves
        "fwd_transient": peak.get("f", 0) - start.get("f", 0) - sum(kept.values()),
    }


def logits_shape(V, tp, layout):
    part = -(-V // tp)
    return (T, B, part) if layout == "T,B" else (B, T, part)


# --------------------------------------------------------------------------
# memledger

def plan_loss(memledger, d, V, tp):
    path = os.path.join(d, "ce-v%d-tp%d.yaml" % (V, tp))
    with open(path, "w") as f:
        f.write(MODEL_YAML.format(vocab=V, tp=tp, seq=T, batch=B))
    args = [memledger, "plan", path, "--allocator", "none", "--format", "json"]
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode not in (0, 1):
        return None, "exit %d: %s" % (out.returncode, out.stderr.strip()[:200])
    try:
        j = json.loads(out.stdout)
    except ValueError as e:
        return None, "output not JSON (%s)" % e
    cfg = j.get("config", {})
    if cfg.get("engine") != "megatron" or cfg.get("parallel", {}).get("tp") != tp:
        return None, "config engine %r tp %r" % (cfg.get("engine"),
                                                 cfg.get("parallel", {}).get("tp"))
    loss = [b for b in j.get("blocks", []) if b.get("name") == "loss"]
    if len(loss) != 1:
        return None, "%d blocks named loss" % len(loss)
    return loss[0].get("activations_saved"), ""


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    memledger = sys.argv[1]
    t0 = time.time()
    results = []

    def check(ok, what):
        results.append(bool(ok))
        print(("ok   " if ok else "FAIL ") + what, flush=True)

    with tempfile.TemporaryDirectory() as d:
        for V in VOCABS:
            for tp in TPS:
                part = -(-V // tp)
                name = "V %d tp %d" % (V, tp)
                want = B * T * (4 * part + 9)
                planned, why = plan_loss(memledger, d, V, tp)
                if planned is None:
                    check(False, "%s: memledger plan: %s" % (name, why))
                    continue
                check(planned == want, "%s: plan's loss activations_saved %d "
                      "= B*T*(4*%d+9)" % (name, planned, part) if planned == want else
                      "%s: plan's loss activations_saved %d, B*T*(4*%d+9) = %d" % (
                          name, planned, part, want))
                expect = sorted([("bool", B * T), ("float32", 4 * B * T * part),
                                 ("int64", 8 * B * T)])
                for layout in LAYOUTS:
                    where = "%s (%s,V/t)" % (name, layout)
                    for r in sorted({0, tp - 1}):
                        saved = measure_saved(V, tp, r, layout)
                        total = sum(n for n, _ in saved.values())
                        kinds = sorted((str(dt)[len("torch."):], n)
                                       for n, dt in saved.values())
                        check(total == planned and kinds == expect,
                              "%s rank %d saves %d = %s; plan %d" % (
                                  where, r, total, " + ".join(
                                      "%s %d" % k for k in kinds), planned))
                    wl, wg = oracle_check(V, tp, layout)
                    check(wl < 1e-4 and wg < 2e-2,
                          "%s, true reductions: |loss-F.ce| %.1e, |grad-F.ce's| %.1e"
                          % (where, wl, wg))
                    o = observe_backward(V, tp, tp - 1, layout)
                    n, rows = o["n"], o["rows"]
                    check(o["same_ptr"], "%s: backward returns the saved softmax's "
                          "storage (same data_ptr)" % where)
                    check(not o["big_fp32"], "%s: no fp32 logits-sized alloc in backward %s"
                          % (where, o["big_fp32"]))
                    cast_op = any(a.startswith("aten::_to_copy") for a in o["cast_ops"])
                    engine = any(a.startswith("autograd::engine::evaluate_function: "
                                              "RankVocabCEBackward") for a in o["cast_ops"])
                    check(len(o["casts"]) == 1 and o["cast_is_grad"] and cast_op and engine
                          and o["grad"] == (torch.bfloat16, True),
                          "%s: one bf16 alloc of %d B (engine's _to_copy) = .grad" % (
                              where, 2 * n))
                    check(len(o["softmax_freed"]) == 1 and o["casts"]
                          and o["softmax_freed"][0] > o["casts"][0][0],
                          "%s: fp32 softmax (%d B) freed after the cast" % (where, 4 * n))
                    print("info %s: bwd peak over start %d B (cast %d), temps %d B "
                          "before it" % (where, o["bwd_peak"], 2 * n, o["temps"]))
                    print("info     fwd peak over saved %d B; chain_head.c: ws_bwd %d, "
                          "ws_fwd %d" % (o["fwd_transient"], 2 * n, 20 * rows))
    bad = results.count(False)
    print("%d passed, %d failed (%.1f s)" % (len(results) - bad, bad, time.time() - t0))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
