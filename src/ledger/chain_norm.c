/* The transformer blocks' norms (chain_transformer.c): LayerNorm, HF
 * LlamaRMSNorm and HF GemmaRMSNorm, with what eager autograd keeps for each
 * and their backward nodes (docs/inventory.md, "Llama block", "Gemma
 * block", "Gemma 2 block"; docs/ledger.md, "Backward, node by node"). */
#include "ledger/chain_kit.h"

/* The RMSNorms: x in fp32 (x itself, or a copy when x is bf16/fp16: xw
 * bytes per element), pow(2) and the mul by rsqrt save it; rsqrt saves its
 * result; the scale saves the normalised h: HF LlamaRMSNorm's weight *
 * h.to(dtype) the cast h, HF GemmaRMSNorm's h * (1 + weight.float()) the
 * fp32 h and, since h needs a gradient, the fp32 (1 + weight) vector
 * (D * 4 B); its result is cast back (.type_as(x): nothing saved). */
static unsigned rmsnorm_fwd(ml_chain *ch, ml_cblock *b, const ml_model *m,
                            const ml_ck_dims *d, const ml_ck_norm_io *io, uint64_t *params)
{
    const unsigned w = io->xw, g = ch->prec.grad;
    const bool gemma = m->norms.kind == ML_NORM_GEMMA_RMSNORM;
    uint64_t BTD = ml_mul(ch, d->BT, d->D);
    uint64_t gD = ml_mul(ch, BTD, w);
    size_t s0, s1, s2, s3 = SIZE_MAX;
    if (w == 4)
        s0 = ml__ck_save(ch, b, "rmsnorm input", BTD, 4, io->xflags);
    else
        s0 = ml__ck_save(ch, b, "rmsnorm fp32 copy of input", BTD, 4, 0);
    s1 = ml__ck_save(ch, b, "rmsnorm rsqrt", d->BT, 4, 0);
    if (gemma) {
        s2 = ml__ck_save(ch, b, "rmsnorm normalised (fp32)", BTD, 4, 0);
        s3 = ml__ck_save(ch, b, "rmsnorm 1 + weight (fp32)", d->D, 4, 0);
    } else {
        s2 = ml__ck_save(ch, b, w == 4 ? "rmsnorm normalised" : "rmsnorm normalised (cast back)",
                         BTD, w, 0);
    }
    *params = d->D;
    ml__ck_tmp(ch, BTD, w);
    /* backward, in execution order: the scale (its weight gradient sums
     * grad * h, a scratch of x's size; Gemma's add of 1 passes it on), x *
     * rsqrt (the same for rsqrt's), its x gradient into x's buffer (or the
     * buffer, when none exists); rsqrt; mean (expands to x's size); pow; its
     * x gradient into the buffer (derivatives.yaml: mul, add, rsqrt, mean,
     * pow). Recorded for fp32 only, where Gemma's casts are no-ops. The
     * output's gradient is freed by the scale's node unless the residual's
     * buffer holds it (out_held: Gemma 2's post norms). */
    uint64_t gR = ml_mul(ch, d->BT, 4);
    ml__ck_accum(ch, b, gD);
    ml__ck_node(ch, b, "PowBackward0 (x^2)", gD, 0, gD, s0, SIZE_MAX);
    ml__ck_node(ch, b, "MeanBackward1", gD, 0, gR, SIZE_MAX, SIZE_MAX);
    ml__ck_node(ch, b, "RsqrtBackward0", gR, 0, gR, s1, SIZE_MAX);
    if (io->xbuf)
        ml__ck_accum(ch, b, gD);
    ml__ck_node(ch, b, "MulBackward0 (x * rsqrt)", ml_add(ch, gD, gR), 0, gD, SIZE_MAX, SIZE_MAX);
    ml__ck_node_scratch(ch, b, gD);
    ml__ck_node(ch, b, gemma ? "MulBackward0 (h * (1 + weight))" : "MulBackward0 (weight * h)",
                gD, ml_mul(ch, d->D, g), io->out_held ? 0 : gD, s2, s3);
    ml__ck_node_scratch(ch, b, gD);
    return w;
}

unsigned ml__ck_norm_fwd(ml_chain *ch, ml_cblock *b, const ml_model *m, const ml_ck_dims *d,
                         const ml_ck_norm_io *io, uint64_t *params)
{
    const unsigned w = io->xw, g = ch->prec.grad;
    uint64_t BTD = ml_mul(ch, d->BT, d->D);
    uint64_t gD = ml_mul(ch, BTD, w);
    if (m->norms.kind == ML_NORM_LAYERNORM) {
        /* native_layer_norm saves input, mean and rstd (fp32 per row) */
        size_t s0 = ml__ck_save(ch, b, "layernorm input", BTD, w, io->xflags);
        size_t s1 = ml__ck_save(ch, b, "layernorm mean+rstd", ml_mul(ch, d->BT, 2), 4, 0);
        *params = m->norms.bias ? 2 * d->D : d->D;
        ml__ck_tmp(ch, BTD, w);
        if (io->xbuf)
            ml__ck_accum(ch, b, gD);
        ml__ck_node(ch, b, "NativeLayerNormBackward0", gD, ml_mul(ch, *params, g),
                    io->out_held ? 0 : gD, s0, s1);
        return w;
    }
    return rmsnorm_fwd(ch, b, m, d, io, params);
}

unsigned ml__ck_stream_norm(ml_chain *ch, ml_cblock *b, const ml_model *m, const ml_ck_dims *d,
                            unsigned xflags, uint64_t *params, bool xbuf)
{
    const ml_ck_norm_io io = {ch->prec.w, xflags, xbuf, false};
    return ml__ck_norm_fwd(ch, b, m, d, &io, params);
}

/* A norm's np parameters as the module registers them: the weight (D),
 * then a LayerNorm's bias. */
void ml__ck_norm_params(ml_chain *ch, ml_cblock *b, uint64_t np, uint64_t D)
{
    ml__ck_param(ch, b, D, 0);
    if (np > D)
        ml__ck_param(ch, b, np - D, 0);
}
