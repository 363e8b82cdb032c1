#!/usr/bin/python3
"""Per-rank saved activations under tensor, sequence and expert parallelism
(expert tensor parallelism included), against real PyTorch.

The Mixtral and Qwen2-MoE twins of twins.py run as Megatron-core runs a
mixture-of-experts decoder with tensor parallelism (TP), sequence
parallelism (SP), expert parallelism (EP) and expert tensor parallelism
(ETP): one process a rank (torch.multiprocessing, spawn), gloo on the CPU.

- The attention is split as tp_twins.py splits Llama's (its
  ColumnParallelLinear q, k, v, which all-gather the rank's sequence shard
  for the product and save only the shard; the RowParallelLinear o,
  reduce-scattered to the shard; H / tp query heads, KV / tp key/value
  heads); the norms and the residual adds run on the rank's T / tp rows.
  tp_twins.py's sequence collectives are rebound here to the rank's TP
  group (a layout with dp > 1 has several). Qwen2's q, k, v biases are
  the rank's rows, added to the product (ColumnParallelLinear's bias; the
  add saves nothing).
- The MoE block runs on the rank's own T / tp tokens: no gather before the
  router (Megatron's MoELayer takes the sequence-sharded hidden states and
  refuses TP without SP in training). The router is the model's (gate,
  softmax in fp32, the top-k by twins.FIXED_ROUTING, here from each token's
  position in the whole sequence so that the shards route as the single
  device does, the renormalisation).
- The dispatch is Megatron-core's MoEAlltoAllTokenDispatcher (Megatron-LM
  d98e8a64, megatron/core/transformer/moe/token_dispatcher.py, moe_utils.py
  permute / sort_chunks_by_idxs / unpermute, tensor_parallel/mappings.py):
  each expert's count of the rank's pairs all-gathered over the EP x ETP
  group (preprocess: no grad); permute as ep_twin.py (a stable sort of the
  pairs by expert, the tokens gathered with index_select, the weights by the
  pairs' order); an all-to-all over the EP group of the tokens, then of the
  weights (an EP group of one returns its input itself, as _AllToAll does);
  with ETP > 1 gather_from_sequence_parallel_region over the ETP group, an
  all-gather along the rows of the tokens and of the weights with
  output_splits_tp (its backward a reduce-scatter; it saves nothing); the
  chunks sorted by local expert (sort_chunks_by_idxs with
  sort_input_by_local_experts, num_local_experts > 1 here); each local
  expert a SwiGLU whose w1 and w3 hold F_e / etp output features and w2 as
  many input features of the ETP rank (w2's output a partial sum), weighted
  by its rows' weights as Hugging Face's loop weights them (ep_twin.py);
  cat, the chunks sorted back (restore_output_by_local_experts); with ETP >
  1 reduce_scatter_to_sequence_parallel_region over ETP of
  hidden_states.to(probs.dtype) (fp32 here: no copy) with output_splits_tp;
  the all-to-all back over EP; unpermute's scatter_add_ (it keeps only its
  index).
- Qwen2-MoE's shared expert is Megatron-core's SharedExpertMLP (d98e8a64,
  megatron/core/transformer/moe/shared_experts.py: an MLP over the dense
  TP group, ffn_hidden_size = moe_shared_expert_intermediate_size), in
  Hugging Face's op order (twins.Mixtral: w2(silu(w1(h)) * w3(h)), then
  sigmoid(shared_expert_gate(h)) * it, added to the experts' output): w1
  (gate_proj) and w3 (up_proj) column-parallel, F_s / tp rows each, over
  the all-gathered sequence, saving the rank's shard (tp_twins.py's
  linears; Megatron fuses the two into linear_fc1, whose unfused glu,
  chunk, silu and multiply, saves the same bytes; bias_swiglu_fusion's
  kernel would keep 3 B T Fsr of the 4 below); w2 (down_proj)
  row-parallel, F_s / tp columns, its output
  reduce-scattered to the shard; the gate (D -> 1, replicated, a
  sequence-parallel parameter as gate_weight is) and its sigmoid on the
  rank's sequence-sharded input. It runs after the routed experts, as
  Hugging Face's Qwen2MoeSparseMoeBlock runs it (Megatron's MoELayer runs
  shared_experts_compute before the router: the same saved bytes, other
  transients).
- Ranks (Megatron's rank generators, pp 1, cp 1): the dense layers'
  tp-dp order, TP groups the consecutive tp ranks, dp groups strided by tp;
  the experts' tp-ep-dp order with expert-tp = etp over the tp * dp ranks:
  ETP groups consecutive ranks of etp, EP groups strided by etp, the
  EP x ETP group the consecutive block of ep * etp, expert-data-parallel
  groups strided by ep * etp. Each dp rank has its own batch; the TP ranks
  of one dp rank the same batch, each its sequence shard. The embedding and
  the LM head are replicated (tp_twins.py's scatter after the embedding,
  gather before the final norm): only the layer blocks are compared.

Layouts run (world = tp * dp processes; Mixtral's twin: E 4, top-2;
Qwen2-MoE's: E 6, top-3, no renormalisation, a shared expert F_s 96 wide):
  (a) tp 2, dp 1, ep 2, etp 1: the EP group is the TP pair, each with its
      sequence half;
  (b) tp 2, dp 1, ep 1, etp 2: every rank all the experts, F_e / 2
      features each; the all-gather brings the other rank's rows;
  (c) tp 2, dp 2, ep 2, etp 2: four processes; rank r = t + 2 e, ETP
      groups {0, 1}, {2, 3}, EP groups {0, 2}, {1, 3}, dense TP groups
      {0, 1}, {2, 3} and dp groups {0, 2}, {1, 3}.

Checks, each rank:
1. its loss equals the single-device model's on its dp rank's batch, and
   the gradients of what it holds equal the single device's slices: q, k,
   v's rows (weights and biases) and o's columns of its TP rank, the
   shared expert's w1 and w3 rows and w2 columns likewise; the norms',
   the router's and the shared expert's gate's (partial per sequence
   shard: all-reduced over the TP group first, as finalize_model_grads
   does for sequence-parallel parameters); a local expert's w1 and w3
   rows and w2 columns of its ETP rank, the single-device gradients
   summed over the dp batches (every token of the EP x ETP group reaches
   its experts; expert-data-parallel size 1 here).
   Tolerances as ep_twin.py's: 1e-5 of the loss, 1e-4 of the largest
   gradient.
2. what autograd saves per layer block (crosscheck.py's Recorder:
   saved_tensors_hooks, each storage once, parameters and the batch
   excluded) equals the hand derivation below.
3. the forward's and the backward's live-bytes peaks, measured as
   livebytes.py measures them (the profiler's memory events on the CPU
   allocator, paired by pointer, 1.13's CPU artefacts taken out: the
   RMSNorms' x^2 from the moment the mean has run, 0-dim Python scalars),
   printed with the block and op where each falls and the layer blocks'
   highest point; the check is the curve's own consistency (every free
   paired with an allocation in the window, nothing left unfreed). The
   collectives hand gloo buffers kept for the process's life (made in the
   first iteration), copying in and out on the rank's thread: gloo's
   worker thread would otherwise free the last reference to a
   collective's tensors where the profiler does not see it. So the curve
   has what Megatron's collectives allocate (each output), not gloo's
   staging nor the emulated reduce-scatter's copy.
   Each layer block's windows beside the plan, INFO lines, not checks:
   fusednorm.py's measure of a block (the highest live bytes above the
   level at the block's start, here also the level at its end above it:
   "rise" and "net"), for every layer's forward (its lb.Blocks range) and
   backward (from its output's gradient, twins.bwd_mark, to its input's:
   a mark on block.0's input ends block.0's), against the plan's
   timeline (`memledger timeline` with the plan's options: the rows of
   the block's step, above the total before them). No twin checks a
   layer's transients against a block-rule plan: fusednorm.py's equality
   holds for blocks the plan replays node by node, and under TP, EP or
   ETP the plan keeps the block rule (docs/parallel.md; docs/ledger.md,
   "Transients"): the forward's workspace (the dispatch's buffers) and
   all the block's saved bytes at once, the backward's workspace (ws_bwd
   with the dispatch's gradients) and all its gradients at once with
   every saved tensor still alive: an estimate, above the measured rise
   in every layout here (livebytes.py reports such rows, it does not
   assert them). The nets are exact (forward: the saved bytes;
   backward: the gradients less the saved bytes); block.0's differ by
   what the plan places elsewhere (the mask and position ids, 2,496 B,
   opened in block.0's forward rows where the twin makes them in the
   embedding's; the rotary tables, 3,072 B, released in the embedding's
   backward rows where the twin frees them in block.0's).
4. the bytes each rank sends in one iteration, counted inside the
   collectives (rows to the other ranks of the group; a reduce-scatter
   counts the other ranks' rows of its input, as a direct reduce-scatter
   sends them; gloo 1.13 has no reduce_scatter, so it is emulated by an
   all-reduce, whose own traffic is not what is counted): the EP
   all-to-alls, the counts' all-gather, the ETP all-gathers and
   reduce-scatters, the TP sequence collectives; each against the hand
   count below.
5. the plan, when it accepts the layout: `memledger plan MODEL --format
   json --tp 2 --dp D --ep E --etp X` (fp32, B and T the file's, no
   checkpointing); each layer block's activations_saved against the
   measured bytes less crosscheck.known_1_13's extras on the rank's T / tp
   rows, and its params against the rank's parameters in that block. A
   refusal (exit status 2) prints "SKIP plan: <message>" and counts as
   nothing.

Hand derivation, one layer block on one rank (fp32, 4 B an element; B
micro-batch, T sequence, D hidden, dh head size, H / KV query / key-value
heads, E experts, top-k, F_e an expert's width; Tn = T / tp the rank's
rows of the stream, N = B Tn its tokens, P = k N its (token, expert) pairs,
Hr = H / tp; R the rows its experts take: the pairs of its EP x ETP group
for its E / ep experts, with the balanced routing
R = ep etp (E / ep) (P / E) = etp P; Fr = F_e / etp):

  norms, two, on Tn rows (tp_twins.py): input, x^2 (1.13), x * rsqrt and
    output B Tn D each, rsqrt B Tn                     2 (4 B Tn D + B Tn)
  attention on all T rows, Hr heads (tp_twins.py): q after the rotary,
    repeat_kv's copies of k and v, o's input B T Hr dh each, the softmax
    B Hr T^2; the scale, a 0-dim double (1.13)    4 B T Hr dh + B Hr T^2, + 8 B
  (the two together: tp_twins.hand_layer less its dense MLP, 4 B T F / tp)
  router on the N tokens (docs/inventory.md, Mixtral): softmax's fp32
    output N E; gather's int64 index N k (8 B); the renormalisation's
    in-place divide keeps the sum N and a copy of the values it
    overwrites N k                                     N E + N + N k, + N k 8 B
  dispatch: the pairs' order and their tokens (int64; the tokens index
    also scatter_add_'s)                               2 P, 8 B each
    the rows sorted by local expert (w1's and w3's input, read through
    views)                                             R D
    the sorted weights                                 R
    each expert's w1, silu, w3 outputs and their product  4 R Fr
    w2's output (the weighting's other operand)        R D
    the all-to-alls, the ETP gathers and reduce-scatters, the cat, the
    sort back: nothing
  Qwen2-MoE's shared expert (F_s its width, Fsr = F_s / tp; Qwen2-MoE
  does not renormalise: its router keeps N E 4 B and N k 8 B only):
    w1's and w3's input, the rank's shard: ln2's output, counted above
    (the router and the gate save the same storage)
    w1's output (silu's input), silu's output, w3's output, their
    product (w2's input), on all T rows: tp_twins.py's dense MLP at
    ffn F_s                                            4 B T Fsr
    the gate's sigmoid output (the multiply's operand; the gate's input
    is ln2's output again)                             N
    w2's reduce-scattered output, the shard (the multiply's other
    operand)                                           N D
    the gathers, the reduce-scatter's whole buffer, the gated product,
    the sum with the experts' output: nothing

  bytes = 4 (2 (4 B Tn D + B Tn) + 4 B T Hr dh + B Hr T^2 + N E + N + N k
             + R D + R + 4 R Fr + R D) + 8 (N k + 2 P) + 8
          (Qwen2-MoE: less 4 (N + N k), plus 4 (4 B T Fsr + N + N D))

Mixtral's twin (B 2, T 24, D 64, H 8, KV 2, dh 8, E 4, k 2, F_e 96), tp 2:
Tn 12, N 24, P 48, Hr 4:
  norms 2 (6,144 + 24) 4 = 49,344; attention (6,144 + 4,608) 4 + 8 = 43,016;
  router 4 (96 + 24 + 48) + 8 (48) = 1,056
  (a) ep 2 etp 1: R 48, Fr 96: dispatch 8 (96) + 4 (3,072 + 48 + 18,432
      + 3,072) = 768 + 98,496 = 99,264; the layer 192,680 B
  (b) ep 1 etp 2 and (c) ep 2 etp 2: R 96, Fr 48: dispatch 768 + 4 (6,144 +
      96 + 18,432 + 6,144) = 768 + 123,264 = 124,032; the layer 217,448 B
1.13's extras (known_1_13 on Tn rows: the two x^2, 2 B Tn D 4 = 12,288,
and the scale's 8 B) 12,296: the planner's figure would be 180,384 (a) and
205,152 (b, c). (At tp 1, ep 2 the same terms, less the extras, give
ep_twin.py's 360,768 B.)

Qwen2-MoE's twin (B 2, T 24, D 64, H 8, KV 4, dh 8, E 6, k 3, F_e 48,
F_s 96, q, k, v biases), tp 2: Tn 12, N 24, P 72, Hr 4, Fsr 48:
  norms 49,344 and attention 43,016 as Mixtral's (KV does not enter: the
  repeat_kv copies have Hr heads; the biases' adds save nothing);
  router 4 (144) + 8 (72) = 1,152; the pairs' order and tokens 8 (144) =
  1,152; shared expert 4 (4 x 2 x 24 x 48 + 24 + 24 x 64) = 4 (9,216 +
  24 + 1,536) = 43,104 (36,864 of it tp_twins.hand_layer's MLP at ffn 96)
  (a) ep 2 etp 1: R 72, Fr 48: 4 (4,608 + 72 + 13,824 + 4,608) = 92,448;
      the layer 49,344 + 43,016 + 1,152 + 1,152 + 92,448 + 43,104 =
      230,216 B, planned 217,920
  (b), (c) etp 2: R 144, Fr 24: 4 (9,216 + 144 + 13,824 + 9,216) =
      129,600; the layer 267,368 B, planned 255,072

Each file runs again at a batch of one (B 1: Tn 12, N 12). There the
attention's k and v are one head each where a rank has one key/value head
(KV / tp = 1: repeat_kv's expand reshapes to Hr heads as a zero-stride
view, matmul's fold to (Hr, T, dh) is a view, so bmm keeps the one head,
T dh each; docs/inventory.md, "A batch of one"): Mixtral's attention
4 (1,536 + 384 + 2,304) + 8 = 16,904 in place of its copies; Qwen2-MoE's
two a rank still copy, 21,512. 1.13's extras 2 (12 x 64) 4 + 8 = 6,152.
  Mixtral, P 24: norms 24,672, router 4 (48 + 12 + 24) + 8 (24) = 528,
      order and tokens 384; (a) R 24: 4 (1,536 + 24 + 9,216 + 1,536) =
      49,248, the layer 91,736 B, planned 85,584; (b), (c) R 48, Fr 48:
      4 (3,072 + 48 + 9,216 + 3,072) = 61,632, the layer 104,120 B,
      planned 97,968
  Qwen2-MoE, P 36: router 4 (72) + 8 (36) = 576, order and tokens 576,
      shared expert 4 (4 x 24 x 48 + 12 + 12 x 64) = 21,552; (a) R 36:
      4 (2,304 + 36 + 6,912 + 2,304) = 46,224, the layer 115,112 B, planned
      108,960; (b), (c) R 72, Fr 24: 4 (4,608 + 72 + 6,912 + 4,608) =
      64,800, the layer 133,688 B, planned 127,536

Bytes sent, one iteration, one rank (L layers; balanced routing, so a
rank's all-to-all rows to the others are (ep - 1) / ep of its P, and each
ETP rank's rows are R / etp = P):
  EP all-to-alls: forward the P pairs' tokens (D 4 B) and weights (4 B),
    the rows back (D 4 B); backward the same three
                               L P (ep - 1) / ep (4 D 4 + 2 4)
  the counts' all-gather (E int64 to each other rank of the EP x ETP
    group; forward only)       L E 8 (ep etp - 1)
  ETP: the gather of the tokens and weights, the reduce-scatter of the
    outputs, and their backwards (a reduce-scatter, an all-gather)
                               L P (etp - 1) (4 D 4 + 2 4)
  TP sequence collectives, a unit being B Tn D 4 (tp - 1): q, k, v each
    gather forward, gather again and reduce-scatter the input's gradient
    backward (9), o reduce-scatters forward and gathers backward (2); the
    embedding's scatter gathers its gradient, the head's gather (2 in
    all)                       (11 L + 2) units
    Qwen2-MoE's shared expert: w1 and w3 as q (6), w2 as o (2)
                               (19 L + 2) units
    (the twin's q, k and v are three linears, each gathering: Megatron's
    fused linear_qkv gathers once, 3 units a layer where this counts 9)
Mixtral, L 2: (a) EP 49,536, counts 64, ETP 0, TP 147,456; (b) EP 0,
counts 64, ETP 99,072, TP 147,456; (c) EP 49,536, counts 192, ETP 99,072,
TP 147,456. Qwen2-MoE, L 2: (a) EP 74,304, counts 96, ETP 0, TP 245,760;
(b) EP 0, counts 96, ETP 148,608, TP 245,760; (c) EP 74,304, counts 288,
ETP 148,608, TP 245,760.

Not modelled (Megatron-core differs; the twin keeps ep_twin.py's choices):
Megatron's experts weight the activation by the probs before linear_fc2
(MLP.forward's per_token_scale), where the twin weights w2's output as
Hugging Face does; Megatron's router returns dense [N, E] probs and a
routing map, which the dispatcher keeps as attributes (self.probs,
self.routing_map, with the permutation's indices) until the layer's next
forward, outside autograd; its permute argsorts the E N map. The twin's
router is Hugging Face's.

usage: tpep_twin.py MEMLEDGER MODELS_DIR
Prints one line per check (and the INFO lines of check 3) and ends with
"N passed, N failed".
"""
import bisect
import gc
import json
import os
import subprocess
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import livebytes as lb  # noqa: E402  (the live-bytes curve and its device view)
import tp_twins as tpt  # noqa: E402  (Megatron's TP linears, the sequence collectives)
import twins as tw  # noqa: E402  (the reference implementations)
from crosscheck import Recorder, known_1_13  # noqa: E402  (the measurement)

# (tp, dp, ep, etp)
LAYOUTS = ((2, 1, 2, 1), (2, 1, 1, 2), (2, 2, 2, 2))
COMM = {}  # bytes this rank sent to other ranks, by kind
KINDS = ("ep", "counts", "etp", "tp")


def layout_name(lay):
    return "tp%d.dp%d.ep%d.etp%d" % lay


# --------------------------------------------------------------------------
# Groups

class Group:
    """A process group with this rank's place in it."""

    def __init__(self, pg, ranks, rank):
        self.pg, self.ranks = pg, ranks
        self.size, self.rank = len(ranks), ranks.index(rank)


def make_groups(lay, rank):
    """Megatron's groups for rank (every rank creates every group, in the
    same order, as new_group asks)."""
    tp, dp, ep, etp = lay
    edp = tp * dp // (ep * etp)

    def one(lists):
        mine = None
        for ranks in lists:
            pg = dist.new_group(ranks)
            if rank in ranks:
                mine = Group(pg, ranks, rank)
        return mine

    def x(t, e, d):  # the experts' rank order, tp-ep-dp
        return t + etp * (e + ep * d)
    return {
        "tp": one([[d * tp + t for t in range(tp)] for d in range(dp)]),
        "dp": one([[d * tp + t for d in range(dp)] for t in range(tp)]),
        "etp": one([[x(t, e, d) for t in range(etp)] for d in range(edp) for e in range(ep)]),
        "ep": one([[x(t, e, d) for e in range(ep)] for d in range(edp) for t in range(etp)]),
        "tpep": one([sorted(x(t, e, d) for e in range(ep) for t in range(etp))
                     for d in range(edp)]),
    }


# --------------------------------------------------------------------------
# Collectives, counted (bytes to the other ranks of the group)

def _row_bytes(x):
    return (x[0].numel() if x.dim() > 1 else 1) * x.element_size()


STAGE = {}


def staged(role, like, shape=None):
    """The buffer a collective hands to gloo, kept for the process's life.
    Gloo's worker thread drops its references to a collective's tensors
    after the caller has woken, so a tensor whose last reference went
    there would be freed where the profiler does not see it (livebytes.py
    pairs every free with its allocation). The copies in and out are the
    caller's, on its thread; the buffers are made in the first iteration,
    before the profiled one, and outlive it: out of its curve, which keeps
    what Megatron's collectives allocate themselves (each output)."""
    shape = tuple(like.shape) if shape is None else tuple(shape)
    key = (role, shape, like.dtype)
    if key not in STAGE:
        STAGE[key] = torch.empty(shape, dtype=like.dtype)
    return STAGE[key]


def gather_rows(x, sizes, g, kind):
    """mappings.py _gather_along_first_dim with output_split_sizes: the
    group's rows in rank order (1.13's gloo: all_gather into equal
    tensors, each padded to the longest, then cat: the output)."""
    n, tail = max(sizes), tuple(x.shape[1:])
    src = staged("ag-in", x, (n,) + tail)
    src[:x.shape[0]].copy_(x)
    parts = staged("ag-out", x, (g.size, n) + tail)
    dist.all_gather(list(parts.unbind(0)), src, group=g.pg)
    COMM[kind] += x.shape[0] * _row_bytes(x) * (g.size - 1)
    return torch.cat([parts[i, :s] for i, s in enumerate(sizes)])


def reduce_scatter_rows(x, sizes, g, kind):
    """mappings.py _reduce_scatter_along_first_dim with input_split_sizes:
    the group's sum of x, this rank's rows (1.13's gloo has no
    reduce_scatter: an all-reduce of a staged copy, this rank's rows
    cloned: the output)."""
    buf = staged("rs", x)
    buf.copy_(x)
    dist.all_reduce(buf, group=g.pg)
    off = sum(sizes[:g.rank])
    COMM[kind] += _row_bytes(x) * (sum(sizes) - sizes[g.rank])
    return buf[off:off + sizes[g.rank]].clone()


class AllToAll(torch.autograd.Function):
    """mappings.py _AllToAll: rows sent by in_splits, received by
    out_splits; the gradient sent back the other way; nothing saved; a
    group of one returns its input itself."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, g):
        ctx.args = (out_splits, in_splits, g)
        if g.size == 1:
            return x
        return _a2a(x, out_splits, in_splits, g)

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits, g = ctx.args
        if g.size == 1:
            return grad, None, None, None
        return _a2a(grad, in_splits, out_splits, g), None, None, None


def _a2a(x, out_splits, in_splits, g):
    src = staged("a2a-in", x)
    src.copy_(x)
    dst = staged("a2a-out", x, (sum(out_splits),) + tuple(x.shape[1:]))
    dist.all_to_all_single(dst, src, out_splits, in_splits, group=g.pg)
    COMM["ep"] += _row_bytes(x) * sum(n for j, n in enumerate(in_splits) if j != g.rank)
    return dst.clone()


class GatherFromSequenceParallelRegion(torch.autograd.Function):
    """mappings.py _GatherFromSequenceParallelRegion over the ETP group
    with output_split_sizes (tensor_parallel_output_grad: the backward
    reduce-scatters); nothing saved."""

    @staticmethod
    def forward(ctx, x, sizes, g):
        ctx.args = (sizes, g)
        return gather_rows(x, sizes, g, "etp")

    @staticmethod
    def backward(ctx, grad):
        sizes, g = ctx.args
        return reduce_scatter_rows(grad, sizes, g, "etp"), None, None


class ReduceScatterToSequenceParallelRegion(torch.autograd.Function):
    """mappings.py _ReduceScatterToSequenceParallelRegion over the ETP
    group with input_split_sizes; its backward all-gathers."""

    @staticmethod
    def forward(ctx, x, sizes, g):
        ctx.args = (sizes, g)
        return reduce_scatter_rows(x, sizes, g, "etp")

    @staticmethod
    def backward(ctx, grad):
        sizes, g = ctx.args
        return gather_rows(grad, sizes, g, "etp"), None, None


def bind_tp_collectives(g):
    """tp_twins.py's sequence collectives (its autograd Functions call them
    by name) over the TP group g, counted: along dim 1 of (B, T, D)."""

    def gather_seq(x):
        src = staged("tp-ag-in", x)
        src.copy_(x)
        parts = list(staged("tp-ag-out", x, (g.size,) + tuple(x.shape)).unbind(0))
        dist.all_gather(parts, src, group=g.pg)
        COMM["tp"] += x.numel() * x.element_size() * (g.size - 1)
        return torch.cat(parts, dim=1)

    def split_seq(x):
        n = x.shape[1] // g.size
        return x[:, g.rank * n:(g.rank + 1) * n].clone(memory_format=torch.contiguous_format)

    def reduce_scatter_seq(x):
        buf = staged("tp-rs", x)
        buf.copy_(x)
        dist.all_reduce(buf, group=g.pg)
        COMM["tp"] += x.numel() * x.element_size() * (g.size - 1) // g.size
        return split_seq(buf)

    tpt._gather_seq, tpt._split_seq, tpt._reduce_scatter_seq = (gather_seq, split_seq,
                                                                reduce_scatter_seq)


# --------------------------------------------------------------------------
# The rank's model

def shard_routing(B, Tn, tp, r, k, E):
    """The fixed routing of the rank's tokens, from their places in the
    whole sequence (the single device's routing of the same tokens)."""
    full = tw.fixed_routing(B * Tn * tp, k, E).view(B, Tn * tp, k)
    # a tensor of its own, as the router's topk makes one: at a batch of one
    # the slice is already contiguous, and contiguous() would hand back a
    # view of the whole sequence's routing, whose storage the gather saves
    return full[:, r * Tn:(r + 1) * Tn].reshape(-1, k).clone()


def tpep_mlp(s, b, h):
    """MoELayer.forward on the rank's sequence shard: the model's router,
    then MoEAlltoAllTokenDispatcher around the rank's experts; Qwen2-MoE's
    shared expert after them, in Hugging Face's order (Qwen2MoeSparseMoeBlock;
    Megatron's MoELayer runs it before the router, which moves no saved
    byte): its w1 (gate_proj) and w3 (up_proj) column-parallel over the
    gathered sequence, w2 (down_proj) row-parallel and reduce-scattered to
    the shard, the gate on the shard."""
    G, (tp, _, ep, etp) = s.groups, s.lay
    B, Tn, D = h.shape
    h3, h = h, h.view(-1, D)
    N, E, k = h.shape[0], s.E, s.k
    El = E // ep
    w = F.softmax(b.router(h), dim=1, dtype=torch.float)
    chosen = shard_routing(B, Tn, tp, G["tp"].rank, k, E)
    w = w.gather(1, chosen)
    if s.renorm:
        w /= w.sum(dim=-1, keepdim=True)
    w = w.to(h.dtype)
    with torch.no_grad():  # preprocess: the dispatch's bookkeeping
        flat = chosen.reshape(-1)
        order = torch.sort(flat, stable=True)[1]
        tok = order // k
        counts = torch.bincount(flat, minlength=E)
        g = G["tpep"]
        if g.size > 1:  # gather_from_sequence_parallel_region(..., tp_ep_group)
            glob = gather_rows(counts, [E] * g.size, g, "counts")
        else:
            glob = counts
        # [ep, etp, E] -> [etp, ep, E]; the columns of the rank's experts
        glob = glob.reshape(ep, etp, E).transpose(0, 1)
        first = G["ep"].rank * El
        local = glob[:, :, first:first + El].contiguous()  # [etp, ep, El]
        per_rank = local.sum(2)
        in_splits = counts.view(ep, El).sum(1).tolist()
        out_splits = per_rank[G["etp"].rank].tolist()
        out_splits_tp = per_rank.sum(1).tolist()
        per_expert = local.sum((0, 1)).tolist()
        chunks = local.view(-1, El)  # [etp * ep, El]: (source, local expert)
        idx = torch.arange(E * etp)
        sort_input = idx.reshape(-1, El).T.ravel().tolist()
        restore_output = idx.reshape(El, -1).T.ravel().tolist()
    # permute
    xp = h.index_select(0, tok)
    wp = w.reshape(-1)[order]
    # token_dispatch
    xr = AllToAll.apply(xp, out_splits, in_splits, G["ep"])
    wr = AllToAll.apply(wp, out_splits, in_splits, G["ep"])
    # dispatch_postprocess
    xg, wg = xr, wr
    if etp > 1:
        xg = GatherFromSequenceParallelRegion.apply(xr, out_splits_tp, G["etp"])
        wg = GatherFromSequenceParallelRegion.apply(wr, out_splits_tp, G["etp"])
    if El > 1:  # sort_chunks_by_idxs
        sizes = chunks.ravel().tolist()
        xc, wc = torch.split(xg, sizes), torch.split(wg, sizes)
        xs = torch.cat([xc[i] for i in sort_input])
        ws = torch.cat([wc[i] for i in sort_input])
        del xc, wc
    else:
        xs, ws = xg, wg
    del xg, wg, wr
    # the experts (SequentialMLP's loop; Hugging Face's weighting)
    outs, start = [], 0
    for e in range(El):
        n = per_expert[e]
        ex, x = b.experts[e], xs[start:start + n]
        outs.append(ex.w2(F.silu(ex.w1(x)) * ex.w3(x)) * ws[start:start + n, None])
        start += n
    y = torch.cat(outs)
    del outs, x, xs, ws
    # combine_preprocess
    if El > 1:
        yc = torch.split(y, chunks.T.ravel().tolist())
        y = torch.cat([yc[i] for i in restore_output])
        del yc
    if etp > 1:
        y = ReduceScatterToSequenceParallelRegion.apply(y.to(w.dtype), out_splits_tp, G["etp"])
    # token_combine, combine_postprocess (unpermute)
    yb = AllToAll.apply(y, in_splits, out_splits, G["ep"])
    del y
    out = torch.zeros((N, D), dtype=h.dtype).scatter_add_(0, tok[:, None].expand(-1, D), yb)
    # MoELayer's custom_forward holds the permuted tokens and the all-to-all's
    # output until it returns
    del xp, xr, yb
    if hasattr(b, "shared"):  # Qwen2-MoE: SharedExpertMLP over the TP group
        sh = b.shared.w2(F.silu(b.shared.w1(h3)) * b.shared.w3(h3))  # (B, Tn, D)
        sh = torch.sigmoid(b.shared_gate(h)) * sh.view(-1, D)
        out = out + sh
    return out.reshape(B, Tn, D)


class ColumnParallelLinearBias(tpt.ColumnParallelLinear):
    """layers.py ColumnParallelLinear with its bias (Qwen2's q, k, v): the
    rank's rows of the bias added to the product (the add saves nothing)."""

    def __init__(s, weight, bias, sp):
        super().__init__(weight, sp)
        s.bias = nn.Parameter(bias.detach().clone())

    def forward(s, x):
        return super().forward(x) + s.bias


class TPEPMixtral(tpt.TPLlama):
    """The rank's part of ref (a twins.Mixtral, Mixtral's or Qwen2-MoE's
    layer): tp_twins.TPLlama's attention and its run (the scatter after the
    embedding, the gather before the head), the router replicated, the
    rank's E / ep experts with F_e / etp features of its ETP rank, the
    dispatch in place of the experts' loop; Qwen2-MoE's shared expert
    split over the TP group as a dense MLP (SharedExpertMLP: w1 and w3 the
    rank's F_s / tp rows, w2 as many columns), its gate replicated (a
    sequence-parallel parameter, as gate_weight is)."""

    def __init__(s, ref, lay, groups):
        nn.Module.__init__(s)
        tp, dp, ep, etp = lay
        s.lay, s.groups = lay, groups
        s.D, s.dh, s.scaling, s.softcap, s.flash = ref.D, ref.dh, ref.scaling, 0.0, False
        s.H, s.KV, s.sp, s.classes = ref.H // tp, ref.KV // tp, True, 0
        s.E, s.k, s.renorm = ref.E, ref.k, ref.renorm
        r, t, El = groups["tp"].rank, groups["etp"].rank, ref.E // ep
        first = groups["ep"].rank * El
        s.embed = tpt._copy(ref.embed)
        dq, dkv = s.H * s.dh, s.KV * s.dh

        def rows(lin, n):
            if lin.bias is not None:
                return ColumnParallelLinearBias(lin.weight[r * n:(r + 1) * n],
                                                lin.bias[r * n:(r + 1) * n], True)
            return tpt.ColumnParallelLinear(lin.weight[r * n:(r + 1) * n], True)

        def cols(lin, n):
            return tpt.RowParallelLinear(lin.weight[:, r * n:(r + 1) * n], True)

        def linear(wt):
            lin = nn.Linear(wt.shape[1], wt.shape[0], bias=False)
            lin.weight = nn.Parameter(wt.detach().clone())
            return lin

        s.blocks = nn.ModuleList()
        for rb in ref.blocks:
            b = nn.Module()
            b.q, b.k, b.v, b.o = rows(rb.q, dq), rows(rb.k, dkv), rows(rb.v, dkv), cols(rb.o, dq)
            b.router = tpt._copy(rb.router)
            b.experts = nn.ModuleList()
            for re in list(rb.experts)[first:first + El]:
                Fr = re.w1.weight.shape[0] // etp
                e = nn.Module()
                e.w1 = linear(re.w1.weight[t * Fr:(t + 1) * Fr])
                e.w2 = linear(re.w2.weight[:, t * Fr:(t + 1) * Fr])
                e.w3 = linear(re.w3.weight[t * Fr:(t + 1) * Fr])
                b.experts.append(e)
            if hasattr(rb, "shared"):
                Fs = rb.shared.w1.weight.shape[0] // tp
                b.shared = nn.Module()
                b.shared.w1, b.shared.w3 = rows(rb.shared.w1, Fs), rows(rb.shared.w3, Fs)
                b.shared.w2 = cols(rb.shared.w2, Fs)
                b.shared_gate = tpt._copy(rb.shared_gate)
            b.ln1, b.ln2 = tpt._copy(rb.ln1), tpt._copy(rb.ln2)
            s.blocks.append(b)
        s.norm = tpt._copy(ref.norm)
        s.lm_head = tpt._copy(ref.lm_head)
        s.register_buffer("inv_freq", ref.inv_freq.clone())

    def mlp(s, b, h):
        return tpep_mlp(s, b, h)

    def block(s, b, x, *rest):
        """twins.Llama.block; before the first, a backward mark on its input
        (the scatter's output): its gradient ends block.0's backward, as
        twins.Llama.run's mark on the embedding's output does (TPLlama.run
        has none)."""
        if b is s.blocks[0]:
            tw.bwd_mark("embedding", x)
        return super().block(b, x, *rest)


def grad_errors(ref, model, lay, groups):
    """The largest relative gap between the rank's gradients and its slices
    of the single-device ones (see the docstring, check 1)."""
    tp, dp, ep, etp = lay
    r, t = groups["tp"].rank, groups["etp"].rank
    first = groups["ep"].rank * (ref.E // ep)
    rp = dict(ref.named_parameters())
    summed = {}  # every expert's, over the dp batches, in the same order on every rank
    for n, p in ref.named_parameters():
        if ".experts." in n:
            summed[n] = p.grad.clone()
            if groups["dp"].size > 1:
                dist.all_reduce(summed[n], group=groups["dp"].pg)
    worst, name = 0.0, ""
    for n, p in model.named_parameters():
        g = p.grad.clone()
        parts = n.split(".")
        leaf = parts[-2]
        if leaf in ("ln1", "ln2", "router", "shared_gate") and groups["tp"].size > 1:
            dist.all_reduce(g, group=groups["tp"].pg)  # sequence-parallel parameters
        if "experts" in parts:  # blocks.i.experts.e.wX.weight
            i = parts.index("experts")
            parts[i + 1] = str(first + int(parts[i + 1]))
            want = summed[".".join(parts)]
            if leaf == "w2":
                c = g.shape[1]
                want = want[:, t * c:(t + 1) * c]
            else:
                c = g.shape[0]
                want = want[t * c:(t + 1) * c]
        else:
            want = rp[n].grad
            if leaf == "o" or (leaf == "w2" and "shared" in parts):
                c = g.shape[1]
                want = want[:, r * c:(r + 1) * c]
            elif leaf in ("q", "k", "v") or "shared" in parts:  # weights' rows, biases
                c = g.shape[0]
                want = want[r * c:(r + 1) * c]
        err = ((g - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()
        if err >= worst:
            worst, name = err, n
    return worst, name


# --------------------------------------------------------------------------
# The live bytes (livebytes.py's curve and device view)

def live_run(ref, lay, groups, batch):
    """One forward and backward of a fresh copy of the rank's model under
    the profiler; the peaks of each phase in the device view."""
    tw.FIXED_ROUTING[0] = True
    saved_norm = tw.RMSNorm.forward
    tw.RMSNorm.forward = lb.rmsnorm_forward  # tags 1.13's x^2

    def bwd_mark(name):
        with lb.Mark("bwd:" + name):
            pass
    tw.BWD_MARK[0] = bwd_mark
    gc.collect()
    try:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            with lb.Mark("setup"):
                model = TPEPMixtral(ref, lay, groups)
                data = tuple(x.clone() for x in batch)
                blocks = lb.Blocks()
            with lb.Mark("fwd"):
                loss = model.run(blocks, data, False)
                blocks.close()
            with lb.Mark("bwd"):
                loss.backward()
            with lb.Mark("teardown"):
                del model, data, loss, blocks
                gc.collect()
    finally:
        tw.RMSNorm.forward = saved_norm
        tw.BWD_MARK[0] = None
    c = lb.Curve(prof)
    view, kind = c.device_view()
    raw = [e["d"] for e in c.ev]
    out = {"errors": c.errors[:3], "leaked": c.leaked}
    for phase in ("fwd", "bwd"):
        s0, e0 = c.range(phase)
        k0, k1 = bisect.bisect_left(c.times, s0), bisect.bisect_left(c.times, e0)
        marks = sorted((s, n[4:]) for s, _, n in c.marks if s0 <= s <= e0
                       and n.startswith("bwd:"))
        mtimes = [m[0] for m in marks]

        def block_of(kk):
            """The block running at event kk: the forward's open range, the
            backward's last block whose output gradient has arrived."""
            if phase == "fwd":
                blk = [a[7:] for a in c.ev[kk]["anc"] if a.startswith("ml:blk:")]
                return blk[-1] if blk else ""
            i = bisect.bisect_right(mtimes, c.times[kk]) - 1
            return marks[i][1] if i >= 0 else "loss"
        for label, d in (("device", view), ("raw", raw)):
            live = sum(d[:k0])
            start, best, at, per = live, live, None, {}
            for kk in range(k0, k1):
                live += d[kk]
                if d[kk]:
                    blk = block_of(kk)
                    per[blk] = max(per.get(blk, 0), live)
                    if live > best:
                        best, at = live, kk
            rec = {"start": start, "peak": best, "block": "", "op": "", "blocks": per}
            if at is not None:
                ops = [a for a in c.ev[at]["anc"] if a.startswith("aten::") and a not in lb.EMPTY]
                rec["op"], rec["block"] = ops[-1] if ops else "", block_of(at)
            out["%s_%s" % (phase, label)] = rec
    out["windows"] = block_windows(c, view)
    return out


def block_windows(c, view):
    """Each layer block's forward and backward window in the device view
    (fusednorm.py's measure of the head's backward, for every layer): from
    the block's mark to the phase's next mark (forward: the block's range,
    lb.Blocks; backward: its output's gradient arriving, twins.bwd_mark,
    to its input's, the next block's mark); the level just before it, the
    highest live bytes in it above that level (rise) and the level at its
    end above it (net)."""
    out = {}
    for phase, prefix in (("fwd", "blk:"), ("bwd", "bwd:")):
        s0, e0 = c.range(phase)
        marks = sorted((s, n[len(prefix):]) for s, _, n in c.marks
                       if s0 <= s <= e0 and n.startswith(prefix))
        ends = [m[0] for m in marks[1:]] + [e0]
        for (t0, name), t1 in zip(marks, ends):
            if not name.startswith("block."):
                continue
            k0, k1 = bisect.bisect_left(c.times, t0), bisect.bisect_left(c.times, t1)
            level = sum(view[:k0])
            live = peak = level
            at = None
            for k in range(k0, k1):
                live += view[k]
                if live > peak:
                    peak, at = live, k
            op = ""
            if at is not None:
                ops = [a for a in c.ev[at]["anc"] if a.startswith("aten::") and a not in lb.EMPTY]
                op = ops[-1] if ops else ""
            out["%s %s" % (phase, name)] = {"level": level, "rise": peak - level,
                                            "net": live - level, "op": op}
    return out


# --------------------------------------------------------------------------
# One rank

def rank_main(rank, lay, init_file, out_dir, jobs):
    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    tp, dp, ep, etp = lay
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank,
                            world_size=tp * dp)
    groups = make_groups(lay, rank)
    bind_tp_collectives(groups["tp"])
    tw.FIXED_ROUTING[0] = True
    dp_rank = rank // tp
    results = []
    for path, B in jobs:
        with open(path) as fh:
            doc = tw.load(fh)
        T = doc.get("training", {}).get("seq_len", 16)
        torch.manual_seed(1)
        ref = tw.build(doc)
        torch.manual_seed(100 + dp_rank)  # each dp rank its own batch
        batch = tw.batch_for(doc, ref, B, T)
        ref_loss = ref.run(Recorder(ref), batch, False)
        ref_loss.backward()
        for kind in KINDS:
            COMM[kind] = 0
        model = TPEPMixtral(ref, lay, groups)
        rec = Recorder(model)
        for t in batch:
            rec.exclude.add(t.storage().data_ptr())
        with torch.autograd.graph.saved_tensors_hooks(rec.pack, lambda t: t):
            loss = model.run(rec, batch, False)
        per_block = rec.per_block()
        loss.backward()
        comm = dict(COMM)
        params = [sum(p.numel() for p in b.parameters()) for b in model.blocks]
        gerr, gname = grad_errors(ref, model, lay, groups)
        loss_v = loss.item()
        del model, rec, loss
        live = live_run(ref, lay, groups, batch)
        results.append({"path": path, "blocks": per_block, "loss": loss_v,
                        "ref_loss": ref_loss.item(), "grad_err": gerr, "grad_worst": gname,
                        "comm": comm, "params": params, "live": live})
    with open(os.path.join(out_dir, "rank%d.json" % rank), "w") as fh:
        json.dump(results, fh)
    dist.barrier()
    dist.destroy_process_group()


def run_world(lay, jobs):
    world = lay[0] * lay[1]
    with tempfile.TemporaryDirectory(prefix="tpep_twin.") as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        mp.start_processes(rank_main, args=(lay, init_file, tmp, jobs), nprocs=world,
                           join=True, start_method="spawn")
        out = []
        for r in range(world):
            with open(os.path.join(tmp, "rank%d.json" % r)) as fh:
                out.append(json.load(fh))
        return out


# --------------------------------------------------------------------------
# By hand

def hand_layer(m, B, T, lay):
    """{term: bytes} of one layer block on one rank (the docstring's)."""
    tp, dp, ep, etp = lay
    D, H, dh = m["hidden"], m["heads"], m.get("head_dim", m["hidden"] // m["heads"])
    E, k, Fe = m["experts"], m.get("experts_per_tok", 2), m.get("expert_ffn", m["ffn"])
    Tn, Hr, KVr = T // tp, H // tp, m.get("kv_heads", H) // tp
    N = B * Tn
    P = k * N
    R = etp * P  # balanced: ep etp (E / ep) (P / E)
    Fr = Fe // etp
    renorm = m.get("expert_renorm", True)
    terms = {
        "norms": 4 * 2 * (4 * B * Tn * D + B * Tn),
        # k and v: one head each at a batch of one with one a rank
        # (tp_twins.hand_layer; docs/inventory.md, "A batch of one")
        "attention": 4 * (2 * B * T * Hr * dh + B * Hr * T * T
                          + (2 * T * dh if B == 1 and KVr == 1 else 2 * B * T * Hr * dh)) + 8,
        "router": 4 * N * E + 8 * N * k + (4 * N + 4 * N * k if renorm else 0),
        "order+tokens 2P*8": 2 * P * 8,
        "sorted rows R*D": 4 * R * D,
        "sorted weights R": 4 * R,
        "experts 4R*Fr": 4 * 4 * R * Fr,
        "w2 out R*D": 4 * R * D,
    }
    Fs = m.get("shared_expert_ffn", 0)
    if Fs:  # Qwen2-MoE's shared expert (the docstring's)
        terms["shared 4B*T*Fs/tp"] = 4 * 4 * B * T * (Fs // tp)
        terms["shared gate N"] = 4 * N
        terms["shared out N*D"] = 4 * N * D
    return terms


def hand_sent(m, B, T, lay):
    """{kind: bytes} a rank sends in one iteration (the docstring's)."""
    tp, dp, ep, etp = lay
    D, E, k, L = m["hidden"], m["experts"], m.get("experts_per_tok", 2), m["layers"]
    Tn = T // tp
    P = k * B * Tn
    unit = B * Tn * D * 4 * (tp - 1)
    shared = 8 if m.get("shared_expert_ffn") else 0  # w1, w3 3 units each, w2 2
    return {"ep": L * P * (ep - 1) // ep * (4 * D * 4 + 2 * 4),
            "counts": L * E * 8 * (ep * etp - 1),
            "etp": L * P * (etp - 1) * (4 * D * 4 + 2 * 4),
            "tp": ((11 + shared) * L + 2) * unit}


def plan(memledger, path, B, T, lay):
    tp, dp, ep, etp = lay
    args = [memledger, "plan", path, "--format", "json", "--micro-batch", str(B), "--seq-len",
            str(T), "--precision", "fp32", "--checkpoint", "none", "--allocator", "none",
            "--tp", str(tp), "--dp", str(dp), "--ep", str(ep), "--etp", str(etp)]
    return subprocess.run(args, capture_output=True, text=True), args


def plan_windows(memledger, path, B, T, lay):
    """The plan's timeline (`memledger timeline --format csv`, the plan's
    options): each layer block's forward and backward rows (micro-batch 0)
    as block_windows measures the twin's: the total before the block's first
    row (level), its highest total above it (rise), the total after its last
    row above it (net); and by category, the highest running workspace in
    the block (ws), the saved bytes and gradients it adds (saved, grads).
    None when the timeline fails (the plan's own check reports it)."""
    tp, dp, ep, etp = lay
    args = [memledger, "timeline", path, "--format", "csv", "--micro-batch", str(B),
            "--seq-len", str(T), "--precision", "fp32", "--checkpoint", "none",
            "--allocator", "none", "--tp", str(tp), "--dp", str(dp), "--ep", str(ep),
            "--etp", str(etp)]
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode != 0:
        return None
    lines = out.stdout.strip().split("\n")
    hdr = lines[0].split(",")
    win, prev = {}, 0
    for ln in lines[1:]:
        r = dict(zip(hdr, ln.split(",")))
        if r["micro_batch"] != "0":
            break
        tot, d = int(r["total"]), int(r["delta_bytes"])
        if r["step"].startswith("block.") and r["phase"] in ("forward", "backward"):
            key = ("fwd " if r["phase"] == "forward" else "bwd ") + r["step"]
            w = win.setdefault(key, {"level": prev, "peak": prev, "ws_now": 0, "ws": 0,
                                     "saved": 0, "grads": 0})
            w["peak"], w["end"] = max(w["peak"], tot), tot
            if r["category"] == "workspace":
                w["ws_now"] += d
                w["ws"] = max(w["ws"], w["ws_now"])
            elif r["category"] == "activations_saved" and d > 0:
                w["saved"] += d
            elif r["category"] == "grads":
                w["grads"] += d
        prev = tot
    return {k: {"level": w["level"], "rise": w["peak"] - w["level"], "net": w["end"] - w["level"],
                "ws": w["ws"], "saved": w["saved"], "grads": w["grads"]}
            for k, w in win.items()}


def live_info(label, m, windows, pw):
    """INFO lines, not checks (see the docstring, check 3): each layer
    block's forward and backward window, measured (the ranks with the same
    figures together) beside the plan's timeline."""
    for i in range(m["layers"]):
        for ph, phase in (("fwd", "forward"), ("bwd", "backward")):
            key = "%s block.%d" % (ph, i)
            groups = {}
            for rank, w in enumerate(windows):
                mw = w.get(key)
                if mw:
                    groups.setdefault((mw["rise"], mw["net"], mw["op"]), []).append(rank)
            q = (pw or {}).get(key)
            if q is None:
                planned = "planned: none"
            else:
                what = "workspace %d + saved %d" % (q["ws"], q["saved"]) if ph == "fwd" else \
                    "workspace %d + gradients %d" % (q["ws"], q["grads"])
                planned = "planned rise %d (%s), net %+d" % (q["rise"], what, q["net"])
            for (rise, net, op), ranks in sorted(groups.items()):
                diff = " (plan %+d)" % (q["rise"] - rise) if q else ""
                print("INFO %s rank%s block.%d %s: measured rise %d at %s%s, net %+d; %s"
                      % (label, ",".join(map(str, ranks)), i, phase, rise, op or "-", diff, net,
                         planned))


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    memledger, models = sys.argv[1], sys.argv[2]
    paths = sorted(os.path.join(models, f) for f in os.listdir(models)
                   if f.endswith(".yaml") and f.startswith(("mixtral", "qwen2moe")))
    check = tw.Checks()

    docs = {}
    for path in paths:
        with open(path) as fh:
            docs[path] = tw.load(fh)
    for lay in LAYOUTS:
        tp, dp, ep, etp = lay
        jobs = []
        for path, doc in docs.items():
            m, T = doc["model"], doc.get("training", {}).get("seq_len", 16)
            Fe = m.get("expert_ffn", m["ffn"])
            why = [w for w, n, d in (("heads", m["heads"], tp),
                                     ("kv_heads", m.get("kv_heads", m["heads"]), tp),
                                     ("seq_len", T, tp), ("experts", m["experts"], ep),
                                     ("expert_ffn", Fe, etp)) if n % d]
            if why:
                print("skip %s at %s: %s not divisible" % (doc["name"], layout_name(lay),
                                                          ", ".join(why)))
            else:  # the file's micro-batch, and a batch of one
                B = doc.get("training", {}).get("micro_batch", 2)
                jobs += [(path, b) for b in ((B, 1) if B != 1 else (1,))]
        if not jobs:
            continue
        try:
            ranks = run_world(lay, jobs)
        except Exception as e:  # a rank raised: its traceback is on stderr
            check("%s ranks" % layout_name(lay), False, "%s: %s" % (type(e).__name__, e))
            continue
        for j, (path, B) in enumerate(jobs):
            doc = docs[path]
            m, T = doc["model"], doc.get("training", {}).get("seq_len", 16)
            label = "%s %s%s" % (doc["name"], layout_name(lay), " B=1" if B == 1 else "")
            terms = hand_layer(m, B, T, lay)
            want = sum(terms.values())
            # the attention and norms: tp_twins.py's layer less its dense MLP
            dense = tpt.hand_layer(m, B, T, tp, True)[0] - 4 * 4 * B * T * (m["ffn"] // tp)
            check("%s attention and norms by hand" % label,
                  dense == terms["norms"] + terms["attention"],
                  "%d + %d, tp_twins.hand_layer less its MLP %d"
                  % (terms["norms"], terms["attention"], dense))
            Fs = m.get("shared_expert_ffn", 0)
            if Fs:
                # the shared expert's MLP: tp_twins.hand_layer's dense MLP at
                # ffn F_s (its layer at ffn F_s less its layer at ffn 0)
                mlp = (tpt.hand_layer(dict(m, ffn=Fs), B, T, tp, True)[0]
                       - tpt.hand_layer(dict(m, ffn=0), B, T, tp, True)[0])
                check("%s shared expert's MLP by hand" % label,
                      mlp == terms["shared 4B*T*Fs/tp"],
                      "%d, tp_twins.hand_layer's MLP at ffn %d: %d"
                      % (terms["shared 4B*T*Fs/tp"], Fs, mlp))
            extra = known_1_13(doc, B, T // tp)
            sent = hand_sent(m, B, T, lay)
            pw = plan_windows(memledger, path, B, T, lay)
            out, args = plan(memledger, path, B, T, lay)
            got = params = None
            if out.returncode == 2:
                print("SKIP plan: %s" % (out.stderr.strip().splitlines() or ["refused"])[-1])
            elif out.returncode != 0:
                check(label + " plan", False, "%s exited %d: %s"
                      % (" ".join(args), out.returncode, out.stderr.strip()))
            else:
                try:
                    blocks = json.loads(out.stdout)["blocks"]
                    got = {x["name"]: x["activations_saved"] for x in blocks}
                    params = {x["name"]: x["params"] for x in blocks}
                except (ValueError, KeyError) as e:
                    check(label + " plan", False, "unreadable JSON: %s" % e)
            for rank, res in enumerate(ranks):
                r = res[j]
                lbl = "%s rank%d" % (label, rank)
                same = (abs(r["loss"] - r["ref_loss"]) <= 1e-5 * abs(r["ref_loss"])
                        and r["grad_err"] <= 1e-4)
                check("%s matches single device" % lbl, same,
                      "loss %.7f vs %.7f, largest gradient gap %.1e (%s)"
                      % (r["loss"], r["ref_loss"], r["grad_err"], r["grad_worst"]))
                stray = sorted(k for k in r["blocks"] if k not in
                               ["embedding", "head", "loss"] +
                               ["block.%d" % i for i in range(m["layers"])])
                if stray:
                    check("%s blocks" % lbl, False, "unattributed %s" % stray)
                for i in range(m["layers"]):
                    blk = "block.%d" % i
                    meas = r["blocks"].get(blk, 0)
                    check("%s %s saved" % (lbl, blk), meas == want,
                          "measured %d, by hand %d (%s)"
                          % (meas, want, ", ".join("%s %d" % kv for kv in terms.items())))
                    if got is not None:
                        planned = meas - extra.get(blk, 0)
                        check("%s %s planned" % (lbl, blk), got.get(blk) == planned,
                              "planned %s, measured less the 1.13 extras %d (%d)"
                              % (got.get(blk), planned, extra.get(blk, 0)))
                lv = r["live"]
                f, b = lv["fwd_device"], lv["bwd_device"]

                def layers(rec):
                    """The layer blocks' highest point, above the phase's start."""
                    blk = max((v, k) for k, v in rec["blocks"].items() if k.startswith("block."))
                    return "%s +%d" % (blk[1], blk[0] - rec["start"])
                check("%s live bytes" % lbl, not lv["errors"] and not lv["leaked"],
                      "forward from %d B, peak %d B (+%d, %s %s; layers' highest %s), "
                      "backward from %d B, peak %d B (+%d, %s %s; layers' highest %s); "
                      "CPU view peaks %d / %d B; unpaired %d B%s"
                      % (f["start"], f["peak"], f["peak"] - f["start"], f["block"], f["op"],
                         layers(f), b["start"], b["peak"], b["peak"] - b["start"], b["block"],
                         b["op"], layers(b), lv["fwd_raw"]["peak"], lv["bwd_raw"]["peak"],
                         lv["leaked"], "; " + "; ".join(lv["errors"]) if lv["errors"] else ""))
                check("%s bytes sent" % lbl, r["comm"] == sent,
                      ", ".join("%s %d (by hand %d)" % (kk, r["comm"].get(kk, 0), sent[kk])
                                for kk in KINDS))
                if params is not None:
                    mine = {"block.%d" % i: n for i, n in enumerate(r["params"])}
                    check("%s layers' parameters planned" % lbl,
                          all(params.get(k) == v for k, v in mine.items()),
                          ", ".join("%s planned %s, the rank's %d" % (k, params.get(k), v)
                                    for k, v in sorted(mine.items())))
            live_info(label, m, [res[j]["live"]["windows"] for res in ranks], pw)
    return check.done(models)


if __name__ == "__main__":
    sys.exit(main())
