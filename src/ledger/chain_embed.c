/* The transformer chains' first block (chain_transformer.c builds the
 * rest) from its op graph (graph/kit_embed.c): token ids with learned or
 * rotary positions (BERT: token types and a LayerNorm; Gemma: the sqrt(D)
 * scale) or ViT's patches (docs/inventory.md, "Embeddings"). */
#include <stdlib.h>

#include "ledger/chain_kit.h"

/* Whether a head shares the word embeddings and creates their gradient:
 * a decoder's LM head or BERT's MLM decoder (a decoder's sequence
 * classifier has no output embedding: the table's gradient is the
 * embedding's own). */
static bool tied_head(const ml_model *m)
{
    const bool enc = m->type == ML_MODEL_ENCODER;
    return m->embed.tied && ((!enc && !m->head.classes) || m->head.mlm);
}

uint64_t ml__ck_inv_freq_bytes(const ml_model *m, uint64_t dh)
{
    if (m->embed.position != ML_POS_ROPE)
        return 0;
    const uint64_t rot = m->attn.kv_lora ? m->attn.rope_dim : dh;
    return rot / 2 * 4;
}

/* The block from the op graph (graph/kit_embed.c; docs/graph.md): what the
 * graph does not hold stays here, as the builders had it: the input's
 * bytes, the rotary's inv_freq buffer, the tied table's dense gradient (a
 * backward transient), the patch conv's backward FLOPs. *taken false:
 * the graph declines it. */
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
            ch->buffer_bytes = ml_add(ch, ch->buffer_bytes, ml__ck_inv_freq_bytes(m, d->dh));
            if (tied_head(m))
                b->ws_bwd = b->tied_grad = ml_mul(ch, ml_mul(ch, d->V, d->D), ch->prec.grad);
        }
        ml__ck_graph_emit(ch, b, G, ml_mul(ch, ml_mul(ch, d->BTs, d->D), ch->prec.w));
        if (m->embed.image_size)
            b->flops_bwd = b->flops_fwd; /* weight gradient only */
    }
    free(G);
    return ML_OK;
}

ml_status ml__ck_embedding_block(ml_chain *ch, const ml_model *m, const ml_ck_dims *d)
{
    ml_cblock *b = ml__ck_begin(ch, "embedding", -1);
    if (!b)
        return ML_NOMEM;
    b->in_nograd = true; /* the model's input: token ids, or pixels */
    bool graph = false;
    if (graph_embedding(ch, b, m, d, &graph) != ML_OK)
        return ML_NOMEM;
    if (!graph)
        return ML_RANGE; /* not modelled: no other rule plans it */
    if (b->grad_view_param && d->B == 1 && !b->nnodes) {
        /* one image: expand's backward (the class token's copies) has no
         * sum to make, so the token's gradient reaches AccumulateGrad as
         * cat's narrow slice of the embeddings' (1, T, D) gradient, which
         * obeys the layout contract and is stolen as .grad
         * (accumulate_grad.h), keeping the whole storage: T - 1 rows more
         * than its own, until zero_grad */
        b->grad_view = ml_mul(ch, ml_mul(ch, d->T - 1, d->D), ch->prec.grad);
    }
    if (!m->embed.image_size && tied_head(m)) {
        /* the tied table's gradient is created by the head's backward */
        uint64_t g = ml_mul(ch, ml_mul(ch, d->V, d->D), ch->prec.grad);
        b->grad_bytes -= g;
    }
    return ML_OK;
}
