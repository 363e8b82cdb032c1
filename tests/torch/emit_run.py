#!/usr/bin/python3
"""`memledger plan --emit torch` and `--emit deepspeed`, checked by running them.

torch: for each precision x optimizer x implementation (with checkpoint
policies, loop references and zero_grad modes rotated through the cases),
the emitted snippet is executed on the CPU (DEVICE set to "cpu"; EMIT_DEVICE=cuda
runs it on a GPU) with a GPT-2 of tests/torch/models/gpt2-nodrop.yaml's shape,
one optimizer step, and the test asserts: the optimizer class, its
implementation flag and its state after the step; the parameters' dtype (and
the fp32 master copies for *-master); autocast's dtype and the GradScaler for
fp16; exactly the planned blocks under torch.utils.checkpoint, segment by
segment, non-reentrant; the output's lifetime (logits kept / released); the
gradients after zero_grad. A case whose package or kernel this torch lacks
(bitsandbytes, lion-pytorch, torch.optim.Adafactor, fused kernels or fp16 on
the CPU) is not run, but the snippet must still name what it needs; the plans
a target cannot run must be refused (exit 2), as docs/hf.md lists them.

deepspeed: the config for each plan against the keys and combinations
DeepSpeed documents (the tables below, each with its source).

usage: emit_run.py MEMLEDGER MODEL.yaml
Prints one line per case and ends with "N passed, N failed, N not run";
exit 1 on a failure, 77 (skipped) when torch cannot be imported (the
DeepSpeed checks, which need no torch, still run and must pass).
"""
import itertools
import json
import math
import os
import subprocess
import sys
import warnings
import weakref

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import torch.utils.checkpoint as tcp
except ImportError:
    torch = None

PRECISIONS = ["fp32", "amp-bf16", "amp-fp16", "bf16", "bf16-master", "fp16-master"]
OPTIMIZERS = ["sgd", "sgd-momentum", "adam", "adamw", "adafactor", "adam-8bit", "lion"]
IMPLS = ["for-loop", "foreach", "fused"]
# gpt2-nodrop.yaml has 3 blocks; the segments derived by hand from each policy
# (docs/ledger.md): full = each block alone; every-2 = (0,1),(2,2);
# sqrt = segments of ceil(sqrt(3)) = 2 blocks; a list = each named block alone
CHECKPOINTS = [("none", []), ("full", [(0, 0), (1, 1), (2, 2)]), ("every-2", [(0, 1), (2, 2)]),
               ("[1]", [(1, 1)]), ("sqrt", [(0, 1), (2, 2)])]

# What the snippet must name for each optimizer, and the class it builds.
NEEDS = {"adam-8bit": ("import bitsandbytes as bnb", "bnb.optim.Adam8bit(", "Adam8bit"),
         "lion": ("lion_pytorch", "Lion(params", "Lion"),
         "adafactor": ("import torch", "torch.optim.Adafactor(", "Adafactor"),
         "sgd": ("import torch", "torch.optim.SGD(", "SGD"),
         "sgd-momentum": ("import torch", "torch.optim.SGD(", "SGD"),
         "adam": ("import torch", "torch.optim.Adam(", "Adam"),
         "adamw": ("import torch", "torch.optim.AdamW(", "AdamW")}

results = {"pass": 0, "fail": 0, "skip": 0}


def report(ok, name, detail=""):
    if ok is None:
        results["skip"] += 1
        print("skip %s: %s" % (name, detail))
    elif ok:
        results["pass"] += 1
        print("ok   %s" % name)
    else:
        results["fail"] += 1
        print("FAIL %s: %s" % (name, detail))


def emit(exe, model, kind, args):
    p = subprocess.run([exe, "plan", model, "--emit", kind] + args, capture_output=True,
                       text=True)
    return p.returncode, p.stdout, p.stderr


# --------------------------------------------------------------------------
# torch: which plans the snippet refuses (docs/hf.md, "--emit torch")

def torch_refusal(prec, opt, impl):
    if opt == "adafactor" and impl == "fused":
        return "no fused implementation"  # the plan itself: memledger refuses it
    if prec.endswith("-master") and impl == "fused":
        return "torch's fused optimizers step parameters in their gradients' dtype"
    if prec == "fp16-master" and impl == "for-loop":
        return "GradScaler skips an overflowing step per optimizer"
    return None


def importable(name):
    try:
        __import__(name)
        return True
    except Exception:
        return False


if torch is not None:
    class Block(nn.Module):
        """GPT-2 eager, pre-LN (the shape of gpt2-nodrop.yaml)."""

        def __init__(self, D, H, F_, P):
            super().__init__()
            self.H = H
            self.ln_1 = nn.LayerNorm(D)
            self.c_attn = nn.Linear(D, 3 * D)
            self.c_proj = nn.Linear(D, D)
            self.ln_2 = nn.LayerNorm(D)
            self.c_fc = nn.Linear(D, F_)
            self.mlp_proj = nn.Linear(F_, D)
            self.register_buffer("mask", torch.tril(torch.ones(P, P)).view(1, 1, P, P))

        def forward(self, x):
            B, T, C = x.size()
            dh = C // self.H
            q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T, self.H, dh).transpose(1, 2) for t in (q, k, v))
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(dh))
            att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf"))
            y = (F.softmax(att, dim=-1) @ v).transpose(1, 2).contiguous().view(B, T, C)
            x = x + self.c_proj(y)
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


    class GPT2(nn.Module):
        def __init__(self, ns, D=64, H=4, F_=256, V=211, P=64, L=3):
            super().__init__()
            self.ns = ns
            self.wte = nn.Embedding(V, D)
            self.wpe = nn.Embedding(P, D)
            self.blocks = nn.ModuleList(Block(D, H, F_, P) for _ in range(L))
            self.ln_f = nn.LayerNorm(D)
            self.lm_head = nn.Linear(D, V, bias=False)
            self.lm_head.weight = self.wte.weight

        def forward(self, idx):
            T = idx.shape[1]
            x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
            x = self.ns["run_blocks"](self.blocks, x)  # the snippet's
            return self.lm_head(self.ln_f(x))


def probe(fn):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn()
        return True
    except Exception:
        return False


def optimizer_class(opt):
    if opt == "adam-8bit":
        import bitsandbytes
        return bitsandbytes.optim.Adam8bit
    if opt == "lion":
        import lion_pytorch
        return lion_pytorch.Lion
    return getattr(torch.optim, NEEDS[opt][2])


def why_not_run(opt, impl, device):
    """None when this torch has the optimizer and implementation on device, else why not."""
    if opt == "adam-8bit" and not importable("bitsandbytes"):
        return "bitsandbytes not importable"
    if opt == "lion":
        if not importable("lion_pytorch"):
            return "lion-pytorch not importable"
        if impl == "foreach" and not importable("lion_pytorch.foreach"):
            return "this lion-pytorch has no foreach Lion"
        if impl == "fused" and (device != "cuda" or not importable("triton")):
            return "lion-pytorch's fused (triton) Lion needs CUDA and triton"
    if opt == "adafactor" and not hasattr(torch.optim, "Adafactor"):
        return "torch %s has no torch.optim.Adafactor (2.5 or later)" % torch.__version__
    if impl == "fused" and opt in ("sgd", "sgd-momentum", "adam", "adamw"):
        def step():
            p = nn.Parameter(torch.zeros(4, device=device))
            p.grad = torch.ones(4, device=device)
            kw = {"momentum": 0.9} if opt == "sgd-momentum" else {}
            optimizer_class(opt)([p], lr=0.1, fused=True, **kw).step()
        if not probe(step):
            return "torch %s has no fused %s on %s" % (torch.__version__, opt, device)
    return None


def fp16_runs(device):
    def fp16():
        a = torch.ones(4, 4, device=device)
        with torch.autocast(device, dtype=torch.float16):
            assert (a @ a).dtype == torch.float16
        h = a.half()
        h @ h
    return probe(fp16)


class Recorder:
    """torch.utils.checkpoint.checkpoint and torch.autocast, patched to record."""

    def __init__(self):
        self.real_ckpt = tcp.checkpoint
        self.real_autocast = torch.autocast
        self.segments = []   # per checkpoint() call: the block indices it ran
        self.current = None
        self.runs = {}       # block index -> forward calls (recomputation included)
        self.reentrant = []
        self.autocasts = []

    def checkpoint(self, fn, *args, **kw):
        self.reentrant.append(kw.get("use_reentrant", True))
        self.current = []
        self.segments.append(self.current)
        try:
            return self.real_ckpt(fn, *args, **kw)
        finally:
            self.current = None

    def autocast(self, device_type, *a, **kw):
        self.autocasts.append((device_type, kw.get("dtype")))
        return self.real_autocast(device_type, *a, **kw)

    def hook(self, i):
        def pre(module, inputs):
            self.runs[i] = self.runs.get(i, 0) + 1
            if self.current is not None:
                self.current.append(i)
        return pre

    def __enter__(self):
        tcp.checkpoint = self.checkpoint
        torch.autocast = self.autocast
        return self

    def __exit__(self, *exc):
        tcp.checkpoint = self.real_ckpt
        torch.autocast = self.real_autocast


def expected_state(opt, p):
    """The tensors the optimizer keeps for p after one step (docs/optimizers.md)."""
    if opt == "sgd":
        return []
    if opt == "sgd-momentum":
        return ["momentum_buffer"]
    if opt in ("adam", "adamw"):
        return ["exp_avg", "exp_avg_sq"]
    if opt == "lion":
        return ["exp_avg"]
    if opt == "adafactor":
        return ["row_var", "col_var"] if p.dim() >= 2 else ["variance"]
    if opt == "adam-8bit":
        return ["state1", "state2"]
    return []


def run_torch_case(exe, model_path, prec, opt, impl, ckpt, segs, logits, zero_grad, device):
    name = "torch %s %s %s ckpt=%s logits=%s zero_grad=%s" % (prec, opt, impl, ckpt, logits,
                                                              zero_grad)
    rc, code, err = emit(exe, model_path, "torch",
                         ["--precision", prec, "--optimizer", opt, "--optimizer-impl", impl,
                          "--checkpoint", ckpt, "--logits", logits, "--zero-grad", zero_grad,
                          "--grad-accum", "2"])
    refusal = torch_refusal(prec, opt, impl)
    if refusal:
        return report(rc == 2 and refusal in err and not code, name,
                      "expected exit 2 with '%s', got %d: %s" % (refusal, rc, err.strip()))
    if rc != 0:
        return report(False, name, "exit %d: %s" % (rc, err.strip()))
    for part in NEEDS[opt][:2]:
        if part not in code:
            return report(False, name, "the snippet does not name %r" % part)
    if code.count('DEVICE = "cuda"') != 1:
        return report(False, name, "no single DEVICE = \"cuda\" line")
    if "autocast(\"cuda\"" in code:
        return report(False, name, "a hard-coded device")
    why = why_not_run(opt, impl, device)
    if why:
        return report(None, name, why + " (the snippet names what it needs)")
    scaler_missing = ("fp16" in prec and device != "cuda"
                      and not hasattr(torch.amp, "GradScaler"))
    if not scaler_missing and "fp16" in prec and not fp16_runs(device):
        return report(None, name, "fp16 on %s unsupported by torch %s" % (device,
                                                                        torch.__version__))
    code = code.replace('DEVICE = "cuda"', 'DEVICE = "%s"' % device)
    torch.manual_seed(0)
    ns = {"__name__": "emitted"}
    try:
        with Recorder() as rec:
            return check_run(name, code, ns, rec, prec, opt, impl, segs, logits, zero_grad,
                             device, scaler_missing)
    except Exception as e:  # the snippet does not run: a failure, with the reason
        return report(False, name, "%s: %s" % (type(e).__name__, e))


def check_run(name, code, ns, rec, prec, opt, impl, segs, logits, zero_grad, device,
              scaler_missing):
    """Runs the snippet (under rec) for one step and checks what it did."""
    exec(compile(code, "<emit torch>", "exec"), ns)
    model = GPT2(ns)
    for i, b in enumerate(model.blocks):
        b.register_forward_pre_hook(rec.hook(i))
    if scaler_missing:
        # no GradScaler for this device in this torch: the snippet must
        # refuse to run fp16 unscaled rather than train differently
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ns["setup"](model)
        except RuntimeError as e:
            return report("needs loss scaling" in str(e), name, str(e))
        return report(False, name, "setup() ran fp16 without a GradScaler")
    model, optimizer = ns["setup"](model)
    before = [p.detach().clone() for p in model.parameters()]
    alive = []   # per loss_fn call: whether the previous output still exists
    outs = []
    dtypes = []

    def loss_fn(out, targets):
        alive.append(outs[-1]() is not None if outs else None)
        outs.append(weakref.ref(out))
        dtypes.append(out.dtype)
        return F.cross_entropy(out.float().view(-1, out.size(-1)), targets.view(-1))

    batches = [(torch.randint(0, 211, (2, 32)), torch.randint(0, 211, (2, 32)))
               for _ in range(2)]
    scaled = []
    if ns.get("SCALER") is not None:
        real_scale = ns["SCALER"].scale
        ns["SCALER"].scale = lambda loss: (scaled.append(1), real_scale(loss))[1]
    ns["train_step"](model, optimizer, batches, loss_fn)
    problems = []
    scaler = ns.get("SCALER")
    # parameters' dtype
    want = {"bf16": torch.bfloat16, "bf16-master": torch.bfloat16,
            "fp16-master": torch.float16}.get(prec, torch.float32)
    got = {p.dtype for p in model.parameters()}
    if got != {want}:
        problems.append("parameters %s, expected %s" % (got, want))
    skipped = scaler is not None and scaler.get_scale() < 65536.0  # an inf/nan step
    if not skipped and all(torch.equal(a, p.detach()) for a, p in zip(before,
                                                                       model.parameters())):
        problems.append("the step changed no parameter")
    # autocast and the output's dtype
    amp = {"amp-bf16": torch.bfloat16, "amp-fp16": torch.float16}.get(prec)
    if amp:
        if set(rec.autocasts) != {(device, amp)}:
            problems.append("autocast %s, expected (%s, %s)" % (rec.autocasts, device, amp))
        if set(dtypes) != {amp}:
            problems.append("logits %s under autocast %s" % (dtypes, amp))
    elif rec.autocasts:
        problems.append("autocast %s in a %s plan" % (rec.autocasts, prec))
    # GradScaler
    if "fp16" in prec:
        if scaler is None or type(scaler).__name__ != "GradScaler" or not scaler.is_enabled():
            problems.append("no enabled GradScaler: %r" % scaler)
        if len(scaled) != 2:
            problems.append("the loss scaled %d times in 2 micro-batches" % len(scaled))
    elif scaler is not None:
        problems.append("a GradScaler in a %s plan" % prec)
    # the optimizer(s): class, implementation, state
    opts = getattr(optimizer, "optimizers", [optimizer])
    cls = NEEDS[opt][2]
    for o in opts:
        if type(o).__name__ != cls:
            problems.append("optimizer %s, expected %s" % (type(o).__name__, cls))
        if opt not in ("lion", "adam-8bit"):
            flag = "fused" if impl == "fused" else "foreach"
            val = o.defaults.get(flag)
            if val is not (impl != "for-loop"):
                problems.append("%s=%r for %s" % (flag, val, impl))
        if opt in ("sgd", "sgd-momentum"):
            m = o.defaults.get("momentum")
            if (m > 0) != (opt == "sgd-momentum"):
                problems.append("momentum %r for %s" % (m, opt))
    master_dtype = torch.float32 if prec.endswith("-master") else want
    stepped = [(o, p) for o in opts for g in o.param_groups for p in g["params"]]
    if prec.endswith("-master"):
        if len(opts) != (len(list(model.parameters())) if impl == "for-loop" else 1):
            problems.append("%d optimizers for %s" % (len(opts), impl))
        for p, m in zip(model.parameters(), optimizer.master):
            if not torch.equal(p.detach(), m.to(p.dtype)):
                problems.append("a parameter is not its master copy after the step")
                break
    for o, p in stepped:
        if p.dtype != master_dtype:
            problems.append("the optimizer steps %s, expected %s" % (p.dtype, master_dtype))
            break
        names = expected_state(opt, p)
        st = o.state[p]
        tensors = sorted(k for k, v in st.items() if torch.is_tensor(v) and v.dim() > 0)
        if opt == "adam-8bit":
            tensors = [k for k in tensors if k in ("state1", "state2")]
        if tensors != sorted(names):
            problems.append("state %s, expected %s" % (tensors, names))
            break
        for k in names:
            if opt not in ("adam-8bit", "adafactor") and st[k].shape != p.shape:
                problems.append("%s shape %s" % (k, tuple(st[k].shape)))
            if opt != "adam-8bit" and st[k].dtype != p.dtype:
                problems.append("%s dtype %s, the parameter's %s" % (k, st[k].dtype, p.dtype))
    # exactly the planned segments, non-reentrant, each recomputed once
    per_forward = [tuple(s) for s in rec.segments]
    want_calls = [tuple(range(a, b + 1)) for a, b in segs] * 2   # two micro-batches
    if per_forward != want_calls:
        problems.append("checkpoint() ran %s, expected %s" % (per_forward, want_calls))
    if any(r is not False for r in rec.reentrant):
        problems.append("use_reentrant %s" % rec.reentrant)
    inside = {i for a, b in segs for i in range(a, b + 1)}
    want_runs = {i: 2 * (2 if i in inside else 1) for i in range(3)}
    if rec.runs != want_runs:
        problems.append("block forward calls %s, expected %s" % (rec.runs, want_runs))
    # the loop's reference to the output (docs/ledger.md): at the second
    # micro-batch's loss, the first output exists under kept only
    if alive != [None, logits == "kept"]:
        problems.append("previous output alive %s under logits %s" % (alive, logits))
    # zero_grad
    grads = [p.grad for p in model.parameters()]
    if zero_grad == "set_to_none" and any(g is not None for g in grads):
        problems.append("gradients left after zero_grad(set_to_none=True)")
    if zero_grad == "zero" and any(g is None or g.count_nonzero() for g in grads):
        problems.append("gradients not kept as zeros")
    report(not problems, name, "; ".join(problems))


def torch_cases(exe, model_path):
    device = os.environ.get("EMIT_DEVICE", "cpu")
    for n, (prec, opt, impl) in enumerate(itertools.product(PRECISIONS, OPTIMIZERS, IMPLS)):
        ckpt, segs = CHECKPOINTS[n % len(CHECKPOINTS)]
        logits = "kept" if n % 2 == 0 else "released"
        zero_grad = "zero" if n % 3 == 0 else "set_to_none"
        run_torch_case(exe, model_path, prec, opt, impl, ckpt, segs, logits, zero_grad, device)


# --------------------------------------------------------------------------
# DeepSpeed: the keys the config may hold and the combinations DeepSpeed
# allows, each from its documentation.
CONFIG_JSON = "https://www.deepspeed.ai/docs/config-json/"
DS_KEYS = {
    "train_micro_batch_size_per_gpu": CONFIG_JSON + "#batch-size-related-parameters",
    "gradient_accumulation_steps": CONFIG_JSON + "#batch-size-related-parameters",
    "train_batch_size": CONFIG_JSON + "#batch-size-related-parameters",
    "bf16": CONFIG_JSON + "#bfloat16-training-options",
    "fp16": CONFIG_JSON + "#fp16-training-options",
    "torch_autocast": "https://deepspeed.readthedocs.io/en/latest/training.html"
                      "#pytorch-automatic-mixed-precision-amp",
    "data_types": CONFIG_JSON + "#data-type-options",
    "optimizer": CONFIG_JSON + "#optimizer-parameters",
    "zero_allow_untested_optimizer": CONFIG_JSON + "#optimizer-parameters",
    "zero_optimization": CONFIG_JSON + "#zero-optimizations-for-fp16-training",
    "wall_clock_breakdown": CONFIG_JSON + "#logging",
}
DS_SUBKEYS = {
    "bf16": {"enabled"},
    "fp16": {"enabled", "loss_scale"},   # loss_scale 0: dynamic (#fp16-training-options)
    "torch_autocast": {"enabled", "dtype", "lower_precision_safe_modules"},
    "data_types": {"grad_accum_dtype"},  # "fp32" | "fp16" | "bf16"
    "optimizer": {"type", "params"},
    "zero_optimization": {"stage", "reduce_bucket_size", "allgather_bucket_size",
                          "offload_optimizer", "offload_param"},
}
# DeepSpeed's own optimizer types (config-json, #optimizer-parameters); any
# other "type" is looked up in torch.optim (engine.py, _configure_basic_optimizer)
DS_OPTIMIZERS = {"Adam", "AdamW", "OneBitAdam", "OneBitLamb", "Lamb", "Lion", "Adagrad",
                 "ZeroOneAdam", "MuAdam", "MuAdamW", "MuSGD"}
TORCH_OPTIMIZERS = {"SGD", "Adafactor"}
# ZeRO runs these without zero_allow_untested_optimizer (zero/utils.py,
# ZERO_SUPPORTED_OPTIMIZERS: Adam/AdamW/FusedAdam/CPUAdam, Adagrad, Lion)
ZERO_TESTED = {"Adam", "AdamW", "Lion", "Adagrad"}
# params DeepSpeed itself takes for Adam/AdamW before building the class
DS_ADAM_PARAMS = {"torch_adam", "adam_w_mode"}


def ds_refusal(prec, opt, zero, offload):
    if offload != "none" and zero == 0:
        return "DeepSpeed offloads at ZeRO stages 1-3 only"   # config-json, offload_optimizer
    if prec == "bf16":
        return "no DeepSpeed setting keeps them in bf16"
    if offload != "none" and opt == "adam-8bit":
        return "bitsandbytes steps on the GPU"
    return None


def check_ds_config(cfg, prec, opt, impl, zero, offload, dp):
    p = []
    for k, v in cfg.items():
        if k not in DS_KEYS:
            p.append("key %s is not among DeepSpeed's documented keys" % k)
        elif isinstance(v, dict) and not set(v) <= DS_SUBKEYS.get(k, set()):
            p.append("%s has %s" % (k, sorted(set(v) - DS_SUBKEYS.get(k, set()))))
    if cfg["train_batch_size"] != (cfg["train_micro_batch_size_per_gpu"] *
                                   cfg["gradient_accumulation_steps"] * dp):
        p.append("train_batch_size is not micro x accumulation x devices")
    modes = [cfg["bf16"]["enabled"], cfg["fp16"]["enabled"],
             cfg.get("torch_autocast", {}).get("enabled", False)]
    if sum(modes) > 1:  # torch_autocast.py: "Cannot enable both torch autocast and fp16/bf16"
        p.append("more than one precision mode: %s" % modes)
    want = {"fp32": [False, False, False], "amp-bf16": [False, False, True],
            "amp-fp16": [False, False, True], "bf16-master": [True, False, False],
            "fp16-master": [False, True, False]}[prec]
    if modes != want:
        p.append("precision modes %s, expected %s for %s" % (modes, want, prec))
    if prec.startswith("amp-"):
        ta = cfg["torch_autocast"]
        if ta["dtype"] != {"amp-bf16": "bfloat16", "amp-fp16": "float16"}[prec]:
            p.append("torch_autocast dtype %s" % ta["dtype"])
        if ta.get("lower_precision_safe_modules") != []:
            p.append("gradients reduced in low precision (lower_precision_safe_modules)")
    if prec == "bf16-master" and cfg.get("data_types", {}).get("grad_accum_dtype") != "bf16":
        p.append("bf16-master without bf16 gradient accumulation")
    z = cfg["zero_optimization"]
    if z["stage"] != zero:
        p.append("stage %s" % z["stage"])
    if "offload_optimizer" in z and z["stage"] < 1:
        p.append("offload_optimizer at stage 0")   # config-json: stages 1, 2 and 3
    if "offload_param" in z and z["stage"] != 3:
        p.append("offload_param below stage 3")    # config-json: stage 3 only
    if ("offload_optimizer" in z) != (offload != "none") or \
            ("offload_param" in z) != (offload == "params"):
        p.append("offload keys %s for offload %s" % (sorted(z), offload))
    o = cfg.get("optimizer")
    if o:
        t = o["type"]
        if t not in DS_OPTIMIZERS | TORCH_OPTIMIZERS:
            p.append("optimizer type %s is neither DeepSpeed's nor torch.optim's" % t)
        want_t = {"adam": "Adam", "adamw": "AdamW", "sgd": "SGD", "sgd-momentum": "SGD",
                  "adafactor": "Adafactor", "lion": "Lion"}.get(opt)
        if t != want_t:
            p.append("optimizer %s for %s" % (t, opt))
        params = o["params"]
        if t in ("Adam", "AdamW"):
            torch_adam = params.get("torch_adam", False)
            if offload == "none" and torch_adam != (impl != "fused"):
                p.append("torch_adam %s for %s" % (torch_adam, impl))
            if (t == "Adam") != (params.get("adam_w_mode") is False):
                p.append("adam_w_mode for %s" % t)   # "Adam" is AdamW unless it is false
            rest = set(params) - DS_ADAM_PARAMS
        else:
            rest = set(params)
        if torch is not None and rest and t in {"Adam", "AdamW", "SGD"} | TORCH_OPTIMIZERS:
            cls = getattr(torch.optim, t, None)
            if cls is not None:
                import inspect
                unknown = rest - set(inspect.signature(cls.__init__).parameters)
                if unknown and not (unknown == {"fused"} and t == "SGD"):
                    p.append("%s takes no %s (torch %s)" % (t, sorted(unknown),
                                                            torch.__version__))
        if t == "SGD" and (params.get("momentum", 0) > 0) != (opt == "sgd-momentum"):
            p.append("SGD momentum %s for %s" % (params.get("momentum"), opt))
        if zero >= 1 and (t not in ZERO_TESTED) != cfg.get("zero_allow_untested_optimizer",
                                                           False):
            p.append("zero_allow_untested_optimizer for %s" % t)
    elif opt not in ("adam-8bit", "lion"):
        p.append("no optimizer section for %s" % opt)
    if "activation_checkpointing" in cfg:
        p.append("activation_checkpointing (it does not choose layers)")
    return p


def deepspeed_cases(exe, model_path):
    n = 0
    for prec, opt, impl, (zero, offload) in itertools.product(
            PRECISIONS, OPTIMIZERS, IMPLS,
            [(0, "none"), (0, "optimizer"), (1, "none"), (2, "optimizer"), (3, "params")]):
        n += 1
        if opt == "adafactor" and impl == "fused":
            continue  # the plan itself is refused (no fused Adafactor)
        ckpt = CHECKPOINTS[n % len(CHECKPOINTS)][0]
        dp = 1 if zero == 0 and n % 2 else 4
        name = "deepspeed %s %s %s zero=%d offload=%s dp=%d ckpt=%s" % (prec, opt, impl, zero,
                                                                       offload, dp, ckpt)
        rc, out, err = emit(exe, model_path, "deepspeed",
                            ["--precision", prec, "--optimizer", opt, "--optimizer-impl", impl,
                             "--zero", str(zero), "--offload", offload, "--data-parallel",
                             str(dp), "--checkpoint", ckpt])
        refusal = ds_refusal(prec, opt, zero, offload)
        if refusal:
            report(rc == 2 and refusal in err and not out, name,
                   "expected exit 2 with '%s', got %d: %s" % (refusal, rc, err.strip()))
            continue
        # exit 4: the checkpoint plan or the optimizer is the model's code
        partial = ckpt != "none" or (opt == "adam-8bit" or (opt == "lion" and impl != "fused"
                                                            and offload == "none"))
        if rc != (4 if partial else 0):
            report(False, name, "exit %d, expected %d: %s" % (rc, 4 if partial else 0,
                                                              err.strip()))
            continue
        try:
            cfg = json.loads(out)
        except ValueError as e:
            report(False, name, "not JSON: %s" % e)
            continue
        problems = check_ds_config(cfg, prec, opt, impl, zero, offload, dp)
        report(not problems, name, "; ".join(problems))


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    exe, model_path = sys.argv[1], sys.argv[2]
    deepspeed_cases(exe, model_path)
    if torch is None:
        print("torch cannot be imported: the --emit torch runs are skipped")
    else:
        torch_cases(exe, model_path)
    print("%d passed, %d failed, %d not run" % (results["pass"], results["fail"],
                                               results["skip"]))
    if results["fail"]:
        return 1
    return 77 if torch is None else 0


if __name__ == "__main__":
    sys.exit(main())
