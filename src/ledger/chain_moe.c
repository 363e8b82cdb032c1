/* DeepSeek's mixture-of-experts MLPs (chain_kit.h): DeepseekV3MoE and
 * DeepseekV2MoE in transformers 4.5x's modeling_deepseek_v3.py and
 * modeling_deepseek_v2.py (Mixtral's and Qwen2-MoE's are in
 * chain_moe_mixtral.c), with what PyTorch's eager autograd keeps
 * for each of their ops (tools/autograd/derivatives.yaml; docs/inventory.md,
 * "DeepSeek-V3 block" and "DeepSeek-V2"). */

#include "ledger/chain_kit.h"

/* The DeepSeek routers' `F.linear(x.type(float32), weight.type(float32))`:
 * x itself in fp32, fp32 copies of x and of the weight in bf16, bf16 casts
 * of both under autocast. Returns the logits' bytes per element. */
static unsigned router_fp32_linear(ml_chain *ch, ml_cblock *b, const ml_model *m,
                                   const ml_ck_dims *d, unsigned src_bpe)
{
    const uint64_t E = m->experts;
    const bool amp = ch->prec.autocast;
    uint64_t BTD = ml_mul(ch, d->BT, d->D);
    if (amp && src_bpe == 4)
        ml__ck_save(ch, b, "router input (cast copy)", BTD, 2, 0);
    else
        ml__ck_save(ch, b, src_bpe == 4 ? "router input (the norm's output)"
                                       : "router input (fp32 copy)", BTD, 4, 0);
    if (amp)
        ml__ck_weight_copy(ch, b, ml_mul(ch, E, d->D));
    else if (ch->prec.param != 4)
        ml__ck_save(ch, b, "router weight (fp32 copy)", ml_mul(ch, E, d->D), 4, 0);
    const unsigned ldt = amp ? 2 : 4;
    ml__ck_tmp(ch, ml_mul(ch, d->BT, E), ldt); /* router_logits */
    b->flops_fwd += 2.0 * (double)d->BT * (double)d->D * (double)E;
    return ldt;
}

/* DeepseekV3TopkRouter.forward: F.linear on the input and the weight in
 * fp32 (`.type(torch.float32)`: x itself in fp32, copies in bf16; autocast
 * casts both to bf16 anyway), sigmoid (keeps its result: the scores), the
 * top-k chosen under no_grad, gather (keeps the scores, the same storage,
 * and its int64 index), the in-place renormalisation by sum + 1e-20 (keeps
 * the denominator and a copy of what it overwrites), the scale by
 * routed_scaling_factor (a Python float: nothing). Returns the scores'
 * bytes per element. */
static unsigned router_v3(ml_chain *ch, ml_cblock *b, const ml_model *m, const ml_ck_dims *d,
                          unsigned src_bpe)
{
    const uint64_t E = m->experts, k = m->experts_per_tok;
    uint64_t BTE = ml_mul(ch, d->BT, E);
    const unsigned sdt = router_fp32_linear(ch, b, m, d, src_bpe);
    ml__ck_save(ch, b, "router sigmoid scores", BTE, sdt, 0);
    ml__ck_tmp(ch, ml_mul(ch, ml_mul(ch, d->BT, k), E), 8); /* moe()'s one_hot mask */
    ml__ck_save(ch, b, "top-k indices (gather's index, int64)", ml_mul(ch, d->BT, k), 8, 0);
    if (m->expert_renorm) {
        /* CUDA autocast runs sum in fp32 (autocast_mode.cpp's
         * fp32_set_opt_dtype list; CPU autocast does not: a known
         * difference, docs/validation.md) */
        ml__ck_save(ch, b, "top-k weight sum + 1e-20", d->BT, ch->prec.autocast ? 4 : sdt, 0);
        ml__ck_save(ch, b, "top-k weights before the in-place divide", ml_mul(ch, d->BT, k),
                    sdt, 0);
    }
    /* the score-correction bias: a buffer of E fp32 values per layer */
    ch->buffer_bytes = ml_add(ch, ch->buffer_bytes, ml_mul(ch, E, 4));
    return sdt;
}

/* A SwiGLU expert's saved tensors on n rows of x (w bytes per element):
 * gate_proj and up_proj keep x (autocast: a cast each), silu gate's
 * output, the mul silu's and up's outputs, down_proj the product. */
static void swiglu_saves(ml_chain *ch, ml_cblock *b, uint64_t nD, uint64_t nF, unsigned w,
                         bool x_saved, const char *what)
{
    const unsigned a = ch->prec.a;
    if (ch->prec.autocast && w == 4) {
        ml__ck_save(ch, b, what, nD, 2, 0);
        ml__ck_save(ch, b, what, nD, 2, 0);
    } else if (!x_saved) {
        ml__ck_save(ch, b, what, nD, w, 0);
    }
    ml__ck_save(ch, b, "gate_proj output (silu input)", nF, a, 0);
    ml__ck_save(ch, b, "silu output", nF, a, 0);
    ml__ck_save(ch, b, "up_proj output", nF, a, 0);
    ml__ck_save(ch, b, "gated product (down_proj input)", nF, a, 0);
}

/* The DeepSeek shared experts: one SwiGLU of moe_intermediate_size *
 * n_shared_experts on the norm's output x (w bytes per element; in fp32 the
 * router saved x already), added without a gate. */
static void ungated_shared(ml_chain *ch, ml_cblock *b, const ml_model *m, const ml_ck_dims *d,
                           unsigned w)
{
    const uint64_t Fs = m->shared_expert_ffn;
    if (!Fs)
        return;
    uint64_t BTD = ml_mul(ch, d->BT, d->D), BTF = ml_mul(ch, d->BT, Fs);
    swiglu_saves(ch, b, BTD, BTF, w, w == 4 && !ch->prec.autocast, "shared experts input");
    for (unsigned i = 0; i < 3; i++)
        ml__ck_weight_copy(ch, b, ml_mul(ch, d->D, Fs));
    ml__ck_linear(ch, b, d->D, Fs, false);
    ml__ck_linear(ch, b, d->D, Fs, false);
    ml__ck_linear(ch, b, Fs, d->D, false);
    ml__ck_tmp(ch, BTF, ch->prec.a);
    b->flops_fwd += 3.0 * 2.0 * (double)d->BT * (double)d->D * (double)Fs;
}

/* E SwiGLU experts' parameters (gate_proj, up_proj, down_proj each), then
 * the router's weight, as DeepseekV2MoE and DeepseekV3MoE register them. */
static void deepseek_expert_params(ml_chain *ch, ml_cblock *b, const ml_model *m,
                                   const ml_ck_dims *d, uint64_t F)
{
    for (uint64_t e = 0; e < m->experts && !ch->overflow; e++) {
        ml__ck_linear(ch, b, d->D, F, false); /* gate_proj */
        ml__ck_linear(ch, b, d->D, F, false); /* up_proj */
        ml__ck_linear(ch, b, F, d->D, false); /* down_proj */
    }
    ml__ck_param(ch, b, m->experts, d->D); /* gate.weight */
}

/* The busiest expert's intermediates (as ml__ck_moe) and the (B*T, D) sum. */
static void busiest_expert(ml_chain *ch, const ml_ck_dims *d, uint64_t N, uint64_t E,
                           uint64_t F)
{
    ml__ck_tmp(ch, ml_mul(ch, ml__ck_busiest_rows(d, N, E), F), ch->prec.a);
    ml__ck_tmp(ch, ml_mul(ch, d->BT, d->D), 4);
}

void ml__ck_moe_v3(ml_chain *ch, ml_cblock *b, const ml_model *m, const ml_ck_dims *d,
                   unsigned src_bpe)
{
    const unsigned a = ch->prec.a, w = src_bpe;
    const uint64_t E = m->experts, k = m->experts_per_tok;
    const uint64_t F = m->expert_ffn ? m->expert_ffn : d->F;
    /* DeepseekV3MoE registers the experts, the router, the shared experts */
    deepseek_expert_params(ch, b, m, d, F);
    const unsigned sdt = router_v3(ch, b, m, d, src_bpe);
    /* moe(): per expert, torch.where's (n_e, 2) int64 storage, the rows
     * hidden_states[token_indices] (the norm's output, w bytes), the
     * expert's SwiGLU, `expert_output * expert_weights.unsqueeze(-1)`
     * (keeps both: down_proj's output, the gathered weights in the scores'
     * dtype), index_add_ into the scores-dtype sum (keeps its source, the
     * product, in the wider dtype); N = k * B * T rows in all */
    const uint64_t N = ml_mul(ch, k, d->BT);
    uint64_t ND = ml_mul(ch, N, d->D), NF = ml_mul(ch, N, F);
    ml__ck_save(ch, b, "expert token indices (torch.where, int64)", ml_mul(ch, N, 2), 8, 0);
    swiglu_saves(ch, b, ND, NF, w, false, "expert input (gathered rows)");
    for (unsigned i = 0; i < 3; i++)
        ml__ck_weight_copy(ch, b, ml_mul(ch, ml_mul(ch, E, d->D), F));
    ml__ck_save(ch, b, "expert output (down_proj)", ND, a, 0);
    ml__ck_save(ch, b, "gathered top-k weights", N, sdt, 0);
    ml__ck_save(ch, b, "weighted expert output (index_add_ source)", ND, a > sdt ? a : sdt, 0);
    busiest_expert(ch, d, N, E, F);
    b->flops_fwd += 3.0 * 2.0 * (double)N * (double)d->D * (double)F;
    ungated_shared(ch, b, m, d, w);
}

/* DeepseekV2MoEGate.forward and DeepseekV2MoE.moe (transformers 4.5x's
 * modeling_deepseek_v2.py): the router's fp32 linear (as V3's), softmax in
 * fp32 (keeps its result), group_limited_greedy's masked_fill (keeps its
 * (B*T, E) bool mask), topk (keeps its int64 indices), the scale by
 * routed_scaling_factor (a new tensor; the norm_topk_prob the config may
 * carry is not read). moe(): argsort of the N = k*B*T (token, expert)
 * pairs (int64, kept by index_put_), their rows `argsort // k` (int64,
 * kept by the indexing), the rows gathered in that order (saved by each
 * expert's slice: one storage; autocast: a cast per linear), the SwiGLUs,
 * the cat of their outputs scattered back into pair order (index_put_
 * keeps only the values' type and size), cast to fp32, multiplied in place by the weights
 * (keeps the weights and a copy of what it overwrites, fp32), summed over
 * the k slots and cast back. */
void ml__ck_moe_v2(ml_chain *ch, ml_cblock *b, const ml_model *m, const ml_ck_dims *d,
                   unsigned src_bpe)
{
    const unsigned a = ch->prec.a, w = src_bpe;
    const uint64_t E = m->experts, k = m->experts_per_tok;
    const uint64_t F = m->expert_ffn ? m->expert_ffn : d->F;
    deepseek_expert_params(ch, b, m, d, F);
    router_fp32_linear(ch, b, m, d, src_bpe);
    const uint64_t BTE = ml_mul(ch, d->BT, E), BTk = ml_mul(ch, d->BT, k);
    ml__ck_save(ch, b, "router softmax scores (fp32)", BTE, 4, 0);
    if (m->grouped_topk)
        ml__ck_save(ch, b, "group mask (masked_fill, bool)", BTE, 1, 0);
    ml__ck_save(ch, b, "top-k indices (int64)", BTk, 8, 0);
    ml__ck_tmp(ch, BTE, 8); /* cnts */
    const uint64_t N = ml_mul(ch, k, d->BT);
    uint64_t ND = ml_mul(ch, N, d->D), NF = ml_mul(ch, N, F);
    ml__ck_save(ch, b, "pair order (argsort, int64)", N, 8, 0);
    ml__ck_save(ch, b, "pair rows (argsort // k, int64)", N, 8, 0);
    swiglu_saves(ch, b, ND, NF, w, false, "rows sorted by expert");
    for (unsigned i = 0; i < 3; i++)
        ml__ck_weight_copy(ch, b, ml_mul(ch, ml_mul(ch, E, d->D), F));
    /* index_put_ keeps its indices and only the type and size of its
     * values (zeros_like(values) in its formula) */
    ml__ck_tmp(ch, ND, a);
    ml__ck_tmp(ch, ND, 4);
    ml__ck_save(ch, b, "outputs in pair order before the in-place mul (fp32 copy)", ND, 4, 0);
    ml__ck_save(ch, b, "scaled top-k weights (fp32)", BTk, 4, 0);
    busiest_expert(ch, d, N, E, F);
    b->flops_fwd += 3.0 * 2.0 * (double)N * (double)d->D * (double)F;
    ungated_shared(ch, b, m, d, w);
}
