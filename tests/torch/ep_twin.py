#!/usr/bin/python3
"""Per-rank saved activations under expert parallelism, against real PyTorch.

The Mixtral, Qwen2-MoE, DeepSeek-V3 and DeepSeek-V2 twins of twins.py
(their attention, norms, router and SwiGLU experts as Hugging Face writes
them) with the experts split over EP ranks, one process each
(torch.multiprocessing, spawn), gloo on the CPU, and the tokens
dispatched as Megatron-core's MoEAlltoAllTokenDispatcher dispatches them
(megatron/core/transformer/moe/token_dispatcher.py,
moe_utils.py permute, sort_chunks_by_idxs, unpermute):

- the router is the model's (gate, softmax in fp32, the top-k, the
  renormalisation); twins.FIXED_ROUTING sends pair p of a rank to expert
  p mod E, so every expert takes as many rows from every rank;
- every rank's count of its pairs for each expert all-gathered (preprocess,
  no grad: the splits);
- permute: the pairs in expert order, each expert's in token order
  (moe_utils.py permute's argsort of the [E, N] routing map, no grad),
  their tokens gathered with index_select (it keeps its index, the pairs'
  tokens) and their weights by the pairs' index into the top-k weights
  (the index keeps it);
- an all-to-all (an autograd Function: the gradient goes back the same
  way; it saves nothing) brings each rank the rows of its E / ep experts,
  which a cat sorts by local expert (sort_chunks_by_idxs); the weights the
  same way;
- each local expert runs on its slice of the sorted rows, its output
  weighted by its slice of the sorted weights (Hugging Face's loop's
  weighting); the outputs are concatenated, sorted back by source rank,
  sent back by a second all-to-all and summed into the tokens by
  scatter_add_ (it keeps only its index);
- one local expert a rank (E = ep): dispatch_postprocess sorts nothing
  (num_local_experts > 1 guards sort_chunks_by_idxs), SequentialMLP.forward
  calls its one expert on the received rows and weights as they are (no
  split, no cat) and combine_preprocess unsorts nothing: the expert's
  weighted output goes to the second all-to-all as it is. The expert's
  ops then save the received rows (R D) and weights (R) themselves, where
  E / ep > 1 saves the sorted copies: the same bytes (checked: the
  all-to-all's output is among the saved storages exactly when E = ep);
- Qwen2-MoE's shared expert runs on every token of the rank, as without
  expert parallelism.

DeepSeek-V3 (twins.DeepseekV3, HF's DeepseekV3MoE): its router is the
twin's DeepseekV3TopkRouter (the fp32 router linear, sigmoid scores, top-k
of the scores plus e_score_correction_bias, replaced under
twins.FIXED_ROUTING by the same balanced rule, pair p to expert p mod E;
the gather of the chosen scores, the renormalisation by their sum +
1e-20, the scale by routed_scaling_factor 2.5), then the same dispatch in
place of moe()'s loop over the experts, the weights in the scores' dtype
(fp32, moe() sums in it; the cast back a no-op here), the shared experts
on every token as before. Its first dense_layers layers have no experts
and are the single device's; the latent attention is unchanged.

DeepSeek-V2 (twins.DeepseekV2, HF's DeepseekV2MoE): its router is the
twin's DeepseekV2MoEGate (the fp32 router linear, softmax in fp32, with
grouped_topk the group-limited masked_fill, the top-k; under
twins.FIXED_ROUTING the same balanced rule, pair p to expert p mod E,
chosen by v2_route as HF's gate chooses: the masked_fill with the fixed
experts' mask, topk of the masked scores, so the gate keeps what HF's
keeps, the softmax's result, the bool mask and topk's int64 indices,
checked against the learned routing's gate ("router"; twins.DeepseekV2's
own fixed routing gathers from the masked scores, and 1.13's gather keeps
them: tokens E 4 B a layer more than HF's), the router's own weights),
the weights topk's values times routed_scaling_factor (1.0: a new tensor,
its Python float a 0-dim double, known_1_13's), then the same dispatch in
place of V2's sorted moe() (argsort, the rows gathered in expert order,
each expert on its slice, cat, scattered back, weighted in place, summed
over the k slots), the shared experts on every token as before; its dense
first layer and its latent attention (the complex rotary) unchanged.

Each rank counts what autograd saves during the forward with crosscheck.py's
Recorder (saved_tensors_hooks; each storage once; parameters, buffers and
the batch excluded; attributed to the block running), and checks that the
split model is the single-device one: its loss on its own batch, the
gradients of what it holds (the router, attention and norms: its own
batch's; each local expert's: every rank's batch's, summed with an
all-reduce of the single-device gradients), within fp32 rounding.

Hand derivation, one layer block on one rank (fp32, 4 B an element; B
micro-batch, T sequence, D hidden; P = k B T the rank's (token, expert)
pairs; R the rows its experts take, here P; F_e an expert's width):

  the layer without its experts, as twins.Mixtral keeps it (attention,
  norms, the router; Qwen2-MoE's shared expert; DeepSeek-V3's latent
  attention, its router's scores, gather index and renormalisation, its
  shared expert): measured on this process with the experts' part taken
  away, i.e. the single-device block less what its experts' loop keeps
  (below)
  the single-device experts' loop over the N = P rows (Mixtral, Qwen2-MoE,
    DeepSeek-V3): torch.where's int64
    (row, slot) pairs 2 N 8, the gathered rows N D, w1's, silu's, w3's
    outputs and the product 4 N F_e, w2's output and the gathered weights
    N D + N, index_add_'s source N D  (4 B each but the indices;
    DeepSeek-V3's moe() the same: its where's pairs, x[tok], gate's,
    silu's, up's outputs and the product, down's output and w[tok, wi],
    index_add_'s weighted source)
  DeepSeek-V2's sorted moe() over the P pairs instead: x[order // k]'s
    int64 index P 8, the gathered rows P D, the experts' four
    intermediates 4 P F_e, new_x[order] = outs's index P 8, the in-place
    mul_'s copy of the new_x it overwrites P D and the weights P  (4 B
    each but the indices): the dispatch's bytes below with R = P
  the dispatch and the rank's experts: the pairs' order and their tokens
    2 P 8 (int64), the sorted rows R D, the sorted weights R, the
    experts' four intermediates 4 R F_e and outputs R D

  DeepSeek-V3 (deepseek.yaml: 3 layers, dense_layers 1, D 64, E 6, k 2,
  F_e 24, a shared expert of 48; B 2, T 24: n = 48 tokens a rank, P = 96),
  balanced: every expert takes 16 pairs of every rank, so R = P = 96 at
  ep 2 (3 experts a rank, S = 48) and at ep 3 (2 a rank, S = 32)
    moe()'s loop: 2 96 8 + 4 96 (3 64 + 4 24 + 1) = 112,512 B
    the dispatch: 2 96 8 + 4 96 (2 64 + 1 + 4 24) = 87,936 B
    a MoE layer (block.1, block.2): the single device's 387,664 (the
      plan's 349,248 at ep 1 and known_1_13's 38,416: two RMSNorms' x^2
      24,576, the latent RMSNorms' 13,824, the attention scale's and the
      routed_scaling_factor's 0-dim doubles 16) - 112,512 + 87,936 =
      363,088 B on every rank at ep 2 and 3; less the extras 324,672,
      planned (24,576 fewer than at ep 1)
    the dense layer (block.0): the single device's 309,512 (271,104
      planned), unchanged
    sent (2 MoE layers): ep 2 2 ((96 + 96 - 96) 516 + 6 8 1) = 99,168 B,
      ep 3 2 ((96 + 96 - 64) 516 + 6 8 2) = 132,288 B, planned
    parameters: an expert 3 64 24 = 4,608; a MoE layer's 54,600 less 3
      experts at ep 2 (40,776: 13,824 fewer), 4 at ep 3 (36,168), the
      plan's block params

  DeepSeek-V2 (deepseek2.yaml: DeepSeek-V3's shape, D 64, E 6, k 2, F_e
  24, a shared expert of 48, kv_lora_rank 32, no q_lora_rank, the dense
  first layer's ffn 96; grouped_topk, n_group 2, topk_group 1;
  routed_scaling_factor 1.0; B 2, T 24: n = 48, P = 96), balanced as
  DeepSeek-V3: R = P = 96 at ep 2 (S = 48) and ep 3 (S = 32)
    moe()'s sorted experts: 2 96 8 + 4 96 (2 64 + 1 + 4 24) = 87,936 B
    the dispatch: the same 87,936 B
    a MoE layer (block.1, block.2): the single device's 331,888 (the
      plan's 301,152 at ep 1 and known_1_13's 30,736: two RMSNorms' x^2
      24,576, the kv latent RMSNorm's 6,144, the attention scale's and
      the routed_scaling_factor's 0-dim doubles 16) - 87,936 + 87,936 =
      331,888 B on every rank at ep 2 and 3; less the extras 301,152,
      planned (the same as at ep 1)
    the dense layer (block.0): the single device's 278,600 (247,872
      planned and known_1_13's 30,728), unchanged
    the single device's MoE layer less the extras is the plan's at ep 1
      (checked: "single device planned at ep 1")
    sent (2 MoE layers): 99,168 B at ep 2, 132,288 B at ep 3, as
      DeepSeek-V3's (the same D, E, k, B T), planned
    parameters: an expert 3 64 24 = 4,608; a MoE layer's 54,304 less 3
      experts at ep 2 (40,480: 13,824 fewer), 4 at ep 3 (35,872), the
      plan's block params

  Mixtral (mixtral.yaml: 2 layers, D 64, E 4, k 2, F_e 96; B 2, T 24:
  n = 48, P = 96) at ep 4 (dp 4), balanced: one expert a rank, which
  takes 24 pairs of every rank: R = 4 x 24 = 96 = P, S = 24
    the loop over 96: 2 96 8 + 4 96 (3 64 + 4 96 + 1) = 223,104 B
    the dispatch: 2 96 8 + 4 96 (2 64 + 1 + 4 96) = 198,528 B (the
      received rows and weights, 96 x 64 x 4 + 96 x 4 = 24,960 B, saved
      by the expert in place of the sorted copy: the same as at ep 2)
    a layer: the single device's 409,928 - 223,104 + 198,528 = 385,352 B
      on every rank; less the extras' 24,584 (two RMSNorms' x^2 24,576,
      the attention scale's double 8): 360,768, planned
    sent: (96 + 96 - 48) 516 + 4 x 8 x 3 = 74,400 B a layer, 148,800 B
      (planned)
    parameters: an expert 3 64 96 = 18,432; a layer's 84,352 less 3
      experts: 29,056 (the plan's)

The bytes a rank's collectives send to the others an iteration, a layer:
E int64 counts to each of the ep - 1 others (the all-gather), then, of
its Ps pairs sent (here P), the Ps - S bound for the others' experts (S
those of its own experts, S = R / ep as every rank routes alike): their
tokens and weights (4 D + 4 B) forward and their outputs' gradients (4 D)
back; of the R rows received, the R - S from the others: their outputs
(4 D) forward, their rows' and weights' gradients (4 D + 4) back. So
(Ps + R - 2 S)(8 D + 4) + 8 E (ep - 1), by hand for every routing.

Expert capacity (CAPACITY; Megatron's --moe-expert-capacity-factor F and
--moe-pad-expert-input-to-capacity: moe_utils.py get_capacity and
apply_router_token_dropping with drop_policy "probs", the dispatcher's
preprocess, d98e8a64): a rank's capacity C = ceil(P / E F) pairs an
expert; the C highest routing weights of each expert's column of the
dense [N, E] weights (topk over the tokens) are kept, and-ed with the
routing (drop: min(routed, C) pairs an expert, the others not permuted,
not sent, adding nothing; their weights' gradients 0) or not (pad: exactly
C, the routed pairs first, then tokens of weight 0, gathered from the
top-k weights with a 0 appended, so the index alone is saved; no counts'
all-gather: preprocess's drop_and_pad splits are C from every rank). Ps
is the pairs sent, R the rows taken, S as above. The single-device
reference (ref_mlp) is twins.Mixtral's loop on the N routed pairs kept
(padding adds 0, left out), its layer the uncapacitated one's less the
loop over P plus the loop over N (held). The twins' models, n = B T = 48
tokens a rank, D 64:

  Mixtral (E 4, k 2, F_e 96; P 96), ep 2, the skewed routing, F 1:
    C = ceil(96 / 4) = 24; a rank routes 36, 20, 20, 20 pairs and sends
    24, 20, 20, 20: Ps = N = 84 (expert 0's 12 lowest weights dropped);
    rank 0 (experts 0, 1): R = 2 (24 + 20) = 88, S 44; rank 1 R 80, S 40
    the loop over 84: 2 84 8 + 4 84 (3 64 + 4 96 + 1) = 195,216 B
    the dispatch: 2 84 8 + 4 R (2 64 + 1 + 4 96) = 181,920 B (rank 0),
      165,504 B (rank 1)
    a layer 382,040 - 195,216 + 181,920 = 368,744 B on rank 0 (less the
      extras' 24,584: 344,160, the plan's fullest rank), 352,328 B rank 1
    sent: (84 + 88 - 88) 516 + 32 = 43,376 B a layer, 86,752 B (rank 1
      the same: 44 + 40 rows); the plan says 88,816 (its (ep - 1) / ep
      share of Ps + R = 172 rows: 2 layers x 2 rows x 516 B more)
  Mixtral, ep 2, balanced, F 1.5 padded: C = ceil(24 x 1.5) = 36 <= n;
    each expert's 24 routed pairs and 12 of weight 0: Ps = R = 144, S 72,
    N = 96 (nothing dropped)
    the dispatch: 2 144 8 + 4 144 513 = 297,792 B; a layer 409,928 -
      223,104 + 297,792 = 484,616 B (less the extras: 460,032, planned)
    sent: 144 x 516 = 74,304 B a layer, no counts: 148,608 B; the plan
      says 148,672 (it counts the counts' all-gather, 2 x 4 x 8 B)
  Qwen2-MoE (E 6, k 3, F_e 48; P 144), ep 3, balanced, F 0.75: C =
    ceil(24 x 0.75) = 18 of each expert's 24: Ps = N = 108, R = 3 x 2 x
    18 = 108, S 36
    the loop over 108: 2 108 8 + 4 108 (3 64 + 4 48 + 1) = 168,048 B;
      the dispatch 2 108 8 + 4 108 (2 64 + 1 + 4 48) = 140,400 B; a layer
      441,272 - 168,048 + 140,400 = 413,624 B (less the extras: 389,040,
      planned)
    sent: (108 + 108 - 72) 516 + 6 x 8 x 2 = 74,400 B a layer, 148,800 B
      (planned)
Which pairs each layer kept is held against a plain sort of the weights
(policy_gap): each expert's C highest, in token order, padded to C with
tokens not routed to it.

The plan: `memledger plan MODEL --format json --ep N --dp N` (fp32, no
checkpointing; --expert-imbalance 1.5 for the skewed routing,
--expert-capacity F [--expert-pad]); each layer block's activations_saved
must be the measured bytes less crosscheck.known_1_13's (the RMSNorms' x^2
and the attention scale's 0-dim double), byte for byte, and, the routing
balanced, its communication.expert_parallel_bytes_per_device what each
rank sent (skewed, what the fullest rank, rank 0, sent: its own pairs for
its own experts stay); each layer block's params the rank's parameters in
it.

The balanced runs are repeated at a batch of one (B 1, T the file's): the
same checks and derivation (the single device's layer as measured, the
experts' loop and the dispatch by hand), with P = k T pairs.

usage: ep_twin.py MEMLEDGER MODELS_DIR
Prints one line per check and ends with "N passed, N failed".
"""
import json
import math
import os
import subprocess
import sys
import tempfile
import types

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import twins as tw  # noqa: E402  (the reference implementations)
from crosscheck import Recorder, known_1_13  # noqa: E402  (the measurement)

EP_SIZES = (2, 3, 4)  # 4: Mixtral's 4 experts, one a rank (the others' 6 do not divide)
# (model file's name, ep, routing, (capacity factor, pad)): Megatron's
# --moe-expert-capacity-factor and --moe-pad-expert-input-to-capacity
CAPACITY = [("mixtral", 2, "skewed", (1.0, False)),  # expert 0's 36 pairs a rank capped at 24
            ("mixtral", 2, "balanced", (1.5, True)),  # 24 pairs an expert padded to 36
            ("qwen2moe", 3, "balanced", (0.75, False))]  # 24 pairs an expert capped at 18
SENT = [0]  # bytes this rank's all-to-alls sent to the other ranks
POLICY = []  # each capacity layer's policy_gap: "" when its pairs are Megatron's
RECEIVED = []  # each layer's (received rows, local experts): held, so no address is reused


def skewed(n, k, E):
    """A routing with expert 0 the busiest, 1.5 times its share: 3/4 of the
    tokens choose it and one of 1, 2, 3 in turn, the last quarter two of
    1, 2, 3 in turn ((1, 2), (2, 3), (3, 1)): per rank 3n/4 pairs for
    expert 0 and 5n/12 for each other, as training.expert_imbalance 1.5
    has the group's (busiest 1.5 x 2n/4, the rest shared evenly)."""
    assert (k, E) == (2, 4) and n % 12 == 0
    first = [[0, 1 + t % 3] for t in range(3 * n // 4)]
    rest = [[[1, 2], [2, 3], [3, 1]][t % 3] for t in range(n // 4)]
    return torch.tensor(first + rest)


class AllToAll(torch.autograd.Function):
    """mappings.py _AllToAll: rows sent by in_splits, received by out_splits;
    the gradient sent back the other way; nothing saved."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits):
        ctx.splits = (out_splits, in_splits)
        out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits)
        SENT[0] += sent(x, in_splits)
        return out

    @staticmethod
    def backward(ctx, g):
        out_splits, in_splits = ctx.splits
        gi = g.new_empty((sum(in_splits),) + tuple(g.shape[1:]))
        dist.all_to_all_single(gi, g.contiguous(), in_splits, out_splits)
        SENT[0] += sent(g, out_splits)
        return gi, None, None


def sent(x, splits):
    """The bytes of x's rows an all-to-all sends to the other ranks."""
    row = math.prod(x.shape[1:]) * x.element_size()  # a rank may send none
    return row * sum(n for j, n in enumerate(splits) if j != dist.get_rank())


def capacity(P, E, factor):
    """moe_utils.py get_capacity: ceil(P / E * factor) pairs an expert."""
    return math.ceil((P / E) * factor)


def dispatch_pairs(w, chosen, E, cap):
    """The pairs a rank sends, in Megatron's permute order (expert by
    expert, each expert's in token order): src, each pair's index into
    w.reshape(-1) (N k for a padding pair, whose weight is a 0 appended),
    tok its token, counts the pairs of each expert. cap None: every routed
    pair; (factor, pad): moe_utils.py apply_router_token_dropping, policy
    "probs": capacity C = get_capacity(N k, E, factor), each expert's C
    highest routing weights of the dense [N, E] probabilities (topk over
    the tokens), and-ed with the routing (drop) or all C of them, the
    routed ones first, then weight-0 tokens (pad); C above N keeps all."""
    N, k = chosen.shape
    with torch.no_grad():
        routed = torch.zeros((N, E), dtype=torch.bool).scatter_(1, chosen, True)
        keep = routed
        if cap is not None:
            factor, pad = cap
            C = capacity(N * k, E, factor)
            assert not pad or C <= N, "Megatron's padded permute needs C <= N"
            if C > N:
                cmask = torch.ones((N, E), dtype=torch.bool)
            else:
                probs = torch.zeros((N, E), dtype=torch.float).scatter_(1, chosen,
                                                                        w.detach().float())
                top = torch.topk(probs, k=C, dim=0, sorted=False)[1]
                cmask = torch.zeros((N, E), dtype=torch.bool).scatter_(0, top, True)
            keep = cmask if pad else routed & cmask
        slot = torch.full((N, E), N * k, dtype=torch.long)
        slot.scatter_(1, chosen, torch.arange(N * k).view(N, k))
        e_of, tok = keep.t().nonzero(as_tuple=True)  # expert-major, tokens ascending
        # views of one (pairs, 2) storage: tok a copy of its own (index_select keeps it)
        src, tok = slot[tok, e_of], tok.clone()
        counts = keep.sum(0).long()
    return src, tok, counts


def policy_gap(w, chosen, E, cap, src, tok, counts):
    """What the dispatch's pairs lack of Megatron's "probs" policy, by a
    plain sort, apart from dispatch_pairs' topk: each expert takes its C
    (or fewer) routed pairs of the highest weights and, padded, C pairs in
    all, the others tokens not routed to it (weight 0); each expert's
    pairs in token order. Returns "" when nothing is lacking."""
    N, k = chosen.shape
    C = capacity(N * k, E, cap[0])
    wl, cl = w.detach().reshape(-1).tolist(), chosen.reshape(-1).tolist()
    got = list(zip(src.tolist(), tok.tolist()))
    start = 0
    for e, n in enumerate(counts.tolist()):
        chunk, start = got[start:start + n], start + n
        mine = sorted(((wl[p], p) for p in range(N * k) if cl[p] == e), reverse=True)
        want = sorted(p for _, p in mine[:C])
        kept = sorted(p for p, _ in chunk if p < N * k)
        pads = [t for p, t in chunk if p == N * k]
        toks = [t for _, t in chunk]
        if kept != want or any(p // k != t for p, t in chunk if p < N * k):
            return "expert %d kept pairs %s, the %d highest weights are %s" % (e, kept, C, want)
        if toks != sorted(set(toks)):
            return "expert %d's pairs not in token order: %s" % (e, toks)
        if cap[1] and (n != C or set(pads) & {p // k for _, p in mine}):
            return "expert %d padded to %d pairs (C %d), padding %s" % (e, n, C, pads)
        if not cap[1] and pads:
            return "expert %d padded without --expert-pad" % e
    return ""


def router(s, b, h):
    """MixtralSparseMoeBlock's router (twins.Mixtral.mlp's, the fixed routing)."""
    w = F.softmax(b.router(h), dim=1, dtype=torch.float)
    chosen = tw.fixed_routing(h.shape[0], s.k, s.E)
    w = w.gather(1, chosen)
    if s.renorm:
        w /= w.sum(dim=-1, keepdim=True)
    return w.to(h.dtype), chosen


def ref_mlp(s, b, h, cap):
    """The single-device reference under a capacity: twins.Mixtral.mlp
    (Hugging Face's loop over the experts) on the routed pairs the capacity
    keeps, the same pairs as the dispatch's (dispatch_pairs on the same
    weights); a padding pair adds 0 times its expert's output, so it is
    left out."""
    B, T, D = h.shape
    h = h.view(-1, D)
    w, chosen = router(s, b, h)
    with torch.no_grad():
        src = dispatch_pairs(w, chosen, s.E, cap)[0]
        kept = torch.zeros(chosen.numel() + 1, dtype=torch.long)
        kept[src] = 1
        kept = kept[:-1].view(chosen.shape)
    return tw.moe_experts(s, b, h, w, chosen, kept).reshape(B, T, D)


def mixtral_expert(ex, x):
    """A Mixtral or Qwen2-MoE expert (MixtralBlockSparseTop2MLP)."""
    return ex.w2(F.silu(ex.w1(x)) * ex.w3(x))


def deepseek_expert(ex, x):
    """A DeepSeek-V3 expert (DeepseekV3MLP)."""
    return ex.down(F.silu(ex.gate(x)) * ex.up(x))


def ep_mlp(s, b, h, ep, cap):
    """MixtralSparseMoeBlock's router, then the alltoall dispatcher around
    the rank's experts (b.experts holds only them); cap as dispatch_pairs."""
    B, T, D = h.shape
    h = h.view(-1, D)
    w, chosen = router(s, b, h)
    out = dispatch(s, b, h, w, chosen, ep, cap, mixtral_expert)
    if hasattr(b, "shared"):
        sh = b.shared.w2(F.silu(b.shared.w1(h)) * b.shared.w3(h))
        out = out + torch.sigmoid(b.shared_gate(h)) * sh
    return out.reshape(B, T, D)


def deepseek_ep_mlp(s, b, h, ep):
    """DeepseekV3MoE.forward with Megatron's dispatch in place of moe()'s
    loop: the twin's DeepseekV3TopkRouter (the fp32 linear, sigmoid, top-k
    of the scores plus the correction bias, here the fixed routing, the
    gather, the renormalisation by sum + 1e-20, routed_scaling_factor), the
    dispatch around the rank's experts with the weights in the scores'
    dtype (moe() sums in it), the cast back, the shared experts on every
    token. The first dense_layers layers are the twin's dense MLP.
    DeepseekV2MoE.forward the same with V2's router (s.route: the
    DeepseekV2MoEGate, softmax, the group mask, the top-k, here the fixed
    routing, times routed_scaling_factor) and the dispatch in place of its
    sorted moe()."""
    if b.dense:
        return type(s).mlp(s, b, h)  # the twin's own (V3's, V2's) dense MLP
    B, T, D = h.shape
    r = h
    x = h.view(-1, D)
    chosen, w = s.route(b, x)
    out = dispatch(s, b, x, w, chosen, ep, None, deepseek_expert)
    out = out.type(x.dtype).view(B, T, D)
    if hasattr(b, "shared"):
        out = out + deepseek_expert(b.shared, r)
    return out


def v2_route(s, b, h):
    """DeepseekV2MoEGate.forward, group_limited_greedy, with the fixed
    routing chosen as Hugging Face's gate chooses: the fp32 router linear,
    softmax in fp32, scores.masked_fill(~mask, 0.0) with the mask the fixed
    routing's experts (where HF's is the chosen groups'), topk of the masked
    scores (their k nonzero entries: the fixed experts, the router's own
    weights), times routed_scaling_factor. It keeps what HF's gate keeps:
    the softmax's result, masked_fill's (tokens, E) bool mask, topk's int64
    indices. twins.DeepseekV2.route under FIXED_ROUTING gathers from the
    masked scores instead, and gather keeps its input in 1.13 (topk only
    its indices and sizes): the masked scores, tokens E 4 bytes a layer
    more than HF's (router_bytes measures the three)."""
    logits = F.linear(h.type(torch.float32), b.router.weight.type(torch.float32), None)
    scores = logits.softmax(dim=-1, dtype=torch.float32)
    n = scores.shape[0]
    with torch.no_grad():
        fixed = tw.fixed_routing(n, s.k, s.E)
        mask = torch.zeros((n, s.E), dtype=torch.bool).scatter_(1, fixed, True)
    tmp = scores.masked_fill(~mask, 0.0)
    w, idx = torch.topk(tmp, k=s.k, dim=-1, sorted=False)
    assert torch.equal(idx.sort(1).values, fixed.sort(1).values), "a score underflowed to 0"
    return idx, w * s.scale


def router_bytes(doc, B, T):
    """The bytes one DeepSeek-V2 MoE layer's gate saves (fp32, B T tokens;
    the input and the weight left out): (HF's, the learned routing through
    twins.DeepseekV2.route's group_limited_greedy; v2_route's, the fixed
    routing as HF chooses; twins.DeepseekV2.route's under FIXED_ROUTING)."""
    torch.manual_seed(1)
    model = tw.build(doc)
    b = next(x for x in model.blocks if not x.dense)
    h = torch.randn(B * T, doc["model"]["hidden"], requires_grad=True)

    def saved(route, fixed):
        seen, keep = {}, []

        def pack(t):
            keep.append(t)  # held: no address reused
            if t.numel() and t.storage().data_ptr() not in (h.storage().data_ptr(),
                                                             b.router.weight.storage().data_ptr()):
                seen[t.storage().data_ptr()] = t.storage().nbytes()
            return t
        was = tw.FIXED_ROUTING[0]
        tw.FIXED_ROUTING[0] = fixed
        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                idx, w = route(model, b, h)
        finally:
            tw.FIXED_ROUTING[0] = was
        return sum(seen.values())
    return (saved(tw.DeepseekV2.route, False), saved(v2_route, True),
            saved(tw.DeepseekV2.route, True))


def dispatch(s, b, h, w, chosen, ep, cap, expert):
    """The alltoall dispatcher around the rank's experts (b.experts holds
    only them; expert(ex, rows) runs one) on the (tokens, D) rows h, the
    router's (tokens, k) weights w and experts chosen: the (tokens, D)
    sum of the weighted outputs, in the weights' dtype."""
    N, D = h.shape
    El = s.E // ep
    pad = cap is not None and cap[1]
    src, tok, counts = dispatch_pairs(w, chosen, s.E, cap)
    if cap is not None:
        POLICY.append(policy_gap(w, chosen, s.E, cap, src, tok, counts))
    me = dist.get_rank()
    with torch.no_grad():  # the dispatch's bookkeeping
        if pad:  # preprocess's drop_and_pad: C from every rank, no all-gather
            recv = torch.full((ep * El,), int(counts[0]), dtype=torch.long)
        else:
            # every rank's counts of every expert, all-gathered (preprocess:
            # gather_from_sequence_parallel_region over the tp x ep group);
            # the rank keeps its local experts' columns
            every = [torch.empty_like(counts) for _ in range(ep)]
            dist.all_gather(every, counts)
            recv = torch.stack(every)[:, me * El:(me + 1) * El].reshape(-1)
            SENT[0] += counts.element_size() * s.E * (ep - 1)
    in_splits = counts.view(ep, El).sum(1).tolist()
    out_splits = recv.view(ep, El).sum(1).tolist()
    sizes = recv.tolist()  # received chunks: (source rank j, local expert e)
    xp = h.index_select(0, tok)
    # the pairs' weights by their index (padding: a 0 appended; cat saves nothing)
    wp = (torch.cat([w.reshape(-1), w.new_zeros(1)]) if pad else w.reshape(-1))[src]
    xr = AllToAll.apply(xp, out_splits, in_splits)
    wr = AllToAll.apply(wp, out_splits, in_splits)
    RECEIVED.append((xr, El))
    if El == 1:
        # dispatch_postprocess: no sort_chunks_by_idxs with one local expert;
        # SequentialMLP.forward: the expert on the received rows and weights
        # (no split, no cat); combine_preprocess: no unsort
        yb = AllToAll.apply(expert(b.experts[0], xr) * wr[:, None], in_splits, out_splits)
        out = torch.zeros((N, D), dtype=yb.dtype).scatter_add_(0, tok[:, None].expand(-1, D), yb)
        del xp, xr, wr, yb
        return out
    by_expert = [j * El + e for e in range(El) for j in range(ep)]
    xc, wc = torch.split(xr, sizes), torch.split(wr, sizes)
    xs = torch.cat([xc[i] for i in by_expert])
    ws = torch.cat([wc[i] for i in by_expert])
    del xc, wc, wr
    outs, start = [], 0
    for e in range(El):
        n = sum(sizes[j * El + e] for j in range(ep))
        outs.append(expert(b.experts[e], xs[start:start + n]) * ws[start:start + n, None])
        start += n
    cat = torch.cat(outs)
    del outs
    oc = torch.split(cat, [sizes[i] for i in by_expert])
    back = torch.cat([oc[by_expert.index(j * El + e)] for j in range(ep) for e in range(El)])
    del oc, cat
    yb = AllToAll.apply(back, in_splits, out_splits)
    del back
    out = torch.zeros((N, D), dtype=yb.dtype).scatter_add_(0, tok[:, None].expand(-1, D), yb)
    del xp, xr, yb
    return out


def split_model(ref, rank, ep, cap):
    """The rank's model: the single-device one's weights, its E / ep
    experts, the dispatch in place of the experts' loop."""
    import copy
    model = copy.deepcopy(ref)
    El = model.E // ep
    for b in model.blocks:
        if hasattr(b, "experts"):  # DeepSeek's first dense_layers have none
            b.experts = torch.nn.ModuleList(list(b.experts)[rank * El:(rank + 1) * El])
    for p in model.parameters():
        p.grad = None
    if isinstance(model, tw.DeepseekV3):  # DeepseekV2 too (its subclass)
        assert cap is None, "no capacity on DeepSeek's twins"
        if isinstance(model, tw.DeepseekV2) and model.grouped:
            model.route = types.MethodType(v2_route, model)  # as the reference's
        model.mlp = types.MethodType(lambda s, b, h: deepseek_ep_mlp(s, b, h, ep), model)
    else:
        model.mlp = types.MethodType(lambda s, b, h: ep_mlp(s, b, h, ep, cap), model)
    return model


def grad_errors(ref, model, rank, ep):
    """The largest relative gap between the split model's gradients and the
    single-device ones (local experts: summed over the ranks' batches)."""
    worst, name = 0.0, ""
    El = ref.E // ep
    rp = dict(ref.named_parameters())
    summed = {}  # every expert's, in the same order on every rank
    for n, p in ref.named_parameters():
        if ".experts." in n:
            summed[n] = p.grad.clone()
            dist.all_reduce(summed[n])
    for n, p in model.named_parameters():
        parts = n.split(".")
        if "experts" in parts:  # blocks.i.experts.e.wX
            i = parts.index("experts")
            parts[i + 1] = str(rank * El + int(parts[i + 1]))
            want = summed[".".join(parts)]
        else:
            want = rp[n].grad
        err = ((p.grad - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()
        if err > worst:
            worst, name = err, n
    return worst, name


def rank_main(rank, ep, init_file, out_dir, jobs):
    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=ep)
    tw.FIXED_ROUTING[0] = True
    results = []
    for path, routing, cap, B in jobs:
        tw.ROUTING[0] = skewed if routing == "skewed" else None
        SENT[0] = 0
        del POLICY[:]
        del RECEIVED[:]
        with open(path) as fh:
            doc = tw.load(fh)
        T = doc.get("training", {}).get("seq_len", 16)
        torch.manual_seed(1)
        ref = tw.build(doc)
        if isinstance(ref, tw.DeepseekV2) and ref.grouped:  # HF's topk, not gather
            ref.route = types.MethodType(v2_route, ref)
        if cap is not None:
            ref.mlp = types.MethodType(lambda s, b, h: ref_mlp(s, b, h, cap), ref)
        torch.manual_seed(100 + rank)  # each rank its own batch
        batch = tw.batch_for(doc, ref, B, T)
        rrec = Recorder(ref)
        for t in batch:
            rrec.exclude.add(t.storage().data_ptr())
        with torch.autograd.graph.saved_tensors_hooks(rrec.pack, lambda t: t):
            ref_loss = ref.run(rrec, batch, False)
        ref_loss.backward()
        model = split_model(ref, rank, ep, cap)
        rec = Recorder(model)
        for t in batch:
            rec.exclude.add(t.storage().data_ptr())
        with torch.autograd.graph.saved_tensors_hooks(rec.pack, lambda t: t):
            loss = model.run(rec, batch, False)
        loss.backward()
        gerr, gname = grad_errors(ref, model, rank, ep)
        # each layer's received rows: saved by the experts' ops or not, their bytes
        received = [[x.storage().data_ptr() in rec.seen, x.storage().nbytes(), el]
                    for x, el in RECEIVED]
        del RECEIVED[:]
        results.append({"path": path, "routing": routing, "blocks": rec.per_block(),
                        "ref_blocks": rrec.per_block(), "sent": SENT[0],
                        "policy": list(POLICY), "received": received,
                        "params": {"block.%d" % i: sum(p.numel() for p in b.parameters())
                                   for i, b in enumerate(model.blocks)},
                        "loss": loss.item(), "ref_loss": ref_loss.item(),
                        "grad_err": gerr, "grad_worst": gname})
    with open(os.path.join(out_dir, "rank%d.json" % rank), "w") as fh:
        json.dump(results, fh)
    dist.barrier()
    dist.destroy_process_group()


def run_world(ep, jobs):
    with tempfile.TemporaryDirectory(prefix="ep_twin.") as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        mp.start_processes(rank_main, args=(ep, init_file, tmp, jobs), nprocs=ep, join=True,
                           start_method="spawn")
        out = []
        for r in range(ep):
            with open(os.path.join(tmp, "rank%d.json" % r)) as fh:
                out.append(json.load(fh))
        return out


def is_v2(m):
    """DeepSeek-V2's twin (twins.build: latent attention, the complex rotary)."""
    return bool(m.get("kv_lora_rank") and m.get("rope_complex"))


def hand_experts(m, B, T, N, Ps, R):
    """(the single-device experts' loop over its N pairs, the dispatch of
    the Ps pairs the rank sends and the rank's experts on its R rows) in
    bytes. DeepSeek-V2's single device runs its sorted moe() instead of the
    loop: x[order // k]'s index and new_x[order]'s (int64), the sorted rows,
    the experts' four intermediates, the in-place weighting's new_x and
    weights."""
    D = m["hidden"]
    Fe = m.get("expert_ffn", m["ffn"])
    if is_v2(m):
        loop = 2 * N * 8 + 4 * (N * D + 4 * N * Fe + N * D + N)
    else:
        loop = 2 * N * 8 + 4 * (N * D + 4 * N * Fe + N * D + N + N * D)
    dispatch = 2 * Ps * 8 + 4 * (R * D + R + 4 * R * Fe + R * D)
    return loop, dispatch


def routed(m, B, T, routing):
    """A rank's (token, expert) pairs of each expert: the balanced routing
    (pair p to expert p mod E) P / E each; the skewed one 3n/4 for expert 0
    and 5n/12 for each other (n = B T tokens)."""
    k, E = m.get("experts_per_tok", 2), m["experts"]
    n = B * T
    if routing == "balanced":
        assert k * n % E == 0
        return [k * n // E] * E
    return [3 * n // 4] + [5 * n // 12] * (E - 1)


def pairs(m, B, T, routing, cap):
    """(the pairs a rank sends each expert, its routed pairs kept): with a
    capacity C, min(routed, C), or C for every expert padded."""
    per = routed(m, B, T, routing)
    if cap is None:
        return per, sum(per)
    factor, pad = cap
    C = capacity(sum(per), m["experts"], factor)
    kept = [min(c, C) for c in per]
    return ([C] * len(per) if pad else kept), sum(kept)


def hand_rank(m, B, T, ep, rank, routing, cap):
    """(Ps the pairs the rank sends, R the rows its experts take, S those
    of them its own, N its routed pairs kept): every rank routes as the
    others do, so R is ep times the rank's own pairs of its experts."""
    per, N = pairs(m, B, T, routing, cap)
    El = m["experts"] // ep
    S = sum(per[rank * El:(rank + 1) * El])
    return sum(per), ep * S, S, N


def hand_sent(m, B, T, ep, rank, routing, cap):
    """What the rank's collectives send to the others in one iteration, as
    Megatron's dispatcher sends: a layer's forward all-gathers its counts of
    every expert (E int64 to each other rank; none padded: preprocess's
    drop_and_pad splits are C), sends its Ps - S pairs' tokens and weights
    bound for the others' experts and the R - S rows' outputs back; the
    backward the gradients of those same rows the other way."""
    Ps, R, S, _ = hand_rank(m, B, T, ep, rank, routing, cap)
    D, E = m["hidden"], m["experts"]
    pad = cap is not None and cap[1]
    counts = 0 if pad else E * 8 * (ep - 1)
    tokens_weights, outputs = 4 * D + 4, 4 * D
    fwd = (Ps - S) * tokens_weights + (R - S) * outputs
    bwd = (Ps - S) * outputs + (R - S) * tokens_weights
    return moe_layers(m) * (fwd + bwd + counts)


def moe_layers(m):
    """The layers with experts: DeepSeek's first dense_layers have none."""
    return m["layers"] - m.get("dense_layers", 0)


def plan(memledger, path, B, T, ep, routing, cap):
    args = [memledger, "plan", path, "--format", "json", "--micro-batch", str(B), "--seq-len",
            str(T), "--precision", "fp32", "--checkpoint", "none", "--ep", str(ep), "--dp",
            str(ep), "--allocator", "none"]
    if routing == "skewed":
        args += ["--expert-imbalance", "1.5"]
    if cap is not None:
        args += ["--expert-capacity", "%g" % cap[0]] + (["--expert-pad"] if cap[1] else [])
    return subprocess.run(args, capture_output=True, text=True), args


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    memledger, models = sys.argv[1], sys.argv[2]
    files = sorted(os.path.join(models, f) for f in os.listdir(models)
                   if f.endswith(".yaml") and f.startswith(("mixtral", "qwen2moe", "deepseek")))
    check = tw.Checks()

    docs = {}
    for path in files:
        with open(path) as fh:
            docs[path] = tw.load(fh)  # DeepSeek-V2's twin too (deepseek2.yaml)
    # DeepSeek-V2's gate under the fixed routing keeps what HF's keeps
    for path, doc in docs.items():
        m, tr = doc["model"], doc.get("training", {})
        if is_v2(m) and m.get("grouped_topk"):
            B, T = tr.get("micro_batch", 2), tr.get("seq_len", 16)
            hf, ours, gather = router_bytes(doc, B, T)
            check("%s router" % doc["name"], hf == ours,
                  "the fixed routing's gate keeps %d B, HF's (learned, grouped topk) %d; "
                  "twins.py's FIXED_ROUTING gather %d (%+d: the masked scores it keeps)"
                  % (ours, hf, gather, gather - hf))
    for ep in EP_SIZES:
        def B0(p):
            return docs[p].get("training", {}).get("micro_batch", 2)
        # balanced at the file's micro-batch and at a batch of one
        jobs = [(p, "balanced", None, B) for p, d in docs.items()
                if d["model"]["experts"] % ep == 0 for B in sorted({B0(p), 1}, reverse=True)]
        # the skewed routing on Mixtral's twin (4 experts, top-2) over 2 ranks
        jobs += [(p, "skewed", None, B0(p)) for p, d in docs.items()
                 if ep == 2 and (d["model"]["experts"], d["model"].get("experts_per_tok", 2)) ==
                 (4, 2)]
        # the capacities (CAPACITY), after the job without one they are held against
        jobs += [(p, routing, cap, B0(p)) for name, n, routing, cap in CAPACITY
                 for p in docs if n == ep and os.path.basename(p).startswith(name)]
        try:
            ranks = run_world(ep, jobs)
        except Exception as e:  # a rank raised: its traceback is on stderr
            check("ep%d ranks" % ep, False, "%s: %s" % (type(e).__name__, e))
            continue
        for j, (path, routing, cap, B) in enumerate(jobs):
            doc = docs[path]
            m, T = doc["model"], doc.get("training", {}).get("seq_len", 16)
            label = "%s ep%d %s%s" % (doc["name"], ep, routing, " B=1" if B == 1 else "")
            if cap is not None:
                label += " capacity %g%s" % (cap[0], " pad" if cap[1] else "")
            extra = known_1_13(doc, B, T)
            out, args = plan(memledger, path, B, T, ep, routing, cap)
            got, comm, params = {}, None, {}
            if out.returncode != 0:
                check(label + " plan", False, "%s exited %d: %s" % (" ".join(args),
                                                                   out.returncode,
                                                                   out.stderr.strip()))
            else:
                d = json.loads(out.stdout)
                got = {x["name"]: x["activations_saved"] for x in d["blocks"]}
                params = {x["name"]: x["params"] for x in d["blocks"]}
                comm = d["communication"].get("expert_parallel_bytes_per_device")
            # the same model without a capacity, balanced, in this world
            plain = jobs.index((path, "balanced", None, B))
            if is_v2(m) and cap is None:  # V2's sorted moe() keeps what the dispatch does
                out1, args1 = plan(memledger, path, B, T, 1, routing, None)
                one = {}
                if out1.returncode == 0:
                    one = {x["name"]: x["activations_saved"]
                           for x in json.loads(out1.stdout)["blocks"]}
                ref = ranks[0][j]["ref_blocks"]
                moe = ["block.%d" % i for i in range(m.get("dense_layers", 0), m["layers"])]
                check("%s single device planned at ep 1" % label,
                      bool(one) and all(ref.get(b_, 0) - extra.get(b_, 0) == one.get(b_)
                                        for b_ in moe),
                      ", ".join("%s %d less the extras %d, planned %s"
                                % (b_, ref.get(b_, 0), extra.get(b_, 0), one.get(b_))
                                for b_ in moe) if one else
                      "%s exited %d: %s" % (" ".join(args1), out1.returncode, out1.stderr.strip()))
            P = sum(routed(m, B, T, routing))
            for rank, res in enumerate(ranks):
                r = res[j]
                Ps, R, S, N = hand_rank(m, B, T, ep, rank, routing, cap)
                loop, dispatch = hand_experts(m, B, T, N, Ps, R)
                want = hand_sent(m, B, T, ep, rank, routing, cap)
                check("%s rank%d sent" % (label, rank), r["sent"] == want,
                      "sent %d B, by hand %d (%d pairs sent, %d rows taken, %d of them its own)"
                      % (r["sent"], want, Ps, R, S))
                # the plan is the fullest rank's: every rank balanced, rank 0
                # (which holds the busiest expert) skewed
                if routing == "balanced" or rank == 0:
                    check("%s rank%d sent planned" % (label, rank), comm == r["sent"],
                          "planned %s, sent %d%s" % (comm, r["sent"], "" if comm is None else
                                                     " (%+d)" % (comm - r["sent"])))
                same = (abs(r["loss"] - r["ref_loss"]) <= 1e-5 * abs(r["ref_loss"])
                        and r["grad_err"] <= 1e-4)
                check("%s rank%d matches single device" % (label, rank), same,
                      "loss %.7f vs %.7f, largest gradient gap %.1e (%s)"
                      % (r["loss"], r["ref_loss"], r["grad_err"], r["grad_worst"]))
                # the received rows: saved by the one local expert's ops (no
                # sorted copy, dispatch_postprocess at E = ep), else not saved
                El, rows = m["experts"] // ep, R * m["hidden"] * 4
                rcv = r["received"]
                check("%s rank%d received rows" % (label, rank),
                      len(rcv) == moe_layers(m) and
                      all(sv == (El == 1) and n == rows and el == El for sv, n, el in rcv),
                      "%d layers' %d rows (%d B each) %s%s"
                      % (len(rcv), R, rows, "saved by its one expert, no sorted copy"
                         if El == 1 else "not saved (%d local experts: the sorted copy is)" % El,
                         "" if all(sv == (El == 1) and n == rows for sv, n, _ in rcv)
                         else ": got %s" % rcv))
                if cap is not None:
                    gaps = [g for g in r["policy"] if g]
                    C = capacity(P, m["experts"], cap[0])
                    check("%s rank%d kept pairs" % (label, rank),
                          len(r["policy"]) == moe_layers(m) and not gaps,
                          "%d layers' pairs: %s" % (len(r["policy"]), gaps[0] if gaps else
                                                    "each expert's C = %d highest weights%s"
                                                    % (C, ", padded" if cap[1] else "")))
                if cap is not None:  # the reference: twins.Mixtral's loop on the N kept pairs
                    full_loop = hand_experts(m, B, T, P, P, P)[0]
                    base = res[plain]["ref_blocks"]
                    gaps = {b_: r["ref_blocks"].get(b_, 0) - base.get(b_, 0) +
                            ((full_loop - loop) if b_.startswith("block.") else 0)
                            for b_ in base}
                    check("%s rank%d single device" % (label, rank),
                          not any(gaps.values()) and set(base) == set(r["ref_blocks"]),
                          "each layer the uncapacitated one's less its loop over %d pairs "
                          "(%d B) plus one over the %d kept (%d B), the rest the same%s"
                          % (P, full_loop, N, loop,
                             "" if not any(gaps.values()) else ": gaps %s" % gaps))
                if params:
                    check("%s rank%d params" % (label, rank),
                          all(params.get(k) == v for k, v in r["params"].items()),
                          ", ".join("%s planned %s, the rank's %d" % (k, params.get(k), v)
                                    for k, v in sorted(r["params"].items())))
                for i in range(m["layers"]):
                    blk = "block.%d" % i
                    whole = r["ref_blocks"].get(blk, 0)
                    meas = r["blocks"].get(blk, 0)
                    if i < m.get("dense_layers", 0):  # no experts: the single device's
                        check("%s rank%d %s" % (label, rank, blk), meas == whole,
                              "measured %d, single device %d (dense)" % (meas, whole))
                    else:
                        want = whole - loop + dispatch
                        check("%s rank%d %s" % (label, rank, blk), meas == want,
                              "measured %d, by hand %d (single device %d - its experts' %s "
                              "%d + dispatch %d)" % (meas, want, whole,
                                                     "sorted moe()" if is_v2(m) else "loop",
                                                     loop, dispatch))
                    # the plan is the fullest rank's: rank 0 (the busiest expert)
                    if got and (routing == "balanced" or rank == 0):
                        planned = meas - extra.get(blk, 0)
                        check("%s rank%d %s planned" % (label, rank, blk),
                              got.get(blk) == planned,
                              "planned %s, measured less the 1.13 artefacts %d"
                              % (got.get(blk), planned))
    return check.done(models)


if __name__ == "__main__":
    sys.exit(main())
