/* A mixture-of-experts MLP (chain_kit.h): HF Mixtral's block_sparse_moe,
 * MixtralSparseMoeBlock.forward in transformers' modeling_mixtral.py, and
 * Qwen2-MoE's Qwen2MoeSparseMoeBlock (modeling_qwen2_moe.py: the top-k
 * weights renormalised only with norm_topk_prob, and a shared expert on
 * every token gated by a sigmoid), with what PyTorch's eager autograd keeps
 * for each of their ops (tools/autograd/derivatives.yaml) and, where the
 * block records them, the backward's nodes in the forward's op order
 * (docs/inventory.md, "Mixtral block"; docs/ledger.md, "Backward, node by
 * node"). Each expert is planned on its share of the routed rows, the
 * balanced one. */
#include <math.h>

#include "ledger/chain_kit.h"

/* Sizes the router, the experts and the shared expert share. gD: the
 * gradient of the norm's output h (one buffer: the first gradient the
 * backward makes for it, the shared expert's gate, or without one the last
 * expert's rows; the others are added in place); gK: the top-k weights'. */
typedef struct {
    uint64_t E, k, F, N, BTD, gD, gK;
    unsigned w; /* bytes per element of h */
} moe_sizes;

uint64_t ml__ck_busiest_rows(const ml_ck_dims *d, uint64_t N, uint64_t E)
{
    double busy = (double)N / (double)E * d->expert_imbalance;
    return busy >= (double)d->BT ? d->BT : (uint64_t)ceil(busy);
}

/* The experts with rows, hit = min(N, E) (HF's expert_hitted; every other
 * expert keeps a row, HF skips the experts without any). Each takes N / E
 * rows, one more for the first N mod E experts (balanced; the twins' fixed
 * routing sends pair p to expert p mod E); with an imbalance the first
 * takes the busiest rows (at most all but a row for each other expert)
 * and the others share the rest the same way. */
unsigned ml__ck_expert_runs(const ml_ck_dims *d, uint64_t N, uint64_t E, uint64_t count[3],
                            uint64_t rows[3])
{
    const uint64_t busiest = ml__ck_busiest_rows(d, N, E), hit = N < E ? N : E;
    const uint64_t most = N - (hit - 1);
    const uint64_t busy = d->expert_imbalance > 1 ? (busiest < most ? busiest : most) : 0;
    uint64_t c[3] = {N % E, hit - N % E, 0}, r[3] = {N / E + 1, N / E, 0};
    if (busy && hit >= 2) {
        const uint64_t rest = N - busy, n = hit - 1;
        c[0] = 1;
        r[0] = busy;
        c[1] = rest % n;
        r[1] = rest / n + 1;
        c[2] = n - rest % n;
        r[2] = rest / n;
    }
    unsigned k = 0;
    for (unsigned i = 0; i < 3; i++)
        if (c[i]) {
            count[k] = c[i];
            rows[k++] = r[i];
        }
    return k;
}

/* The router: gate (D -> E), softmax in fp32, top-k, the in-place
 * renormalisation, the cast back to the stream's dtype (nothing in fp32).
 * Backward: the divide makes the top-k values' gradient (their buffer) and
 * the sum's; the sum's expands a view of it into the buffer in place; topk
 * scatters into a zero-filled (B*T, E) one, softmax makes another, the
 * router's mm h's (added into its buffer) and its weight's. */
static void router(ml_chain *ch, ml_cblock *b, const ml_model *m, const ml_ck_dims *d,
                   const moe_sizes *z, bool src_saved)
{
    const unsigned g = ch->prec.grad, a = ch->prec.a;
    const uint64_t E = z->E, BTE = ml_mul(ch, d->BT, E);
    size_t s_in = SIZE_MAX;
    /* gate's input is the norm's output viewed (B*T, D): mm saves it
     * (autocast: its bf16 cast) */
    if (ch->prec.autocast && z->w == 4)
        ml__ck_save(ch, b, "router input (cast copy)", z->BTD, 2, 0);
    else if (!src_saved)
        s_in = ml__ck_save(ch, b, "router input (the norm's output)", z->BTD, z->w, 0);
    ml__ck_weight_copy(ch, b, ml_mul(ch, d->D, E));
    ml__ck_linear(ch, b, d->D, E, false);
    ml__ck_tmp(ch, BTE, a); /* router_logits */
    ml__ck_accum(ch, b, z->gD);
    ml__ck_node(ch, b, "MmBackward0 (router)", z->gD, ml_mul(ch, ml_mul(ch, d->D, E), g),
                ml_mul(ch, BTE, a), s_in, SIZE_MAX);
    /* softmax(dtype=float) keeps its fp32 result; topk keeps its int64
     * indices; `routing_weights /= sum` keeps the sum and, in place, a
     * copy of the top-k values it overwrites */
    size_t s = ml__ck_save(ch, b, "router softmax output (fp32)", BTE, 4, 0);
    ml__ck_node(ch, b, "SoftmaxBackward0 (router)", ml_mul(ch, BTE, a), 0, ml_mul(ch, BTE, 4), s,
                SIZE_MAX);
    s = ml__ck_save(ch, b, "top-k indices (int64)", ml_mul(ch, d->BT, z->k), 8, 0);
    ml__ck_node(ch, b, "TopkBackward0 (zero-filled, scattered)", ml_mul(ch, BTE, 4), 0, z->gK, s,
                SIZE_MAX);
    if (m->expert_renorm) {
        size_t s0 = ml__ck_save(ch, b, "top-k weight sum (fp32)", d->BT, 4, 0);
        size_t s1 = ml__ck_save(ch, b, "top-k weights before the in-place divide (fp32)",
                                ml_mul(ch, d->BT, z->k), 4, 0);
        uint64_t gS = ml_mul(ch, d->BT, 4);
        ml__ck_node(ch, b, "SumBackward1 (an expanded view, added in place)", 0, 0, gS, SIZE_MAX,
                    SIZE_MAX);
        ml__ck_node(ch, b, "DivBackward0 (in place)", ml_add(ch, z->gK, gS), 0, z->gK, s0, s1);
        ml__ck_node_scratch(ch, b, z->gK);
    }
    b->flops_fwd += 2.0 * (double)d->BT * (double)d->D * (double)E;
}

/* Expert e on its n rows, in the forward's op order: the rows of h
 * (IndexBackward0: a zero-filled gradient of h's size, index_put), w1,
 * silu, w3, the product, w2, the routing weights' rows (IndexBackward0: a
 * zero-filled (B*T, k) gradient), the weighting, index_add_ (its source's
 * gradient index_select'ed; the sum's is the output's itself). h_first: its
 * h gradient is h's buffer; w_first: its weights' gradient is theirs. */
static void expert(ml_chain *ch, ml_cblock *b, const ml_ck_dims *d, const moe_sizes *z,
                   uint64_t n, bool h_first, bool w_first)
{
    const unsigned a = ch->prec.a, g = ch->prec.grad, w = z->w;
    uint64_t nD = ml_mul(ch, n, d->D), nF = ml_mul(ch, n, z->F);
    uint64_t gx = ml_mul(ch, nD, w), gF = ml_mul(ch, nF, a), gY = ml_mul(ch, nD, a);
    uint64_t pw = ml_mul(ch, ml_mul(ch, d->D, z->F), g);
    size_t s_idx = ml__ck_save(ch, b, "expert token indices (torch.where, int64)",
                               ml_mul(ch, n, 2), 8, 0);
    if (!h_first)
        ml__ck_accum(ch, b, z->gD);
    ml__ck_node(ch, b, "IndexBackward0 (the expert's rows of h)", z->gD, 0, gx, s_idx, SIZE_MAX);
    /* hidden_states[None, top_x]: a copy of the rows, which w1 and w3 save
     * (autocast: each its own bf16 cast) */
    size_t s_x = SIZE_MAX;
    if (ch->prec.autocast && w == 4) {
        ml__ck_save(ch, b, "expert input cast for w1", nD, 2, 0);
        ml__ck_save(ch, b, "expert input cast for w3", nD, 2, 0);
    } else {
        s_x = ml__ck_save(ch, b, "expert input (gathered rows)", nD, w, 0);
    }
    ml__ck_accum(ch, b, gx);
    ml__ck_node(ch, b, "MmBackward0 (w1)", gx, pw, gF, s_x, SIZE_MAX);
    /* SwiGLU: silu keeps w1's output, the mul silu's and w3's outputs, w2
     * the product */
    size_t s = ml__ck_save(ch, b, "expert w1 output (silu input)", nF, a, 0);
    ml__ck_node(ch, b, "SiluBackward0 (expert)", gF, 0, gF, s, SIZE_MAX);
    ml__ck_node(ch, b, "MmBackward0 (w3)", gx, pw, gF, SIZE_MAX, SIZE_MAX);
    size_t s0 = ml__ck_save(ch, b, "expert silu output", nF, a, 0);
    size_t s1 = ml__ck_save(ch, b, "expert w3 output", nF, a, 0);
    ml__ck_node(ch, b, "MulBackward0 (silu * w3)", ml_mul(ch, 2, gF), 0, gF, s0, s1);
    s = ml__ck_save(ch, b, "expert product (w2 input)", nF, a, 0);
    ml__ck_node(ch, b, "MmBackward0 (w2)", gF, pw, gY, s, SIZE_MAX);
    if (!w_first)
        ml__ck_accum(ch, b, z->gK);
    ml__ck_node(ch, b, "IndexBackward0 (the expert's routing weights)", z->gK, 0,
                ml_mul(ch, n, w), SIZE_MAX, SIZE_MAX);
    /* `expert(x) * routing_weights[top_x, idx, None]`: the mul keeps both,
     * w2's output and the gathered weights (cast to the stream's dtype);
     * the weights' gradient sums grad * w2's output over D (a scratch) */
    s0 = ml__ck_save(ch, b, "expert output (weighted by the router)", nD, a, 0);
    s1 = ml__ck_save(ch, b, "gathered routing weights", n, w, 0);
    ml__ck_node(ch, b, "MulBackward0 (expert output * weights)", ml_add(ch, gY, ml_mul(ch, n, w)),
                0, gx, s0, s1);
    ml__ck_node_scratch(ch, b, gY);
    /* index_add_ keeps its source, the weighted output (in the stream's
     * dtype: the weights promote it), for expand_as(source) in
     * derivatives.yaml's formula */
    s = ml__ck_save(ch, b, "weighted expert output (index_add_ source)", nD, w, 0);
    ml__ck_node(ch, b, "IndexAddBackward0 (index_select of the sum's gradient)", gx, 0, 0, s,
                SIZE_MAX);
}

/* Qwen2-MoE's shared expert, a SwiGLU of width Fs on every token (its
 * gate_proj and up_proj read the norm's output the router saved; autocast
 * casts it once for each), scaled by sigmoid(shared_expert_gate(x)): the
 * sigmoid keeps its (B*T, 1) result, the mul that result and the expert's
 * output; the sum with the routed experts' keeps nothing (AddBackward0
 * hands the output's gradient to both). shared_expert_gate is the last to
 * read h: its gradient is h's buffer. */
static void shared_expert(ml_chain *ch, ml_cblock *b, const ml_model *m, const ml_ck_dims *d,
                          const moe_sizes *z)
{
    const unsigned a = ch->prec.a, g = ch->prec.grad;
    const uint64_t Fs = m->shared_expert_ffn;
    uint64_t BTF = ml_mul(ch, d->BT, Fs), gF = ml_mul(ch, BTF, a), gB = ml_mul(ch, d->BT, a);
    uint64_t pw = ml_mul(ch, ml_mul(ch, d->D, Fs), g);
    if (ch->prec.autocast && z->w == 4)
        for (unsigned i = 0; i < 3; i++)
            ml__ck_save(ch, b, "shared expert input (cast copy)", z->BTD, 2, 0);
    for (unsigned i = 0; i < 3; i++)
        ml__ck_weight_copy(ch, b, ml_mul(ch, d->D, Fs));
    ml__ck_weight_copy(ch, b, d->D);
    ml__ck_accum(ch, b, z->gD);
    ml__ck_node(ch, b, "MmBackward0 (shared gate_proj)", z->gD, pw, gF, SIZE_MAX, SIZE_MAX);
    size_t s = ml__ck_save(ch, b, "shared expert gate_proj output (silu input)", BTF, a, 0);
    ml__ck_node(ch, b, "SiluBackward0 (shared)", gF, 0, gF, s, SIZE_MAX);
    ml__ck_accum(ch, b, z->gD);
    ml__ck_node(ch, b, "MmBackward0 (shared up_proj)", z->gD, pw, gF, SIZE_MAX, SIZE_MAX);
    size_t s0 = ml__ck_save(ch, b, "shared expert silu output", BTF, a, 0);
    size_t s1 = ml__ck_save(ch, b, "shared expert up_proj output", BTF, a, 0);
    ml__ck_node(ch, b, "MulBackward0 (shared silu * up)", ml_mul(ch, 2, gF), 0, gF, s0, s1);
    s = ml__ck_save(ch, b, "shared expert product (down_proj input)", BTF, a, 0);
    uint64_t gY = ml_mul(ch, z->BTD, a);
    ml__ck_node(ch, b, "MmBackward0 (shared down_proj)", gF, pw, gY, s, SIZE_MAX);
    ml__ck_node(ch, b, "MmBackward0 (shared_expert_gate)", z->gD, ml_mul(ch, d->D, g), gB,
                SIZE_MAX, SIZE_MAX);
    s = ml__ck_save(ch, b, "shared expert gate sigmoid output", d->BT, a, 0);
    ml__ck_node(ch, b, "SigmoidBackward0 (shared gate)", gB, 0, gB, s, SIZE_MAX);
    s = ml__ck_save(ch, b, "shared expert output (gated)", z->BTD, a, 0);
    ml__ck_node(ch, b, "MulBackward0 (sigmoid * shared)", ml_add(ch, gB, gY), 0, 0, s, SIZE_MAX);
    ml__ck_node_scratch(ch, b, gY);
    ml__ck_linear(ch, b, d->D, Fs, false); /* gate_proj */
    ml__ck_linear(ch, b, d->D, Fs, false); /* up_proj */
    ml__ck_linear(ch, b, Fs, d->D, false); /* down_proj */
    ml__ck_linear(ch, b, d->D, 1, false);  /* shared_expert_gate */
    ml__ck_tmp(ch, BTF, a);
    b->flops_fwd += 3.0 * 2.0 * (double)d->BT * (double)d->D * (double)Fs +
                    2.0 * (double)d->BT * (double)d->D;
}

void ml__ck_moe(ml_chain *ch, ml_cblock *b, const ml_model *m, const ml_ck_dims *d,
                unsigned src_bpe, bool src_saved)
{
    const unsigned a = ch->prec.a, w = ch->prec.w;
    moe_sizes z;
    z.E = m->experts;
    z.k = m->experts_per_tok;
    z.F = m->expert_ffn ? m->expert_ffn : d->F;
    z.N = ml_mul(ch, z.k, d->BT);
    z.BTD = ml_mul(ch, d->BT, d->D);
    z.w = src_bpe;
    z.gD = ml_mul(ch, z.BTD, src_bpe);
    z.gK = ml_mul(ch, ml_mul(ch, d->BT, z.k), 4);
    router(ch, b, m, d, &z, src_saved);
    const uint64_t rows = ml__ck_busiest_rows(d, z.N, z.E);
    /* N = k * B * T (token, expert) pairs; each expert e takes its n_e of
     * them, and every saved tensor above is n_e rows: their sum over the
     * experts is N rows whatever the routing (docs/inventory.md); the
     * experts with rows run (HF's expert_hitted), the last of them first
     * in backward */
    uint64_t count[3], n_e[3];
    const unsigned runs = ml__ck_expert_runs(d, z.N, z.E, count, n_e);
    const uint64_t hit = z.N < z.E ? z.N : z.E;
    uint64_t done = 0;
    for (unsigned r = 0; r < runs; r++)
        for (uint64_t i = 0; i < count[r] && !ch->overflow; i++) {
            const bool last = ++done == hit;
            expert(ch, b, d, &z, n_e[r], last && !m->shared_expert_ffn, last);
        }
    for (unsigned i = 0; i < 3; i++)
        ml__ck_weight_copy(ch, b, ml_mul(ch, ml_mul(ch, z.E, d->D), z.F));
    for (uint64_t e = 0; e < z.E && !ch->overflow; e++) {
        ml__ck_linear(ch, b, d->D, z.F, false); /* w1 (Qwen2-MoE: gate_proj) */
        ml__ck_linear(ch, b, z.F, d->D, false); /* w2 (down_proj) */
        ml__ck_linear(ch, b, d->D, z.F, false); /* w3 (up_proj) */
    }
    /* the busiest expert's intermediates, and the (B*T, D) sum index_add_
     * builds */
    ml__ck_tmp(ch, ml_mul(ch, rows, z.F), a);
    ml__ck_tmp(ch, z.BTD, w);
    b->flops_fwd += 3.0 * 2.0 * (double)z.N * (double)d->D * (double)z.F;
    if (m->shared_expert_ffn)
        shared_expert(ch, b, m, d, &z);
}
