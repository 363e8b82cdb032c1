#!/usr/bin/env python3
"""The host's dispatch cost of PyTorch eager training, per kernel-launching op.

What it measures
----------------
A step-time model that adds up kernel times misses the host: Python, the
nn.Module calls, the dispatcher, autograd and the optimizer's per-tensor loop.
At small per-op work the host is the bottleneck (the H200 bf16 runs were 44 %
host time).  This script runs real PyTorch layers at tiny shapes (B = 1,
T = 8, hidden 16 by default) so the work inside each kernel is negligible and
the wall time is the host's, and reports host microseconds per op:

  forward    the layer called in train mode with grad enabled (graph built)
  backward   s.backward() of s = output.sum() (the sum itself is not timed)
  nograd     the same forward under torch.no_grad() (evaluation)
  recompute  torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False)
             forward + backward, minus the plain forward + backward of the
             same iteration: what checkpointing one layer adds on the host
             (recompute_layer_us); less the plain forward, what it adds beyond
             re-running the forward's kernels (recompute_block_us: the saved
             tensor hooks, the RNG state saved and restored, the contexts)
  step       torch.optim.AdamW.step() with foreach=True and foreach=False over
             n tiny parameter tensors (n = 1, 8, 32, 128); a least-squares
             line t = call + n * tensor (weighted 1/t^2) gives the per-call
             and per-tensor costs (step_call_us is foreach's; the counts give
             step_foreach_ops, the _foreach_* calls of one step, and the
             for-loop's kernels per tensor)
  block_fit  per phase, a line us = block + kernels * op over the fp32 layers
             (gpt2, llama and two leaner variants of the same modules,
             gpt2_lean: no dropout, fused GELU; llama_mha: no grouped heads):
             block is what a block costs besides its kernels (module calls,
             view ops, autograd nodes that launch nothing, AccumulateGrad)

The backward figures include the seed of s.backward() (ones_like, one
kernel; SumBackward0) and the AccumulateGrad of the block's input, which
stands for the previous block's output.

Each figure is the median of --iters timed iterations after --warmup untimed
ones, with the garbage collector off; in each iteration the plain and the
checkpointed passes run back to back, and the recompute figure is the median
of the per-iteration differences.  Parameter and input gradients are set to
None before every pass, as zero_grad(set_to_none=True) leaves them.

Layers (plain torch.nn, written after Hugging Face's eager code):
  gpt2   LayerNorm, fused qkv Linear, split into heads, q k^T scaled,
         masked_fill with a causal bool mask, softmax, attention dropout,
         @ v, merge heads, out projection, residual dropout, residual add,
         LayerNorm, Linear 4D, GELU (HF's gelu_new, a Python tanh expression,
         by default; --gelu fused uses F.gelu(approximate='tanh')), Linear,
         dropout, residual add.  Dropout p = 0.1 as GPT-2's config.
  llama  RMSNorm as HF writes it (to fp32, pow, mean, + eps, rsqrt, mul,
         weight mul), q/k/v/o Linear without bias, rotary embedding
         q*cos + rotate_half(q)*sin on q and k (cos/sin computed once per
         model forward, so they are inputs here), repeat_kv for grouped
         key/value heads, q k^T scaled, additive causal mask, softmax in fp32
         and cast back, dropout(p=0), @ v, SiLU gated MLP, residual adds.
  *_sdpa the attention core as F.scaled_dot_product_attention (is_causal);
         skipped where torch has no SDPA (1.13 has none).
  *_bf16 the forward under torch.autocast(device, dtype=bfloat16); backward
         outside autocast, as the AMP recipe does.

Output
------
YAML: host: (the figures above; autocast: the same over the *_bf16 layers;
layers: each layer's counts and times; step: the optimizer's points;
scale_check; block_fit) and profile_host:, the figures in the keys a
calibration profile's host: section takes (src/profile/profile_read.c
read_host): forward/backward per kernel and per block from block_fit,
recompute_block_us, and step_call_us / step_tensor_us per _foreach_ call
(the step's line divided by step_foreach_ops).

Counting ops
------------
The op counts come from a TorchDispatchMode: it sees every ATen op after
autograd and after the composite ops have been decomposed (linear -> t +
addmm), i.e. the ops that reach a backend kernel, in forward, in backward
(the autograd engine's ops) and in the checkpoint's recompute.
"kernel ops" are those minus the ones that launch no kernel (views, detach,
empty allocations: see NO_KERNEL); "dispatched ops" counts them all; "torch
calls" (a TorchFunctionMode) counts the Python-level calls into torch, and
"autograd nodes" (torch.profiler's autograd::engine::evaluate_function
events) the backward's nodes.  host us per op = median wall / kernel ops.
torch.profiler's own parent/child tree is not used for counting: its event
times are whole microseconds, and at these sizes ties misplace children at the
top level.  (torch 1.13: checkpoint's recompute detaches a saved wrapped
number, x * 0.25 saves 0.25, which reaches the dispatch mode as a float; the
counter hands back a tensor of it, not counted.)

Limits
------
- On the CPU the "device" is this same CPU, so the kernels' own work is in the
  wall time: hence the tiny shapes.  The run repeats gpt2's forward +
  backward (fp32 and bf16) at twice the width (scale_check); a ratio near 1
  says the figure is host-bound.  On the 2-core AMD EPYC VM this was written
  on, fp32 gpt2 forward + backward took ~880 / 946 / 1019 / 1691 us at hidden
  16 / 32 / 64 / 128, and the CPU's bf16 GEMMs (no native bf16) were most of
  the bf16 time at 64: hence 16.
- A CPU kernel's fixed cost (TensorIterator set-up, the CPU loop) stands in
  for the CUDA launch path (cudaLaunchKernel, the caching allocator); with
  --device cuda the same script times the host's enqueue (no synchronisation
  inside the timed region, one outside), which is the figure to use on a GPU
  (written for it, not yet run on one).
- AdamW (torch 1.13, and later without capturable) reads each tensor's step
  count with .item() twice in Python for its bias corrections: part of the
  per-tensor cost with foreach=True, on any device.
- Kernel choice differs by device: CPU dropout is bernoulli_ + div_ + mul
  where CUDA has one fused native_dropout; CPU foreach optimizer ops loop over
  tensors in C++ dispatching one op per tensor, where CUDA's multi_tensor_apply
  launches one kernel per chunk of tensors.  The per-op cost transfers better
  than the counts do.
- One intra-op thread by default (--threads): at these sizes no kernel splits
  its work, and a thread pool would add wake-up costs a GPU host does not pay.
- The figures are this host's (CPU model, clock, Python and torch build), a
  shared or virtual machine adds noise; the median damps it, it does not
  remove it.

Run it with an interpreter that has torch (here /usr/bin/python3):
  /usr/bin/python3 calib/host_profile.py              # ~10-20 s on 2 cores
  /usr/bin/python3 calib/host_profile.py --quick      # ~2 s, 20 iterations
  /usr/bin/python3 calib/host_profile.py --out host.yaml
"""
import argparse
import gc
import math
import platform
import statistics
import sys
import time

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:  # pragma: no cover - depends on the interpreter
    sys.exit("host_profile.py: torch is not importable by %s; run it with an "
             "interpreter that has torch (e.g. /usr/bin/python3)" % sys.executable)

try:
    from torch.utils._python_dispatch import TorchDispatchMode
except ImportError:  # very old torch
    TorchDispatchMode = None
try:
    from torch.overrides import TorchFunctionMode
except ImportError:
    TorchFunctionMode = None
from torch.utils.checkpoint import checkpoint

HAS_SDPA = hasattr(F, "scaled_dot_product_attention")

# ATen ops that reach the dispatcher's backend but launch no kernel: views,
# metadata, allocation without initialisation.
NO_KERNEL = {
    "view", "_unsafe_view", "_reshape_alias", "reshape", "as_strided",
    "transpose", "t", "permute", "expand", "squeeze", "unsqueeze", "select",
    "slice", "narrow", "split", "split_with_sizes", "unbind", "chunk",
    "detach", "alias", "lift_fresh", "empty", "empty_like", "empty_strided",
    "new_empty", "new_empty_strided", "resize_", "set_", "diagonal",
    "unfold", "view_as_real", "view_as_complex", "_conj", "resolve_conj",
    "resolve_neg", "real", "imag", "sym_size", "sym_stride", "sym_numel",
    "size", "stride", "numel", "is_same_size", "_has_compatible_shallow_copy_type",
    # profiler markers (Optimizer.step's record_function)
    "_record_function_enter", "_record_function_exit", "_record_function_enter_new",
    # .item() of a CPU scalar: AdamW's step counts live on the CPU (a CUDA
    # tensor's .item() would be a copy and a sync; no layer here calls it)
    "_local_scalar_dense",
}


# --------------------------------------------------------------------------
# Layers
# --------------------------------------------------------------------------

def gelu_new(x):
    """Hugging Face's NewGELUActivation (GPT-2's activation_function)."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi)
                                       * (x + 0.044715 * torch.pow(x, 3.0))))


class GPT2Block(nn.Module):
    def __init__(self, d, heads, t_max, p_drop=0.1, gelu="new", sdpa=False):
        super().__init__()
        self.d, self.h, self.dh = d, heads, d // heads
        self.ln_1 = nn.LayerNorm(d, eps=1e-5)
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d, eps=1e-5)
        self.c_fc = nn.Linear(d, 4 * d)
        self.mlp_proj = nn.Linear(4 * d, d)
        self.attn_dropout = nn.Dropout(p_drop)
        self.resid_dropout = nn.Dropout(p_drop)
        self.mlp_dropout = nn.Dropout(p_drop)
        self.p_drop = p_drop
        self.act = gelu_new if gelu == "new" else (lambda x: F.gelu(x, approximate="tanh"))
        self.sdpa = sdpa
        # True where a query must not see a key (above the diagonal)
        self.register_buffer("masked", torch.ones(t_max, t_max, dtype=torch.bool).triu(1),
                             persistent=False)

    def forward(self, x):
        b, t, d = x.shape
        h = self.ln_1(x)
        q, k, v = self.c_attn(h).split(d, dim=2)
        q = q.view(b, t, self.h, self.dh).transpose(1, 2)
        k = k.view(b, t, self.h, self.dh).transpose(1, 2)
        v = v.view(b, t, self.h, self.dh).transpose(1, 2)
        if self.sdpa:
            a = F.scaled_dot_product_attention(
                q, k, v, dropout_p=self.p_drop if self.training else 0.0, is_causal=True)
        else:
            w = torch.matmul(q, k.transpose(-1, -2)) * (self.dh ** -0.5)
            w = w.masked_fill(self.masked[:t, :t], torch.finfo(w.dtype).min)
            w = F.softmax(w, dim=-1)
            w = self.attn_dropout(w)
            a = torch.matmul(w, v)
        a = a.transpose(1, 2).contiguous().view(b, t, d)
        x = x + self.resid_dropout(self.c_proj(a))
        h = self.mlp_proj(self.act(self.c_fc(self.ln_2(x))))
        return x + self.mlp_dropout(h)


class RMSNorm(nn.Module):
    """As Hugging Face's LlamaRMSNorm."""

    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, h):
        dtype = h.dtype
        h = h.to(torch.float32)
        var = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(var + self.eps)
        return self.weight * h.to(dtype)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def repeat_kv(x, n_rep):
    b, kv, t, dh = x.shape
    if n_rep == 1:
        return x
    x = x[:, :, None, :, :].expand(b, kv, n_rep, t, dh)
    return x.reshape(b, kv * n_rep, t, dh)


class LlamaBlock(nn.Module):
    def __init__(self, d, heads, kv_heads, ffn, sdpa=False):
        super().__init__()
        self.d, self.h, self.kv, self.dh = d, heads, kv_heads, d // heads
        self.input_layernorm = RMSNorm(d)
        self.q_proj = nn.Linear(d, heads * self.dh, bias=False)
        self.k_proj = nn.Linear(d, kv_heads * self.dh, bias=False)
        self.v_proj = nn.Linear(d, kv_heads * self.dh, bias=False)
        self.o_proj = nn.Linear(heads * self.dh, d, bias=False)
        self.post_attention_layernorm = RMSNorm(d)
        self.gate_proj = nn.Linear(d, ffn, bias=False)
        self.up_proj = nn.Linear(d, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, d, bias=False)
        self.sdpa = sdpa

    def forward(self, x, cos, sin, mask):
        b, t, d = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(b, t, self.h, self.dh).transpose(1, 2)
        k = self.k_proj(h).view(b, t, self.kv, self.dh).transpose(1, 2)
        v = self.v_proj(h).view(b, t, self.kv, self.dh).transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q = (q * cos) + (rotate_half(q) * sin)
        k = (k * cos) + (rotate_half(k) * sin)
        k = repeat_kv(k, self.h // self.kv)
        v = repeat_kv(v, self.h // self.kv)
        if self.sdpa:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            w = torch.matmul(q, k.transpose(2, 3)) * (self.dh ** -0.5)
            w = w + mask[:, :, :, : k.shape[-2]]
            w = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
            w = F.dropout(w, p=0.0, training=self.training)
            a = torch.matmul(w, v)
        a = a.transpose(1, 2).contiguous().reshape(b, t, -1)
        x = x + self.o_proj(a)
        h = self.post_attention_layernorm(x)
        h = self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))
        return x + h


def rope(b, t, dh, device, base=10000.0):
    """cos, sin of shape (b, t, dh), as LlamaRotaryEmbedding returns them."""
    inv = 1.0 / (base ** (torch.arange(0, dh, 2, dtype=torch.float32, device=device) / dh))
    pos = torch.arange(t, dtype=torch.float32, device=device)
    f = torch.outer(pos, inv)
    emb = torch.cat((f, f), dim=-1)[None].expand(b, t, dh)
    return emb.cos(), emb.sin()


# --------------------------------------------------------------------------
# Counting
# --------------------------------------------------------------------------

class OpCounter:
    """Counts ATen ops at the backend (TorchDispatchMode) and Python-level
    torch calls (TorchFunctionMode) while active."""

    def __init__(self):
        self.ops = {}
        self.calls = 0

    def __enter__(self):
        counter = self
        self._modes = []
        if TorchFunctionMode is not None:
            class _Fn(TorchFunctionMode):
                def __torch_function__(self, func, types, args=(), kwargs=None):
                    counter.calls += 1
                    return func(*args, **(kwargs or {}))
            self._modes.append(_Fn())
        if TorchDispatchMode is not None:
            class _Disp(TorchDispatchMode):
                def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                    name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") \
                        else str(func).split(".")[1]
                    counter.ops[name] = counter.ops.get(name, 0) + 1
                    if args and not isinstance(args[0], torch.Tensor) and name == "detach":
                        # torch 1.13: a wrapped-number tensor (x * 0.25 saves
                        # 0.25) reaches the mode as a float when checkpoint's
                        # recompute detaches what it saves
                        counter.ops[name] -= 1
                        return torch.tensor(args[0])
                    return func(*args, **(kwargs or {}))
            self._modes.append(_Disp())
        for m in self._modes:
            m.__enter__()
        return self

    def __exit__(self, *exc):
        for m in reversed(self._modes):
            m.__exit__(*exc)
        return False

    @property
    def dispatched(self):
        return sum(self.ops.values())

    @property
    def kernels(self):
        return sum(n for k, n in self.ops.items() if k.rstrip("_") not in NO_KERNEL
                   and k not in NO_KERNEL)


def autograd_nodes(fn):
    """Number of autograd nodes the backward fn() runs (torch.profiler)."""
    try:
        from torch.profiler import profile, ProfilerActivity
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            fn()
        return sum(1 for e in prof.events()
                   if e.name.startswith("autograd::engine::evaluate_function"))
    except Exception:
        fn()
        return None


# --------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------

class Clock:
    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    @staticmethod
    def now():
        return time.perf_counter_ns()


def med_us(xs):
    return statistics.median(xs) / 1000.0


def fit_line(xs, ys):
    """y = a + b x by least squares weighted 1/y^2 (the noise of a median
    grows with the time measured, so the small-n points fix the intercept)."""
    w = [1.0 / (y * y) if y > 0 else 1.0 for y in ys]
    sw = sum(w)
    mx = sum(wi * x for wi, x in zip(w, xs)) / sw
    my = sum(wi * y for wi, y in zip(w, ys)) / sw
    sxx = sum(wi * (x - mx) ** 2 for wi, x in zip(w, xs))
    slope = sum(wi * (x - mx) * (y - my) for wi, x, y in zip(w, xs, ys)) / sxx
    return my - slope * mx, slope


def measure_layer(name, layer, call, x, args, clock, autocast=None):
    """Times and counts one layer.  call(layer, x) runs its forward."""
    params = [p for p in layer.parameters()]
    dev = x.device

    def fwd(xx):
        if autocast is not None:
            with torch.autocast(dev.type, dtype=autocast):
                return call(layer, xx)
        return call(layer, xx)

    def ckpt_fwd(xx):
        if autocast is not None:
            with torch.autocast(dev.type, dtype=autocast):
                return checkpoint(lambda z: call(layer, z), xx, use_reentrant=False)
        return checkpoint(lambda z: call(layer, z), xx, use_reentrant=False)

    def clear():
        for p in params:
            p.grad = None
        x.grad = None

    layer.train()
    # ---- counts (one pass each, outside the timing)
    clear()
    c_fwd = OpCounter()
    with c_fwd:
        y = fwd(x)
    s = y.sum()
    c_bwd = OpCounter()
    with c_bwd:
        s.backward()
    clear()
    y = fwd(x)
    s = y.sum()
    nodes = autograd_nodes(s.backward)
    clear()
    c_ng = OpCounter()
    with torch.no_grad(), c_ng:
        fwd(x)
    c_cf = OpCounter()
    with c_cf:
        y = ckpt_fwd(x)
    s = y.sum()
    c_cb = OpCounter()
    with c_cb:
        s.backward()
    clear()
    del y, s

    # ---- timing
    t_f, t_b, t_fb, t_cf, t_cb, t_rc, t_ng = [], [], [], [], [], [], []
    now = clock.now

    def fwd_bwd(forward):
        """One forward of x and the backward of its sum: the two host times."""
        clear()
        clock.sync()
        t0 = now()
        y = forward(x)
        t1 = now()
        s = y.sum()
        clock.sync()
        t2 = now()
        s.backward()
        t3 = now()
        del y, s
        return t1 - t0, t3 - t2

    gc.collect()
    gc.disable()
    try:
        for i in range(args.warmup + args.iters):
            f, b = fwd_bwd(fwd)
            cf, cb = fwd_bwd(ckpt_fwd)
            clock.sync()
            with torch.no_grad():
                c0 = now()
                y = fwd(x)
                c1 = now()
            del y
            if i < args.warmup:
                continue
            t_f.append(f)
            t_b.append(b)
            t_fb.append(f + b)
            t_cf.append(cf)
            t_cb.append(cb)
            t_rc.append((cf + cb) - (f + b))
            t_ng.append(c1 - c0)
    finally:
        gc.enable()
        clear()

    fk, bk, nk = c_fwd.kernels, c_bwd.kernels, c_ng.kernels
    rk = c_cf.kernels + c_cb.kernels - fk - bk
    r = {
        "forward_ops": fk, "backward_ops": bk, "nograd_ops": nk,
        "recompute_ops": rk,
        "forward_dispatched": c_fwd.dispatched, "backward_dispatched": c_bwd.dispatched,
        "forward_torch_calls": c_fwd.calls, "backward_autograd_nodes": nodes,
        "forward_us": med_us(t_f), "backward_us": med_us(t_b),
        "nograd_us": med_us(t_ng), "fwd_bwd_us": med_us(t_fb),
        "ckpt_forward_us": med_us(t_cf), "ckpt_backward_us": med_us(t_cb),
        "recompute_layer_us": med_us(t_rc),
    }
    # what checkpointing adds beyond re-running the forward's kernels
    r["recompute_block_us"] = r["recompute_layer_us"] - r["forward_us"]
    r["forward_op_us"] = r["forward_us"] / fk if fk else None
    r["backward_op_us"] = r["backward_us"] / bk if bk else None
    r["nograd_op_us"] = r["nograd_us"] / nk if nk else None
    r["recompute_op_us"] = r["recompute_layer_us"] / rk if rk > 0 else None
    if args.show_ops:
        r["forward_op_names"] = dict(sorted(c_fwd.ops.items()))
        r["backward_op_names"] = dict(sorted(c_bwd.ops.items()))
    return r


def measure_step(args, device, clock, foreach):
    """AdamW.step() over n tiny tensors, for each n of args.tensors."""
    per_n = {}
    for n in args.tensors:
        ps = [nn.Parameter(torch.randn(args.tensor_numel, device=device)) for _ in range(n)]
        for p in ps:
            p.grad = torch.randn_like(p)
        opt = torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.01, foreach=foreach)
        opt.step()  # states created lazily in the first step
        cnt = OpCounter()
        with cnt:
            opt.step()
        ts = []
        gc.collect()
        gc.disable()
        try:
            for i in range(args.warmup + args.step_iters):
                clock.sync()
                t0 = clock.now()
                opt.step()
                t1 = clock.now()
                if i >= args.warmup:
                    ts.append(t1 - t0)
        finally:
            gc.enable()
        per_n[n] = {"us": med_us(ts), "ops": cnt.kernels,
                    "foreach_ops": sum(v for k, v in cnt.ops.items() if k.startswith("_foreach_"))}
        del opt, ps
    ns = sorted(per_n)
    call, tensor = fit_line(ns, [per_n[n]["us"] for n in ns])
    lo, hi = per_n[ns[0]], per_n[ns[-1]]
    return {"call_us": call, "tensor_us": tensor, "per_n": per_n,
            # kernel ops a step adds per tensor (for-loop: one per op and tensor)
            "ops_per_tensor": (hi["ops"] - lo["ops"]) / float(ns[-1] - ns[0]),
            # _foreach_* calls in one step (a constant with foreach=True)
            "foreach_ops": hi["foreach_ops"]}


# --------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------

def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def build_cases(args, device):
    """(name, layer, call, autocast dtype or None) for each variant."""
    d, t = args.hidden, args.tokens
    heads = args.heads
    ffn = args.ffn or int(2.75 * d)
    cases = []
    variants = [("", False)] + ([("_sdpa", True)] if HAS_SDPA else [])
    cos, sin = rope(args.batch, t, d // heads, device)
    mask = torch.full((t, t), torch.finfo(torch.float32).min, device=device).triu(1)[None, None]
    for suffix, sdpa in variants:
        if "gpt2" in args.layers:
            g = GPT2Block(d, heads, t, p_drop=args.dropout, gelu=args.gelu, sdpa=sdpa).to(device)
            cases.append(("gpt2" + suffix, g, lambda m, x: m(x)))
        if "llama" in args.layers:
            ll = LlamaBlock(d, heads, args.kv_heads, ffn, sdpa=sdpa).to(device)
            cases.append(("llama" + suffix, ll,
                          lambda m, x, c=cos, s=sin, k=mask: m(x, c, s, k)))
    out = [(n, m, c, None) for n, m, c in cases]
    if args.autocast:
        out += [(n + "_bf16", m, c, torch.bfloat16) for n, m, c in cases]
    if args.fit:
        # fewer kernels, the same modules: points for the per-block line
        if "gpt2" in args.layers:
            g = GPT2Block(d, heads, t, p_drop=0.0, gelu="fused").to(device)
            out.append(("gpt2_lean", g, lambda m, x: m(x), None))
        if "llama" in args.layers and args.kv_heads != heads:
            ll = LlamaBlock(d, heads, heads, ffn).to(device)
            out.append(("llama_mha", ll, lambda m, x, c=cos, s=sin, k=mask: m(x, c, s, k), None))
    return out


FIT_ONLY = ("gpt2_lean", "llama_mha")


def block_fit(layers):
    """Per phase, us = block + ops * op over the fp32 layers (ordinary least
    squares): block is what a block costs besides its kernels."""
    names = [n for n in layers if not n.endswith("_bf16")]
    if len(names) < 3:
        return None
    out = {}
    for ph in ("forward", "backward", "nograd"):
        xs = [float(layers[n][ph + "_ops"]) for n in names]
        ys = [layers[n][ph + "_us"] for n in names]
        if max(xs) == min(xs):
            continue
        n = len(xs)
        mx, my = sum(xs) / n, sum(ys) / n
        sxx = sum((x - mx) ** 2 for x in xs)
        b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
        a = my - b * mx
        res = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys))
        tot = sum((y - my) ** 2 for y in ys)
        out[ph] = {"block_us": a, "op_us": b, "r2": 1 - res / tot if tot else 1.0,
                   "points": n}
    return out


def profile_host(host, step, fit):
    """The keys of a calibration profile's host: section (src/profile/
    profile_read.c read_host), or None if a figure is missing.  Per kernel
    and per block from block_fit where it has a non-negative block for both
    phases, else per kernel = wall / kernels with no block term."""
    if True not in step or not step[True]["foreach_ops"]:
        return None
    n = float(step[True]["foreach_ops"])
    f = fit or {}
    use_fit = all(ph in f and f[ph]["block_us"] >= 0 and f[ph]["op_us"] > 0
                  for ph in ("forward", "backward"))
    ph = {"forward_op_us": f["forward"]["op_us"] if use_fit else host["forward_op_us"],
          "backward_op_us": f["backward"]["op_us"] if use_fit else host["backward_op_us"],
          "forward_block_us": f["forward"]["block_us"] if use_fit else 0.0,
          "backward_block_us": f["backward"]["block_us"] if use_fit else 0.0,
          "recompute_block_us": host["recompute_block_us"],
          "step_call_us": step[True]["call_us"] / n,
          "step_tensor_us": step[True]["tensor_us"] / n}
    return None if any(v is None for v in ph.values()) else ph


def median_of(layers, key, names):
    vals = [layers[n][key] for n in names if n in layers and layers[n].get(key) is not None]
    return statistics.median(vals) if vals else None


def fmt(v):
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "%.3f" % v if abs(v) < 100 else "%.1f" % v
    s = str(v)
    if any(ch in s for ch in ":#{}[],&*!|>'\"%@`") or s != s.strip():
        return '"%s"' % s.replace('"', '\\"')
    return s


def emit(obj, indent=0):
    pad = "  " * indent
    lines = []
    for k, v in obj.items():
        if isinstance(v, dict):
            if v and all(not isinstance(x, dict) for x in v.values()) and len(v) <= 4:
                lines.append("%s%s: {%s}" % (pad, k, ", ".join(
                    "%s: %s" % (kk, fmt(vv)) for kk, vv in v.items())))
            else:
                lines.append("%s%s:" % (pad, k))
                lines.extend(emit(v, indent + 1))
        else:
            lines.append("%s%s: %s" % (pad, k, fmt(v)))
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="20 timed iterations after 3 warm-up ones (a few seconds)")
    ap.add_argument("--out", help="write the YAML here instead of stdout")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    ap.add_argument("--iters", type=int, help="timed iterations per figure (default 200, quick 20)")
    ap.add_argument("--warmup", type=int, help="untimed iterations first (default 20, quick 3)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=16,
                    help="width (default 16: at 64 this CPU's GEMMs were ~15 %% of the "
                         "fp32 time and most of the bf16 time)")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2,
                    help="llama key/value heads (default 2: grouped, so repeat_kv copies; "
                         "with 1 its reshape is a view)")
    ap.add_argument("--ffn", type=int, default=0, help="llama MLP width (default 2.75 x hidden)")
    ap.add_argument("--dropout", type=float, default=0.1, help="gpt2 dropout p (default 0.1)")
    ap.add_argument("--gelu", choices=("new", "fused"), default="new",
                    help="gpt2 activation: HF gelu_new expression (default) or F.gelu tanh")
    ap.add_argument("--layers", default="gpt2,llama", help="comma list of gpt2, llama")
    ap.add_argument("--no-autocast", dest="autocast", action="store_false", default=None,
                    help="skip the bf16 autocast variants")
    ap.add_argument("--no-fit", dest="fit", action="store_false", default=True,
                    help="skip gpt2_lean (no dropout, fused GELU) and llama_mha (no grouped "
                         "heads), the extra points of the per-block line (block_fit)")
    ap.add_argument("--tensors", default="1,8,32,128",
                    help="optimizer step: numbers of parameter tensors (default 1,8,32,128)")
    ap.add_argument("--tensor-numel", type=int, default=64,
                    help="elements per optimizer parameter tensor (default 64)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    ap.add_argument("--no-scale-check", dest="scale_check", action="store_false", default=None,
                    help="skip gpt2 at twice the width (the check that the figures are "
                         "host-bound)")
    ap.add_argument("--show-ops", action="store_true",
                    help="list the ATen ops of each layer's forward and backward")
    args = ap.parse_args(argv)

    if args.iters is None:
        args.iters = 20 if args.quick else 200
    if args.warmup is None:
        args.warmup = 3 if args.quick else 20
    if args.autocast is None:
        args.autocast = True
    if args.scale_check is None:
        args.scale_check = True
    args.step_iters = args.iters
    args.layers = [s.strip() for s in args.layers.split(",") if s.strip()]
    bad = [s for s in args.layers if s not in ("gpt2", "llama")]
    if bad or not args.layers:
        ap.error("--layers: unknown %s (gpt2, llama)" % ",".join(bad or ["(none)"]))
    try:
        args.tensors = sorted({int(s) for s in args.tensors.split(",") if s.strip()})
    except ValueError:
        ap.error("--tensors: comma-separated integers")
    if len(args.tensors) < 2:
        ap.error("--tensors: at least two sizes to fit a line")
    if args.hidden % args.heads or args.heads % args.kv_heads:
        ap.error("--hidden must be a multiple of --heads, --heads of --kv-heads")
    if args.iters < 1 or args.warmup < 0:
        ap.error("--iters >= 1, --warmup >= 0")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: CUDA is not available to this torch")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    clock = Clock(device)
    t_start = time.time()
    notes = []
    if TorchDispatchMode is None:
        notes.append("no TorchDispatchMode in this torch: op counts are 0")
    if not HAS_SDPA:
        notes.append("no F.scaled_dot_product_attention in torch %s: sdpa variants skipped"
                     % torch.__version__)

    layers = {}
    x = torch.randn(args.batch, args.tokens, args.hidden, device=device, requires_grad=True)
    for name, layer, call, ac in build_cases(args, device):
        try:
            layers[name] = measure_layer(name, layer, call, x, args, clock, autocast=ac)
        except Exception as e:  # e.g. autocast unsupported for this device/torch
            notes.append("%s skipped: %s" % (name, str(e).splitlines()[0][:120]))

    scale = {}
    if args.scale_check:
        # the same layer at twice the width: a ratio near 1 says host-bound
        d2 = 2 * args.hidden
        x2 = torch.randn(args.batch, args.tokens, d2, device=device, requires_grad=True)
        for name, ac in (("gpt2", None), ("gpt2_bf16", torch.bfloat16)):
            if name not in layers:
                continue
            g2 = GPT2Block(d2, args.heads, args.tokens, p_drop=args.dropout,
                           gelu=args.gelu).to(device)
            r2 = measure_layer(name, g2, lambda m, z: m(z), x2, args, clock, autocast=ac)
            scale[name] = {"hidden": d2, "fwd_bwd_us": r2["fwd_bwd_us"],
                           "ratio": r2["fwd_bwd_us"] / layers[name]["fwd_bwd_us"]}

    step = {}
    for fe in (True, False):
        try:
            step[fe] = measure_step(args, device, clock, fe)
        except Exception as e:
            notes.append("AdamW foreach=%s skipped: %s" % (fe, str(e).splitlines()[0][:120]))

    base = [n for n in layers if not n.endswith("_bf16") and n not in FIT_ONLY]
    amp = [n for n in layers if n.endswith("_bf16")]
    host = {
        "device": cpu_model() if device.type == "cpu" else torch.cuda.get_device_name(device),
        "host_cpu": cpu_model(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "shape": {"batch": args.batch, "tokens": args.tokens, "hidden": args.hidden,
                  "heads": args.heads, "kv_heads": args.kv_heads,
                  "llama_ffn": args.ffn or int(2.75 * args.hidden)},
        "iters": args.iters,
        "forward_op_us": median_of(layers, "forward_op_us", base),
        "backward_op_us": median_of(layers, "backward_op_us", base),
        "nograd_op_us": median_of(layers, "nograd_op_us", base),
        "recompute_layer_us": median_of(layers, "recompute_layer_us", base),
        "recompute_op_us": median_of(layers, "recompute_op_us", base),
        "recompute_block_us": median_of(layers, "recompute_block_us", base),
        "step_tensor_us_foreach": step[True]["tensor_us"] if True in step else None,
        "step_tensor_us_forloop": step[False]["tensor_us"] if False in step else None,
        "step_call_us": step[True]["call_us"] if True in step else None,
        "step_call_us_forloop": step[False]["call_us"] if False in step else None,
        "step_foreach_ops": step[True]["foreach_ops"] if True in step else None,
        "step_forloop_ops_per_tensor": step[False]["ops_per_tensor"] if False in step else None,
    }
    if False in step and step[False]["ops_per_tensor"]:
        host["step_forloop_op_us"] = step[False]["tensor_us"] / step[False]["ops_per_tensor"]
    if amp:
        host["autocast"] = {
            "forward_op_us": median_of(layers, "forward_op_us", amp),
            "backward_op_us": median_of(layers, "backward_op_us", amp),
            "nograd_op_us": median_of(layers, "nograd_op_us", amp),
            "recompute_layer_us": median_of(layers, "recompute_layer_us", amp),
        }
    if step:
        host["step"] = {("foreach" if fe else "forloop"): {
            ("n%d" % n): {"us": v["us"], "ops": v["ops"]} for n, v in s["per_n"].items()}
            for fe, s in step.items()}
    if scale:
        host["scale_check"] = scale
    bf = block_fit(layers)
    if bf:
        host["block_fit"] = bf
    host["layers"] = layers
    host["seconds"] = time.time() - t_start
    ph = profile_host(host, step, bf)
    neg = sorted(k for k, v in (ph or {}).items() if v < 0)
    if neg:
        notes.append("negative %s: noise over a small difference; rerun with more --iters"
                     % ", ".join(neg))
    if notes:
        host["notes"] = {("n%d" % i): s for i, s in enumerate(notes)}

    lines = ["# memledger host profile: calib/host_profile.py (median wall / kernel ops)"]
    lines += emit({"host": host})
    if ph:
        lines += ["# profile_host: the same figures as a calibration profile's host: section",
                  "# takes them (src/profile/profile_read.c read_host): per kernel and per block",
                  "# in forward and backward (block_fit's line; without one, wall / kernels and",
                  "# no block term), per recomputed block beyond its forward (recompute_block_us),",
                  "# per _foreach_ call and per tensor in one (the step's line / step_foreach_ops)"]
        lines += emit({"profile_host": ph})
    text = "\n".join(lines) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
