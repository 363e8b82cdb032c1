/* DeepSeek's multi-head latent attention (kit.h; transformers'
 * modeling_deepseek_v3.py, DeepseekV3Attention with
 * eager_attention_forward; docs/inventory.md, "DeepSeek-V3 block"): q
 * from q_proj, or compressed through q_a_proj, its RMSNorm and q_b_proj;
 * the keys and values from kv_a_proj_with_mqa, whose first kv_lora_rank
 * columns an RMSNorm and kv_b_proj expand into H heads of the keys' pass
 * part and the values, its last columns the rotated part every head
 * shares. Eager attention (the chain refuses sdpa and flash with it),
 * whose backward runs at block level: no node is recorded. */
#include <stddef.h>

#include "graph/kit.h"

static uint16_t act3(ml_graph *g, const char *name, uint8_t dtype, uint8_t w)
{
    return ml__graph_tensor(g, name, dtype, MLG_ACT, 3, MLG_B, MLG_T, w);
}

/* DeepseekV3RMSNorm (LlamaRMSNorm's code) of the r-wide x, a linear's
 * output or a slice of one in the compute dtype: in fp32 pow and the mul
 * by rsqrt save x itself (a slice keeps its whole storage), otherwise its
 * fp32 copy; weight * h.to(x.dtype) is in the stream's dtype (the wider of
 * the parameters' and x's). Its output is the next linear's input. */
static uint16_t latent_norm(ml_graph *g, const mlg_layer *L, uint16_t x, uint8_t r)
{
    return ml__kit_rmsnorm_of(g, &L->latent, x, false, r, MLG_STREAM);
}

/* A bias-free linear (in -> out) of a latent norm's output x (autocast's
 * copies of x and the weight made here) into y. */
static mlg_op *linear(ml_graph *g, const mlg_layer *L, const char *name, const char *node,
                      uint8_t in, uint8_t out, uint16_t x, uint16_t y)
{
    const mlg_linear lin = {name, node, in, out, false};
    mlg_op *o = ml__kit_linear(g, L, &lin, x, y);
    ml__op_gout(o, y);
    return o;
}

/* q: q_proj(h), or q_b_proj(q_a_layernorm(q_a_proj(h))); cq autocast's
 * copy of h for its first linear. */
static uint16_t queries(ml_graph *g, const mlg_layer *L, uint16_t h, uint16_t cq)
{
    uint16_t q = act3(g, "q projection output", MLG_COMPUTE, MLG_DQ);
    if (q != MLG_NONE)
        g->t[q].flags |= MLG_T_TMP;
    const uint8_t first = L->attn.q_lora ? MLG_RQ : MLG_DQ;
    const uint16_t w = ml__kit_weight_copy(g, L, MLG_D, first);
    if (!L->attn.q_lora) {
        const mlg_linear lin = {"mm (q_proj)", "MmBackward0 (q_proj)", MLG_D, MLG_DQ, false};
        ml__op_gout(ml__kit_linear_with(g, &lin, h, cq, w, q), q);
        return q;
    }
    const uint16_t qa = act3(g, "q_a output (latent rmsnorm input)", MLG_COMPUTE, MLG_RQ);
    const mlg_linear lin = {"mm (q_a_proj)", "MmBackward0 (q_a_proj)", MLG_D, MLG_RQ, false};
    ml__op_gout(ml__kit_linear_with(g, &lin, h, cq, w, qa), qa);
    const uint16_t y = latent_norm(g, L, qa, MLG_RQ);
    mlg_op *o = linear(g, L, "mm (q_b_proj)", "MmBackward0 (q_b_proj)", MLG_RQ, MLG_DQ, y, q);
    ml__op_free(o, y);
    ml__op_free(o, qa);
    return q;
}

/* softmax(scores + mask, dtype=fp32) (the mask, in the stream's dtype,
 * promotes the sum under autocast), saving its result, cast to the
 * compute dtype for PV (.to(query.dtype), then autocast's cast), and the
 * PV matmul with the values' contiguous copy vc (of a strided view of
 * kv_b's output; MLG_NONE: a batch of one, whose view of kv_b's output
 * the matmul saves); returns its output. */
static uint16_t core(ml_graph *g, const mlg_layer *L, uint16_t qb, uint16_t kb, uint16_t kvb,
                     uint16_t vc)
{
    uint16_t S1 = ml__kit_scores(g, "scores (q k^T)", MLG_COMPUTE, MLG_T_TMP);
    ml__kit_qk(g, qb, kb, S1);
    uint16_t S2 = ml__kit_scale(g, S1);
    uint16_t S3 = ml__kit_scores(g, "scores + mask", MLG_STREAM, MLG_T_TMP);
    ml__op_free(ml__graph_step(g, MLG_OP_ELEMENTWISE, "add (causal mask)", S2, S3, NULL), S2);
    uint16_t P = ml__kit_scores(g, "softmax output", MLG_FP32, MLG_T_CORE);
    mlg_op *o = ml__graph_step(g, MLG_OP_SOFTMAX, "softmax", S3, P, "SoftmaxBackward0");
    ml__op_save(o, P);
    ml__op_free(o, S3);
    const uint16_t probs = L->attn.probs_cast ? ml__kit_probs_cast(g, P) : P;
    if (vc != MLG_NONE)
        ml__graph_step(g, MLG_OP_COPY, "contiguous (value for bmm)", kvb, vc, NULL);
    uint16_t O = act3(g, "attention output (P v)", MLG_COMPUTE, MLG_VO);
    o = ml__kit_pv_into(g, probs, vc != MLG_NONE ? vc : kvb, O, MLG_DV);
    ml__op_free(o, vc);
    ml__op_free(o, probs); /* the cast dropped P's reference */
    return O;
}

uint16_t ml__kit_mla_attention(ml_graph *g, const mlg_layer *L, uint16_t h)
{
    /* h feeds q's first linear and kv_a_proj_with_mqa: saved once, or under
     * autocast cast once for each */
    const uint16_t cq = ml__kit_cast_copy(g, L, h), ckv = ml__kit_cast_copy(g, L, h);
    const uint16_t q = queries(g, L, h, cq);
    const uint16_t w = ml__kit_weight_copy(g, L, MLG_D, MLG_KVA);
    uint16_t kva = act3(g, "kv_a output", MLG_COMPUTE, MLG_KVA);
    if (kva != MLG_NONE)
        g->t[kva].flags |= MLG_T_TMP;
    const mlg_linear lin = {"mm (kv_a_proj_with_mqa)", "MmBackward0 (kv_a_proj_with_mqa)", MLG_D,
                            MLG_KVA, false};
    ml__op_gout(ml__kit_linear_with(g, &lin, h, ckv, w, kva), kva);
    const uint16_t kp = ml__graph_view(g, "k_pass (compressed)", kva, 3, MLG_B, MLG_T, MLG_RKV);
    const uint16_t y = latent_norm(g, L, kp, MLG_RKV);
    uint16_t kvb = act3(g, "kv_b output", MLG_COMPUTE, MLG_KVB);
    if (kvb != MLG_NONE)
        g->t[kvb].flags |= MLG_T_TMP;
    ml__op_free(linear(g, L, "mm (kv_b_proj)", "MmBackward0 (kv_b_proj)", MLG_RKV, MLG_KVB, y, kvb),
                y);
    /* the rotary on q's and the shared key's rotated parts, and the cats
     * into the (B, H, T, dh) query and key (fp32 under autocast, where the
     * rotated parts are; autocast's matmul saves bf16 copies). Its small
     * products are not listed; the block rule counts one fp32 tensor of
     * q's size for them in every precision, as the builders do */
    uint16_t rot = act3(g, "rotary (the block rule's)", MLG_FP32, MLG_DQ);
    if (rot != MLG_NONE)
        g->t[rot].flags |= MLG_T_TMP;
    uint16_t qs = act3(g, "query (cat of pass and rotated parts)", MLG_STREAM, MLG_DQ);
    uint16_t ks = act3(g, "key (cat of pass and shared rotated part)", MLG_STREAM, MLG_DQ);
    ml__op_free(ml__graph_step(g, MLG_OP_ELEMENTWISE, "rotary, cat (query)", q, qs, NULL), q);
    mlg_op *o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "rotary, expand, cat (key)", kvb, ks, NULL);
    ml__op_in(o, kva);
    const uint16_t cqs = ml__kit_cast_copy(g, L, qs), cks = ml__kit_cast_copy(g, L, ks);
    ml__kit_cast_ops(g, qs, cqs, MLG_NONE, MLG_NONE);
    ml__kit_cast_ops(g, ks, cks, MLG_NONE, MLG_NONE);
    const uint16_t qb = cqs != MLG_NONE ? cqs : qs, kb = cks != MLG_NONE ? cks : ks;
    const uint16_t vc = L->attn.fold_views
                            ? MLG_NONE
                            : act3(g, "value contiguous copy (bmm)", MLG_COMPUTE, MLG_VO);
    const uint16_t O = core(g, L, qb, kb, kvb, vc);
    /* transpose(1, 2).contiguous(), then o_proj */
    uint16_t Oc = act3(g, "output projection input", MLG_COMPUTE, MLG_VO);
    /* (its node a view for a batch of one: ml__kit_attention_out) */
    o = ml__graph_step(g, MLG_OP_COPY, "contiguous (attention output)", O, Oc,
                       L->attn.fold_views ? NULL : "UnsafeViewBackward0 (attention output)");
    ml__op_free(o, O);
    uint16_t A = act3(g, "output projection output", MLG_COMPUTE, MLG_D);
    if (A != MLG_NONE)
        g->t[A].flags |= MLG_T_TMP;
    const mlg_linear out = {"mm (o_proj)", "MmBackward0 (o_proj)", MLG_VO, MLG_D, false};
    ml__op_free(ml__kit_linear(g, L, &out, Oc, A), Oc);
    /* the attention returns: its locals go */
    const uint16_t go[2][3] = {{kva, kvb, qs}, {ks, cqs, cks}};
    for (unsigned i = 0; i < 2; i++)
        ml__kit_free_storages(g, ml__graph_release(g, "attention returns"), go[i], 3);
    return A;
}
