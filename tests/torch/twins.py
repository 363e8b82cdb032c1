"""The reference implementations the torch checks build from a model YAML
(tests/torch/models/*.yaml): the eager layouts of docs/inventory.md written
out in PyTorch, one class per family, with the batch each trains on.
crosscheck.py measures what they save; livebytes.py replays their memory
curve (it patches `F` and the RMSNorms' forward here).
"""
import itertools
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as tcp
import yaml

import cuda_autocast

# In-place ReLU, except in checkpointed runs (seq_layers)
INPLACE = [True]
# torch.utils.checkpoint's implementation. 1.13's default is the reentrant
# one (an autograd Function whose backward re-runs the segment and calls a
# nested backward); the planner models the non-reentrant one (saved-tensor
# hooks), which its emitted scripts and Hugging Face's
# gradient_checkpointing_kwargs ask for (docs/ledger.md, "Checkpointed
# segments, node by node"). crosscheck.py keeps the reentrant one: its outer
# saved_tensors_hooks see the segment inputs that ctx.save_for_backward
# keeps, where the non-reentrant hooks, innermost, would hide them.
# livebytes.py sets False.
REENTRANT = [True]
# > 0 while a checkpointed function runs (its forward or its recompute):
# livebytes.py's `mean` artefact does not apply there, the checkpoint
# keeping the segment's input anyway
IN_CHECKPOINT = [0]


# livebytes.py: called with a block's name when the gradient of its output
# arrives (the block's backward starts); None: no marks
BWD_MARK = [None]


def bwd_mark(name, t):
    """Marks the start of block `name`'s backward: a hook on its output (its
    handle, None when none is set)."""
    if BWD_MARK[0] is not None and t.requires_grad:
        return t.register_hook(lambda g, n=name: BWD_MARK[0](n))
    return None


# livebytes.py sets True: the MoE twins' routers send row t to experts t*k ..
# t*k + k - 1 (mod E), the same every iteration and balanced, as the plan
# assumes; the saved bytes do not depend on the routing (crosscheck.py keeps
# the learned one), its transients do
FIXED_ROUTING = [False]
# with FIXED_ROUTING, a function (tokens, k, E) -> the (tokens, k) experts
# chosen, in place of the balanced rule (ep_twin.py's skewed routing)
ROUTING = [None]


def fixed_routing(n, k, E):
    """The fixed routing's experts for n tokens: the balanced rule, or ROUTING's."""
    if ROUTING[0]:
        return ROUTING[0](n, k, E)
    return (torch.arange(n)[:, None] * k + torch.arange(k)[None]) % E


# Blocks per checkpoint segment of a transformer (livebytes.py sets 2 for
# its every-2 rows; checkpoint: every-K segments the blocks from the first)
CKPT_EVERY = [1]


def run_blocks(rec, blocks, fn, x, ckpt, *extra):
    """The layer blocks, each run as fn(block, x, *extra): with ckpt, in
    segments of CKPT_EVERY blocks under one checkpoint each. A segment's
    range is named after its blocks, joined by "|" (a range opened inside it
    would open again in the recompute, during backward); bwd_mark marks
    where each one's backward starts."""
    k = CKPT_EVERY[0] if ckpt else 1
    for i in range(0, len(blocks), k):
        group = list(blocks[i:i + k])
        names = "|".join("block.%d" % (i + j) for j in range(len(group)))
        rec.block = names
        if not ckpt:
            x = fn(group[0], x, *extra)
            bwd_mark(names, x)
            continue

        def segment(x, *e, group=group):
            for b in group:
                x = fn(b, x, *e)
            return x
        x = checkpoint(segment, x, *extra)
        bwd_mark(names, x)
    return x


class Checks:
    """The twins' checks: one line each ("ok" or "FAIL", the label, the
    detail), counted; done() prints "N passed, N failed" and gives the exit
    status (1 when one failed or nothing was checked)."""

    def __init__(self):
        self.passed = self.failed = 0

    def __call__(self, label, ok, detail):
        print("%s %s: %s" % ("ok  " if ok else "FAIL", label, detail))
        if ok:
            self.passed += 1
        else:
            self.failed += 1
        return ok

    def done(self, models):
        print("%d passed, %d failed" % (self.passed, self.failed))
        if self.passed + self.failed == 0:
            print("FAIL no model under %s: nothing was checked" % models)
            return 1
        return 0 if self.failed == 0 else 1


def explain(diff, parts):
    """The subset of the named items (name: bytes, the zero ones left out)
    whose sum is diff, as "name +bytes + ..."; None when none is. A twin
    uses it to name every byte of a plan-measurement difference."""
    names = [n for n, v in parts.items() if v]
    for k in range(1, len(names) + 1):
        for sub in itertools.combinations(names, k):
            if sum(parts[x] for x in sub) == diff:
                return " + ".join("%s %+d" % (x, parts[x]) for x in sub)
    return None


def checkpoint(fn, *args):
    def run(*a):
        IN_CHECKPOINT[0] += 1
        try:
            return fn(*a)
        finally:
            IN_CHECKPOINT[0] -= 1
    return tcp.checkpoint(cuda_autocast.region_for(run), *args, use_reentrant=REENTRANT[0])


# logits: fused (livebytes.py sets it): the decoders' LM head and loss run
# as Liger Kernel's fused linear cross-entropy (FusedLinearCE)
FUSED = [False]


def liger_chunk_rows(BT, D, V):
    # liger_kernel/ops/fused_linear_cross_entropy.py: next_power_of_2(
    # ceil(BT / ceil(V / D))), at most the rows there are
    inc = -(-V // D)
    want, rows = -(-BT // inc), 1
    while rows < want:
        rows *= 2
    return min(rows, BT)


class FusedLinearCE(torch.autograd.Function):
    """Liger Kernel's fused linear cross-entropy, its allocations in plain
    PyTorch: the forward makes W's and x's gradients (zeros_like), an fp32
    loss per row and the target mask, then per chunk of rows the logits,
    turned into their gradient in place (Liger's Triton kernel writes over
    them), x's gradient rows through a temporary and W's by addmm_ into it.
    `logits` is rebound only once the next chunk's product exists, as in
    Liger's loop. The backward hands the two gradients over (grad_output is
    1). The small per-row temporaries of the in-place softmax are deleted at
    once: the kernel has none."""

    @staticmethod
    def forward(ctx, x, weight, target):
        BT, D = x.shape
        V = weight.shape[0]
        rows = liger_chunk_rows(BT, D, V)
        grad_weight = torch.zeros_like(weight)
        grad_input = torch.zeros_like(x)
        loss_1d = torch.zeros(BT, dtype=torch.float32)
        target_mask = target != -100
        n = int(target_mask.sum().item())
        logits = None
        for s0 in range(0, BT, rows):
            e = min(s0 + rows, BT)
            xc, tc = x[s0:e], target[s0:e]
            logits = xc @ weight.t()
            m = logits.amax(-1, keepdim=True)
            logits.sub_(m)
            del m
            logits.exp_()
            z = logits.sum(-1, keepdim=True)
            logits.div_(z)
            del z
            p_t = logits.gather(1, tc[:, None])
            loss_1d[s0:e] = p_t[:, 0].log().neg_()
            del p_t
            logits.scatter_add_(1, tc[:, None], torch.full((e - s0, 1), -1.0, dtype=logits.dtype))
            logits.div_(n)
            grad_input[s0:e] = logits @ weight
            grad_weight.addmm_(logits.t(), xc)
        loss = loss_1d.sum() / n
        ctx.save_for_backward(grad_input.detach(), grad_weight.detach())
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        grad_input, grad_weight = ctx.saved_tensors
        return grad_input, grad_weight, None


def lm_loss(rec, h, lm_head, tgt, softcap=0.0):
    """The LM head and the cross-entropy over the vocabulary at every token:
    as two modules (the loop may hold the logits), or fused. softcap: Gemma
    2's logits / cap, tanh, * cap (the planner refuses it fused)."""
    if FUSED[0]:
        bwd_mark("head", h)
        rec.block = "loss"
        return FusedLinearCE.apply(h.reshape(-1, h.size(-1)), lm_head.weight, tgt.reshape(-1))
    logits = lm_head(h)
    if softcap:
        logits = logits / softcap
        logits = torch.tanh(logits)
        logits = logits * softcap
    bwd_mark("head", logits)
    rec.block = "loss"
    return F.cross_entropy(logits.view(-1, logits.size(-1)), tgt.view(-1))


def cls_loss(rec, h, score, idx, tgt, pad=0):
    """A decoder's sequence-classification head (transformers'
    GenericForSequenceClassification): score on every token, the logits of
    each sequence's last non-pad token, cross-entropy over the classes."""
    logits = score(h)
    keep = (idx != pad).to(torch.int32)
    pos = torch.arange(idx.shape[-1], dtype=torch.int32)
    last = (pos * keep).argmax(-1)
    pooled = logits[torch.arange(idx.shape[0]), last]
    bwd_mark("head", pooled)
    rec.block = "loss"
    # the logits, the mask and the positions are the forward's locals until
    # it returns, after the loss (ForSequenceClassificationLoss)
    loss = F.cross_entropy(pooled.view(-1, pooled.size(-1)), tgt.view(-1))
    del logits, keep, pos
    return loss


def dropout(x, p):
    # CUDA's fused dropout keeps a 1-byte mask; 1.13's CPU nn.Dropout keeps a
    # float noise tensor instead, so the cross-check calls native_dropout,
    # which keeps the bool mask on the CPU too (docs/validation.md).
    if p <= 0:
        return x
    return torch.native_dropout(x, p, True)[0]


def gelu_new(input):  # transformers.activations.NewGELUActivation.forward
    return 0.5 * input * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (input + 0.044715 * torch.pow(input, 3.0))))


class GPT2(nn.Module):
    """nanoGPT / HF GPT-2 eager: pre-LN, fused qkv, masked_fill causal mask;
    the MLP's GELU the one op (nanoGPT's nn.GELU) or, with `activation:
    gelu_new`, HF GPT-2's default NewGELUActivation."""

    def __init__(s, m):
        super().__init__()
        D, H, F_, V, P = m["hidden"], m["heads"], m.get("ffn", 4 * m["hidden"]), m["vocab"], m["max_positions"]
        s.D, s.H, s.p = D, H, float(m.get("dropout", 0))
        s.act = gelu_new if m.get("activation") == "gelu_new" else F.gelu
        s.wte = nn.Embedding(V, D)
        s.wpe = nn.Embedding(P, D)
        s.blocks = nn.ModuleList()
        for _ in range(m["layers"]):
            b = nn.Module()
            b.ln_1 = nn.LayerNorm(D)
            b.c_attn = nn.Linear(D, 3 * D)
            b.c_proj = nn.Linear(D, D)
            b.ln_2 = nn.LayerNorm(D)
            b.c_fc = nn.Linear(D, F_)
            b.mlp_proj = nn.Linear(F_, D)
            s.blocks.append(b)
        s.ln_f = nn.LayerNorm(D)
        s.lm_head = nn.Linear(D, V, bias=False)
        s.lm_head.weight = s.wte.weight  # tied
        s.register_buffer("mask", torch.tril(torch.ones(P, P)).view(1, 1, P, P))

    # Written with nanoGPT's modules' own scoping (Block, CausalSelfAttention,
    # MLP): under no_grad (a checkpointed forward) a tensor lives until its
    # last Python reference goes (docs/ledger.md, "Forward under no_grad").
    def attn(s, b, x):  # CausalSelfAttention.forward
        B, T, C = x.size()
        H, dh = s.H, C // s.H
        q, k, v = b.c_attn(x).split(C, dim=2)
        k = k.view(B, T, H, dh).transpose(1, 2)
        q = q.view(B, T, H, dh).transpose(1, 2)
        v = v.view(B, T, H, dh).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(dh))
        att = att.masked_fill(s.mask[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = dropout(att, s.p)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        y = dropout(b.c_proj(y), s.p)
        return y

    def mlp(s, b, x):  # MLP.forward
        # nanoGPT rebinds x; called as a module, its argument tuple keeps
        # the input until forward returns, as this name does here
        h = b.c_fc(x)
        h = s.act(h)
        h = b.mlp_proj(h)
        h = dropout(h, s.p)
        return h

    def block(s, b, x):  # Block.forward
        x = x + s.attn(b, b.ln_1(x))
        x = x + s.mlp(b, b.ln_2(x))
        return x

    def run(s, rec, batch, ckpt):
        idx, tgt = batch
        B, T = idx.shape
        rec.block = "embedding"
        pos = torch.arange(0, T, dtype=torch.long)
        x = dropout(s.wte(idx) + s.wpe(pos), s.p)
        bwd_mark("embedding", x)
        x = run_blocks(rec, s.blocks, s.block, x, ckpt)
        rec.block = "head"
        return lm_loss(rec, s.ln_f(x), s.lm_head, tgt)


class RMSNorm(nn.Module):
    def __init__(s, D, eps=1e-6):
        super().__init__()
        s.weight = nn.Parameter(torch.ones(D))
        s.eps = eps

    def forward(s, x):  # HF LlamaRMSNorm
        dt = x.dtype
        h = x.to(torch.float32)
        var = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(var + s.eps)
        return s.weight * h.to(dt)


class GemmaRMSNorm(nn.Module):
    def __init__(s, D, eps=1e-6):
        super().__init__()
        s.weight = nn.Parameter(torch.zeros(D))
        s.eps = eps

    def forward(s, x):  # HF GemmaRMSNorm: the scale (1 + w) in fp32, then the cast
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + s.eps)
        return (h * (1.0 + s.weight.float())).type_as(x)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin):  # HF modeling_llama
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed


def apply_rotary_pos_emb_partial(q, k, cos, sin):  # HF modeling_phi3
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    rd = cos.shape[-1]
    q_rot, q_pass = q[..., :rd], q[..., rd:]
    k_rot, k_pass = k[..., :rd], k[..., rd:]
    q_embed = torch.cat([(q_rot * cos) + (rotate_half(q_rot) * sin), q_pass], dim=-1)
    k_embed = torch.cat([(k_rot * cos) + (rotate_half(k_rot) * sin), k_pass], dim=-1)
    return q_embed, k_embed


class FlashAttention(torch.autograd.Function):
    """The fused attention kernel's autograd node, as PyTorch 2.x's CUDA
    kernels keep it (tools/autograd/derivatives.yaml,
    _scaled_dot_product_flash_attention: its backward takes query, key,
    value, output and logsumexp): saves exactly those five, the logsumexp
    (B, H, T) in fp32. PyTorch 1.13 has no scaled_dot_product_attention;
    this node computes the same output with the math of eager attention
    under no_grad (nothing of it saved) and keeps what the kernel keeps, so
    the storages autograd holds are the kernel's: q and k as the rotary
    made them, v a view of its projection (docs/validation.md, "Fused
    attention on 1.13"); its output laid out as the kernels write it, (B,
    T, H, dh) returned transposed. Causal; k and v may have fewer heads
    (GQA, as enable_gqa passes them)."""

    @staticmethod
    def forward(ctx, q, k, v, scale):
        with torch.no_grad():
            rep = q.shape[1] // k.shape[1]
            kr = k.repeat_interleave(rep, dim=1)
            vr = v.repeat_interleave(rep, dim=1)
            T = q.shape[2]
            w = (q.float() @ kr.float().transpose(2, 3)) * scale
            w = w + torch.full((T, T), float("-inf")).triu(1)
            lse = torch.logsumexp(w, dim=-1)
            out = (torch.softmax(w, dim=-1) @ vr.float()).to(q.dtype)
            # the kernels write their output as (B, T, H, dh) and return it
            # transposed (attention.cu), so the caller's transpose(1, 2)
            # back is contiguous: no copy
            out = out.transpose(1, 2).contiguous().transpose(1, 2)
        ctx.scale = scale
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, g):
        q, k, v, out, lse = ctx.saved_tensors
        with torch.enable_grad():
            q2, k2, v2 = (t.detach().requires_grad_() for t in (q, k, v))
            rep = q2.shape[1] // k2.shape[1]
            kr = k2.repeat_interleave(rep, dim=1)
            vr = v2.repeat_interleave(rep, dim=1)
            T = q2.shape[2]
            w = (q2.float() @ kr.float().transpose(2, 3)) * ctx.scale
            w = w + torch.full((T, T), float("-inf")).triu(1)
            y = torch.softmax(w, dim=-1) @ vr.float()
            gq, gk, gv = torch.autograd.grad(y, (q2, k2, v2), g.float())
        return gq, gk, gv, None


def repeat_kv(x, rep):  # HF modeling_llama
    """HF indexes x[:, :, None, :, :]. 2.x's indexing returns the tensor
    itself for a slice that spans its axis (ATen TensorIndexing.h,
    applySlice: `length <= stop`), so only the unsqueeze is recorded; 1.13
    tested `stop == length`, and `:` (stop PY_SSIZE_T_MAX) records a
    SliceBackward0 whose backward zero-fills a copy of the gradient. The twin
    writes the unsqueeze, what 2.x records."""
    if rep == 1:
        return x
    B, KV, T, dh = x.shape
    return x.unsqueeze(2).expand(B, KV, rep, T, dh).reshape(B, KV * rep, T, dh)


class GPT2Rope(GPT2):
    """The LayerNorm rotary decoder (video-tokens' layout: a LayerNorm
    pre-norm decoder with `position: rope`, not parallel): nanoGPT's block
    (c_attn, split, the head views) with HF's apply_rotary_pos_emb on q and
    k before the attention core (rotate_half; cos and sin made once from
    the embedding's output, as LlamaRotaryEmbedding makes them, shared by
    every layer), no learned positions. Eager: nanoGPT's masked_fill core;
    flash: scaled_dot_product_attention (is_causal), FlashAttention's node
    on 1.13 (docs/inventory.md)."""

    def __init__(s, m):
        super().__init__(m)
        del s.wpe
        s.dh = s.D // s.H
        s.flash = m.get("attention", "eager") == "flash"
        s.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, s.dh, 2).float() / s.dh)))

    def attn(s, b, x, cos, sin):  # CausalSelfAttention.forward with the rotary
        B, T, C = x.size()
        H, dh = s.H, C // s.H
        q, k, v = b.c_attn(x).split(C, dim=2)
        k = k.view(B, T, H, dh).transpose(1, 2)
        q = q.view(B, T, H, dh).transpose(1, 2)
        v = v.view(B, T, H, dh).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        if s.flash:
            if torch.is_autocast_cpu_enabled():
                dt = torch.get_autocast_cpu_dtype()
                q, k, v = (t.to(dt) for t in (q, k, v))
            y = FlashAttention.apply(q, k, v, 1.0 / math.sqrt(dh))
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(dh))
            att = att.masked_fill(s.mask[:, :, :T, :T] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            att = dropout(att, s.p)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        y = dropout(b.c_proj(y), s.p)
        return y

    def block(s, b, x, cos, sin):  # Block.forward
        x = x + s.attn(b, b.ln_1(x), cos, sin)
        x = x + s.mlp(b, b.ln_2(x))
        return x

    def run(s, rec, batch, ckpt):
        idx, tgt = batch
        B, T = idx.shape
        rec.block = "embedding"
        x = dropout(s.wte(idx), s.p)
        pos = torch.arange(T)[None]  # cache_position[None]: one row for the batch (LlamaModel.forward)
        cos, sin = Llama.rotary(s, x, pos)
        # made once and saved by every block: counted with the embedding
        rec.pinned[cos.storage().data_ptr()] = "embedding"
        rec.pinned[sin.storage().data_ptr()] = "embedding"
        bwd_mark("embedding", x)
        x = run_blocks(rec, s.blocks, s.block, x, ckpt, cos, sin)
        rec.block = "head"
        return lm_loss(rec, s.ln_f(x), s.lm_head, tgt)


class Llama(nn.Module):
    """HF modeling_llama eager: RMSNorm, rotary, GQA repeat_kv, SwiGLU, untied."""
    Norm = RMSNorm
    final_softcap = 0.0  # Gemma 2's logits soft-cap (Gemma2 sets it)

    def __init__(s, m):
        super().__init__()
        D, H, KV, F_, V = m["hidden"], m["heads"], m.get("kv_heads", m["heads"]), m["ffn"], m["vocab"]
        s.D, s.H, s.KV, s.dh = D, H, KV, m.get("head_dim", D // H)
        s.scaling = s.dh ** -0.5
        s.softcap = 0.0
        s.flash = m.get("attention", "eager") == "flash"
        s.embed = nn.Embedding(V, D)
        s.blocks = nn.ModuleList()
        for _ in range(m["layers"]):
            # registered as LlamaDecoderLayer does (model.parameters() order,
            # the order torch.optim's for-loop visits): self_attn (q, k, v,
            # o), mlp (gate, up, down), input_layernorm, post_attention_layernorm
            b = nn.Module()
            qb = m.get("qkv_bias", m.get("bias", False))  # Qwen2's q, k, v biases
            b.q = nn.Linear(D, H * s.dh, bias=qb)
            b.k = nn.Linear(D, KV * s.dh, bias=qb)
            b.v = nn.Linear(D, KV * s.dh, bias=qb)
            b.o = nn.Linear(H * s.dh, D, bias=False)
            b.gate = nn.Linear(D, F_, bias=False)
            b.up = nn.Linear(D, F_, bias=False)
            b.down = nn.Linear(F_, D, bias=False)
            b.ln1 = s.Norm(D)
            b.ln2 = s.Norm(D)
            s.blocks.append(b)
        s.norm = s.Norm(D)
        # LlamaForSequenceClassification's score, where the LM head would be
        s.classes = m.get("classes", 0)
        s.lm_head = nn.Linear(D, s.classes or V, bias=False)
        s.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, s.dh, 2).float() / s.dh)))

    # Written with HF's own scoping (LlamaDecoderLayer, LlamaAttention,
    # eager_attention_forward, LlamaMLP): under no_grad (a checkpointed
    # forward) a tensor lives until its last Python reference goes — the
    # attention weights the layer keeps in `_` until it returns
    # (docs/ledger.md, "Forward under no_grad").
    def attn(s, b, h, cos, sin, mask):  # LlamaAttention.forward
        B, T, _ = h.shape
        q = b.q(h).view(B, T, -1, s.dh).transpose(1, 2)
        k = b.k(h).view(B, T, -1, s.dh).transpose(1, 2)
        v = b.v(h).view(B, T, -1, s.dh).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        y, w = s.core(q, k, v, mask)
        y = y.reshape(B, T, -1).contiguous()
        y = b.o(y)
        return y, w

    def core(s, q, k, v, mask):  # the attention interface the config names
        if getattr(s, "flash", False):  # sdpa_attention_forward: the kernel's output, made contiguous
            if torch.is_autocast_cpu_enabled():
                # scaled_dot_product_attention is on autocast's lower-precision
                # list: its inputs cast (a copy only where the dtype differs)
                dt = torch.get_autocast_cpu_dtype()
                q, k, v = (t.to(dt) for t in (q, k, v))
            y = FlashAttention.apply(q, k, v, s.scaling)
            return y.transpose(1, 2).contiguous(), None
        return s.eager(q, k, v, mask)

    def eager(s, q, k, v, mask):  # eager_attention_forward
        kr = repeat_kv(k, s.H // s.KV)
        vr = repeat_kv(v, s.H // s.KV)
        w = torch.matmul(q, kr.transpose(2, 3)) * s.scaling
        if s.softcap:
            w = w / s.softcap
            w = torch.tanh(w)
            w = w * s.softcap
        w = w + mask
        w = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
        y = torch.matmul(w, vr)
        y = y.transpose(1, 2).contiguous()
        return y, w

    def mlp(s, b, h):  # LlamaMLP.forward
        return b.down(s.act(b.gate(h)) * b.up(h))

    def post_attn(s, b, h):  # Gemma 2's post_attention_layernorm
        return h

    def post_mlp(s, b, h):  # Gemma 2's post_feedforward_layernorm
        return h

    def block(s, b, x, cos, sin, mask, pos):  # LlamaDecoderLayer.forward (pos: position_ids)
        r = x
        h = b.ln1(x)
        h, _ = s.attn(b, h, cos, sin, mask)
        h = s.post_attn(b, h)
        h = r + h
        r = h
        h = b.ln2(h)
        h = s.mlp(b, h)
        h = s.post_mlp(b, h)
        h = r + h
        return h

    def act(s, x):
        return F.silu(x)

    def embed_tokens(s, idx):
        return s.embed(idx)

    def rotary(s, x, pos):  # LlamaRotaryEmbedding.forward: its locals go at return
        # (it computes the frequencies with autocast disabled: fp32)
        with cuda_autocast.disabled():
            freqs = (s.inv_freq[None, :, None] @ pos[:, None, :].float()).transpose(1, 2)
            emb = torch.cat((freqs, freqs), dim=-1)
            return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    def run(s, rec, batch, ckpt):
        idx, tgt = batch
        B, T = idx.shape
        rec.block = "embedding"
        x = s.embed_tokens(idx)
        pos = torch.arange(T)[None]  # cache_position[None]: one row for the batch (LlamaModel.forward)
        cos, sin = s.rotary(x, pos)
        # the tables are made here and saved by every block: counted once,
        # with the embedding block (docs/inventory.md)
        rec.pinned[cos.storage().data_ptr()] = "embedding"
        rec.pinned[sin.storage().data_ptr()] = "embedding"
        # SDPA and flash get no 4-D mask: with no padding HF's builder returns
        # None and the kernel runs is_causal (masking_utils.py, sdpa_mask,
        # _ignore_causal_mask_sdpa), so a checkpoint keeps none
        mask = None if getattr(s, "flash", False) else \
            torch.full((T, T), float("-inf")).triu(1)[None, None].expand(B, 1, T, T)
        bwd_mark("embedding", x)
        x = run_blocks(rec, s.blocks, s.block, x, ckpt, cos, sin, mask, pos)
        del mask, pos  # LlamaModel.forward's: it returns after the layers (and its norm)
        rec.block = "head"
        if s.classes:
            return cls_loss(rec, s.norm(x), s.lm_head, idx, tgt)
        return lm_loss(rec, s.norm(x), s.lm_head, tgt, s.final_softcap)


class OlmoLayerNorm(nn.Module):
    def __init__(s, D):
        super().__init__()
        s.shape = (D,)

    def forward(s, x):  # HF OlmoLayerNorm: no weight, no bias, in fp32
        dt = x.dtype
        return F.layer_norm(x.to(dtype=torch.float32), s.shape, None, None, eps=1e-05).to(dt)


class Olmo(Llama):
    """HF modeling_olmo eager (OlmoDecoderLayer, OlmoAttention with
    clip_qkv null, OlmoMLP): Llama's layer with OlmoLayerNorm; tied as
    OLMo-1B is (tie_word_embeddings)."""
    Norm = OlmoLayerNorm

    def __init__(s, m):
        super().__init__(m)
        if m.get("tied_embeddings"):
            s.lm_head.weight = s.embed.weight


class Gemma(Llama):
    """HF modeling_gemma eager: Llama's attention (head_dim of its own, MQA)
    with GemmaRMSNorm, GeGLU with tanh GELU, embeddings times sqrt(D), tied."""
    Norm = GemmaRMSNorm

    def __init__(s, m):
        super().__init__(m)
        s.lm_head.weight = s.embed.weight  # tie_word_embeddings (GemmaConfig: true)

    def act(s, x):
        return F.gelu(x, approximate="tanh")  # gelu_pytorch_tanh

    def embed_tokens(s, idx):
        x = s.embed(idx)
        # GemmaModel.forward: a 0-dim tensor made without a device, which mul
        # saves (known_1_13: host memory on a GPU)
        return x * torch.tensor(s.D ** 0.5, dtype=x.dtype)


class Gemma2(Gemma):
    """HF modeling_gemma2 eager (Gemma2DecoderLayer, eager_attention_forward,
    Gemma2ForCausalLM): Gemma's layer with a GemmaRMSNorm on the attention's
    and on the MLP's output before each residual add, the scores scaled by
    attn_scalar ** -0.5, soft-capped scores (/ cap, tanh, * cap) before the
    mask, and soft-capped logits. The rotary tables are made once (the
    model's rotary_emb, as in today's transformers); no sliding layer (the
    tiny model's sequence is within any window, where its mask's values are
    the causal mask's)."""

    def __init__(s, m):
        super().__init__(m)
        s.scaling = float(m.get("attn_scalar", s.dh)) ** -0.5
        s.softcap = float(m.get("attn_softcap", 0))
        s.final_softcap = float(m.get("final_softcap", 0))
        for b in s.blocks:
            # Gemma2DecoderLayer registers input_layernorm,
            # post_attention_layernorm, pre_feedforward_layernorm,
            # post_feedforward_layernorm after self_attn and mlp
            del b.ln2
            b.ln_attn = s.Norm(s.D)
            b.ln2 = s.Norm(s.D)
            b.ln_mlp = s.Norm(s.D)

    def post_attn(s, b, h):
        return b.ln_attn(h)

    def post_mlp(s, b, h):
        return b.ln_mlp(h)


class Phi3(Llama):
    """HF modeling_phi3 eager (Phi3Attention, Phi3MLP): Llama's block with one
    qkv_proj whose output is sliced into q, k, v and one gate_up_proj whose
    output is chunked into gate and up; untied (Phi3Config)."""

    def __init__(s, m):
        super().__init__(m)
        D, F_ = m["hidden"], m["ffn"]
        for b in s.blocks:
            # Phi3Attention registers o_proj before qkv_proj; Phi3MLP
            # gate_up_proj before down_proj; the norms come last
            o, down, ln1, ln2 = b.o, b.down, b.ln1, b.ln2
            del b.q, b.k, b.v, b.o, b.gate, b.up, b.down, b.ln1, b.ln2
            b.o = o
            b.qkv = nn.Linear(D, (s.H + 2 * s.KV) * s.dh, bias=False)
            b.gate_up = nn.Linear(D, 2 * F_, bias=False)
            b.down, b.ln1, b.ln2 = down, ln1, ln2

    def attn(s, b, h, cos, sin, mask):  # Phi3Attention.forward
        B, T, _ = h.shape
        qkv = b.qkv(h)
        qp, kp = s.H * s.dh, s.KV * s.dh
        q = qkv[..., :qp]
        k = qkv[..., qp:qp + kp]
        v = qkv[..., qp + kp:]
        q = q.view(B, T, -1, s.dh).transpose(1, 2)
        k = k.view(B, T, -1, s.dh).transpose(1, 2)
        v = v.view(B, T, -1, s.dh).transpose(1, 2)
        q, k = apply_rotary_pos_emb_partial(q, k, cos, sin)
        y, w = s.core(q, k, v, mask)
        y = y.reshape(B, T, -1).contiguous()
        y = b.o(y)
        return y, w

    def mlp(s, b, h):  # Phi3MLP.forward
        up = b.gate_up(h)
        gate, up = up.chunk(2, dim=-1)
        up = up * F.silu(gate)
        return b.down(up)


class NeoX(Llama):
    """HF modeling_gpt_neox (GPTNeoXForCausalLM) eager, use_parallel_residual:
    x + attn(ln1(x)) + mlp(ln2(x)); one query_key_value with biases, viewed
    (B, T, H, 3*dh) and chunked into q, k, v; rotary on the whole head
    (rotary_pct 1); the additive mask and fp32 softmax of
    eager_attention_forward; a GELU MLP with biases; untied embed_out."""

    def __init__(s, m):
        nn.Module.__init__(s)
        D, H, F_, V = m["hidden"], m["heads"], m["ffn"], m["vocab"]
        s.D, s.H, s.KV, s.dh = D, H, H, D // H
        s.scaling = s.dh ** -0.5
        s.softcap = s.final_softcap = 0.0
        s.flash = m.get("attention", "eager") == "flash"
        s.classes = 0
        s.embed = nn.Embedding(V, D)
        s.blocks = nn.ModuleList()
        for _ in range(m["layers"]):
            # registered as GPTNeoXLayer does: input_layernorm,
            # post_attention_layernorm, attention (query_key_value, dense), mlp
            b = nn.Module()
            b.ln1 = nn.LayerNorm(D)
            b.ln2 = nn.LayerNorm(D)
            b.qkv = nn.Linear(D, 3 * D)
            b.dense = nn.Linear(D, D)
            b.h_to_4h = nn.Linear(D, F_)
            b.h4_to_h = nn.Linear(F_, D)
            s.blocks.append(b)
        s.norm = nn.LayerNorm(D)
        s.lm_head = nn.Linear(D, V, bias=False)
        s.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, s.dh, 2).float() / s.dh)))

    def attn(s, b, h, cos, sin, mask):  # GPTNeoXAttention.forward
        B, T, _ = h.shape
        qkv = b.qkv(h).view(B, T, -1, 3 * s.dh).transpose(1, 2)
        q, k, v = qkv.chunk(3, dim=-1)
        # modeling_gpt_neox's apply_rotary_pos_emb: the rotated part and the
        # pass (empty at rotary_pct 1) concatenated
        q, k = apply_rotary_pos_emb_partial(q, k, cos, sin)
        y, w = s.core(q, k, v, mask)
        y = y.reshape(B, T, -1).contiguous()
        return b.dense(y), w

    def mlp(s, b, h):  # GPTNeoXMLP.forward
        return b.h4_to_h(F.gelu(b.h_to_4h(h)))

    def block(s, b, x, cos, sin, mask, pos):  # GPTNeoXLayer.forward
        a, _ = s.attn(b, b.ln1(x), cos, sin, mask)
        y = s.mlp(b, b.ln2(x))
        return y + a + x


class Mixtral(Llama):
    """HF modeling_mixtral (MixtralForCausalLM) eager: Llama's attention and
    norms; the MLP is MixtralSparseMoeBlock, a router over E SwiGLU experts
    (w1, w2, w3) with each token sent to its top k, the experts run one by
    one on their tokens (no capacity, no dropped tokens); no auxiliary loss
    (output_router_logits false)."""

    def __init__(s, m):
        super().__init__(m)
        D, E = m["hidden"], m["experts"]
        F_ = m.get("expert_ffn", m["ffn"])
        s.E, s.k = E, m.get("experts_per_tok", 2)
        s.renorm = m.get("expert_renorm", True)
        Fs = m.get("shared_expert_ffn", 0)
        for b in s.blocks:
            # MixtralDecoderLayer registers self_attn, block_sparse_moe
            # (gate, then experts[i].w1, w2, w3), the two norms
            ln1, ln2 = b.ln1, b.ln2
            del b.gate, b.up, b.down, b.ln1, b.ln2
            b.router = nn.Linear(D, E, bias=False)
            b.experts = nn.ModuleList()
            for _ in range(E):
                e = nn.Module()
                e.w1 = nn.Linear(D, F_, bias=False)
                e.w2 = nn.Linear(F_, D, bias=False)
                e.w3 = nn.Linear(D, F_, bias=False)
                b.experts.append(e)
            if Fs:  # Qwen2MoeSparseMoeBlock: shared_expert, shared_expert_gate
                b.shared = nn.Module()
                b.shared.w1 = nn.Linear(D, Fs, bias=False)
                b.shared.w3 = nn.Linear(D, Fs, bias=False)
                b.shared.w2 = nn.Linear(Fs, D, bias=False)
                b.shared_gate = nn.Linear(D, 1, bias=False)
            b.ln1, b.ln2 = ln1, ln2

    def mlp(s, b, h):  # MixtralSparseMoeBlock.forward
        B, T, D = h.shape
        h = h.view(-1, D)
        logits = b.router(h)
        w = F.softmax(logits, dim=1, dtype=torch.float)
        if FIXED_ROUTING[0]:  # as DeepseekV3's; gather saves what topk does
            chosen = fixed_routing(w.shape[0], s.k, s.E)
            w = w.gather(1, chosen)
        else:
            w, chosen = torch.topk(w, s.k, dim=-1)
        if s.renorm:  # Qwen2-MoE: only with norm_topk_prob
            w /= w.sum(dim=-1, keepdim=True)
        return moe_experts(s, b, h, w.to(h.dtype), chosen).reshape(B, T, D)


def moe_experts(s, b, h, w, chosen, kept=None):
    """MixtralSparseMoeBlock.forward after its router: each expert with
    rows on its (B*T, D) rows of h weighted by w (the top-k weights of the
    pairs chosen), summed by index_add_, and Qwen2-MoE's gated shared
    expert; kept (a (B*T, k) 0/1 mask) leaves the other pairs out."""
    D = h.shape[-1]
    out = torch.zeros(h.shape, dtype=h.dtype)
    mask = F.one_hot(chosen, num_classes=s.E).permute(2, 1, 0)
    if kept is not None:
        mask = mask * kept.t()[None]
    hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
    for e in hit:
        ex = b.experts[e]
        idx, top_x = torch.where(mask[e].squeeze(0))
        x = h[None, top_x].reshape(-1, D)
        y = ex.w2(F.silu(ex.w1(x)) * ex.w3(x)) * w[top_x, idx, None]
        out.index_add_(0, top_x, y.to(h.dtype))
    if hasattr(b, "shared"):
        sh = b.shared.w2(F.silu(b.shared.w1(h)) * b.shared.w3(h))
        sh = torch.sigmoid(b.shared_gate(h)) * sh
        out = out + sh
    return out


def apply_rotary_pos_emb_interleave(q, k, cos, sin):  # HF modeling_deepseek_v3
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    b, h, t, d = q.shape
    q = q.view(b, h, t, d // 2, 2).transpose(4, 3).reshape(b, h, t, d)
    b, h, t, d = k.shape
    k = k.view(b, h, t, d // 2, 2).transpose(4, 3).reshape(b, h, t, d)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


class DeepseekV3(Llama):
    """HF modeling_deepseek_v3 (DeepseekV3ForCausalLM, transformers 4.5x) eager:
    multi-head latent attention (q through q_a_proj, its RMSNorm and q_b_proj;
    k and v from kv_a_proj_with_mqa's compressed output, its RMSNorm and
    kv_b_proj; one rotated key part shared by the heads, interleaved rope),
    the first dense_layers layers with a dense MLP, the others
    DeepseekV3MoE: the sigmoid top-k router, SwiGLU experts run one by one
    on their tokens, summed in the router's dtype, plus ungated shared
    experts."""

    def __init__(s, m):
        super().__init__(m)
        D, H, V = m["hidden"], m["heads"], m["vocab"]
        s.dqk, s.dr = m["head_dim"], m["rope_head_dim"]
        s.dn, s.dv = s.dqk - s.dr, m.get("v_head_dim", s.dqk - s.dr)
        s.rkv, s.rq = m["kv_lora_rank"], m.get("q_lora_rank", 0)
        s.E, s.k = m["experts"], m.get("experts_per_tok", 2)
        s.renorm = m.get("expert_renorm", True)
        s.scale = 2.5  # routed_scaling_factor: a value
        F_, Fe, Fs = m["ffn"], m["expert_ffn"], m.get("shared_expert_ffn", 0)

        def mlp_of(width):
            e = nn.Module()
            e.gate = nn.Linear(D, width, bias=False)
            e.up = nn.Linear(D, width, bias=False)
            e.down = nn.Linear(width, D, bias=False)
            return e
        s.blocks = nn.ModuleList()
        for i in range(m["layers"]):
            b = nn.Module()  # DeepseekV3DecoderLayer: self_attn, mlp, the two norms
            if s.rq:
                b.q_a = nn.Linear(D, s.rq, bias=False)
                b.q_a_norm = RMSNorm(s.rq)
                b.q_b = nn.Linear(s.rq, H * s.dqk, bias=False)
            else:
                b.q = nn.Linear(D, H * s.dqk, bias=False)
            b.kv_a = nn.Linear(D, s.rkv + s.dr, bias=False)
            b.kv_a_norm = RMSNorm(s.rkv)
            b.kv_b = nn.Linear(s.rkv, H * (s.dn + s.dv), bias=False)
            b.o = nn.Linear(H * s.dv, D, bias=False)
            b.dense = i < m.get("dense_layers", 0)
            if b.dense:
                b.gate, b.up, b.down = nn.Linear(D, F_, bias=False), nn.Linear(D, F_, bias=False), nn.Linear(F_, D, bias=False)
            else:
                b.experts = nn.ModuleList([mlp_of(Fe) for _ in range(s.E)])
                b.router = nn.Module()
                b.router.weight = nn.Parameter(torch.randn(s.E, D) * 0.02)
                b.router.register_buffer("e_score_correction_bias", torch.zeros(s.E))
                if Fs:
                    b.shared = mlp_of(Fs)
            b.ln1, b.ln2 = RMSNorm(D), RMSNorm(D)
            s.blocks.append(b)
        s.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, s.dr, 2).float() / s.dr)))

    def attn(s, b, h, cos, sin, mask):  # DeepseekV3Attention.forward
        B, T, _ = h.shape
        q = b.q_b(b.q_a_norm(b.q_a(h))) if s.rq else b.q(h)
        q = q.view(B, T, -1, s.dqk).transpose(1, 2)
        q_pass, q_rot = torch.split(q, [s.dn, s.dr], dim=-1)
        ckv = b.kv_a(h)
        k_pass, k_rot = torch.split(ckv, [s.rkv, s.dr], dim=-1)
        k_pass = b.kv_b(b.kv_a_norm(k_pass)).view(B, T, -1, s.dn + s.dv).transpose(1, 2)
        k_pass, v = torch.split(k_pass, [s.dn, s.dv], dim=-1)
        k_rot = k_rot.view(B, 1, T, s.dr)
        q_rot, k_rot = s.rotate(q_rot, k_rot, cos, sin)
        k_rot = k_rot.expand(*k_pass.shape[:-1], -1)
        q = torch.cat((q_pass, q_rot), dim=-1)
        k = torch.cat((k_pass, k_rot), dim=-1)
        y, w = s.core(q, k, v, mask)
        y = y.reshape(B, T, -1).contiguous()
        return b.o(y), w

    def rotate(s, q, k, cos, sin):  # V3's interleaved rotary (V2: complex)
        return apply_rotary_pos_emb_interleave(q, k, cos, sin)

    def route(s, b, h):  # DeepseekV3TopkRouter.forward (n_group 1: no group mask)
        logits = F.linear(h.type(torch.float32), b.router.weight.type(torch.float32))
        scores = logits.sigmoid()
        with torch.no_grad():
            choice = scores + b.router.e_score_correction_bias.unsqueeze(0)
            idx = torch.topk(choice, k=s.k, dim=-1, sorted=False)[1]
            if FIXED_ROUTING[0]:  # row t to experts t*k .. t*k + k - 1 (mod E)
                n = idx.shape[0]
                idx = (torch.arange(n)[:, None] * s.k + torch.arange(s.k)[None]) % s.E
        w = scores.gather(1, idx)
        if s.renorm:
            den = w.sum(dim=-1, keepdim=True) + 1e-20
            w /= den
        return idx, w * s.scale

    def mlp(s, b, h):  # DeepseekV3MLP, or DeepseekV3MoE.forward
        if b.dense:
            return super().mlp(b, h)
        B, T, D = h.shape
        r = h
        idx, w = s.route(b, h.view(-1, D))
        x = h.view(-1, D)
        out = torch.zeros_like(x, dtype=w.dtype)  # DeepseekV3MoE.moe
        mask = F.one_hot(idx, num_classes=s.E).permute(2, 0, 1)
        for e in range(s.E):
            ex = b.experts[e]
            tok, wi = torch.where(mask[e])
            if tok.numel() > 0:
                ew = w[tok, wi]
                xi = x[tok]
                y = ex.down(F.silu(ex.gate(xi)) * ex.up(xi))
                out.index_add_(0, tok, y * ew.unsqueeze(-1))
        out = out.type(x.dtype).view(B, T, D)
        if hasattr(b, "shared"):
            sh = b.shared
            out = out + sh.down(F.silu(sh.gate(r)) * sh.up(r))
        return out


def apply_rotary_emb(xq, xk, freqs_cis):  # HF modeling_deepseek_v2
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = freqs_cis.unsqueeze(1)
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3).type_as(xq)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3).type_as(xk)
    return xq_out, xk_out


class DeepseekV2(DeepseekV3):
    """HF modeling_deepseek_v2 (DeepseekV2ForCausalLM, transformers 4.5x) eager:
    DeepSeek-V3's latent attention with the rotary as a complex product
    (Llama4TextRotaryEmbedding's freqs_cis), and DeepseekV2MoE: the softmax
    router (greedy or group_limited_greedy top-k, no renormalisation), the
    (token, expert) pairs sorted by expert, each expert on its slice, the
    outputs scattered back, weighted in place and summed in fp32; ungated
    shared experts."""

    def __init__(s, m):
        super().__init__(m)
        s.grouped = m.get("grouped_topk", False)
        s.n_group, s.topk_group = 2, 1
        s.scale = 1.0  # routed_scaling_factor
        for b in s.blocks:
            if hasattr(b, "router"):  # DeepseekV2MoEGate has no correction bias
                del b.router.e_score_correction_bias

    def rotary(s, x, pos):  # Llama4TextRotaryEmbedding.forward
        inv = s.inv_freq[None, :, None].float().expand(pos.shape[0], -1, 1)
        freqs = (inv @ pos[:, None, :].float()).transpose(1, 2)
        fc = torch.polar(torch.ones_like(freqs), freqs)
        fc = fc * 1.0  # attention_scaling
        return fc, fc

    def rotate(s, q, k, freqs_cis, _):  # DeepseekV2Attention: apply_rotary_emb
        return apply_rotary_emb(q, k, freqs_cis)

    def route(s, b, h):  # DeepseekV2MoEGate.forward
        logits = F.linear(h.type(torch.float32), b.router.weight.type(torch.float32), None)
        scores = logits.softmax(dim=-1, dtype=torch.float32)
        if FIXED_ROUTING[0]:  # as DeepseekV3's: the same pairs every iteration
            n = scores.shape[0]
            idx = (torch.arange(n)[:, None] * s.k + torch.arange(s.k)[None]) % s.E
            src = scores.masked_fill(torch.zeros_like(scores, dtype=torch.bool), 0.0) if s.grouped else scores
            w = src.gather(1, idx)
        elif s.grouped:
            n = scores.shape[0]
            # HF runs max and topk on the groups with grad: their nodes keep
            # int64 indices until the gate returns, then die with `gs`, so
            # nothing of them is left at the end of the forward. Under
            # no_grad here: the recorder keys storages by address, and a
            # later tensor at a freed one's address would go uncounted
            with torch.no_grad():
                gs = scores.view(n, s.n_group, -1).max(dim=-1).values
                gi = torch.topk(gs, k=s.topk_group, dim=-1, sorted=False)[1]
            gm = torch.zeros_like(gs)
            gm.scatter_(1, gi, 1)
            sm = gm.unsqueeze(-1).expand(n, s.n_group, s.E // s.n_group).reshape(n, -1)
            tmp = scores.masked_fill(~sm.bool(), 0.0)
            w, idx = torch.topk(tmp, k=s.k, dim=-1, sorted=False)
        else:
            w, idx = torch.topk(scores, k=s.k, dim=-1, sorted=False)
        return idx, w * s.scale

    def mlp(s, b, h):  # DeepseekV2MLP, or DeepseekV2MoE.forward
        if b.dense:
            return Llama.mlp(s, b, h)
        B, T, D = h.shape
        r = h
        ids, wt = s.route(b, h.view(-1, D))
        x = h.view(-1, D)
        cnts = ids.new_zeros((ids.shape[0], s.E))  # DeepseekV2MoE.moe
        cnts.scatter_(1, ids, 1)
        per = cnts.sum(dim=0)
        order = ids.view(-1).argsort()
        rows = x[order // ids.shape[1]]
        outs, start = [], 0
        for i, n in enumerate(per):
            if n == 0:
                continue
            end = start + n
            ex = b.experts[i]
            xe = rows[start:end]
            outs.append(ex.down(F.silu(ex.gate(xe)) * ex.up(xe)))
            start = end
        outs = torch.cat(outs, dim=0)
        new_x = torch.empty_like(outs)
        new_x[order] = outs
        out = new_x.view(*ids.shape, -1).type(wt.dtype).mul_(wt.unsqueeze(dim=-1)).sum(dim=1).type(new_x.dtype)
        out = out.view(B, T, D)
        if hasattr(b, "shared"):
            sh = b.shared
            out = out + sh.down(F.silu(sh.gate(r)) * sh.up(r))
        return out


class Falcon(Llama):
    """HF modeling_falcon (FalconForCausalLM, Falcon-7B's layout: rotary,
    parallel_attn, the old decoder architecture), eager: one input_layernorm
    feeds the attention and the MLP; one query_key_value projection with H
    query heads and one key/value head (multi_query); FalconLinear is
    `x @ weight.T`; the softmax runs in the stream's dtype; tied."""

    def __init__(s, m):
        nn.Module.__init__(s)
        D, H, F_, V = m["hidden"], m["heads"], m["ffn"], m["vocab"]
        s.D, s.H, s.KV, s.dh = D, H, m.get("kv_heads", H), D // H
        s.final_softcap = 0.0
        s.embed = nn.Embedding(V, D)
        s.blocks = nn.ModuleList()
        bias = m.get("bias", True)
        for _ in range(m["layers"]):
            # registered as FalconDecoderLayer does: self_attention
            # (query_key_value, dense), mlp (dense_h_to_4h, dense_4h_to_h),
            # input_layernorm
            b = nn.Module()
            b.qkv = nn.Linear(D, (H + 2 * s.KV) * s.dh, bias=bias)
            b.dense = nn.Linear(D, D, bias=bias)
            b.h_to_4h = nn.Linear(D, F_, bias=bias)
            b.h4_to_h = nn.Linear(F_, D, bias=bias)
            b.ln = nn.LayerNorm(D)
            s.blocks.append(b)
        s.norm = nn.LayerNorm(D)
        s.classes = m.get("classes", 0)
        s.lm_head = nn.Linear(D, s.classes or V, bias=False)
        if not s.classes:
            s.lm_head.weight = s.embed.weight  # tied
        s.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, s.dh, 2).float() / s.dh)))

    @staticmethod
    def linear(lin, x):  # FalconLinear.forward
        y = x @ lin.weight.T
        return y if lin.bias is None else y + lin.bias

    def attn(s, b, h, cos, sin, mask):  # FalconAttention.forward (rotary, eager)
        B, T, _ = h.shape
        qkv = s.linear(b.qkv, h)
        # _split_heads, written as the nodes 2.x records for it: HF's
        # fused_qkv[..., :-2, :], [..., [-2], :] and [..., 0, :] make 1.13
        # record a SliceBackward0 for the trailing full slice too (its
        # TensorIndexing.h applySlice tests stop == length, 2.x
        # length <= stop), each a zero-filled gradient in backward that
        # 2.x never makes; narrow, aten.index with None for the leading
        # dimensions, and select are those indexings without it
        if s.KV == 1:  # multi_query: the key and value by index lists (copies)
            qkv = qkv.view(B, T, s.H + 2, s.dh)
            q = qkv.narrow(2, 0, s.H)
            k = torch.ops.aten.index(qkv, [None, None, torch.tensor([-2], device=qkv.device)])
            v = torch.ops.aten.index(qkv, [None, None, torch.tensor([-1], device=qkv.device)])
        else:
            qkv = qkv.view(B, T, s.H, 3, s.dh)
            q, k, v = qkv.select(3, 0), qkv.select(3, 1), qkv.select(3, 2)
        q = q.transpose(1, 2).reshape(B, s.H, T, s.dh)
        k = k.transpose(1, 2).reshape(B, s.KV, T, s.dh)
        v = v.transpose(1, 2).reshape(B, s.KV, T, s.dh)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        w = q @ k.transpose(-1, -2)
        w /= math.sqrt(s.dh)
        w = F.softmax(w + mask, dim=-1, dtype=h.dtype)
        y = w @ v
        y = y.view(B, s.H, T, s.dh)
        y = y.permute(0, 2, 1, 3)
        y = y.reshape(B, T, s.H * s.dh)
        return s.linear(b.dense, y)

    def mlp(s, b, h):  # FalconMLP.forward
        h = s.act(s.linear(b.h_to_4h, h))
        return s.linear(b.h4_to_h, h)

    def act(s, x):
        return F.gelu(x)

    def block(s, b, x, cos, sin, mask, pos):  # FalconDecoderLayer.forward
        r = x
        h = b.ln(x)
        a = s.attn(b, h, cos, sin, mask)
        y = s.mlp(b, h)
        y += a
        # dropout_add with hidden_dropout 0: F.dropout(p=0) returns its input
        return r + y


class Bert(nn.Module):
    """HF BERT eager: post-LN, separate q/k/v, pooler, classifier."""

    def __init__(s, m):
        super().__init__()
        D, H, F_, V = m["hidden"], m["heads"], m.get("ffn", 4 * m["hidden"]), m["vocab"]
        s.D, s.H, s.p = D, H, float(m.get("dropout", 0))
        s.word = nn.Embedding(V, D)
        s.pos = nn.Embedding(m["max_positions"], D)
        s.typ = nn.Embedding(m.get("token_types", 2), D)
        s.ln = nn.LayerNorm(D)
        s.blocks = nn.ModuleList()
        for _ in range(m["layers"]):
            b = nn.Module()
            b.q, b.k, b.v, b.o = (nn.Linear(D, D) for _ in range(4))
            b.ln1 = nn.LayerNorm(D)
            b.inter = nn.Linear(D, F_)
            b.out = nn.Linear(F_, D)
            b.ln2 = nn.LayerNorm(D)
            s.blocks.append(b)
        s.pooler = nn.Linear(D, D)
        s.cls = nn.Linear(D, m.get("classes", 2))

    # Written with HF's own scoping (BertLayer, BertAttention,
    # BertSelfAttention, BertSelfOutput, feed_forward_chunk,
    # BertIntermediate, BertOutput): under no_grad (a checkpointed forward)
    # a tensor lives until its last Python reference goes (docs/ledger.md,
    # "Forward under no_grad").
    def self_attn(s, b, x, mask):  # BertSelfAttention.forward (eager)
        B, T, D = x.shape
        H, dh = s.H, D // s.H

        def heads(t):
            return t.view(B, T, H, dh).permute(0, 2, 1, 3)

        mq = b.q(x)
        kl = heads(b.k(x))
        vl = heads(b.v(x))
        ql = heads(mq)
        sc = torch.matmul(ql, kl.transpose(-1, -2))
        sc = sc / math.sqrt(dh)
        sc = sc + mask
        p = F.softmax(sc, dim=-1)
        p = dropout(p, s.p)
        ctx = torch.matmul(p, vl)
        ctx = ctx.permute(0, 2, 1, 3).contiguous()
        ctx = ctx.view(B, T, D)
        return (ctx,)

    def attention(s, b, x, mask):  # BertAttention.forward, BertSelfOutput
        so = s.self_attn(b, x, mask)
        h = b.o(so[0])
        h = dropout(h, s.p)
        h = b.ln1(h + x)
        return (h,) + so[1:]

    def output(s, b, h, a):  # BertOutput.forward
        h = b.out(h)
        h = dropout(h, s.p)
        h = b.ln2(h + a)
        return h

    def ffn(s, b, a):  # feed_forward_chunk, BertIntermediate
        i = b.inter(a)
        i = F.gelu(i)
        return s.output(b, i, a)

    def block(s, b, x, mask):  # BertLayer.forward
        ao = s.attention(b, x, mask)
        a = ao[0]
        return s.ffn(b, a)

    def run(s, rec, batch, ckpt):
        idx, tgt = batch
        B, T = idx.shape
        rec.block = "embedding"
        pos = torch.arange(T)
        types = torch.zeros(B, T, dtype=torch.long)
        x = dropout(s.ln(s.word(idx) + s.pos(pos) + s.typ(types)), s.p)
        mask = torch.zeros(B, 1, 1, T)
        bwd_mark("embedding", x)
        x = run_blocks(rec, s.blocks, s.block, x, ckpt, mask)
        del mask  # BertModel.forward's extended mask: it returns after the layers
        rec.block = "head"
        return s.head(rec, x, tgt)

    def head(s, rec, x, tgt):
        pooled = torch.tanh(s.pooler(x[:, 0]))
        logits = s.cls(dropout(pooled, s.p))
        bwd_mark("head", logits)
        rec.block = "loss"
        return F.cross_entropy(logits, tgt)


class BertMLM(Bert):
    """HF BertForMaskedLM: BertModel without its pooler, BertLMPredictionHead
    (dense, gelu, LayerNorm, the decoder tied to the word embeddings with its
    own bias), cross-entropy over the vocabulary at every token."""

    def __init__(s, m):
        super().__init__(m)
        D, V = m["hidden"], m["vocab"]
        del s.pooler, s.cls
        # BertLMPredictionHead's own `bias` (the decoder's) is listed before
        # its submodules' parameters by model.parameters()
        s.mlm_bias = nn.Parameter(torch.zeros(V))
        s.dense = nn.Linear(D, D)
        s.head_ln = nn.LayerNorm(D)
        s.decoder = nn.Linear(D, V, bias=False)
        s.decoder.weight = s.word.weight  # tie_word_embeddings (BertConfig: true)
        s.decoder.bias = s.mlm_bias

    def head(s, rec, x, tgt):
        # BertLMPredictionHead: transform (dense, act, LayerNorm, each
        # rebinding one name), then the decoder
        h = s.dense(x)
        h = F.gelu(h)
        if torch.is_autocast_cpu_enabled():
            # CUDA autocast runs layer_norm in fp32 (the fp32 cast is what it
            # saves); 1.13's CPU autocast does not list it and would fail on
            # a bf16 input with fp32 weights: cast as CUDA autocast does
            h = h.float()
        h = s.head_ln(h)
        logits = s.decoder(h)
        bwd_mark("head", logits)
        rec.block = "loss"
        return F.cross_entropy(logits.view(-1, logits.size(-1)), tgt.view(-1))


class ViT(nn.Module):
    """HF modeling_vit eager (transformers 4.5x: ViTForImageClassification,
    ViTModel without its pooler): ViTEmbeddings (a Conv2d patch projection
    with bias, flatten(2).transpose(1, 2), the class token expanded over the
    batch and concatenated in front, + position_embeddings, dropout);
    ViTLayer, pre-norm (layernorm_before, ViTSelfAttention's separate
    query/key/value Linears, eager_attention_forward: q @ k^T * scaling,
    softmax(dtype=float32).to(q.dtype), dropout, @ v; ViTSelfOutput dense +
    dropout; the residual add; layernorm_after; ViTIntermediate dense + gelu;
    ViTOutput dense + dropout + the residual); the final layernorm; the
    classifier on sequence_output[:, 0, :], with no dropout and no pooler
    before it (add_pooling_layer=False); CrossEntropyLoss. The scoping is
    the 4.5x file's whose ViTLayer passes layernorm_before's output as a
    temporary argument and keeps self_attention_outputs to its end; later
    4.5x releases bind that output to a local (hidden_states_norm) and keep
    the attention probabilities in ViTAttention's `_`: the same saved
    tensors, longer-lived temporaries under no_grad."""

    def __init__(s, m):
        super().__init__()
        D, H, F_ = m["hidden"], m["heads"], m.get("ffn", 4 * m["hidden"])
        C, S, P = m.get("channels", 3), m["image_size"], m["patch_size"]
        s.D, s.H, s.p = D, H, float(m.get("dropout", 0))
        s.dh = D // H
        s.scaling = s.dh ** -0.5  # ViTSelfAttention.scaling
        s.classes = m.get("classes", 2)
        T = (S // P) ** 2 + 1
        # registered as ViTForImageClassification's are (model.parameters()
        # order): ViTEmbeddings' own cls_token and position_embeddings, then
        # its patch_embeddings.projection; each ViTLayer's query, key, value,
        # output.dense, intermediate.dense, output.dense, layernorm_before,
        # layernorm_after; vit.layernorm; the classifier
        s.cls_token = nn.Parameter(torch.randn(1, 1, D))
        s.pos = nn.Parameter(torch.randn(1, T, D))
        s.patch = nn.Conv2d(C, D, kernel_size=P, stride=P)
        qb = m.get("qkv_bias", m.get("bias", True))  # ViTConfig.qkv_bias
        s.blocks = nn.ModuleList()
        for _ in range(m["layers"]):
            b = nn.Module()
            b.q = nn.Linear(D, D, bias=qb)
            b.k = nn.Linear(D, D, bias=qb)
            b.v = nn.Linear(D, D, bias=qb)
            b.o = nn.Linear(D, D)
            b.inter = nn.Linear(D, F_)
            b.out = nn.Linear(F_, D)
            b.ln1 = nn.LayerNorm(D)
            b.ln2 = nn.LayerNorm(D)
            s.blocks.append(b)
        s.ln = nn.LayerNorm(D)
        s.cls = nn.Linear(D, s.classes)

    # Written with HF's own scoping (ViTLayer, ViTAttention,
    # ViTSelfAttention, eager_attention_forward, ViTSelfOutput,
    # ViTIntermediate, ViTOutput): under no_grad (a checkpointed forward) a
    # tensor lives until its last Python reference goes (docs/ledger.md,
    # "Forward under no_grad").
    def eager(s, q, k, v):  # eager_attention_forward (head_mask None)
        w = torch.matmul(q, k.transpose(-1, -2)) * s.scaling
        w = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
        w = dropout(w, s.p)
        y = torch.matmul(w, v)
        y = y.transpose(1, 2).contiguous()
        return y, w

    def self_attn(s, b, x):  # ViTSelfAttention.forward
        B, T, D = x.shape

        def heads(t):  # transpose_for_scores
            t = t.view(B, T, s.H, s.dh)
            return t.permute(0, 2, 1, 3)

        kl = heads(b.k(x))
        vl = heads(b.v(x))
        ql = heads(b.q(x))
        ctx, probs = s.eager(ql, kl, vl)
        ctx = ctx.view(B, T, D)
        return (ctx,)

    def self_output(s, b, h):  # ViTSelfOutput.forward (input_tensor unused)
        h = b.o(h)
        h = dropout(h, s.p)
        return h

    def attention(s, b, x):  # ViTAttention.forward
        so = s.self_attn(b, x)
        ao = s.self_output(b, so[0])
        return (ao,) + so[1:]

    def intermediate(s, b, h):  # ViTIntermediate.forward
        h = b.inter(h)
        h = F.gelu(h)
        return h

    def output(s, b, h, r):  # ViTOutput.forward
        h = b.out(h)
        h = dropout(h, s.p)
        h = h + r
        return h

    def block(s, b, x):  # ViTLayer.forward
        sao = s.attention(b, b.ln1(x))
        a = sao[0]
        x = a + x
        lo = b.ln2(x)
        lo = s.intermediate(b, lo)
        lo = s.output(b, lo, x)
        return lo

    def run(s, rec, batch, ckpt):
        pix, tgt = batch
        B = pix.shape[0]
        rec.block = "embedding"
        # ViTEmbeddings.forward, ViTPatchEmbeddings.forward
        x = s.patch(pix).flatten(2).transpose(1, 2)
        cls = s.cls_token.expand(B, -1, -1)
        x = torch.cat((cls, x), dim=1)
        x = x + s.pos
        x = dropout(x, s.p)
        del cls  # a view of the parameter; ViTEmbeddings.forward returns
        bwd_mark("embedding", x)
        x = run_blocks(rec, s.blocks, s.block, x, ckpt)
        rec.block = "head"
        # ViTModel.forward: the final layernorm; ViTForImageClassification:
        # the classifier on the class token's row (a view of the norm's output)
        seq = s.ln(x)
        logits = s.cls(seq[:, 0, :])
        bwd_mark("head", logits)
        rec.block = "loss"
        return F.cross_entropy(logits.view(-1, s.classes), tgt.view(-1))


class Residual(nn.Module):
    def __init__(s, body, shortcut):
        super().__init__()
        s.body, s.shortcut = body, shortcut

    def forward(s, x):
        return s.body(x) + (s.shortcut(x) if s.shortcut is not None else x)


def expand_repeats(layers):
    """A layer list with every `repeat: {times: N, layers: [...]}` replaced
    by N copies of its layers, in residual bodies and shortcuts too: the
    flat model the YAML means, expanded here independently of the C loader."""
    out = []
    for item in layers:
        (kind, a), = item.items()
        if kind == "repeat":
            out += expand_repeats(a["layers"]) * a["times"]
        elif kind == "residual" and isinstance(a, list):
            out.append({kind: expand_repeats(a)})
        elif kind == "residual":
            out.append({kind: {k: expand_repeats(v) for k, v in a.items()}})
        else:
            out.append(item)
    return out


def load(fh):
    """A model file as a document, its sequential layers expanded."""
    doc = yaml.safe_load(fh)
    if doc["model"]["type"] == "sequential":
        doc["model"]["layers"] = expand_repeats(doc["model"]["layers"])
    return doc


def seq_layers(spec, shape, top=False):
    """nn.Sequential for a YAML layer list; returns (module, output shape).
    top: the model's own entries, each its own block (and checkpoint)."""
    mods = []
    for item in spec:
        (kind, a), = item.items()
        a = a or {}
        if kind == "linear":
            mods.append(nn.Linear(shape[-1], a["out"], bias=a.get("bias", True)))
            shape = shape[:-1] + [a["out"]]
        elif kind == "conv2d":
            k, st, pd = a["kernel"], a.get("stride", 1), a.get("padding", 0)
            mods.append(nn.Conv2d(shape[0], a["out"], k, st, pd, bias=a.get("bias", True)))
            shape = [a["out"]] + [(d + 2 * pd - k) // st + 1 for d in shape[1:]]
        elif kind == "batchnorm":
            mods.append(nn.BatchNorm2d(shape[0]) if len(shape) == 3 else nn.BatchNorm1d(shape[0]))
        elif kind == "layernorm":
            mods.append(nn.LayerNorm(shape[-1]))
        elif kind == "relu":
            # `inplace: true` (torchvision's ReLU); a checkpointed entry that
            # is an in-place ReLU would overwrite the checkpoint's input,
            # which torch.utils.checkpoint cannot recompute: checkpointed
            # runs (INPLACE False) run those out of place, as the planner
            # plans them (docs/ledger.md)
            mods.append(nn.ReLU(inplace=bool(a.get("inplace")) and (INPLACE[0] or not top)))
        elif kind == "gelu":
            mods.append(nn.GELU())
        elif kind == "silu":
            mods.append(nn.SiLU())
        elif kind == "maxpool":
            k = a["kernel"]
            st = a.get("stride", k)
            mods.append(nn.MaxPool2d(k, st, a.get("padding", 0)))
            shape = [shape[0]] + [(d + 2 * a.get("padding", 0) - k) // st + 1 for d in shape[1:]]
        elif kind == "avgpool":
            assert a.get("global")
            mods.append(nn.AdaptiveAvgPool2d(1))
            shape = [shape[0], 1, 1]
        elif kind == "flatten":
            mods.append(nn.Flatten())
            shape = [math.prod(shape)]
        elif kind == "residual":
            if isinstance(a, list):
                body, bs = seq_layers(a, shape)
                sc = None
            else:
                body, bs = seq_layers(a["body"], shape)
                sc, _ = seq_layers(a["shortcut"], shape) if "shortcut" in a else (None, shape)
            mods.append(Residual(body, sc))
            shape = bs
        else:
            raise SystemExit("crosscheck: layer kind %s not built here" % kind)
    return nn.Sequential(*mods), shape


class Sequential(nn.Module):
    def __init__(s, m):
        super().__init__()
        s.input = list(m["input"])
        s.loss = m.get("loss", "cross_entropy")
        s.layers = nn.ModuleList()
        shape = list(s.input)
        s.names = []
        for i, item in enumerate(m["layers"]):
            mod, shape = seq_layers([item], shape, top=True)
            s.layers.append(mod)
            s.names.append("%d:%s" % (i, next(iter(item))))
        s.out = shape

    def run(s, rec, batch, ckpt):
        x, tgt = batch
        names, mark = "", None
        for name, mod in zip(s.names, s.layers):
            rec.block = name
            y = checkpoint(mod, x) if ckpt and x.requires_grad else mod(x)
            # an in-place layer (ReLU) returns its input, whose hook autograd
            # moves to the new node: one mark for both blocks
            names = names + "|" + name if y is x else name
            if y is x and mark is not None:
                mark.remove()
            x = y
            mark = bwd_mark(names, x)
        rec.block = "loss"
        return F.mse_loss(x, tgt) if s.loss == "mse" else F.cross_entropy(x, tgt)


def target_len(doc, T):
    """An encoder-decoder's decoder length at encoder length T: the file's
    target_len at its seq_len, scaled with T (None: not an encoder-decoder)."""
    m, tr = doc["model"], doc.get("training", {})
    if m["type"] != "encoder-decoder":
        return None
    T0 = tr.get("seq_len", 16)
    return max(1, tr.get("target_len", T0) * T // T0)


def build(doc):
    m = doc["model"]
    if m["type"] == "encoder-decoder":
        from twins_t5 import build_t5  # twins_t5 imports this module
        return build_t5(doc)
    if m["type"] == "multimodal":
        from twins_llava import build_llava  # twins_llava imports this module
        return build_llava(doc)
    if m["type"] == "sequential":
        return Sequential(m)
    if m["type"] == "encoder" and m.get("image_size"):
        return ViT(m)
    if m["type"] == "encoder":
        return BertMLM(m) if m.get("mlm_head") else Bert(m)
    if m.get("shared_norm"):
        return Falcon(m)
    if m.get("kv_lora_rank"):
        return DeepseekV2(m) if m.get("rope_complex") else DeepseekV3(m)
    if m.get("experts"):
        return Mixtral(m)
    if m.get("parallel_residual"):
        return NeoX(m)
    if m.get("fused_projections"):
        return Phi3(m)
    if m.get("post_norms"):
        return Gemma2(m)
    if m.get("norm", "layernorm") == "gemma_rmsnorm":
        return Gemma(m)
    if m.get("norm", "layernorm") == "olmo_layernorm":
        return Olmo(m)
    if m.get("norm", "layernorm") == "rmsnorm":
        return Llama(m)
    if m.get("position") == "rope":
        return GPT2Rope(m)
    return GPT2(m)


def batch_for(doc, model, B, T):
    m = doc["model"]
    if m["type"] == "encoder-decoder":
        from twins_t5 import batch_t5
        return batch_t5(doc, model, B, T, target_len(doc, T))
    if m["type"] == "multimodal":
        from twins_llava import batch_llava
        return batch_llava(doc, model, B, T)
    if m["type"] == "sequential":
        x = torch.randn([B] + list(m["input"]))
        if model.loss == "mse":
            return x, torch.randn([B] + model.out)
        return x, torch.randint(0, model.out[-1], (B,))
    if m.get("image_size"):  # ViT: pixel values and one class per image
        S = m["image_size"]
        x = torch.randn(B, m.get("channels", 3), S, S)
        return x, torch.randint(0, m.get("classes", 2), (B,))
    idx = torch.randint(0, m["vocab"], (B, T))
    if m.get("classes") and not m.get("mlm_head"):
        return idx, torch.randint(0, m["classes"], (B,))
    return idx, torch.randint(0, m["vocab"], (B, T))
