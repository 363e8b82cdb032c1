#!/usr/bin/python3
"""Live-bytes oracle: the memory curve of real PyTorch training iterations
against memledger's timeline and peaks (docs/validation.md, "Live bytes: the
peak against real PyTorch").

Method. Each loop runs, from building the model to deleting it, inside
torch.profiler.profile(profile_memory=True) on the CPU (Debian's PyTorch 1.13,
one intra-op thread). Every allocation and free of the CPU allocator while
the profiler is on is an `[memory]` event; in 1.13 the profiler's event tree
(`prof.profiler.kineto_results.experimental_event_tree()`) gives each one its
pointer, signed size, timestamp, the allocator's running total
(`total_allocated`) and the ops it happened in. The oracle orders the events
by time, checks that the sum of the deltas reproduces `total_allocated` at
every event, pairs frees with allocations by pointer (a free of a pointer not
allocated in the window fails the run: everything is created inside it), and
rebuilds the live-bytes curve. Phases and blocks are record_function ranges
opened with `torch.ops.profiler._record_function_enter_new`, the
non-allocating form (1.13's `torch.profiler.record_function` allocates a
4-byte handle tensor and a 288-byte RecordFunction holder at each range; the
hand-counted examples show it: they would be in the curve).

The raw curve is the CPU's. The "device view" compared with memledger removes
the CPU-only artefacts, each identified by op and tensor, never by a tolerance:
  scalars   Python numbers wrapped as 0-dim tensors (8 B doubles, e.g. the
            attention scale), their casts to the op's dtype (`aten::_to_copy`
            of <= 8 B), and the optimizers' per-parameter `step` counters
            (`torch.tensor(0.)`): host memory on a GPU.
  foreach2  1.13's `_multi_tensor_adam` keeps `denom = _foreach_add(sqrt, eps)`
            beside `exp_avg_sq_sqrt`; 2.x adds eps in place (one temporary).
  mean      1.13's `mean` backward keeps its input: RMSNorm's x^2 and the
            input of global average pooling live until backward; in 2.x they
            are freed when the mean has run. Removed from that moment.
  bn-grad2  1.13's CPU batch-norm backward allocates grad_input twice and
            frees the first at once (SCRATCH_OPS below).
  rng       torch.utils.checkpoint saves the CPU RNG state (a uint8 tensor)
            per checkpointed call: host memory on a GPU.
  mse-out   1.13's CPU `mse_loss` writes its mean into a storage of the
            input's size (allocated before `mean_out` resizes it to a
            scalar), which lives as long as the loss; 2.x's result is the
            mean's own 0-dim tensor.
  dropout-bwd
            1.13's CPU `native_dropout_backward` computes grad * mask * scale
            op by op (the mask cast to the gradient's dtype, then the
            product, then the scaled one, the first two freed before the op
            returns); CUDA's `masked_scale` kernel writes the result alone
            (aten/src/ATen/native/cuda/Dropout.cu). The allocations under
            the op that do not outlive it are removed (SCRATCH_OPS).
  mixed-cast
            an elementwise op on tensors of two dtypes (under autocast: a
            bf16 tensor with the fp32 residual stream, mask or rotary) on the
            CPU first copies the other-dtype input to the common dtype
            (`aten::_to_copy` under `aten::to` under the op: TensorIterator's
            compute_types promotes inputs by temporaries only where the
            common device is the CPU, aten/src/ATen/TensorIterator.cpp); a
            CUDA kernel casts as it reads. Freed with the op.
  dropout-cast
            1.13's CPU `native_dropout` computes `input.mul(mask)` with its
            bool mask, which TensorIterator first copies to the input's
            dtype (`aten::_to_copy` under `aten::native_dropout`), freed with
            the op; CUDA's fused dropout kernel writes the output and the
            mask directly.
  ln-buffer 1.13's CPU `native_layer_norm_backward` sums gamma's and beta's
            gradients through a per-thread buffer (aten/src/ATen/native/cpu/
            layer_norm_kernel.cpp, LayerNormBackwardKernelImplInternal),
            freed before the op returns; its results, the gradients, outlive
            it. Removed (SCRATCH_OPS).
  onednn    oneDNN convolution weight/activation reorder buffers (allocations
            under `aten::mkldnn_convolution` and its backward that do not
            outlive the op; in backward, those under `aten::convolution_backward`
            freed before that op ends, its gradients being the ones that
            outlive it): CPU only. A GPU's cuDNN takes a workspace instead,
            sized by the algorithm it picks: not modelled (docs/validation.md).

It also adds what only the GPU allocates, at the op that allocates it there:
  softmax-tmp
            CUDA's softmax backward computes `grad * output` into a
            temporary of the output's bytes after grad_input and frees it
            as the op ends (aten/src/ATen/native/cuda/SoftMax.cu,
            softmax_backward_cuda_out); the CPU kernel has none. Added at
            grad_input's allocation in `aten::_softmax_backward_data`,
            removed at the op's end.

usage: livebytes.py MEMLEDGER MODELS_DIR [--doc OUT.md] [--quick] [--only TEXT]
(--only: the rows whose name contains TEXT, e.g. "ckpt=full")
Prints the checks and a table; ends with "N passed, N failed".
"""
import bisect
import contextlib
import gc
import json
import os
import subprocess
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import crosscheck as xc  # noqa: E402  (the measurement and the checks)
import twins as tw  # noqa: E402  (the reference implementations)
import twins_t5 as t5  # noqa: E402  (T5's)
import cuda_autocast  # noqa: E402  (CUDA autocast's casts on the CPU)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "calib"))
import sim_diff  # noqa: E402  (the simulation's trace, pass by pass)

torch.set_num_threads(1)  # every allocation on the profiled (main) thread
# When the profiler stops, 1.13 also turns its results into FunctionEvents
# (torch/autograd/profiler.py, profile.__exit__: _parse_kineto_results, then
# EventList._build_tree) for its tables; the oracle reads only
# kineto_results' event tree, and that conversion was 60 % of the run's time
# (cProfile, 19 loops). Skipped: the event tree is the same object either way.
torch.autograd.profiler.profile._parse_kineto_results = lambda self, result: []

EMPTY = ("aten::empty", "aten::empty_strided", "aten::empty_like")
# Backward ops whose allocations freed before the op ends are CPU artefacts,
# by kind (their results, the gradients, outlive them): 1.13's CPU
# convolution_backward calls oneDNN through a stub, without an op record,
# and its reorder buffers are those; 1.13's CPU native_batch_norm_backward
# allocates grad_input twice on its contiguous path (Normalization.cpp,
# batch_norm_backward_cpu_template: `empty_like(input)` before the layout
# test and again inside it), the first freed at once.
SCRATCH_OPS = {"aten::convolution_backward": "onednn",
               "aten::native_batch_norm_backward": "bn-grad2",
               "aten::native_dropout_backward": "dropout-bwd",
               "aten::native_layer_norm_backward": "ln-buffer"}
# the profiler's range of one backward node's run (engine.cpp,
# evaluate_function): the node, then what the engine does with its outputs
EVALUATE = "autograd::engine::evaluate_function: "

# GPU-only temporaries added to the device view, by the op that makes them
# on the GPU (the docstring: softmax-tmp)
GPU_TMP_OPS = {"aten::_softmax_backward_data": "softmax-tmp"}
# elementwise ops whose CPU TensorIterator copies an input of another dtype
# to the common one first (mixed-cast)
MIXED_OPS = ("aten::add", "aten::mul", "aten::sub", "aten::div", "aten::add_", "aten::mul_")
# the models run under amp-bf16 too
AMP_MODELS = ("xc-gpt2", "xc-llama", "xc-vit", "xc-llama-b1", "xc-vit-b1")
PHASE_OF = {"step": "optimizer", "zero_grad": "optimizer", "end": "optimizer"}


class Mark:
    """A record_function range that allocates nothing (see the docstring)."""

    def __init__(self, name):
        self.name = "ml:" + name

    def __enter__(self):
        self.h = torch.ops.profiler._record_function_enter_new(self.name, None)
        return self

    def __exit__(self, *a):
        torch.ops.profiler._record_function_exit._RecordFunction(self.h)


def tag(kind, t):
    """Marks `t`'s storage, at this moment, as a CPU artefact of kind `kind`."""
    with Mark("tag:%s:%d" % (kind, t.storage().data_ptr())):
        pass


# --------------------------------------------------------------------------
# The curve

class Curve:
    def __init__(self, prof):
        allocs, marks = [], []

        gpu_ops = self.gpu_ops = set()  # each op that adds a GPU temporary: (kind, its end)

        def walk(n, anc, cb_end, gpu_end=None, fn=None):
            ef = n.extra_fields
            if type(ef).__name__ == "_ExtraFields_Allocation":
                allocs.append((n.start_time_ns, len(allocs), ef.ptr, ef.alloc_size,
                               ef.total_allocated, tuple(anc), cb_end, gpu_end, fn))
            if n.name.startswith(EVALUATE):  # one backward node's run
                fn = (n.name[len(EVALUATE):], n.start_time_ns)
            elif n.name.startswith("ml:"):
                marks.append((n.start_time_ns, n.end_time_ns, n.name[3:]))
            if n.name in SCRATCH_OPS:  # the op's own end, for its artefact kind
                cb_end = (SCRATCH_OPS[n.name], n.end_time_ns)
            if n.name in GPU_TMP_OPS:
                gpu_end = (GPU_TMP_OPS[n.name], n.end_time_ns)
                gpu_ops.add(gpu_end)
            for c in n.children:
                walk(c, anc + [n.name], cb_end, gpu_end, fn)
        for r in prof.profiler.kineto_results.experimental_event_tree():
            walk(r, [], None)
        allocs.sort()
        self.errors = []
        # (1) the allocator's running total, reproduced at every event
        run = None
        for i, (t, _, ptr, d, tot, anc, _cb, _g, _fn) in enumerate(allocs):
            run = tot - d if run is None else run
            run += d
            if run != tot:
                self.errors.append("event %d: running total %d, allocator %d" % (i, run, tot))
                run = tot
        # (2) frees paired with allocations by pointer; live bytes from zero
        live, self.ev = {}, []
        total = 0
        for t, _, ptr, d, tot, anc, cb_end, gpu_end, fn in allocs:
            if d > 0:
                if ptr in live:
                    self.errors.append("pointer %#x allocated twice" % ptr)
                live[ptr] = len(self.ev)
                self.ev.append({"t": t, "d": d, "anc": anc, "ptr": ptr, "free": None,
                                "scratch_of": cb_end, "gpu_tmp": gpu_end, "fn": fn})
            else:
                a = live.pop(ptr, None)
                if a is None or self.ev[a]["d"] != -d:
                    self.errors.append("free of %d B at %#x not allocated in the window" % (-d, ptr))
                    continue
                self.ev[a]["free"] = len(self.ev)
                self.ev.append({"t": t, "d": d, "anc": anc, "ptr": ptr, "alloc": a})
            total += d
        self.leaked = sum(self.ev[i]["d"] for i in live.values())
        self.marks = marks
        self.times = [e["t"] for e in self.ev]

    def range(self, name):
        for s, e, n in self.marks:
            if n == name:
                return s, e
        raise KeyError(name)

    def live_at(self, t, view=None):
        """Live bytes just before time t."""
        k = bisect.bisect_left(self.times, t)
        deltas = view if view is not None else [e["d"] for e in self.ev]
        return sum(deltas[:k])

    # -- the device view ----------------------------------------------------
    def device_view(self):
        """Per event deltas with the CPU artefacts removed and the GPU's own
        temporaries added (self.added: their kinds), and each event's
        artefact kind."""
        d = [e["d"] for e in self.ev]
        kind = [None] * len(self.ev)
        for i, e in enumerate(self.ev):
            if e["d"] <= 0 or "ml:setup" in e["anc"]:
                continue  # what the setup builds (buffers too) is resident on a GPU
            ops = [a for a in e["anc"] if a.startswith("aten::") and a not in EMPTY]
            inner = ops[-1] if ops else None
            if e["d"] <= 8 and (inner is None or inner in ("aten::_to_copy", "aten::lift_fresh",
                                                          "aten::scalar_tensor")):
                kind[i] = "scalars"
            elif inner == "aten::_to_copy" and "aten::native_dropout" in e["anc"]:
                kind[i] = "dropout-cast"
            elif inner == "aten::_to_copy" and len(ops) >= 3 and ops[-2] == "aten::to" \
                    and ops[-3] in MIXED_OPS and e["scratch_of"] is None:
                kind[i] = "mixed-cast"
            elif inner == "aten::mse_loss" and e["free"] is not None \
                    and "aten::mse_loss" not in self.ev[e["free"]]["anc"]:
                kind[i] = "mse-out"
            elif "aten::_foreach_add" in e["anc"] and any("Adam" in a for a in e["anc"]):
                kind[i] = "foreach2"
            elif any("mkldnn_convolution" in a for a in e["anc"]) and e["free"] is not None \
                    and self.ev[e["free"]]["anc"][:len(e["anc"])] == e["anc"][:len(self.ev[e["free"]]["anc"])] \
                    and any("mkldnn_convolution" in a for a in self.ev[e["free"]]["anc"]):
                kind[i] = "onednn"
            elif e["scratch_of"] is not None and e["free"] is not None \
                    and self.ev[e["free"]]["t"] <= e["scratch_of"][1]:
                kind[i] = e["scratch_of"][0]  # see SCRATCH_OPS
        extra = []  # (time, delta) pseudo-events for tagged tensors
        for s, _, n in self.marks:
            if not n.startswith("tag:"):
                continue
            _, k, ptr = n.split(":")
            ptr = int(ptr)
            j = bisect.bisect_left(self.times, s) - 1
            while j >= 0 and not (self.ev[j]["ptr"] == ptr and self.ev[j]["d"] > 0):
                j -= 1
            if j < 0:
                self.errors.append("tag %s: no allocation at %#x" % (k, ptr))
                continue
            kind[j] = k
            extra.append((s, j))
        whole = set(j for s, j in extra if bisect.bisect_left(self.times, s) == j + 1)
        out = []
        for i, e in enumerate(self.ev):
            a = e.get("alloc")
            src = a if a is not None else i
            if kind[src] is None:
                out.append(e["d"])
            elif a is None and src in {j for _, j in extra} and src not in whole:
                out.append(e["d"])  # a tagged tensor: removed from the tag on
            else:
                out.append(0)
        # the frees moved onto another event (a tagged tensor's at its tag,
        # the GPU temporary's at its op's end): event index -> [-bytes, ...]
        self.moved = {}
        for s, j in extra:
            k = bisect.bisect_left(self.times, s)
            if j not in whole and k < len(out):
                out[k] -= self.ev[j]["d"]
                self.moved.setdefault(k, []).append(-self.ev[j]["d"])
        # the GPU's own temporaries: beside the op's result (its one
        # allocation that outlives the op; the temporary has the result's
        # bytes, the output's dtype being the input's off CUDA's fp16
        # half_to_float path), from that allocation to the op's end
        self.added = []
        self.added_at = {}  # event index -> the GPU temporary's bytes merged into it
        results = {}  # the op's end -> its results' event indices
        for i, e in enumerate(self.ev):
            g = e.get("gpu_tmp")
            if g is None or e["d"] <= 0 or kind[i] is not None or e["free"] is None \
                    or self.ev[e["free"]]["t"] <= g[1]:
                continue
            results.setdefault(g, []).append(i)
        for g in sorted(self.gpu_ops - set(results)):
            self.errors.append("%s: an op without a result that outlives it" % g[0])
        for g, idx in results.items():
            if len(idx) != 1:
                self.errors.append("%s: %d results of one op, not one" % (g[0], len(idx)))
                continue
            i = idx[0]
            out[i] += self.ev[i]["d"]
            self.added_at[i] = self.ev[i]["d"]
            k = bisect.bisect_right(self.times, g[1])
            if k < len(out):
                out[k] -= self.ev[i]["d"]
                self.moved.setdefault(k, []).append(-self.ev[i]["d"])
            self.added.append(g[0])
        return out, kind

    def phases(self, it, view):
        """{phase: max live}, the peak, its phase and op, start and end live, for iteration it."""
        s0, e0 = self.range("iter%d" % it)
        spans = []
        for s, e, n in self.marks:
            if s0 <= s <= e0 and (n.startswith("blk:") or n in ("backward", "step", "zero_grad", "end")):
                name = n[4:] if n.startswith("blk:") else n
                ph = "loss" if name == "loss" else ("forward" if n.startswith("blk:") else PHASE_OF.get(n, n))
                spans.append((s, e, ph))
        spans.sort()
        starts = [sp[0] for sp in spans]
        # the block each backward moment belongs to: the last whose output's
        # gradient arrived (twins.py's bwd_mark), the loss before any
        bwd = sorted((s, n[4:]) for s, _, n in self.marks if s0 <= s <= e0 and n.startswith("bwd:"))
        bwd_t = [b[0] for b in bwd]
        blk = sorted((s, n[4:]) for s, _, n in self.marks if s0 <= s <= e0 and n.startswith("blk:"))
        blk_t = [b[0] for b in blk]

        def step_at(t, ph):
            if ph == "optimizer":
                return "optimizer.step"
            marks, times = (bwd, bwd_t) if ph == "backward" else (blk, blk_t)
            i = bisect.bisect_right(times, t) - 1
            return marks[i][1] if i >= 0 else "loss"
        k0 = bisect.bisect_left(self.times, s0)
        k1 = bisect.bisect_left(self.times, e0)
        live = sum(view[:k0])
        start = live

        def bias_copy(k):  # an allocation or a free of autocast's copy of a bias
            e = self.ev[k]
            a = e if e["d"] > 0 else self.ev[e["alloc"]] if e.get("alloc") is not None else e
            return "ml:bias-copy" in a["anc"]
        # the bias copies live at each phase's maximum (bias_at)
        bias = sum(self.ev[k]["d"] for k in range(k0) if bias_copy(k))
        best, bias_at, peak, cur = {}, {}, (start, "forward", "", "embedding"), None
        for k in range(k0, k1):
            t = self.times[k]
            i = bisect.bisect_right(starts, t) - 1
            ph = spans[i][2] if i >= 0 else "forward"
            if ph != cur:
                cur = ph
                if live >= best.get(ph, 0):
                    bias_at[ph] = bias
                best[ph] = max(best.get(ph, 0), live)
            live += view[k]
            if bias_copy(k):
                bias += self.ev[k]["d"]
            if view[k] != 0:
                if live > best[ph]:
                    bias_at[ph] = bias
                best[ph] = max(best[ph], live)
                if live > peak[0]:
                    ops = [a for a in self.ev[k]["anc"] if not a.startswith("ml:") and a not in EMPTY]
                    peak = (live, ph, ops[-1] if ops else "", step_at(t, ph))
        return {"start": start, "end": live, "phases": best, "bias_at": bias_at, "peak": peak[0],
                "peak_phase": peak[1], "peak_op": peak[2],
                "peak_step": peak[3]}


# --------------------------------------------------------------------------
# The training loop

class Blocks:
    """Stands for crosscheck's Recorder: each `rec.block = name` opens a range."""

    def __init__(self):
        self.pinned = {}
        self.cur = None

    def __setattr__(self, k, v):
        if k == "block":
            self.close()
            object.__setattr__(self, "cur", Mark("blk:" + v).__enter__())
        else:
            object.__setattr__(self, k, v)

    def close(self):
        if self.cur is not None:
            self.cur.__exit__()
            object.__setattr__(self, "cur", None)


class FShim:
    """crosscheck's `F` with the loss functions' input held (logits: kept)."""

    def __init__(self, held):
        self.held = held

    def __getattr__(self, k):
        return getattr(F, k)

    def cross_entropy(self, x, *a, **kw):
        self.held.append(x)
        if cuda_autocast.ACTIVE[0] is not None and x.dtype != torch.float32:
            # the model returns the lower-precision logits, which the loop
            # holds; transformers' ForCausalLMLoss upcasts them first
            x = x.float()
        return F.cross_entropy(x, *a, **kw)

    def mse_loss(self, x, *a, **kw):
        self.held.append(x)
        return F.mse_loss(x, *a, **kw)


def rmsnorm_forward(s, x):  # crosscheck.RMSNorm.forward, tagging 1.13's kept x^2
    dt = x.dtype
    h = x.to(torch.float32)
    p = h.pow(2)
    var = p.mean(-1, keepdim=True)
    if torch.is_grad_enabled():
        tag("mean", p)
    del p
    h = h * torch.rsqrt(var + s.eps)
    return s.weight * h.to(dt)


def t5_layernorm_forward(s, hidden_states):  # twins_t5.T5LayerNorm.forward, tagging x^2
    p = hidden_states.to(torch.float32).pow(2)
    variance = p.mean(-1, keepdim=True)
    if torch.is_grad_enabled():
        tag("mean", p)
    del p
    hidden_states = hidden_states * torch.rsqrt(variance + s.variance_epsilon)
    if s.weight.dtype in [torch.float16, torch.bfloat16]:
        hidden_states = hidden_states.to(s.weight.dtype)
    return s.weight * hidden_states


def gemma_rmsnorm_forward(s, x):  # crosscheck.GemmaRMSNorm.forward, tagging x^2
    h = x.float()
    p = h.pow(2)
    var = p.mean(-1, keepdim=True)
    if torch.is_grad_enabled():
        tag("mean", p)
    del p
    # HF's _norm is one expression: the mean goes after the add, the sum
    # after the rsqrt, the rsqrt after the product
    r = var + s.eps
    del var
    r = torch.rsqrt(r)
    h = h * r
    del r
    return (h * (1.0 + s.weight.float())).type_as(x)


def avgpool_forward(s, x):  # nn.AdaptiveAvgPool2d(1): 1.13's mean keeps x
    y = F.adaptive_avg_pool2d(x, s.output_size)
    # not inside a checkpoint: its input is the segment's, which the
    # checkpoint keeps (non-reentrant: the mean saves a holder, and its
    # recompute a detached alias of that input)
    if torch.is_grad_enabled() and not tw.IN_CHECKPOINT[0]:
        tag("mean", x)
    return y


def make_optimizer(name, impl, params):
    if name in ("adam", "adamw"):
        cls = torch.optim.Adam if name == "adam" else torch.optim.AdamW
        return cls(params, foreach=(impl == "foreach"))
    if name == "sgd-momentum":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9, foreach=False)
    return torch.optim.SGD(params, lr=0.1, foreach=False)


class QuietRange(Mark):
    """torch.autograd.profiler.record_function for the optimizers' own ranges
    (`Optimizer.step#Adam.step`, `Optimizer.zero_grad#...`), without 1.13's
    4 B handle and 288 B holder tensors: a profiler artefact, removed at the
    source."""

    def __init__(self, name, args=None):
        self.name = name


def run_loop(build, make_batch, step_fn, optim, impl, logits, iters=3):
    """Runs `iters` iterations under the profiler; returns (Curve, facts)."""
    facts = {}
    saved_rf = torch.autograd.profiler.record_function
    torch.autograd.profiler.record_function = QuietRange
    try:
        return _run_loop(build, make_batch, step_fn, optim, impl, logits, iters, facts)
    finally:
        torch.autograd.profiler.record_function = saved_rf


def _run_loop(build, make_batch, step_fn, optim, impl, logits, iters, facts):
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with Mark("setup"):
            model = build()
            opt = make_optimizer(optim, impl, model.parameters())
            batch = make_batch(model)
        for it in range(iters):
            held = []
            with Mark("iter%d" % it):
                loss = step_fn(model, batch, held, logits)
                with Mark("backward"):
                    loss.backward()
                    if logits == "through-backward":  # `del out` after backward()
                        held.clear()
                with Mark("step"):
                    opt.step()
                with Mark("zero_grad"):
                    opt.zero_grad(set_to_none=True)
                with Mark("end"):
                    del loss
                    held.clear()
        facts["params"] = sum(p.numel() * p.element_size() for p in model.parameters())
        facts["numels"] = [p.numel() for p in model.parameters()]
        facts["buffers"] = sum(b.numel() * b.element_size() for b in model.buffers())
        facts["batch"] = sum(t.numel() * t.element_size() for t in batch)
        facts["states"] = facts["counters"] = 0
        for st in opt.state.values():
            for k, v in st.items():
                if torch.is_tensor(v):
                    facts["counters" if k == "step" else "states"] += v.numel() * v.element_size()
        st = k = v = None  # the loop's names would keep the last state alive
        with Mark("teardown"):
            del model, opt, batch, held
            gc.collect()
    return Curve(prof), facts


# --------------------------------------------------------------------------
# Hand-counted examples: one Linear(6 -> 5) with bias, batch N = 4,
# cross-entropy over C = 5 classes. fp32 throughout, so:
#   x = 4*6*4 = 96 B, targets (int64) = 4*8 = 32 B, W = 5*6*4 = 120 B,
#   b = 5*4 = 20 B, logits = N*C*4 = 80 B.
# Resident at the start of the first iteration: W + b + x + y = 268 B.

def hand_build():
    torch.manual_seed(0)
    return nn.Linear(6, 5)


def hand_batch(model):
    return torch.randn(4, 6), torch.randint(0, 5, (4,))


def hand_step(model, batch, held, logits):
    x, y = batch
    with Mark("blk:linear"):
        out = model(x)                 # addmm: + logits 80
    with Mark("blk:loss"):
        loss = F.cross_entropy(out, y)  # log_softmax out + 80 (saved); nll: loss + 4, total_weight + 4
    if logits in ("kept", "through-backward"):
        held.append(out)
    return loss
# released: `out` dies when hand_step returns, after the loss range: the
# log-softmax does not save its input, so the logits go then (1.13 and 2.x).
#
# Expected raw (CPU) figures, relative to the resident state R at the start of
# the iteration, "phase: maximum live - R" (a phase's maximum includes the
# level it starts at; 1.13, one thread, with the profiler's own ranges quiet):
#   forward  addmm: logits +80                                      -> 80
#   loss     _log_softmax out +80 (saved), nll_loss: loss +4,
#            total_weight +4 (saved)                                -> 168
#            released: then the logits -80                          -> 88
#   backward (kept) ones_like seed +4 = 172; nll_loss_backward grad_input
#            (zeros N*C) +80 = 252; total_weight freed -4 = 248;
#            _log_softmax_backward_data +80 = 328 (the maximum); nll grad
#            -80 = 248; log-probs (saved) -80 = 168; dW = grad^T x: mm +120 =
#            288; db = sum +20 = 308; grad of the logits -80 = 228; seed -4
#            -> max 328, ends at 224 (logits 80 + loss 4 + grads 140).
#            released: the same without the 80 B logits -> max 248, ends 144.
#   optimizer SGD (lr, no momentum, for-loop): p.add_(grad, alpha=-lr)
#            allocates nothing (alpha is a c10::Scalar): max = level at
#            entry, 224 (kept) / 144 (released); zero_grad -140; end: loss -4,
#            logits -80 (kept) -> 0.
#   optimizer Adam (for-loop), steady (R = 268 + states 280 + counters 8 = 556):
#            per parameter: step_t += 1, exp_avg.mul_(beta1),
#            exp_avg_sq.mul_(beta2), each a Python float wrapped as an 8 B
#            double and cast to a 4 B float (+12, -12); exp_avg_sq.sqrt() +n;
#            / bc2_sqrt: +8 +4, denom +n, -4 -8; sqrt -n; .add_(eps) +12 -12.
#            W (n = 120): 224 + 120 (sqrt) + 12 + 120 (denom) = 476, the
#            maximum; b (n = 20) while W's denom is still bound to `denom`
#            (the loop rebinds it only at b's): 224 + 120 + 20 + 12 + 20 = 396.
#            -> max 476 (kept), 396 (released: 476 - 80).
#            First iteration (R = 268): states created in the step first,
#            step = tensor(0.) 4 + exp_avg 120 + exp_avg_sq 120, 4 + 20 + 20
#            = +288, then as above: 224 + 288 + 252 = 764; ends at R + 288.
#   Device view: minus the scalars (12 at Adam's maximum; the counters, 8,
#            from the resident state): steady 548 + 464, first 268 + 744.

HAND = [
    # (optimizer, logits, iteration, start, {phase: max - start}, end - start, device view max - start)
    ("sgd", "kept", 1, 268, {"forward": 80, "loss": 168, "backward": 328, "optimizer": 224}, 0, 328),
    ("sgd", "released", 1, 268, {"forward": 80, "loss": 168, "backward": 248, "optimizer": 144}, 0, 248),
    ("adam", "kept", 0, 268, {"forward": 80, "loss": 168, "backward": 328, "optimizer": 764}, 288, 744),
    ("adam", "kept", 1, 556, {"forward": 80, "loss": 168, "backward": 328, "optimizer": 476}, 0, 464),
    ("adam", "released", 1, 556, {"forward": 80, "loss": 168, "backward": 248, "optimizer": 396}, 0, 384),
    # through-backward: held as under kept until backward() returns, then
    # dropped: the step starts without the 80 B of logits (sgd 224 - 80 =
    # 144, Adam 476 - 80 = 396, as released), the backward as kept; the
    # device view's maximum is then the backward's 328 for sgd and the
    # step's 396 - 12 scalars = 384 for Adam
    ("sgd", "through-backward", 1, 268,
     {"forward": 80, "loss": 168, "backward": 328, "optimizer": 144}, 0, 328),
    ("adam", "through-backward", 1, 556,
     {"forward": 80, "loss": 168, "backward": 328, "optimizer": 396}, 0, 384),
]


# --------------------------------------------------------------------------
# The cross-check models

def model_step_fn(ckpt, amp=False):
    def step(model, batch, held, logits):
        rec = Blocks()
        tw.F = FShim(held if logits in ("kept", "through-backward") else [])
        tw.FUSED[0] = logits == "fused"
        tw.CKPT_EVERY[0] = 2 if ckpt == 2 else 1
        try:
            # amp-bf16: the forward and the loss in one autocast region, as
            # a training loop runs them (CUDA autocast's policy, restated:
            # cuda_autocast.py)
            with cuda_autocast.CudaAutocast() if amp else contextlib.nullcontext():
                loss = model.run(rec, batch, ckpt)
        finally:
            rec.close()
            tw.F = F
            tw.FUSED[0] = False
            tw.CKPT_EVERY[0] = 1
        return loss
    return step


def block_rule_backward(j):
    """The blocks of plan j whose backward keeps the block rule."""
    return set(b["name"] for b in j["blocks"] if b.get("backward") == "block_rule")


def plan_args(B, T, ckpt, optim, impl, logits, Td=None, amp=False):
    """The command line's settings for a row (ckpt: False, True (full) or
    2 (every-2, the transformers' blocks))."""
    args = ["--micro-batch", str(B), "--precision", "amp-bf16" if amp else "fp32",
            "--checkpoint", "every-2" if ckpt == 2 else "full" if ckpt else "none",
            "--optimizer", optim, "--optimizer-impl", impl, "--logits", logits]
    if T:
        args += ["--seq-len", str(T)]
    if Td:
        args += ["--target-len", str(Td)]
    return args


def planned(memledger, path, B, T, ckpt, optim, impl, logits, Td=None, amp=False):
    args = plan_args(B, T, ckpt, optim, impl, logits, Td, amp)
    out = subprocess.run([memledger, "plan", path, "--format", "json"] + args,
                         capture_output=True, text=True)
    if out.returncode not in (0, 1):
        raise SystemExit("memledger plan failed: %s" % out.stderr)
    j = json.loads(out.stdout)
    out = subprocess.run([memledger, "timeline", path, "--format", "csv"] + args,
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit("memledger timeline failed: %s" % out.stderr)
    lines = out.stdout.strip().split("\n")
    hdr = lines[0].split(",")
    best, cur, live = {}, None, 0
    for ln in lines[1:]:
        r = dict(zip(hdr, ln.split(",")))
        if r["step"] == "resident":
            live = int(r["total"])
            continue
        if r["phase"] != cur:
            cur = r["phase"]
            best[cur] = max(best.get(cur, 0), live)
        live = int(r["total"])
        best[cur] = max(best[cur], live)
    j["phase_max"] = best
    return j


def amp_checks(check, name, doc, B, T, run, planned):
    """Under autocast the layers' forward and backward are written out op
    by op as in fp32 (docs/precision.md), so each phase's maximum is
    asserted exactly, short by what the plan leaves out, each named:
    autocast's bf16 copies of the biases, which its cache holds to the end
    of the region (no op saves them: 2 B per bias element), in the forward
    and the loss, those made by the measured maximum (the twin's autocast
    tags each: run["bias_at"]): at the loss's every bias of the model (a
    count from the model file), at the forward's at most that; the
    loss's 4-byte 0-dim tensor in the loss; in the backward the loss's and
    backward()'s ones_like seed, 4 B each, those of the two live at the
    measured maximum; in the optimizer step its 0-dim tensors (12 B at
    most)."""
    m, measured = doc["model"], run["phases"]
    D, F_ = m["hidden"], m.get("ffn", 4 * m["hidden"])
    if m.get("image_size"):
        # ViT: every Linear has a bias (the query, key and value's as
        # qkv_bias says), the patch conv's and the classifier's too
        qkv = 3 * D if m.get("qkv_bias", m.get("bias", True)) else 0
        biases = m["layers"] * (qkv + D + F_ + D) + D + m.get("classes", 2)
    else:
        biases = m["layers"] * (3 * D + D + F_ + D) if m.get("bias") else 0
    made = run["bias_at"]
    # the loss follows the last product: every bias's copy is made by its
    # maximum, by the forward's those made so far
    check(name + " bias copies live at the loss's maximum: every bias's",
          made.get("loss", 0), 2 * biases)
    check(name + " bias copies live at the forward's maximum: at most every bias's",
          made.get("forward", 0) <= 2 * biases, True)
    check(name + " forward maximum: short by the bias copies",
          measured.get("forward", 0) - planned.get("forward", 0), made.get("forward", 0))
    check(name + " loss maximum: short by the bias copies and 4 B",
          measured.get("loss", 0) - planned.get("loss", 0), made.get("loss", 0) + 4)
    check(name + " backward maximum: short by the loss and the seed (4 B each) at most",
          0 <= measured.get("backward", 0) - planned.get("backward", 0) <= 8, True)
    # the optimizer step's maximum, which holds the first and steady peaks:
    # the 0-dim tensors the plan does not count (12 B at most)
    check(name + " optimizer maximum within 12 B under the measured",
          0 <= measured.get("optimizer", 0) - planned.get("optimizer", 0) <= 12, True)


def steady_events(memledger, path, B, T, ckpt, optim, impl, logits, Td=None, amp=False):
    """The allocations (+bytes) and frees (-bytes), in order, the plan's
    allocator simulation makes in its first steady iteration (`timeline
    --format trace`), its tensors of 8 B or less left out as the measured
    ones are (the CPU's 0-dim scalars cannot be told from them: Falcon's
    one-element index lists, real on a GPU, among them)."""
    args = plan_args(B, T, ckpt, optim, impl, logits, Td, amp)
    out = subprocess.run([memledger, "timeline", path, "--format", "trace"] + args,
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit("memledger timeline --format trace failed: %s" % out.stderr)
    return [b for _, b, _ in sim_diff.read_sim(out.stdout, path)["steady"] if abs(b) > 8]


def steady_allocs(memledger, path, B, T, ckpt, optim, impl, logits, Td=None, amp=False):
    """The allocation sizes of steady_events, in order."""
    return [b for b in steady_events(memledger, path, B, T, ckpt, optim, impl, logits, Td, amp)
            if b > 0]


def free_runs_sorted(seq):
    """seq (+allocations, -frees) with each run of consecutive frees in
    ascending order: the frees a node makes once it has run (its incoming
    gradients, then the saved variables release_variables() resets), whose
    order within the node differs between versions (2.x's codegen sorts a
    node's saved variables by name, gen_autograd_functions.py; 1.13 lists
    them as derivatives.yaml's formulas use them)."""
    out, run = [], []
    for x in seq:
        if x < 0:
            run.append(x)
            continue
        out += sorted(run)
        run = []
        out.append(x)
    return out + sorted(run)


def holds_run(run, seq):
    """Whether run (free runs sorted) is a window of seq, each compared with
    its free runs sorted in the window (a window may start inside a run)."""
    n = len(run)
    return any(free_runs_sorted(seq[i:i + n]) == run for i in range(len(seq) - n + 1)
               if seq[i] == run[0] or run[0] < 0)


def window_events(c, view, k0, k1, amp):
    """The device view's allocations and frees from event k0 to k1, signed,
    as the plan's simulation makes them: the GPU's softmax temporary its own
    allocation after grad_input's, the frees the view moves onto another
    event (c.moved: a `mean`-tagged tensor's at its tag, the softmax
    temporary's at its op's end) their own events;
    left out: 0-dim tensors of 8 B or less,
    under autocast the CPU's bias copies, and 1.13's out-of-place
    accumulation where 2.x adds in place (out_of_place_add: its result and
    the free of the old sum that follows it)."""
    def own(k):  # event k's own delta in the view, without the frees moved onto it
        return view[k] - sum(c.moved.get(k, []))

    seq, drop = [], set()
    for k in range(k0, k1):
        e = c.ev[k]
        seq += c.moved.get(k, [])
        if e["d"] > 0:
            if own(k) <= 8 or (amp and "ml:bias-copy" in e["anc"]):
                continue
            old = out_of_place_add(c, k)
            if old is not None:
                drop.add(old)
                continue
            g = c.added_at.get(k)
            seq += [own(k) - g, g] if g else [own(k)]
            continue
        a = c.ev[e["alloc"]]
        if own(k) == 0 or own(e["alloc"]) <= 8 or (amp and "ml:bias-copy" in a["anc"]):
            continue
        if k in drop:
            continue
        seq.append(e["d"])
    return seq


def runs_of(run, seq):
    """How many times run occurs in seq, without overlapping."""
    n, i, k = len(run), 0, 0
    while i + n <= len(seq):
        if tuple(seq[i:i + n]) == run:
            k, i = k + 1, i + n
        else:
            i += 1
    return k


def ckpt_steps_checks(check, name, c, view, j, planned_allocs, grad=False, amp=False):
    """A checkpointed layer's forward runs without grad, and where its
    forward is known op by op (the plan's block `transients: ops`) the
    allocator simulation makes its ops' tensors one by one (docs/allocator.md,
    "On the plan"): the sizes the layer's forward allocates in the device
    view, in order, are found as a run of the plan's steady-iteration
    allocations, as many times as in the run's iteration (a checkpointed
    layer's forward comes again, with grad, as its recompute before its
    backward: the plan makes both op by op). With grad (a run without
    checkpointing), the same for each layer's forward with grad, its saved
    tensors made as their ops run. The 0-dim tensors of 8 bytes or less that wrap Python
    numbers (the scalars artefact, host memory on a GPU) are left out of the
    measured ones, under whatever op makes them; a layer left with fewer
    than two allocations is said, not checked (one size proves no order),
    and so is a layer inside a checkpointed segment the twin marks as one
    (every-2); a layer not marked at all fails.
    Frees are not compared:
    when a tensor goes depends on the Python code's scoping, which differs
    between this oracle's twins and the models a GPU runs. A layer with a
    batch norm is not compared (said, not checked): 1.13's CPU batch norm
    (aten/src/ATen/native/Normalization.cpp, batch_norm_cpu_update_stats)
    allocates its batch mean and variance and the running statistics'
    updates around save_mean and save_invstd, one tensor each, where the
    plan makes the output and the saved statistics alone (one tensor of
    both, as cuDNN's batch norm saves them); its peaks are checked above."""
    s0, e0 = c.range("iter1")
    seen, unmarked = set(), []
    mode = "with grad" if grad else "without grad"
    # under autocast, the bias copies its cache holds are not planned (see
    # amp_checks): left out of the measured, named by their range
    kept = [v if v > 8 and not (amp and "ml:bias-copy" in e["anc"]) else 0
            for v, e in zip(view, c.ev)]
    measured_allocs = [v for v in kept[bisect.bisect_left(c.times, s0):
                                       bisect.bisect_left(c.times, e0)] if v]
    for b in j["blocks"]:
        if bool(b.get("checkpointed")) == grad or b.get("transients") != "ops":
            continue
        marks = [(s, e, n[4:].split("|")) for s, e, n in c.marks
                 if s0 <= s <= e0 and n.startswith("blk:") and b["name"] in n[4:].split("|")]
        if not marks:
            unmarked.append(b["name"])  # a block the twin does not mark: a failure below
            continue
        if len(marks[0][2]) > 1:  # a checkpointed segment's one mark (every-2)
            print("skip %s %s's forward %s: one mark for its segment %s"
                  % (name, b["name"], mode, "+".join(marks[0][2])))
            continue
        rng = [(marks[0][0], marks[0][1])]
        k0 = bisect.bisect_left(c.times, rng[0][0])
        k1 = bisect.bisect_left(c.times, rng[0][1])
        if any("aten::native_batch_norm" in c.ev[k]["anc"] for k in range(k0, k1)):
            print("skip %s %s's forward %s: a batch norm on the CPU" % (name, b["name"], mode))
            continue
        allocs = tuple(v for v in kept[k0:k1] if v)
        if allocs in seen:
            continue  # a repeated layer: checked once
        seen.add(allocs)
        n = len(allocs)
        if n < 2:  # one size found anywhere proves no order: said, not checked
            print("skip %s %s's forward %s: %d allocation(s), no order to check"
                  % (name, b["name"], mode, n))
            continue
        # as often in the plan's iteration as in the run's: a checkpointed
        # layer's run comes again in its recompute (with grad), once per
        # identical layer each
        check(name + " %s's forward %s: its %d allocations, in order, as often in the plan's "
              "iteration as in the run's" % (b["name"], mode, n),
              runs_of(allocs, planned_allocs), runs_of(allocs, measured_allocs))
    check(name + " every %slayer the plan makes op by op marked in the run"
          % ("" if grad else "checkpointed "), unmarked, [])


PARAM_NODES = ("AddmmBackward0", "NativeLayerNormBackward0")


def node_layers(j):
    """The layers (`block.N`) whose backward the plan `j` runs node by node."""
    return set(b["name"] for b in j["blocks"]
               if b.get("backward") == "nodes" and b["name"].startswith("block."))


def param_nodes_checks(check, name, c, view, j, planned_allocs):
    """The backward nodes of a product with a bias and of a LayerNorm make
    their gradients as tensors of their own, in order: AddmmBackward0 its
    input's, its weight's, then its bias's (the codegen takes the inputs in
    sorted order, mat1, mat2, self; the bias's is the engine's sum_to of the
    output's gradient, engine.cpp validate_outputs), NativeLayerNormBackward0
    its input's, gamma's, then beta's (layer_norm_backward). In the layers
    whose backward the plan runs node by node (blocks `block.N` with
    `backward: nodes`), each distinct run of sizes such a node allocates in the
    steady iteration's device view (without the CPU's ln-buffer) is found
    as a run of the plan's steady-iteration allocations; a node is the
    block's whose backward mark (twins.py, bwd_mark) is the latest before
    it; a run of one allocation (a LayerNorm without parameters) proves no
    order and is said, not checked. Left out of a node's run, each named: what
    the engine allocates after the node when it adds the node's gradient to
    one already in the input buffer (1.13's InputBuffer::accumulate adds out
    of place, `old_var + var`, an `aten::add` under the node's
    evaluate_function outside the node itself; 2.x adds in place where it
    can), and 0-dim tensors of 8 B or less."""
    ops = node_layers(j)
    s0, e0 = c.range("iter1")
    bwd = sorted((s, n[4:]) for s, _, n in c.marks if s0 <= s <= e0 and n.startswith("bwd:"))
    runs = {}
    for k in range(bisect.bisect_left(c.times, s0), bisect.bisect_left(c.times, e0)):
        e = c.ev[k]
        fn = e.get("fn")
        if view[k] <= 8 or fn is None or fn[0] not in PARAM_NODES:
            continue
        i = bisect.bisect_right(bwd, (fn[1], chr(0x10FFFF))) - 1
        if i < 0 or bwd[i][1] not in ops:
            continue  # outside the layers whose backward runs node by node
        if out_of_place_add(c, k) is not None:
            continue  # see above
        runs.setdefault(fn, []).append(view[k])
    seen = set()
    for fn, sizes in sorted(runs.items(), key=lambda kv: kv[0][1]):
        key = (fn[0], tuple(sizes))
        if key in seen:
            continue
        seen.add(key)
        if len(sizes) < 2:  # one size found anywhere proves no order: said, not checked
            print("skip %s %s's gradients %s: one allocation, no order to check"
                  % (name, fn[0], sizes))
            continue
        check(name + " %s's gradients %s: a run of the plan's allocations" % (fn[0], list(sizes)),
              runs_of(tuple(sizes), planned_allocs) > 0, True)
    if not seen:
        print("skip %s backward nodes' gradients: none in a layer whose backward runs node by "
              "node" % name)


def out_of_place_add(c, k):
    """Event k is 1.13's out-of-place accumulation that 2.x makes in place:
    InputBuffer::accumulate's `old_var + var` (an `aten::add` under a
    node's evaluate_function, outside the node itself) whose old sum goes
    at once, being the buffer's alone; the index of that free, else None.
    2.x adds in place only there (input_buffer.cpp, can_accumulate_inplace:
    the old sum's only reference); an old sum another node still holds
    (GPT-NeoX's skip gradient while the attention's branch waits for it)
    is added out of place by both, and the sum stays in the view."""
    e = c.ev[k]
    fn = e.get("fn")
    if e["d"] <= 0 or fn is None:
        return None
    inner = e["anc"][e["anc"].index(EVALUATE + fn[0]) + 1:]
    if fn[0] in inner or inner[:1] != ("aten::add",):
        return None
    for i in range(k + 1, min(k + 4, len(c.ev))):
        f = c.ev[i]
        if f["d"] > 0:
            break
        if f["d"] == -e["d"] and c.ev[f["alloc"]].get("fn") != fn:
            return i  # the old sum, made before this node ran
    return None


# Layers whose backward runs node by node in the plan but whose allocations
# still differ from PyTorch's (docs/validation.md names each); their check
# expects the difference, so a change that removes it fails until the entry
# goes.
BACKWARD_GAPS = {
    # none today: a layer whose whole backward is known to differ is named
    # here with the difference, its check then expecting it
}

# Layers whose backward with its frees (free_check) differs from PyTorch's:
# (model, layer or "*" for every layer checked, the difference), each named
# in docs/validation.md ("Frees"); their check expects the difference, so
# that one fixed fails until it goes (a "*" entry expects any difference:
# a second one in such a layer goes unseen).
BLOCK_RULE = ("a block-rule forward (no op-by-op programs for this layout): its saved "
              "tensors made whole, e.g. LayerNorm's mean and rstd or q's and k's copies "
              "as one allocation each")
FREE_GAPS = [(m, "*", BLOCK_RULE) for m in ("xc-qwen2moe", "xc-mixtral")]

# Rows whose planned steady peak is below the measured one by more than the
# 0-dim tensors the plan leaves out (12 B): each an open gap, named with its
# size, its check then expecting it (a fix fails the check: drop the entry)
PEAK_GAPS = {
    # 1.13's input buffer adds dense gradients out of place (old + new): the
    # two select_backward zeros of the fused qkv gradient (q's and k's) and
    # their sum live at once in block.0's backward, 36,864 B above the plan,
    # which adds in place as 2.x does when the old sum is the buffer's alone
    # (input_buffer.cpp, can_accumulate_inplace); with checkpointing and SGD
    # that moment is the measured steady peak
    "xc-falcon-mha B=2 T=24 ckpt=every-2 sgd-momentum logits released":
        "2,056 B under: 1.13's out-of-place add of two gradients, 2.x's in place",
}


def layer_backward_checks(check, name, c, view, j, planned, ckpt=False, amp=False):
    """The layers whose backward the plan runs node by node (blocks `block.N`
    with `backward: nodes`; docs/ledger.md, "Backward, node by node"), the
    allocator simulation making each node's tensors one by one: every
    allocation a layer's backward makes in
    the steady iteration's device view, in order, from its backward mark
    (twins.py, bwd_mark) to the next layer's (or the step), is found as one
    run of the plan's steady-iteration allocations. Each distinct run is
    checked once. Left out, each named: 1.13's out-of-place accumulations
    (out_of_place_add) and 0-dim tensors of 8 B or less; the GPU's softmax
    temporary the device view adds (softmax-tmp) is its own allocation,
    after grad_input's, as the GPU makes it. Checkpointed (ckpt), the
    window holds the layer's recompute too, op by op where the plan's block
    says `transients: ops` (the other layers' recompute keeps the block
    rule: said, not checked), with the nodes that unpack no saved tensor
    before it (non-reentrant checkpointing recomputes at the first unpack);
    under autocast the CPU's bias copies are left out of it (amp_checks)."""
    planned_allocs = [b for b in planned if b > 0]
    planned_sorted = free_runs_sorted(planned)
    ops = node_layers(j)
    if ckpt:
        by_op = set(b["name"] for b in j["blocks"] if b.get("transients") == "ops")
        left = sorted(ops - by_op)
        if left:
            print("said, not checked: %s %s's recompute keeps the block rule"
                  % (name, ", ".join(left)))
        ops &= by_op
    s0, e0 = c.range("iter1")
    step = min(s for s, _, n in c.marks if s0 <= s <= e0 and n == "step")
    bwd = sorted((s, n[4:]) for s, _, n in c.marks if s0 <= s <= e0 and n.startswith("bwd:"))
    seen, seen_frees = set(), set()
    for i, (t, blk) in enumerate(bwd):
        if blk not in ops:
            continue
        t1 = bwd[i + 1][0] if i + 1 < len(bwd) else step
        events = window_events(c, view, bisect.bisect_left(c.times, t),
                               bisect.bisect_left(c.times, t1), amp)
        seq = tuple(x for x in events if x > 0)
        if not seq:
            continue
        # with its frees: each distinct run too (the first layer's can
        # differ from the others' by what the model's tensors free there)
        signed = tuple(free_runs_sorted(events))
        if signed not in seen_frees:
            seen_frees.add(signed)
            free_check(check, name, blk, list(signed), planned_sorted)
        if seq in seen:
            continue
        seen.add(seq)
        gap = BACKWARD_GAPS.get(name.split(" ")[0])
        if gap:  # the difference expected (BACKWARD_GAPS)
            check(name + " %s's backward, %d allocations: not a run of the plan's (%s)"
                  % (blk, len(seq), gap), runs_of(seq, planned_allocs) > 0, False)
            continue
        if not check(name + " %s's backward, %d allocations: a run of the plan's" % (blk, len(seq)),
                     runs_of(seq, planned_allocs) > 0, True):
            print("    measured: " + ", ".join(map(str, seq)))
    if not seen:
        print("skip %s layers' backward: none runs node by node" % name)


def free_check(check, name, blk, seq, planned):
    """A layer's backward window with its frees (window_events, free runs
    sorted): one run of the plan's steady-iteration events, or, for a
    layer FREE_GAPS names, not (the difference expected)."""
    model = name.split(" ")[0]
    gap = next((why for m, b, why in FREE_GAPS if m == model and b in (blk, "*")), None)
    label = name + " %s's backward with its frees, %d events: " % (blk, len(seq))
    if gap:
        check(label + "not a run of the plan's (%s)" % gap, holds_run(seq, planned), False)
    else:
        check(label + "a run of the plan's", holds_run(seq, planned), True)


def pct(m, p):
    return "%+.1f%%" % ((p - m) / m * 100) if m else "-"


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    t_start = time.time()
    memledger, models = sys.argv[1], sys.argv[2]
    doc_out = sys.argv[sys.argv.index("--doc") + 1] if "--doc" in sys.argv else None
    quick = "--quick" in sys.argv
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else None
    # the planner models the non-reentrant checkpoint (twins.py, REENTRANT)
    tw.REENTRANT[0] = False
    passed = failed = 0

    def check(label, got, want):
        nonlocal passed, failed
        ok = got == want
        print("%s %s: got %s, expected %s" % ("ok  " if ok else "FAIL", label, got, want))
        passed, failed = passed + ok, failed + (not ok)
        return ok

    # (1) the hand-counted examples, byte for byte
    for optim, logits, it, start, ph, end, dev in HAND:
        c, f = run_loop(hand_build, hand_batch, hand_step, optim, "for-loop", logits)
        name = "hand Linear(6,5)+CE %s logits %s iter %d" % (optim, logits, it)
        check(name + " oracle errors", c.errors, [])
        r = c.phases(it, [e["d"] for e in c.ev])
        check(name + " start", r["start"], start)
        check(name + " phase maxima", {k: v - r["start"] for k, v in r["phases"].items()}, ph)
        check(name + " end", r["end"] - r["start"], end)
        v, _ = c.device_view()
        rd = c.phases(it, v)
        check(name + " device-view peak", rd["peak"] - rd["start"], dev)
        check(name + " device-view errors", c.errors, [])

    # (2), (3) the cross-check models
    xc.RMSNorm.forward = rmsnorm_forward
    xc.GemmaRMSNorm.forward = gemma_rmsnorm_forward
    t5.T5LayerNorm.forward = t5_layernorm_forward
    # the decoder's key/value cache a T5 forward with use_cache keeps is not
    # planned (docs/inventory.md, "T5"): the loop passes use_cache=False
    t5.USE_CACHE[0] = False
    tw.FIXED_ROUTING[0] = True
    nn.AdaptiveAvgPool2d.forward = avgpool_forward
    orig_rng = torch.get_rng_state

    def tagged_rng():
        t = orig_rng()
        tag("rng", t)
        return t
    torch.get_rng_state = tagged_rng

    def bwd_mark(name):  # a block's backward starts (twins.py, bwd_mark)
        with Mark("bwd:" + name):
            pass
    tw.BWD_MARK[0] = bwd_mark
    rows = []
    files = sorted(f for f in os.listdir(models) if f.endswith(".yaml"))
    for fn in files:
        path = os.path.join(models, fn)
        with open(path) as fh:
            doc = xc.load(fh)
        seq = doc["model"]["type"] == "sequential"
        B = doc.get("training", {}).get("micro_batch", 2)
        T = None if seq else doc.get("training", {}).get("seq_len", 16)
        # a vision encoder's sequence is its image's: no --seq-len to plan
        Tp = None if doc["model"].get("image_size") else T
        own = doc.get("training", {}).get("optimizer", "adamw")
        adam = own if own in ("adam", "adamw") else "adam"
        confs = [(False, adam, impl, lg) for impl in ("for-loop", "foreach") for lg in ("kept", "released")]
        confs += [(False, "sgd-momentum", "for-loop", lg) for lg in ("kept", "released")]
        confs += [(True, adam, "foreach", lg) for lg in ("kept", "released")]
        # the output held through the backward and dropped before the step
        confs += [(False, adam, "foreach", "through-backward"),
                  (True, adam, "foreach", "through-backward")]
        # checkpoint every-2: segments of two layer blocks (HF's T5 checkpoints
        # each block: the twin ignores CKPT_EVERY)
        if not seq and doc["model"]["type"] != "encoder-decoder":
            confs += [(2, adam, "foreach", "kept"), (2, "sgd-momentum", "for-loop", "released")]
        # Liger's fused linear cross-entropy (refused with soft-capped logits
        # and for a sequence-classification head)
        if (doc["model"]["type"] == "decoder" and not doc["model"].get("final_softcap")
                and not doc["model"].get("classes")):
            confs += [(False, adam, impl, "fused") for impl in ("for-loop", "foreach")]
            confs += [(False, "sgd-momentum", "for-loop", "fused"), (True, adam, "foreach", "fused")]
        confs = [c + (False,) for c in confs]
        # amp-bf16 (CUDA autocast's casts, cuda_autocast.py): GPT-2 and Llama
        if doc["name"] in AMP_MODELS:
            confs += [(ck, adam, "foreach", "through-backward", True) for ck in (False, True)]
        if quick:
            confs = confs[:1]
        for ckpt, optim, impl, logits, amp in confs:
            name = "%s B=%d%s%s%s %s %s logits %s" % (doc["name"], B, "" if seq else " T=%d" % T,
                                                    " ckpt=every-2" if ckpt == 2 else
                                                    " ckpt=full" if ckpt else "",
                                                    " amp-bf16" if amp else "", optim,
                                                    impl if optim != "sgd-momentum" else "", logits)
            name = " ".join(name.split())
            if only and only not in name:
                continue

            def build(doc=doc, ckpt=ckpt):
                torch.manual_seed(1)
                xc.INPLACE[0] = not ckpt
                m = xc.build(doc)
                m.train()
                return m
            # amp-bf16: PyTorch 1.13 runs bf16 matrix products through
            # oneDNN where the CPU has AVX-512 (use_mkldnn_bf16_matmul,
            # aten/src/ATen/native/mkldnn/Matmul.cpp), whose reorder buffers
            # no GPU makes; off, ATen's own gemm runs them, as on a CPU
            # without it (the amp-bf16 models have no convolution, the one
            # other op oneDNN would take)
            with torch.backends.mkldnn.flags(enabled=not amp):
                c, f = run_loop(build, lambda m: xc.batch_for(doc, m, B, T or 1),
                                model_step_fn(ckpt, amp), optim, impl, logits)
            j = planned(memledger, path, B, Tp, ckpt, optim, impl, logits,
                        tw.target_len(doc, T) if T else None, amp)
            view, kind = c.device_view()  # its tags and GPU temporaries' errors too
            check(name + " oracle (running total, pairing, device view)", c.errors, [])
            # each phase's peak in the plan's JSON (docs/ledger.md, "Each
            # phase's peak") against the phase maxima this oracle rebuilds
            # from the timeline CSV's running totals
            check(name + " plan's phase peaks = the timeline's phase maxima",
                  {k: v["peak"] for k, v in j["peaks"]["phases"]["steady"].items() if v},
                  j["phase_max"])
            check(name + " nothing left after teardown", c.leaked, 0)
            raw = [e["d"] for e in c.ev]
            r = [c.phases(i, view) for i in range(3)]
            rr = [c.phases(i, raw) for i in range(3)]
            other = f["buffers"] + f["batch"]
            # exact today: model states and the resident state
            check(name + " params bytes", j["bytes"]["params"], f["params"])
            check(name + " optimizer states bytes", j["bytes"]["optimizer_states"], f["states"])
            # the batch the loop holds and the model's buffers (docs/ledger.md,
            # "The batch and the buffers")
            check(name + " batch bytes", j["bytes"]["batch"], f["batch"])
            check(name + " buffers bytes", j["bytes"]["buffers"], f["buffers"])
            if optim in ("adam", "adamw") and impl == "for-loop":
                # _single_tensor_adam: the previous parameter's `denom` is
                # alive beside this one's sqrt and quotient, in
                # model.parameters() order (fp32 states)
                n = f["numels"]
                check(name + " for-loop step temporaries (model.parameters() order)",
                      j["bytes"]["optimizer_step_temp"],
                      4 * max((n[i - 1] if i else 0) + 2 * n[i] for i in range(len(n))))
            check(name + " first iteration starts at params + buffers + batch",
                  rr[0]["start"], f["params"] + other)
            check(name + " steady iteration starts at the resident state",
                  rr[1]["start"], f["params"] + f["states"] + f["counters"] + other)
            check(name + " device view: resident = planned resident (with buffers and batch)",
                  r[1]["start"], j["bytes"]["params"] + j["bytes"]["master_params"]
                  + j["bytes"]["optimizer_states"] + j["bytes"]["batch"] + j["bytes"]["buffers"])
            check(name + " steady iteration ends where it started", rr[1]["end"], rr[1]["start"])
            check(name + " first iteration ends at the resident state", rr[0]["end"], rr[1]["start"])
            check(name + " iterations 2 and 3 identical", (rr[2]["peak"], rr[2]["phases"]),
                  (rr[1]["peak"], rr[1]["phases"]))
            # the peak's phase and step: the planned step (a recompute is its
            # block's) among the measured block's names (a segment's blocks)
            want = j["peak"]["step"].replace(" (recompute)", "")
            if amp:
                amp_checks(check, name, doc, B, T, r[1], j["phase_max"])
            if doc["model"].get("experts") or doc["model"]["type"] == "encoder-decoder":
                # a mixture of experts' and T5's backward run at block level,
                # an upper bound (docs/validation.md): the peak can be placed
                # in a later block than the measured one; the phase is still
                # asserted
                check(name + " peak phase as measured (block-level backward)",
                      r[1]["peak_phase"], j["peak"]["phase"])
            elif want in block_rule_backward(j) and want not in r[1]["peak_step"].split("|"):
                # the planned peak in a block whose backward keeps the block
                # rule (the embedding's: its tied table's dense gradient and
                # the head's partial), an upper bound (docs/validation.md):
                # there the phase, and the plan not below the measured peak
                check(name + " peak phase as measured, planned at a block-rule backward "
                      "(%s) not below it" % want,
                      (r[1]["peak_phase"], j["bytes"]["peak"] >= r[1]["peak"]),
                      (j["peak"]["phase"], True))
            else:
                # and the plan's peak not below the measured one but by the
                # 0-dim tensors it leaves out (12 B at most: amp_checks), or
                # a gap PEAK_GAPS names
                gap = PEAK_GAPS.get(name)
                check(name + " peak phase and step as measured, the peak "
                      + ("below it (%s)" % gap if gap else "not below it"),
                      (r[1]["peak_phase"], want in r[1]["peak_step"].split("|"),
                       j["bytes"]["peak"] + 12 >= r[1]["peak"]),
                      (j["peak"]["phase"], True, not gap))
            # without checkpointing: each model's first loop (the layers'
            # forward is the same in every loop)
            if ckpt or (ckpt, optim, impl, logits, amp) == confs[0] or amp:
                ckpt_steps_checks(check, name, c, view, j, steady_allocs(
                    memledger, path, B, Tp, ckpt, optim, impl, logits,
                    tw.target_len(doc, T) if T else None, amp), grad=not ckpt, amp=amp)
            # the first loop without checkpointing, in fp32, and amp-bf16's;
            # the first checkpointed one (every layer its own segment), and
            # amp-bf16's
            first = (ckpt, optim, impl, logits, amp) == confs[0]
            first_ckpt = ckpt is True and (logits == "kept" or amp)
            if first or (amp and not ckpt) or first_ckpt:
                steady = steady_events(memledger, path, B, Tp, ckpt, optim, impl, logits,
                                       tw.target_len(doc, T) if T else None, amp)
                layer_backward_checks(check, name, c, view, j, steady, ckpt=bool(ckpt), amp=amp)
                if first and any(e.get("fn") and e["fn"][0] in PARAM_NODES for e in c.ev):
                    param_nodes_checks(check, name, c, view, j, [b for b in steady if b > 0])
            arts = {}
            for i, k in enumerate(kind):
                if k is not None:
                    arts[k] = arts.get(k, 0) + 1
            for k in c.added:
                arts[k] = arts.get(k, 0) + 1
            rows.append((name, r[1], r[0], rr[1], j, other, arts))
    # (3) the report
    hdr = ("| model and loop | steady peak: measured / planned (B) | diff | first iteration: measured / planned | diff "
           "| peak phase and step (op): measured / planned | forward max m / p | loss max m / p | backward max m / p "
           "| optimizer max m / p "
           "| buffers + batch, measured and planned (B) | raw CPU steady peak (B) | artefacts removed, GPU temporaries added (allocations) |")
    lines = [hdr, "|" + "---|" * 13]
    for name, st, fi, raw, j, other, arts in rows:
        pm = j["phase_max"]
        lines.append("| %s | %d / %d | %s | %d / %d | %s | %s (%s) / %s | %d / %d | %d / %d | %d / %d | %d / %d | %d | %d | %s |" % (
            name, st["peak"], j["peaks"]["steady"], pct(st["peak"], j["peaks"]["steady"]),
            fi["peak"], j["peaks"]["first_iteration"], pct(fi["peak"], j["peaks"]["first_iteration"]),
            "%s %s" % (st["peak_phase"], st["peak_step"].replace("|", "+")), st["peak_op"],
            "%s %s" % (j["peak"]["phase"], j["peak"]["step"]),
            st["phases"].get("forward", 0), pm.get("forward", 0),
            st["phases"].get("loss", 0), pm.get("loss", 0),
            st["phases"].get("backward", 0), pm.get("backward", 0),
            st["phases"].get("optimizer", 0), pm.get("optimizer", 0),
            other, raw["peak"], ", ".join("%s %d" % kv for kv in sorted(arts.items())) or "none"))
    print("\n".join(lines))
    if doc_out:
        with open(doc_out, "w") as out:
            out.write("\n".join(lines) + "\n")
    print("%d passed, %d failed (%.1f s)" % (passed, failed, time.time() - t_start))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
