/* Multi-head latent attention (chain_kit.h): HF DeepseekV3Attention.forward
 * in transformers' modeling_deepseek_v3.py (4.5x), eager, with what
 * PyTorch's eager autograd keeps for each of its ops
 * (tools/autograd/derivatives.yaml; docs/inventory.md, "DeepSeek-V3
 * block"). Its backward runs at block level. */
#include "ledger/chain_kit.h"

/* An RMSNorm (DeepseekV3RMSNorm, LlamaRMSNorm's code) on an r-wide linear
 * output x in the compute dtype, then the linear that reads its result.
 * x.to(float32) is x itself in fp32 (pow and the mul by rsqrt save it:
 * x_elems, the storage x views) and a contiguous fp32 copy otherwise;
 * rsqrt keeps its result, `weight * h.to(input_dtype)` the cast h; the
 * result is in the wider of the weight's dtype and x's, which the next
 * linear saves (autocast: a bf16 cast of it). */
static void latent_norm(ml_chain *ch, ml_cblock *b, const ml_ck_dims *d, uint64_t r,
                        uint64_t x_elems, const char *what[3])
{
    const unsigned a = ch->prec.a, p = ch->prec.param;
    uint64_t BTr = ml_mul(ch, d->BT, r);
    ml__ck_save(ch, b, what[0], a == 4 ? x_elems : BTr, 4, 0);
    ml__ck_save(ch, b, "latent rmsnorm rsqrt", d->BT, 4, 0);
    ml__ck_save(ch, b, what[1], BTr, a, 0);
    ml__ck_param(ch, b, r, 0);
    unsigned out = p > a ? p : a;
    ml__ck_tmp(ch, BTr, out);
    if (ch->prec.autocast && out == 4)
        ml__ck_save(ch, b, what[2], BTr, 2, 0);
    else
        ml__ck_save(ch, b, what[2], BTr, out, 0);
}

/* The projections: q (q_proj, or q_a_proj, its norm and q_b_proj), the
 * compressed key/value (kv_a_proj_with_mqa: kv_lora + rope_dim wide, its
 * norm on the first kv_lora columns, kv_b_proj), in the order the module
 * registers them. */
static void mla_projections(ml_chain *ch, ml_cblock *b, const ml_model *m,
                            const ml_ck_dims *d, unsigned src_bpe, uint64_t Qw)
{
    const unsigned a = ch->prec.a;
    const uint64_t rkv = m->kv_lora, rq = m->q_lora, dr = m->rope_dim, dh = d->dh;
    const uint64_t kv_a = rkv + dr, kv_b = ml_mul(ch, d->H, dh - dr + m->v_dim);
    uint64_t BTD = ml_mul(ch, d->BT, d->D);
    /* x feeds q_proj (or q_a_proj) and kv_a_proj_with_mqa: saved once, or
     * under autocast one cast per linear */
    if (ch->prec.autocast && src_bpe == 4) {
        ml__ck_save(ch, b, "q projection input (cast copy)", BTD, 2, 0);
        ml__ck_save(ch, b, "kv_a projection input (cast copy)", BTD, 2, 0);
    } else {
        ml__ck_save(ch, b, "q and kv_a projection input", BTD, src_bpe, 0);
    }
    if (rq) {
        static const char *q_norm[3] = {"q_a output (latent rmsnorm input, fp32)",
                                        "q latent normalised (cast back)",
                                        "q_b projection input"};
        ml__ck_weight_copy(ch, b, ml_mul(ch, d->D, rq));
        ml__ck_linear(ch, b, d->D, rq, false); /* q_a_proj */
        latent_norm(ch, b, d, rq, ml_mul(ch, d->BT, rq), q_norm);
        ml__ck_weight_copy(ch, b, ml_mul(ch, rq, Qw));
        ml__ck_linear(ch, b, rq, Qw, false); /* q_b_proj */
        b->flops_fwd += 2.0 * (double)d->BT * ((double)d->D * (double)rq + (double)rq * (double)Qw);
    } else {
        ml__ck_weight_copy(ch, b, ml_mul(ch, d->D, Qw));
        ml__ck_linear(ch, b, d->D, Qw, false); /* q_proj */
        b->flops_fwd += 2.0 * (double)d->BT * (double)d->D * (double)Qw;
    }
    ml__ck_tmp(ch, ml_mul(ch, d->BT, Qw), a);
    /* the norm reads a slice of kv_a's output: in fp32 the storage it
     * saves is the whole (B*T, kv_lora + rope_dim) output */
    static const char *kv_norm[3] = {"kv_a output (latent rmsnorm input, fp32)",
                                     "kv latent normalised (cast back)", "kv_b projection input"};
    ml__ck_weight_copy(ch, b, ml_mul(ch, d->D, kv_a));
    ml__ck_linear(ch, b, d->D, kv_a, false); /* kv_a_proj_with_mqa */
    ml__ck_tmp(ch, ml_mul(ch, d->BT, kv_a), a);
    latent_norm(ch, b, d, rkv, ml_mul(ch, d->BT, kv_a), kv_norm);
    ml__ck_weight_copy(ch, b, ml_mul(ch, rkv, kv_b));
    ml__ck_linear(ch, b, rkv, kv_b, false); /* kv_b_proj */
    ml__ck_tmp(ch, ml_mul(ch, d->BT, kv_b), a);
    b->flops_fwd += 2.0 * (double)d->BT * ((double)d->D * (double)kv_a + (double)rkv * (double)kv_b);
}

void ml__ck_mla_attention(ml_chain *ch, ml_cblock *b, const ml_model *m, const ml_ck_dims *d,
                          unsigned src_bpe)
{
    const unsigned a = ch->prec.a;
    const uint64_t dh = d->dh, dv = m->v_dim;
    const uint64_t Qw = ml_mul(ch, d->H, dh), Vw = ml_mul(ch, d->H, dv);
    const uint64_t BHTT = ml__ck_mul3(ch, d->B, d->H, ml_mul(ch, d->T, d->T));
    mla_projections(ch, b, m, d, src_bpe, Qw);
    /* rotary: q * cos + rotate_half(q) * sin on the rope parts keeps only
     * cos and sin (the embedding block's); cat((pass, rot)) makes query
     * and key, (B, H, T, head_dim) each, which QK^T's bmm saves (under
     * autocast the rotated parts are fp32, so the cat is, and the matmul
     * saves bf16 casts of the same size); the value heads, a strided view
     * of kv_b's output, are copied contiguous for PV's bmm */
    ml__ck_tmp(ch, ml_mul(ch, d->BT, Qw), 4);
    ml__ck_save(ch, b, "query (cat of pass and rotated parts)", ml_mul(ch, d->BT, Qw), a, 0);
    ml__ck_save(ch, b, "key (cat of pass and shared rotated part)", ml_mul(ch, d->BT, Qw), a, 0);
    ml__ck_save(ch, b, "value contiguous copy (bmm)", ml_mul(ch, d->BT, Vw), a, 0);
    /* eager_attention_forward: the additive mask, softmax in fp32, cast to
     * the query's dtype (a copy where that is not fp32) for PV */
    ml__ck_tmp(ch, BHTT, ch->prec.autocast ? 4 : a);
    ml__ck_save(ch, b, "softmax output", BHTT, 4, ML_SV_CORE);
    if (a != 4)
        ml__ck_save(ch, b, "attention probabilities cast for PV", BHTT, a, ML_SV_CORE);
    double core = 2.0 * (double)d->B * (double)d->H * (double)d->T * (double)d->T *
                  (double)(dh + dv);
    b->flops_fwd += core;
    b->flops_core = core;
    /* the output heads, transposed contiguous, into o_proj */
    ml__ck_save(ch, b, "output projection input", ml_mul(ch, d->BT, Vw), a, 0);
    ml__ck_weight_copy(ch, b, ml_mul(ch, Vw, d->D));
    ml__ck_linear(ch, b, Vw, d->D, false); /* o_proj */
    b->flops_fwd += 2.0 * (double)d->BT * (double)Vw * (double)d->D;
    ml__ck_tmp(ch, ml_mul(ch, d->BT, d->D), a);
}
