/* The transformer chains' first block (chain_transformer.c builds the
 * rest): token ids with learned or rotary positions (BERT: token types and
 * a LayerNorm; Gemma: the sqrt(D) scale) or ViT's patches, with what eager
 * autograd keeps for each (docs/inventory.md, "Embeddings"). */
#include <stdlib.h>

#include "ledger/chain_kit.h"

/* ViT: conv patchify (its input needs no grad), class token, positions. */
static void patch_embedding(ml_chain *ch, ml_cblock *b, const ml_model *m, const ml_ck_dims *d)
{
    const unsigned w = ch->prec.w;
    uint64_t px = ml_mul(ch, ml__ck_mul3(ch, d->B, m->embed.channels, m->embed.image_size),
                         m->embed.image_size);
    if (ch->prec.autocast)
        ml__ck_save(ch, b, "image cast copy (patch conv input)", px, 2, 0);
    else
        ml__ck_save(ch, b, "image (patch conv input)", px, w, ML_SV_INPUT);
    uint64_t kin = ml__ck_mul3(ch, m->embed.channels, m->embed.patch_size, m->embed.patch_size);
    /* autocast casts the conv's weight (ConvolutionBackward0 saves it) */
    ml__ck_weight_copy(ch, b, ml_mul(ch, d->D, kin));
    ml__ck_param(ch, b, d->D, kin);
    ml__ck_param(ch, b, d->D, 0);
    ml__ck_param(ch, b, d->D, 0);                  /* class token */
    ml__ck_param(ch, b, ml_mul(ch, d->T, d->D), 0); /* positions */
    b->flops_fwd = 2.0 * (double)d->B * (double)(d->T - 1) * (double)kin * (double)d->D;
    b->flops_bwd = b->flops_fwd; /* weight gradient only */
    ml__ck_tmp(ch, ml_mul(ch, d->BT, d->D), ch->prec.a);
    b->in_bytes = ml_mul(ch, px, w);
}

/* Token embedding with learned or rotary positions (BERT: token types and
 * a LayerNorm). */
/* Whether a head shares the word embeddings and creates their gradient:
 * a decoder's LM head or BERT's MLM decoder (a decoder's sequence
 * classifier has no output embedding: the table's gradient is the
 * embedding's own). */
static bool tied_head(const ml_model *m)
{
    const bool enc = m->type == ML_MODEL_ENCODER;
    return m->embed.tied && ((!enc && !m->head.classes) || m->head.mlm);
}

static void token_embedding(ml_chain *ch, ml_cblock *b, const ml_model *m, const ml_ck_dims *d)
{
    const unsigned w = ch->prec.w;
    const bool enc = m->type == ML_MODEL_ENCODER;
    uint64_t BTD = ml_mul(ch, d->BT, d->D);
    ml__ck_save(ch, b, "token ids (int64)", d->BT, 8, ML_SV_INPUT);
    b->in_bytes = ml_mul(ch, d->BT, 8);
    ml__ck_param(ch, b, d->V, d->D);
    /* Gemma: embeds * normalizer, sqrt(D) as a 0-dim tensor made without a
     * device (modeling_gemma.py, GemmaModel.forward): mul saves it for the
     * embedding's gradient (derivatives.yaml, mul.Tensor: self's gradient is
     * grad * other), a host tensor on a GPU, so nothing on the device; the
     * product is the block's output and the lookup's result a transient */
    if (m->embed.scale)
        ml__ck_tmp(ch, BTD, w);
    if (m->embed.position == ML_POS_LEARNED) {
        ml__ck_save(ch, b, "position ids (int64)", d->T, 8, 0);
        ml__ck_param(ch, b, m->embed.max_positions, d->D);
    }
    if (enc && m->embed.token_types) {
        ml__ck_save(ch, b, "token type ids (int64)", d->BT, 8, 0);
        ml__ck_param(ch, b, m->embed.token_types, d->D);
    }
    if (m->embed.position == ML_POS_ROPE) {
        /* multi-head latent attention rotates rope_dim of each head */
        const uint64_t rot = m->attn.kv_lora ? m->attn.rope_dim : d->dh;
        if (m->embed.rope_complex) /* DeepSeek-V2: (B, T, rot / 2) complex64 */
            ml__ck_save(ch, b, "rotary freqs_cis, complex64 (shared by all blocks)",
                        ml_mul(ch, d->BT, rot), 4, 0);
        else
            ml__ck_save(ch, b, "rotary cos and sin (shared by all blocks)",
                        ml__ck_mul3(ch, 2, d->BT, rot), w, 0);
        /* the model's rotary embedding registers inv_freq, head_dim / 2
         * fp32 values, as a buffer (modeling_llama.py, LlamaRotaryEmbedding,
         * one per model) */
        ch->buffer_bytes = ml_add(ch, ch->buffer_bytes, ml_mul(ch, rot / 2, 4));
    }
    if (enc) {
        /* BERT: LayerNorm(word + position + type) then dropout */
        ml__ck_save(ch, b, "embedding layernorm input", BTD, w, 0);
        ml__ck_save(ch, b, "embedding layernorm mean+rstd", ml_mul(ch, d->BT, 2), 4, 0);
        ml__ck_param(ch, b, d->D, 0);
        ml__ck_param(ch, b, d->D, 0);
    }
    ml__ck_tmp(ch, BTD, w);
    /* embedding backward builds a dense (V, D) gradient; with tied
     * weights (a decoder's LM head, BERT's MLM decoder) .grad already
     * exists (head backward ran first) and it is added in place, so the
     * dense copy is a transient */
    if (tied_head(m))
        b->ws_bwd = ml_mul(ch, ml_mul(ch, d->V, d->D), ch->prec.grad);
}

/* The block from the op graph (graph/kit_embed.c; docs/graph.md): what the
 * graph does not hold stays here, as the builders had it: the input's
 * bytes, the rotary's inv_freq buffer, the tied table's dense gradient (a
 * backward transient), the patch conv's backward FLOPs. False: the graph
 * declines it (the builders run). */
static ml_status graph_embedding(ml_chain *ch, ml_cblock *b, const ml_model *m,
                                 const ml_ck_dims *d, bool *taken)
{
    ml_ck_graph *G = malloc(sizeof *G);
    if (!G)
        return ML_NOMEM;
    *taken = ml__ck_graph_embedding(ch, m, d, G);
    if (*taken) {
        if (m->embed.image_size) {
            uint64_t px = ml_mul(ch, ml__ck_mul3(ch, d->B, m->embed.channels, m->embed.image_size),
                                 m->embed.image_size);
            b->in_bytes = ml_mul(ch, px, ch->prec.w);
        } else {
            b->in_bytes = ml_mul(ch, d->BT, 8);
            if (m->embed.position == ML_POS_ROPE) {
                const uint64_t rot = m->attn.kv_lora ? m->attn.rope_dim : d->dh;
                ch->buffer_bytes = ml_add(ch, ch->buffer_bytes, ml_mul(ch, rot / 2, 4));
            }
            if (tied_head(m))
                b->ws_bwd = ml_mul(ch, ml_mul(ch, d->V, d->D), ch->prec.grad);
        }
        ml__ck_graph_emit(ch, b, G, ml_mul(ch, ml_mul(ch, d->BT, d->D), ch->prec.w));
        if (m->embed.image_size)
            b->flops_bwd = b->flops_fwd; /* weight gradient only */
    }
    free(G);
    return ML_OK;
}

ml_status ml__ck_embedding_block(ml_chain *ch, const ml_model *m, const ml_ck_dims *d)
{
    uint64_t BTD = ml_mul(ch, d->BT, d->D);
    ml_cblock *b = ml__ck_begin(ch, "embedding", -1);
    if (!b)
        return ML_NOMEM;
    bool graph = false;
    if (!ch->builders_only && graph_embedding(ch, b, m, d, &graph) != ML_OK)
        return ML_NOMEM;
    if (!graph) {
        if (m->embed.image_size)
            patch_embedding(ch, b, m, d);
        else
            token_embedding(ch, b, m, d);
        if (d->drop)
            ml__ck_save(ch, b, "embedding dropout mask", BTD, 1, 0);
        ml__ck_end(ch, b, ml_mul(ch, BTD, ch->prec.w));
    }
    if (!m->embed.image_size && tied_head(m)) {
        /* the tied table's gradient is created by the head's backward */
        uint64_t g = ml_mul(ch, ml_mul(ch, d->V, d->D), ch->prec.grad);
        b->grad_bytes -= g;
    }
    return ML_OK;
}
