"""CUDA autocast's casts, restated on the CPU (bf16).

1.13's CPU autocast lists other ops than CUDA's (no layer_norm, softmax,
pow or sum in fp32; docs/validation.md), so a CPU run under
torch.autocast("cpu") allocates what no GPU run does. This mode applies
CUDA autocast's policy instead, as PyTorch 2.x registers it
(aten/src/ATen/autocast_mode.h, AT_FORALL_LOWER_PRECISION_FP,
AT_FORALL_FP32, AT_FORALL_FP32_SET_OPT_DTYPE; autocast_mode.cpp,
cached_cast), to the ops the twins call, through a TorchFunctionMode: the
casts are the same autograd-visible `.to()` copies autocast makes
(ToCopyBackward0 in the graph), so the kernels that run and the tensors
they allocate are those of a GPU run, measured by the CPU's allocator.

- lower precision (linear, matmul, bmm, ...): every floating input cast to
  bf16; a cast of a leaf tensor that requires grad (a weight) is cached
  until the outermost autocast region exits (cached_cast), so a weight used
  twice is cast once and its copy lives as long as the region or a saved
  reference (a bias's copy is made in a profiler range `ml:bias-copy`,
  which allocates nothing, so that a check can name it);
- fp32 (layer_norm, pow, rsqrt, exp, nll_loss, ...): floating inputs cast
  to fp32;
- fp32_set_opt_dtype (softmax, log_softmax, sum, ...): dtype=float32 added
  where the caller gave none and the first input is floating;
- composite ops dispatch their parts through autocast one by one; the one
  the twins call is cross_entropy, whose ATen body is
  nll_loss(log_softmax(x, dim, x.dtype)) (aten/src/ATen/native/LossNLL.cpp,
  cross_entropy_loss): the explicit dtype keeps log_softmax in x's dtype,
  then nll_loss casts to fp32.
Everything else runs as called (binary ops promote bf16 with fp32 to fp32
by themselves).

A checkpointed segment's recompute runs under the autocast state of its
forward (torch/utils/checkpoint.py: the recompute enters
torch.autocast(**saved kwargs)) with a cache of its own: `recompute_region`.
"""
import contextlib

import torch
from torch.overrides import TorchFunctionMode

LOWER = {"linear", "matmul", "__matmul__", "__rmatmul__", "mm", "bmm", "addmm", "baddbmm",
         "addbmm", "addmv", "mv", "einsum", "prelu", "conv1d", "conv2d", "conv3d",
         "scaled_dot_product_attention"}
FP32 = {"layer_norm", "group_norm", "pow", "__pow__", "rsqrt", "exp", "expm1", "log", "log1p",
        "log2", "log10", "reciprocal", "softplus", "nll_loss", "mse_loss", "l1_loss",
        "smooth_l1_loss", "huber_loss", "kl_div", "logsumexp", "cosine_similarity",
        "binary_cross_entropy_with_logits", "acos", "asin", "cosh", "sinh", "tan", "erfinv"}
SET_OPT_DTYPE = {"softmax", "log_softmax", "sum", "prod", "cumsum", "cumprod"}

LOW = torch.bfloat16
ACTIVE = [None]  # the mode in force, for the checkpoint's recompute


def _floating(t):
    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64


class CudaAutocast(TorchFunctionMode):
    """CUDA autocast (bf16) as a function mode; `with CudaAutocast():` is one
    autocast region, its weight cache dropped when it exits."""

    def __init__(self):
        super().__init__()
        self.cache = {}
        self.enabled = True

    def __enter__(self):
        self.outer = ACTIVE[0]
        if self.outer is not None:  # one cache a thread (autocast_mode.cpp)
            self.cache = self.outer.cache
        ACTIVE[0] = self
        return super().__enter__()

    def __exit__(self, *exc):
        ACTIVE[0] = self.outer
        if self.outer is None:  # the outermost region's exit clears the cache
            self.cache.clear()
        return super().__exit__(*exc)

    def cast(self, t, dtype):
        if isinstance(t, (list, tuple)):
            return type(t)(self.cast(x, dtype) for x in t)
        if not _floating(t) or t.dtype == dtype:
            return t
        if dtype == LOW and t.is_leaf and t.requires_grad:
            c = self.cache.get(id(t))
            if c is None or c[0] is not t:
                if t.dim() == 1:  # a bias's copy, in a range that names it
                    h = torch.ops.profiler._record_function_enter_new("ml:bias-copy", None)
                    c = (t, t.to(dtype))
                    torch.ops.profiler._record_function_exit._RecordFunction(h)
                else:
                    c = (t, t.to(dtype))
                self.cache[id(t)] = c
            return c[1]
        return t.to(dtype)

    def cast_all(self, args, kwargs, dtype):
        """An op's arguments cast last to first: the wrapper passes
        cached_cast(args)... to the op (autocast_mode.h, WrapFunction_), an
        argument list the compilers PyTorch is built with evaluate from the
        last (a linear's bias, weight, then input: 1.13's CPU autocast
        under a TorchDispatchMode, and the H200 runs' allocator traces,
        2.11). Keywords follow the positional arguments in a signature:
        cast first, the last first."""
        kw = {}
        for k in reversed(list(kwargs)):
            kw[k] = self.cast(kwargs[k], dtype)
        out = [self.cast(a, dtype) for a in reversed(args)]
        return tuple(reversed(out)), {k: kw[k] for k in kwargs}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", "") if self.enabled else ""
        if name == "cross_entropy" and kwargs.get("label_smoothing", 0.0):
            raise NotImplementedError("cross_entropy's label_smoothing under CudaAutocast")
        if name in LOWER:
            args, kwargs = self.cast_all(args, kwargs, LOW)
        elif name in FP32:
            args, kwargs = self.cast_all(args, kwargs, torch.float32)
        elif name in SET_OPT_DTYPE:
            given = kwargs.get("dtype") is not None or any(isinstance(a, torch.dtype)
                                                           for a in args[1:])
            if args and _floating(args[0]) and not given:
                kwargs["dtype"] = torch.float32
        elif name == "cross_entropy":
            x, target = args[0], args[1]
            with torch._C.DisableTorchFunction():
                lp = torch.nn.functional.log_softmax(x, 1, dtype=x.dtype)
                lp = self.cast(lp, torch.float32)
                kw = {k: v for k, v in kwargs.items() if k in ("weight", "ignore_index",
                                                                 "reduction")}
                return torch.nn.functional.nll_loss(lp, target, **kw)
        with torch._C.DisableTorchFunction():
            return func(*args, **kwargs)


@contextlib.contextmanager
def disabled():
    """torch.autocast(enabled=False) inside a region (transformers' rotary
    embeddings compute their frequencies so): the ops run as called."""
    mode = ACTIVE[0]
    if mode is None:
        yield
        return
    mode.enabled = False
    try:
        yield
    finally:
        mode.enabled = True


def region_for(fn):
    """fn, as a checkpoint runs it: called under the region its forward runs
    in, or, recomputed in backward outside any region when its forward ran
    under one, in a fresh region (its own weight cache)."""
    amp = ACTIVE[0] is not None

    def run(*a):
        if amp and ACTIVE[0] is None:
            with CudaAutocast():
                return fn(*a)
        return fn(*a)
    return run
