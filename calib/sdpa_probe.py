#!/usr/bin/env python3
"""Which scaled_dot_product_attention kernels accept a shape, on this GPU:
each backend alone (flash, memory-efficient, cuDNN, math), fp32 and bf16,
with grouped-query heads (enable_gqa=True, 16 query heads on 4 key/value
heads, as transformers passes them) and with the heads already repeated.
A backend that refuses raises; PyTorch's dispatcher falls back to the math
kernel, which materialises the T x T scores like eager attention."""
import contextlib

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

B, H, KV, T, dh = 2, 16, 4, 2048, 64
for dtype in (torch.float32, torch.bfloat16):
    q = torch.randn(B, H, T, dh, device="cuda", dtype=dtype, requires_grad=True)
    k = torch.randn(B, KV, T, dh, device="cuda", dtype=dtype, requires_grad=True)
    v = torch.randn(B, KV, T, dh, device="cuda", dtype=dtype, requires_grad=True)
    for gqa in (True, False):
        kk = k if gqa else k.repeat_interleave(H // KV, 1)
        vv = v if gqa else v.repeat_interleave(H // KV, 1)
        kk, vv = kk.detach().requires_grad_(), vv.detach().requires_grad_()
        for be in (None, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                   SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH):
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            try:
                with sdpa_kernel(be) if be is not None else contextlib.nullcontext():
                    o = F.scaled_dot_product_attention(q, kk, vv, is_causal=True,
                                                       enable_gqa=gqa)
                    o.sum().backward()
                del o
                torch.cuda.synchronize()
                verdict = "runs, peak %d B above the inputs" % (
                    torch.cuda.max_memory_allocated() - base)
            except Exception as e:
                verdict = "refused: " + str(e).splitlines()[0][:100]
            q.grad = kk.grad = vv.grad = None
            print("%-9s gqa=%-5s %-20s %s" % (str(dtype).split(".")[1], gqa,
                                              be.name if be is not None else "default", verdict))
