#!/usr/bin/python3
"""Per-rank saved activations under tensor parallelism, against real PyTorch.

The Llama twin of twins.py (RMSNorm, q/k/v/o projections, rotary, eager
softmax attention with GQA's repeat_kv, SwiGLU), sharded as Megatron-LM
shards it (megatron/core/tensor_parallel/layers.py and mappings.py) and run
as TP ranks: one process each (torch.multiprocessing, spawn), gloo on the
CPU. The layer is twins.Llama's own code; only the linears, the heads and
the width of the MLP are per rank, and the collectives sit where Megatron
puts them:

- column-parallel q_proj, k_proj, v_proj, gate_proj, up_proj (out_features
  / tp rows of the weight each). Without sequence parallelism (SP) the
  input goes through copy_to_tensor_model_parallel_region (identity; its
  backward all-reduces the gradient) and the linear saves the full input.
  With SP the input is the rank's sequence shard; the linear
  (LinearWithGradAccumulationAndAsyncCommunication) all-gathers it for
  the product, saves only the shard and gathers it again in backward.
- row-parallel o_proj, down_proj (in_features / tp columns each): the
  partial sums are all-reduced (reduce_from_tensor_model_parallel_region)
  or, with SP, reduce-scattered along the sequence
  (reduce_scatter_to_sequence_parallel_region).
- with SP the residual stream, both RMSNorms and the residual adds run on
  the shard (B, T/tp, D); attention runs on the whole sequence with the
  rank's heads (H/tp query heads, KV/tp key/value heads), the MLP with
  F/tp columns. A layer's input and output are shards.
- the embedding is Megatron's VocabParallelEmbedding: ceil(V / tp) rows
  of the table (padded, as Megatron pads the vocabulary), the ids outside
  them masked and the rest shifted (the lookup saves the shifted int64
  ids, the zeroing of the masked rows the bool mask: 9 B a token), the
  output all-reduced, or reduce-scattered along the sequence under SP.
  Compared: its saved bytes (hand_embedding) and the layers'.
- the final norm runs on the stream as it is (the shard under SP); the
  output layer is column-parallel over the vocabulary (ceil(V / tp) rows a
  rank, the last ones fewer: unpadded, so that the loss stays the single
  device's), and the loss Megatron's vocab-parallel cross-entropy
  (megatron_ce_twin.RankVocabCE, its all-reduces over the ranks) on the
  fp32 logits, whose storage becomes the saved softmax. Compared: the
  head's and the loss's saved bytes (hand_head_loss), every rank against
  its own rows, rank 0 (the fullest) against the plan.

Each rank counts what autograd saves during the forward with crosscheck.py's
Recorder (saved_tensors_hooks; each storage once; parameters, buffers and
the batch excluded; attributed to the block running). Each rank also checks
that the sharded model is the single-device one: its loss, and after the
backward every gradient (the shard's rows or columns of the single-device
gradient; the layers' norm weights, partial per sequence shard under SP,
after the all-reduce Megatron does for them), within fp32 rounding.

Hand derivation: one layer's saved bytes per rank (fp32, 4 B an element;
B micro-batch, T sequence, D hidden, dh head size, H/KV/F the model's
query heads, key/value heads and MLP width; Hr = H/tp, Fr = F/tp; Tn = T
rows of the residual stream without SP, T/tp with SP):

  each RMSNorm (two a layer), on Tn rows:
    its input x (pow's and the product's)                      B*Tn*D
    x^2, mean's input (PyTorch 1.13 keeps it; 2.x does not)    B*Tn*D
    rsqrt's output                                             B*Tn
    x * rsqrt (weight * h's h)                                 B*Tn*D
    its output: the column-parallel linears' input             B*Tn*D
      (without SP the full rows, replicated; with SP the shard:
       the all-gathered rows are a transient, not saved)
  attention, on all T rows, Hr heads (rotary's products with cos and sin
  save only the tables, which do not require grad; they are the
  embedding's):
    q after the rotary (q @ k^T's)                             B*Hr*T*dh
    repeat_kv's copy of k and of v (Hr/(KV/tp) > 1)          2*B*Hr*T*dh
    softmax's output                                           B*Hr*T*T
    o_proj's input (the contiguous heads)                      B*T*Hr*dh
    the scale, a Python float saved as a 0-dim double          8 B
      (1.13 on the CPU; host memory on a GPU)
  the MLP, on all T rows, Fr columns:
    gate's output (silu's input), silu's output, up's output,
    the product (down_proj's input)                          4*B*T*Fr
  the collectives save nothing: gathered inputs, the reduce-scatter's
  full-size buffer, the all-reduced sums are transients.

  bytes = 4 * (2*(4*B*Tn*D + B*Tn) + 4*B*T*Hr*dh + B*Hr*T*T + 4*B*T*Fr) + 8

The planner's figure leaves out the two 1.13 artefacts (2*B*Tn*D*4 + 8 B,
crosscheck.py's known_1_13 on the rank's rows). For the files of
models-tp/ (B 2, T 24, D 64, H 8, dh 8, F 160; kv_heads 2 in
llama-tp.yaml, 4 in llama-kv4-tp.yaml: kv_heads does not enter, the
repeat_kv copies having Hr heads):

  tp sp  Tn  Hr Fr  norms            attention        MLP     elements  measured  planner
  1  -   24  8  160 2*(4*3072+48)    4*3072+9216      4*7680  76896     307592    283008
  2  no  24  4  80  2*(4*3072+48)    4*1536+4608      4*3840  50784     203144    178560
  2  yes 12  4  80  2*(4*1536+24)    4*1536+4608      4*3840  38448     153800    141504
  4  no  24  2  40  2*(4*3072+48)    4*768+2304       4*1920  37728     150920    126336
  4  yes 6   2  40  2*(4*768+12)     4*768+2304       4*1920  19224      76904     70752

(measured = 4 * elements + 8; planner = measured - 2*B*Tn*D*4 - 8.) tp 4
runs on llama-kv4-tp.yaml only: llama-tp.yaml's two key/value heads do not
split four ways. tp 1 is twins.Llama itself, in this process, against the
plan without --tp.

Each file also runs at a batch of one (B 1), where kv_heads enters: with
one key/value head a rank (KV/tp = 1) repeat_kv's expand reshapes to the
rank's Hr heads as a zero-stride view and matmul's fold to (Hr, T, dh) is
a view too, so bmm keeps the one head of k and of v, T*dh each, in place
of the two copies 2*Hr*T*dh (docs/inventory.md, "A batch of one"); with
two or more a rank the reshape still copies. The attention is then
2*T*Hr*dh + 2*T*dh + Hr*T*T:

  tp sp  KV/tp  norms           attention           MLP     elements  measured  planner
  1  -   2, 4   2*(4*1536+24)   4*1536+4608         4*3840  38448     153800    141504
  2  no  1      2*(4*1536+24)   2*768+2*192+2304    4*1920  24240      96968     84672
  2  no  2      2*(4*1536+24)   4*768+2304          4*1920  25392     101576     89280
  2  yes 1      2*(4*768+12)    2*768+2*192+2304    4*1920  18072      72296     66144
  2  yes 2      2*(4*768+12)    4*768+2304          4*1920  19224      76904     70752
  4  no  1      2*(4*1536+24)   2*384+2*192+1152    4*960   18480      73928     61632
  4  yes 1      2*(4*384+6)     2*384+2*192+1152    4*960    9228      36920     33840

The plan: `memledger plan MODEL --format json --tp N` (SP, the default for
N > 1) and `--tp N --no-sp`; each layer block's activations_saved must be
the planner column above, and the embedding's, head's and loss's the
fullest rank's figures below (hand_embedding, hand_head_loss), byte for
byte (a plan that fails is a failed check).

PyTorch 1.13's gloo has no reduce_scatter and no all-gather into one
tensor: the reduce-scatter is an all-reduce of a full-size copy and this
rank's rows taken as a new tensor (inside the autograd Function, so the
buffer is a transient), the gather all_gather into a list and cat.

Then each rank's live bytes (measure_live): three training iterations
(AdamW foreach, zero_grad(set_to_none), the loop holding the batch and the
loss) under livebytes.py's profiler and device view, the collectives on a
one-thread gloo group with a fence after each (their tensors freed on the
measured thread), the sequence-parallel gathers into one buffer kept from
its first use (Megatron's global memory buffer). Checked: no oracle error,
nothing left, iterations 2 and 3 alike; the fullest rank's steady and
first-iteration peaks against the plan's (`--optimizer adamw
--optimizer-impl foreach --logits released --allocator none`), within 1 %
and every byte of the difference a named item of the phase the peak is in
(compare_live).

usage: tp_twins.py MEMLEDGER MODELS_DIR
Prints one line per check and ends with "N passed, N failed".
"""
import copy
import datetime
import json
import os
import subprocess
import sys
import tempfile
import weakref

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import twins as tw  # noqa: E402  (the reference implementations)
from crosscheck import Recorder  # noqa: E402  (the measurement)
import megatron_ce_twin as mce  # noqa: E402  (Megatron's cross-entropy, restated)
import livebytes as lb  # noqa: E402  (the live-bytes oracle)

TP_SIZES = (2, 4)


def layer_blocks(m):
    """The blocks compared: the layers (the embedding and the head are not)."""
    return ["block.%d" % i for i in range(m["layers"])]


# --------------------------------------------------------------------------
# The hand derivation (the docstring's table, as a formula)

def hand_layer(m, B, T, tp, sp):
    """One layer block's saved bytes on one rank, as PyTorch 1.13 on the CPU
    saves them: (measured, planned), planned without the 1.13 artefacts."""
    D, H, KV, F_ = m["hidden"], m["heads"], m.get("kv_heads", m["heads"]), m["ffn"]
    dh = m.get("head_dim", D // H)
    Hr, KVr, Fr = H // tp, KV // tp, F_ // tp
    # repeat_kv copies k and v (rep > 1); at rep 1 it returns them and the
    # products would keep k after the rotary and v's projection instead
    assert Hr // KVr > 1, "the derivation assumes repeat_kv copies"
    Tn = T // tp if sp else T
    norm = 4 * B * Tn * D + B * Tn                     # x, x^2, x * rsqrt, output; rsqrt
    # k and v as bmm keeps them: repeat_kv's copies, B*T*Hr*dh each; at a
    # batch of one with one key/value head a rank, the expand reshapes to
    # Hr heads as a zero-stride view and matmul's fold to (Hr, T, dh) is a
    # view too, so bmm keeps the one head, T*dh each (docs/inventory.md,
    # "A batch of one"); with two or more a rank the reshape still copies
    kv = 2 * T * dh if B == 1 and KVr == 1 else 2 * B * T * Hr * dh
    attn = 2 * B * T * Hr * dh + kv + B * Hr * T * T   # q, o's input; k, v; softmax
    mlp = 4 * B * T * Fr                               # gate, silu, up, product
    measured = 4 * (2 * norm + attn + mlp) + 8         # + the scale's 0-dim double
    artefacts = 2 * B * Tn * D * 4 + 8                 # two x^2 and the scale (known_1_13)
    return measured, measured - artefacts


def hand_embedding(m, B, T, tp):
    """The embedding block's saved bytes on one rank: the rotary's cos and
    sin (T*dh each, fp32: one row for the batch, as the position ids a
    model makes, cache_position[None]), and above one rank the vocab-parallel lookup's
    masked ids (int64, which F.embedding saves) and its bool mask (which the
    zeroing of the masked rows, index_put_, saves): 9 bytes a token."""
    dh = m.get("head_dim", m["hidden"] // m["heads"])
    return 2 * T * dh * 4 + (9 * B * T if tp > 1 else 0)


def hand_head_loss(m, B, T, tp, sp, rank):
    """Above one rank, the head's and the loss's saved bytes on rank `rank`:
    (head measured, head planned, loss). The head: the final RMSNorm on the
    stream's Tn rows (its input, x * rsqrt, its output, which the
    column-parallel output layer saves, B*Tn*D each, and rsqrt, B*Tn; 1.13
    also keeps x^2, B*Tn*D, which the plan leaves out). The loss: Megatron's
    vocab-parallel cross-entropy on the rank's Vr = its rows of the
    vocabulary (ceil(V / tp), the last rank fewer): the softmax, made in the
    fp32 logits' own storage (B*T*Vr), the bool target mask (B*T) and the
    int64 masked targets (B*T*8)."""
    D, V = m["hidden"], m["vocab"]
    Tn = T // tp if sp else T
    per = (V + tp - 1) // tp
    Vr = max(0, min(V, (rank + 1) * per) - rank * per)
    head = 4 * (3 * B * Tn * D + B * Tn)
    return head + 4 * B * Tn * D, head, 4 * B * T * Vr + B * T + 8 * B * T


# the docstring's tables, for the shipped files (B 2, T 24, D 64, H 8, F 160;
# the same for both files) and at a batch of one ({key/value heads a rank: row})
TABLE = {(1, False): (307592, 283008), (2, False): (203144, 178560),
         (2, True): (153800, 141504), (4, False): (150920, 126336),
         (4, True): (76904, 70752)}
TABLE_B1 = {(1, False): {2: (153800, 141504), 4: (153800, 141504)},
            (2, False): {1: (96968, 84672), 2: (101576, 89280)},
            (2, True): {1: (72296, 66144), 2: (76904, 70752)},
            (4, False): {1: (73928, 61632)},
            (4, True): {1: (36920, 33840)}}


# --------------------------------------------------------------------------
# Megatron's communication, along the sequence dimension of HF's (B, T, D)
# (Megatron's activations are (T, B, D): its "first dim" is our dim 1)

# While a rank's live bytes are measured (measure_live), its collectives run
# on a gloo group of one worker thread, each followed by a fence: the
# worker runs the works in order and drops each before the next, so once
# the fence is done the collective's tensors are referenced by this thread
# only, and their frees happen here, where the profiler records them (a
# free on gloo's thread is not recorded: the oracle would see the pointer
# allocated twice).
_PG = [None]          # the group the collectives use now (None: the default)
_ONE_THREAD = [None]  # the one-thread group, made once
_FENCE = [None]
_GATHER = {}


def _done(work):
    work.wait()
    if _PG[0] is not None:
        _PG[0].allreduce([_FENCE[0]]).wait()


def _all_reduce(t, op=dist.ReduceOp.SUM):
    if _PG[0] is None:
        dist.all_reduce(t, op=op)
        return
    o = dist.AllreduceOptions()
    o.reduceOp = op
    _done(_PG[0].allreduce([t], o))


def _all_gather(parts, t):
    if _PG[0] is None:
        dist.all_gather(parts, t)
        return
    _done(_PG[0].allgather([parts], [t]))


def _gather_seq(x):
    """mappings.py _gather_along_first_dim; 1.13's gloo has no
    _all_gather_base: all_gather into a list, then cat. While the live
    bytes are measured the list is Megatron's global memory buffer
    (get_global_memory_buffer: one buffer every sequence-parallel gather
    reuses, kept from its first use, _GATHER), and the cat the twin's own
    transient (Megatron's (T, B, D) buffer is the gathered tensor)."""
    n = dist.get_world_size()
    if _PG[0] is not None:
        key = (n,) + tuple(x.shape)
        if key not in _GATHER:
            _GATHER[key] = torch.empty(key, dtype=x.dtype)
        parts = list(_GATHER[key].unbind(0))
    else:
        parts = [torch.empty_like(x) for _ in range(n)]
    _all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=1)


def _split_seq(x):
    """mappings.py _split_along_first_dim: this rank's rows, as a tensor of
    their own (a clone: a slice along dim 1 of (B, T, D) is a view of the
    whole; a reduce-scatter's output is a shard-sized tensor)."""
    n = x.shape[1] // dist.get_world_size()
    r = dist.get_rank()
    return x[:, r * n:(r + 1) * n].clone(memory_format=torch.contiguous_format)


def _reduce_scatter_seq(x):
    """mappings.py _reduce_scatter_along_first_dim; 1.13's gloo has no
    reduce_scatter: all-reduce a full-size copy, keep this rank's rows."""
    buf = x.clone(memory_format=torch.contiguous_format)
    _all_reduce(buf)
    return _split_seq(buf)


class CopyToModelParallelRegion(torch.autograd.Function):
    """mappings.py _CopyToModelParallelRegion: identity forward, the
    gradient all-reduced (the column-parallel linears' input without SP)."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous()
        _all_reduce(g)
        return g


class ReduceFromModelParallelRegion(torch.autograd.Function):
    """mappings.py _ReduceFromModelParallelRegion: the row-parallel partial
    sums all-reduced (in place, as _reduce does); gradient identity."""

    @staticmethod
    def forward(ctx, x):
        x = x.contiguous()
        _all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g


class ScatterToSequenceParallelRegion(torch.autograd.Function):
    """mappings.py _ScatterToSequenceParallelRegion: this rank's rows of a
    replicated tensor (a replicated embedding's output); gradient
    all-gathered."""

    @staticmethod
    def forward(ctx, x):
        return _split_seq(x)

    @staticmethod
    def backward(ctx, g):
        return _gather_seq(g)


class GatherFromSequenceParallelRegion(torch.autograd.Function):
    """mappings.py _GatherFromSequenceParallelRegion with
    tensor_parallel_output_grad=False: the rows all-gathered for a
    replicated computation (the head here), so the gradient is split."""

    @staticmethod
    def forward(ctx, x):
        return _gather_seq(x)

    @staticmethod
    def backward(ctx, g):
        return _split_seq(g)


class ReduceScatterToSequenceParallelRegion(torch.autograd.Function):
    """mappings.py _ReduceScatterToSequenceParallelRegion: the row-parallel
    partial sums reduce-scattered along the sequence (emulated: the buffer
    is this forward's transient); gradient all-gathered."""

    @staticmethod
    def forward(ctx, x):
        return _reduce_scatter_seq(x)

    @staticmethod
    def backward(ctx, g):
        return _gather_seq(g)


class LinearWithGradAccumulationAndAsyncCommunication(torch.autograd.Function):
    """layers.py's linear (no bias, no gradient-accumulation fusion):
    saves (input, weight), input being the rank's sequence shard under SP;
    the all-gathered rows are the product's transient, gathered again for
    the weight's gradient; the input's gradient reduce-scattered under SP.
    Without SP the input's gradient is all-reduced by
    CopyToModelParallelRegion (today's Megatron does it here instead,
    allreduce_dgrad: the same saved tensors)."""

    @staticmethod
    def forward(ctx, x, weight, sequence_parallel):
        ctx.save_for_backward(x, weight)
        ctx.sequence_parallel = sequence_parallel
        total = _gather_seq(x) if sequence_parallel else x
        return torch.matmul(total, weight.t())

    @staticmethod
    def backward(ctx, g):
        x, weight = ctx.saved_tensors
        total = _gather_seq(x) if ctx.sequence_parallel else x
        grad_input = g.matmul(weight)
        # prepare_input_tensors_for_wgrad_compute: rows flattened
        grad_weight = g.reshape(-1, g.shape[-1]).t().matmul(total.reshape(-1, total.shape[-1]))
        if ctx.sequence_parallel:
            grad_input = _reduce_scatter_seq(grad_input)
        return grad_input, grad_weight, None


class VocabParallelEmbedding(nn.Module):
    """layers.py VocabParallelEmbedding: ceil(V / tp) rows of the table (the
    vocabulary padded to tp of them, as Megatron pads it: the padding rows
    are never looked up). The ids outside the rank's rows are masked, the
    others shifted into them; the masked rows of the output zeroed; the
    output all-reduced, or reduce-scattered along the sequence under SP
    (reduce_scatter_embeddings)."""

    def __init__(s, weight, rank, tp, sp):
        super().__init__()
        V, D = weight.shape
        s.per = (V + tp - 1) // tp
        s.start, s.sp = rank * s.per, sp
        rows = torch.zeros(s.per, D)
        mine = weight.detach()[s.start:s.start + s.per]
        rows[:mine.shape[0]] = mine
        s.weight = nn.Parameter(rows)

    def forward(s, input_):
        input_mask = (input_ < s.start) | (input_ >= s.start + s.per)
        masked_input = input_.clone() - s.start
        masked_input[input_mask] = 0
        output_parallel = nn.functional.embedding(masked_input, s.weight)
        output_parallel[input_mask, :] = 0.0
        if s.sp:
            return ReduceScatterToSequenceParallelRegion.apply(output_parallel)
        return ReduceFromModelParallelRegion.apply(output_parallel)


def _ce_reduce(kind, t):
    """megatron_ce_twin.RankVocabCE's all-reduces over the TP group."""
    _all_reduce(t, dist.ReduceOp.MAX if kind == "max" else dist.ReduceOp.SUM)
    return t


class VocabParallelCE(torch.autograd.Function):
    """cross_entropy.py _VocabParallelCrossEntropy on the rank's logits
    [lo, hi) of the vocabulary: megatron_ce_twin.RankVocabCE (the
    restatement held there against Megatron's reading) with the three
    all-reduces made over the TP group. On fp32 logits .float() returns
    them: the softmax is made in their storage, which it saves."""

    @staticmethod
    def forward(ctx, logits, target, lo, hi):
        return mce.RankVocabCE.forward(ctx, logits, target, lo, hi, _ce_reduce)

    @staticmethod
    def backward(ctx, grad_loss):
        return mce.RankVocabCE.backward(ctx, grad_loss)[:4]


class ColumnParallelLinear(nn.Module):
    """layers.py ColumnParallelLinear: out_features / tp rows of the weight."""

    def __init__(s, weight, sp):
        super().__init__()
        s.weight = nn.Parameter(weight.detach().clone())
        s.sp = sp

    def forward(s, x):
        if not s.sp:
            x = CopyToModelParallelRegion.apply(x)
        return LinearWithGradAccumulationAndAsyncCommunication.apply(x, s.weight, s.sp)


class RowParallelLinear(nn.Module):
    """layers.py RowParallelLinear (input_is_parallel): in_features / tp
    columns of the weight; the output all-reduced or reduce-scattered."""

    def __init__(s, weight, sp):
        super().__init__()
        s.weight = nn.Parameter(weight.detach().clone())
        s.sp = sp

    def forward(s, x):
        y = LinearWithGradAccumulationAndAsyncCommunication.apply(x, s.weight, False)
        if s.sp:
            return ReduceScatterToSequenceParallelRegion.apply(y)
        return ReduceFromModelParallelRegion.apply(y)


# --------------------------------------------------------------------------
# The sharded twin: twins.Llama's layer with the rank's linears

def _copy(mod):
    """A replicated module: the single-device one's copy, without its
    gradients (the reference has run its backward already)."""
    out = copy.deepcopy(mod)
    for p in out.parameters():
        p.grad = None
    return out


class TPLlama(tw.Llama):
    """Rank `rank` of `ref` (a twins.Llama) at tensor parallel size tp:
    the same parameters, registered in the same order, the linears the
    rank's rows (q, k, v, gate, up) or columns (o, down)."""

    def __init__(s, ref, rank, tp, sp):
        nn.Module.__init__(s)
        s.D, s.dh, s.scaling, s.softcap, s.flash = ref.D, ref.dh, ref.scaling, 0.0, False
        # the rank's heads; H // KV, repeat_kv's factor, is the model's
        s.H, s.KV, s.sp, s.classes = ref.H // tp, ref.KV // tp, sp, 0
        s.embed = VocabParallelEmbedding(ref.embed.weight, rank, tp, sp)
        dq, dkv = s.H * s.dh, s.KV * s.dh

        def rows(lin, n):
            return ColumnParallelLinear(lin.weight[rank * n:(rank + 1) * n], sp)

        def cols(lin, n):
            return RowParallelLinear(lin.weight[:, rank * n:(rank + 1) * n], sp)

        s.blocks = nn.ModuleList()
        for rb in ref.blocks:
            Fr = rb.gate.weight.shape[0] // tp
            b = nn.Module()
            b.q, b.k, b.v, b.o = rows(rb.q, dq), rows(rb.k, dkv), rows(rb.v, dkv), cols(rb.o, dq)
            b.gate, b.up, b.down = rows(rb.gate, Fr), rows(rb.up, Fr), cols(rb.down, Fr)
            b.ln1, b.ln2 = _copy(rb.ln1), _copy(rb.ln2)
            s.blocks.append(b)
        s.norm = _copy(ref.norm)
        # the output layer's rows: ceil(V / tp) a rank, the last ones fewer
        # (unpadded: padding rows would enter the softmax, and the loss
        # would not be the single device's; the plan is the fullest rank's)
        V = ref.lm_head.weight.shape[0]
        per = (V + tp - 1) // tp
        s.vocab_lo, s.vocab_hi = min(V, rank * per), min(V, (rank + 1) * per)
        s.lm_head = ColumnParallelLinear(ref.lm_head.weight[s.vocab_lo:s.vocab_hi], sp)
        s.register_buffer("inv_freq", ref.inv_freq.clone())

    def attn(s, b, h, cos, sin, mask):  # LlamaAttention.forward
        # as twins.Llama.attn, but the sequence is the tables' (all T rows):
        # under SP h holds T/tp rows and q, k, v the gathered T
        B, T = h.shape[0], cos.shape[-2]
        q = b.q(h).view(B, T, -1, s.dh).transpose(1, 2)
        k = b.k(h).view(B, T, -1, s.dh).transpose(1, 2)
        v = b.v(h).view(B, T, -1, s.dh).transpose(1, 2)
        q, k = tw.apply_rotary_pos_emb(q, k, cos, sin)
        y, w = s.core(q, k, v, mask)
        y = y.reshape(B, T, -1).contiguous()
        y = b.o(y)
        return y, w

    def run(s, rec, batch, ckpt):  # twins.Llama.run with the scatter and the gather
        idx, tgt = batch
        B, T = idx.shape
        rec.block = "embedding"
        x = s.embed_tokens(idx)
        pos = torch.arange(T)[None]  # cache_position[None]: one row for the batch (LlamaModel.forward)
        cos, sin = s.rotary(x, pos)
        rec.pinned[cos.storage().data_ptr()] = "embedding"
        rec.pinned[sin.storage().data_ptr()] = "embedding"
        mask = torch.full((T, T), float("-inf")).triu(1)[None, None].expand(B, 1, T, T)
        if s.sp and not isinstance(s.embed, VocabParallelEmbedding):
            # a replicated embedding (tpep_twin.py's): its output's shard
            x = ScatterToSequenceParallelRegion.apply(x)
        x = tw.run_blocks(rec, s.blocks, s.block, x, ckpt, cos, sin, mask, pos)
        del mask, pos
        rec.block = "head"
        if not isinstance(s.embed, VocabParallelEmbedding):
            # tpep_twin.py's replicated head: the whole sequence gathered
            if s.sp:
                x = GatherFromSequenceParallelRegion.apply(x)
            return tw.lm_loss(rec, s.norm(x), s.lm_head, tgt)
        # the final norm on the stream as it is (the shard under SP), the
        # column-parallel output layer, Megatron's vocab-parallel
        # cross-entropy, the mean over the tokens
        logits = s.lm_head(s.norm(x))
        tw.bwd_mark("head", logits)
        rec.block = "loss"
        return VocabParallelCE.apply(logits, tgt, s.vocab_lo, s.vocab_hi).mean()


def _grad_errors(ref, model, rank, tp, sp):
    """The largest gap between each of this rank's gradients and its part of
    the single-device gradient (the layers' norm weights all-reduced under
    SP first, as Megatron's finalize_model_grads does for sequence-parallel
    parameters)."""
    worst, name = 0.0, ""
    for (n, p), (rn, rp) in zip(model.named_parameters(), ref.named_parameters()):
        assert n == rn, (n, rn)
        g, want = p.grad.clone(), rp.grad
        # the sequence-parallel norms (the final one too: it runs on the
        # shard before the column-parallel output layer)
        if sp and (".ln1." in n or ".ln2." in n or n == "norm.weight"):
            dist.all_reduce(g)
        if n == "lm_head.weight":  # the rank's rows, ceil(V / tp) a rank
            per = (want.shape[0] + tp - 1) // tp
            want = want[rank * per:rank * per + g.shape[0]]
        elif n == "embed.weight":  # the rank's rows of the padded table
            per = g.shape[0]
            want = torch.cat([want, want.new_zeros(per * tp - want.shape[0], want.shape[1])])
            want = want[rank * per:(rank + 1) * per]
        elif g.shape != want.shape:
            leaf = n.rsplit(".", 2)[-2]
            if leaf in ("o", "down"):
                c = g.shape[1]
                want = want[:, rank * c:(rank + 1) * c]
            else:
                r = g.shape[0]
                want = want[rank * r:(rank + 1) * r]
        err = ((g - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()
        if err > worst:
            worst, name = err, n
    return worst, name


def measure_live(ref, rank, tp, sp, batch):
    """The rank's live bytes over three training iterations (AdamW foreach,
    zero_grad(set_to_none), the loop holding the batch and the loss, no
    output), as livebytes.py measures them: the peak of the first and of
    the steady iterations in the device view (1.13's CPU artefacts removed
    by op and tensor), and the phase each falls in."""
    if _ONE_THREAD[0] is None:  # made once, outside the measured window
        from torch._C._distributed_c10d import ProcessGroupGloo
        o = ProcessGroupGloo._Options()
        o._devices = [ProcessGroupGloo.create_device(hostname="127.0.0.1")]
        o._threads = 1
        o._timeout = datetime.timedelta(seconds=120)
        store = dist.PrefixStore("one-thread", dist.distributed_c10d._get_default_store())
        _ONE_THREAD[0] = ProcessGroupGloo(store, rank, tp, o)
        _FENCE[0] = torch.zeros(1)

    def build():
        m = TPLlama(ref, rank, tp, sp)
        m.train()
        # the gather buffer goes with the model (in the measured teardown)
        weakref.finalize(m, _GATHER.clear)
        return m
    _PG[0] = _ONE_THREAD[0]
    try:
        # the batch made in the window, as the planned loop holds it
        c, f = lb.run_loop(build, lambda m: tuple(t.clone() for t in batch),
                           lb.model_step_fn(False), "adamw", "foreach", "released")
    finally:
        _PG[0] = None
    view, _ = c.device_view()
    r = [c.phases(i, view) for i in range(3)]
    return {"errors": c.errors[:5], "leaked": c.leaked, "first": r[0]["peak"],
            "first_at": r[0]["peak_phase"], "steady": r[1]["peak"],
            "steady_at": r[1]["peak_phase"], "third": r[2]["peak"], "params": f["params"]}


def rank_main(rank, tp, init_file, out_dir, jobs):
    """One TP rank: for each (model file, sp, micro-batch), the single-device
    twin and the rank's shard of it; writes what it measured to out_dir."""
    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=tp)
    tw.RMSNorm.forward = lb.rmsnorm_forward  # the same forward, its x^2 tagged
    results = []
    for path, sp, B in jobs:
        with open(path) as fh:
            doc = tw.load(fh)
        T = doc.get("training", {}).get("seq_len", 16)
        torch.manual_seed(1)
        ref = tw.build(doc)
        batch = tw.batch_for(doc, ref, B, T)
        ref_loss = ref.run(Recorder(ref), batch, False)
        ref_loss.backward()
        model = TPLlama(ref, rank, tp, sp)
        rec = Recorder(model)
        for t in batch:
            rec.exclude.add(t.storage().data_ptr())
        with torch.autograd.graph.saved_tensors_hooks(rec.pack, lambda t: t):
            loss = model.run(rec, batch, False)
        per_block = rec.per_block()
        loss.backward()
        gerr, gname = _grad_errors(ref, model, rank, tp, sp)
        res = {"path": path, "sp": sp, "B": B, "blocks": per_block, "loss": loss.item(),
               "ref_loss": ref_loss.item(), "grad_err": gerr, "grad_worst": gname}
        del model, rec, loss
        res["live"] = measure_live(ref, rank, tp, sp, batch) if tp > 1 else None
        results.append(res)
    with open(os.path.join(out_dir, "rank%d.json" % rank), "w") as fh:
        json.dump(results, fh)
    dist.barrier()
    dist.destroy_process_group()


def run_world(tp, jobs):
    """Spawns tp ranks over the jobs; returns each rank's results."""
    with tempfile.TemporaryDirectory(prefix="tp_twins.") as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        mp.start_processes(rank_main, args=(tp, init_file, tmp, jobs), nprocs=tp,
                           join=True, start_method="spawn")
        out = []
        for r in range(tp):
            with open(os.path.join(tmp, "rank%d.json" % r)) as fh:
                out.append(json.load(fh))
        return out


# --------------------------------------------------------------------------
# The plan

def plan(memledger, path, B, T, tp, sp, live=False):
    args = [memledger, "plan", path, "--format", "json", "--micro-batch", str(B),
            "--seq-len", str(T), "--precision", "fp32", "--checkpoint", "none"]
    if live:  # the loop measure_live runs
        args += ["--optimizer", "adamw", "--optimizer-impl", "foreach", "--logits", "released",
                 "--allocator", "none"]
    if tp > 1:
        args += ["--tp", str(tp)] + ([] if sp else ["--no-sp"])
    return subprocess.run(args, capture_output=True, text=True), args


def compare_live(check, memledger, label, path, B, T, D, tp, sp, ranks, j):
    """Each rank's live bytes over a training step (measure_live): three
    iterations alike, nothing left; the fullest rank's (rank 0: the most
    vocabulary rows) steady and first-iteration peaks against the plan:
    within 1 %, and every byte of the difference a named item of the phase
    the peak falls in."""
    out, args = plan(memledger, path, B, T, tp, sp, live=True)
    if out.returncode not in (0, 1):
        check(label + " live plan", False, "%s exited %d" % (" ".join(args), out.returncode))
        return
    q = json.loads(out.stdout)
    for rank, res in enumerate(ranks):
        lv = res[j]["live"]
        check("%s rank%d live-bytes oracle" % (label, rank),
              not lv["errors"] and not lv["leaked"] and lv["third"] == lv["steady"],
              "errors %s, left %d B, iterations 2 and 3: %d, %d" % (
                  lv["errors"], lv["leaked"], lv["steady"], lv["third"]))
    lv = ranks[0][j]["live"]
    if sp:
        # by hand: the step's peak, the parameters P, AdamW's two states 2P,
        # the gradients P and foreach AdamW's square roots of exp_avg_sq P,
        # the rotary's inv_freq (16 B), Megatron's gather buffer (B*T*D*4),
        # the batch's ids and targets (2*B*T*8); measured besides, the
        # loop's loss (4 B) and _foreach_div_'s 0-dim double (8 B)
        P = lv["params"]
        hand = 5 * P + 16 + 4 * B * T * D + 16 * B * T
        check("%s rank0 steady peak by hand" % label,
              (lv["steady"], lv["steady_at"]) == (hand + 12, "optimizer"),
              "measured %d in %s, by hand 5 x %d + 16 + %d + %d + 12 = %d in the step" % (
                  lv["steady"], lv["steady_at"], P, 4 * B * T * D, 16 * B * T, hand + 12))
    for what, planned, meas, phase in (
            ("steady", q["peaks"]["steady"], lv["steady"], lv["steady_at"]),
            ("first-iteration", q["peaks"]["first_iteration"], lv["first"], lv["first_at"])):
        items = {
            # the loop's `loss` (0-dim fp32), alive from the loss to the
            # iteration's end; the plan does not count it
            "the loss the loop holds (4 B)": -4,
            # ones_like(loss), backward's seed, alive through the backward
            "the backward's seed (4 B)": -4 if phase == "backward" else 0,
            # _foreach_div_ wraps the bias correction in a 0-dim double
            # inside aten::div_ (host memory on a GPU)
            "_foreach_div_'s 0-dim double in AdamW's step (8 B)": -8 if phase == "optimizer" else 0,
        }
        d = planned - meas
        why = tw.explain(d, items) if d else "nothing"
        ok = abs(d) <= 0.01 * meas and why is not None
        check("%s rank0 %s peak planned" % (label, what), ok,
              "planned %d, measured %d (%+.3f%%, in %s): %+d = %s" % (
                  planned, meas, 100.0 * d / meas, phase, d, why or "not the named items"))


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    memledger, models = sys.argv[1], sys.argv[2]
    files = sorted(os.path.join(models, f) for f in os.listdir(models) if f.endswith(".yaml"))
    check = tw.Checks()

    docs = {}
    for path in files:
        with open(path) as fh:
            docs[path] = tw.load(fh)

    def compare_plan(label, path, B, T, tp, sp, measured):
        """measured: {block: the planner's figure derived from the twin}."""
        out, args = plan(memledger, path, B, T, tp, sp)
        if out.returncode != 0:
            check(label + " plan", False, "%s exited %d: %s" % (" ".join(args), out.returncode,
                                                               out.stderr.strip()))
            return
        got = {b["name"]: b["activations_saved"] for b in json.loads(out.stdout)["blocks"]}
        for blk, want in measured.items():
            check("%s %s planned" % (label, blk), got.get(blk) == want,
                  "planned %s, measured less the 1.13 artefacts %d" % (got.get(blk), want))

    def batches(doc):
        """The micro-batches each file runs at: its own, and one."""
        B = doc.get("training", {}).get("micro_batch", 2)
        return (B, 1) if B != 1 else (1,)

    def tag(B):
        return " B=1" if B == 1 else ""

    # tp 1: twins.Llama itself, measured as crosscheck.py measures it
    for path, doc, B in [(p, d, b) for p, d in docs.items() for b in batches(d)]:
        m, tr = doc["model"], doc.get("training", {})
        T = tr.get("seq_len", 16)
        label = "%s tp1%s" % (doc["name"], tag(B))
        torch.manual_seed(1)
        model = tw.build(doc)
        batch = tw.batch_for(doc, model, B, T)
        rec = Recorder(model)
        for t in batch:
            rec.exclude.add(t.storage().data_ptr())
        with torch.autograd.graph.saved_tensors_hooks(rec.pack, lambda t: t):
            model.run(rec, batch, False)
        per_block = rec.per_block()
        want, planned = hand_layer(m, B, T, 1, False)
        got = per_block.get("embedding", 0)
        check("%s embedding" % label, got == hand_embedding(m, B, T, 1),
              "measured %d, by hand %d" % (got, hand_embedding(m, B, T, 1)))
        derived = {"embedding": got}
        for blk in layer_blocks(m):
            got = per_block.get(blk, 0)
            check("%s %s" % (label, blk), got == want, "measured %d, by hand %d" % (got, want))
            derived[blk] = got - (want - planned)
        compare_plan(label, path, B, T, 1, False, derived)

    # the hand formula reproduces the docstring's table
    for path, doc in docs.items():
        m, tr = doc["model"], doc.get("training", {})
        B, T = tr.get("micro_batch", 2), tr.get("seq_len", 16)
        if (B, T, m["hidden"], m["heads"], m["ffn"]) != (2, 24, 64, 8, 160):
            continue
        KV = m.get("kv_heads", m["heads"])
        for (tp, sp), row in TABLE.items():
            if KV % tp == 0:
                mode = " sp" if sp else " no-sp" if tp > 1 else ""
                for b, want in ((B, row), (1, TABLE_B1[(tp, sp)].get(KV // tp))):
                    got = hand_layer(m, b, T, tp, sp)
                    check("%s tp%d%s%s table" % (doc["name"], tp, mode, tag(b)),
                          got == want, "formula %s, docstring %s" % (got, want))

    for tp in TP_SIZES:
        jobs = []
        for path, doc in docs.items():
            m, T = doc["model"], doc.get("training", {}).get("seq_len", 16)
            sizes = (("heads", m["heads"]), ("kv_heads", m.get("kv_heads", m["heads"])),
                     ("ffn", m["ffn"]), ("seq_len", T))
            why = [what for what, n in sizes if n % tp]
            if why:
                print("skip %s at tp %d: %s not divisible by %d"
                      % (doc["name"], tp, ", ".join(why), tp))
                continue
            jobs += [(path, sp, B) for B in batches(doc) for sp in (False, True)]
        if not jobs:
            continue
        try:
            ranks = run_world(tp, jobs)
        except Exception as e:  # a rank raised: its traceback is on stderr
            check("tp%d ranks" % tp, False, "%s: %s" % (type(e).__name__, e))
            continue
        for j, (path, sp, B) in enumerate(jobs):
            doc = docs[path]
            m, T = doc["model"], doc.get("training", {}).get("seq_len", 16)
            label = "%s tp%d %s%s" % (doc["name"], tp, "sp" if sp else "no-sp", tag(B))
            want, planned = hand_layer(m, B, T, tp, sp)
            derived = {}
            for rank, res in enumerate(ranks):
                r = res[j]
                same = (abs(r["loss"] - r["ref_loss"]) <= 1e-5 * abs(r["ref_loss"])
                        and r["grad_err"] <= 1e-4)
                check("%s rank%d matches single device" % (label, rank), same,
                      "loss %.7f vs %.7f, largest gradient gap %.1e (%s)"
                      % (r["loss"], r["ref_loss"], r["grad_err"], r["grad_worst"]))
                stray = sorted(k for k in r["blocks"] if k not in
                               ["embedding", "head", "loss"] + layer_blocks(m))
                if stray:
                    check("%s rank%d blocks" % (label, rank), False, "unattributed %s" % stray)
                got = r["blocks"].get("embedding", 0)
                check("%s rank%d embedding" % (label, rank), got == hand_embedding(m, B, T, tp),
                      "measured %d, by hand %d" % (got, hand_embedding(m, B, T, tp)))
                if rank == 0:
                    derived["embedding"] = got
                h_meas, h_plan, loss = hand_head_loss(m, B, T, tp, sp, rank)
                for blk, want_b in (("head", h_meas), ("loss", loss)):
                    got = r["blocks"].get(blk, 0)
                    check("%s rank%d %s" % (label, rank, blk), got == want_b,
                          "measured %d, by hand %d" % (got, want_b))
                if rank == 0:  # the fullest rank, the plan's
                    derived["head"] = r["blocks"].get("head", 0) - (h_meas - h_plan)
                    derived["loss"] = r["blocks"].get("loss", 0)
                for blk in layer_blocks(m):
                    got = r["blocks"].get(blk, 0)
                    check("%s rank%d %s" % (label, rank, blk), got == want,
                          "measured %d, by hand %d" % (got, want))
                    if rank == 0:
                        derived[blk] = got - (want - planned)
            compare_plan(label, path, B, T, tp, sp, derived)
            compare_live(check, memledger, label, path, B, T, m["hidden"], tp, sp, ranks, j)

    return check.done(models)


if __name__ == "__main__":
    sys.exit(main())
