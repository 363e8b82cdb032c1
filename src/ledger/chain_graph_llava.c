/* LLaVA's vision embeddings and projector from the op graph
 * (graph/kit_clip.c; docs/graph.md, "LLaVA"), each sized at the chain's
 * shape (chain_graph.c); chain_llava.c emits them and adds the roles. */
#include "ledger/chain_kit.h"

bool ml__ck_graph_clip_embedding(ml_chain *ch, const ml_model *m, const ml_ck_dims *vd,
                                 ml_ck_graph *G)
{
    /* the literal sizes, as the builders multiplied them */
    const mlg_clip_embed E = {
        ch->prec.autocast, ml__ck_mul3(ch, m->vision.channels, m->vision.image, m->vision.image),
        ml__ck_mul3(ch, m->vision.channels, m->vision.patch, m->vision.patch),
        vd->T ? vd->T - 1 : 0};
    ml__kit_clip_embedding(&G->g, &E);
    if (!ml__ck_graph_sized(ch, m, vd, G))
        return false;
    G->programs = false; /* the block rule, as the builders had it */
    return true;
}

bool ml__ck_llava_keeps_hidden(const ml_chain *ch, const ml_model *m, uint64_t images)
{
    return !ch->prec.autocast && (m->vision.full || images == 1);
}

bool ml__ck_graph_llava_projector(ml_chain *ch, const ml_model *m, const ml_ck_dims *vd,
                                  const ml_ck_dims *d, uint64_t n_img, ml_ck_graph *G)
{
    /* the one layout kept by the builders (chain_kit.h) */
    if (!ch->prec.autocast && m->vision.full &&
        ml_mul(ch, m->vision.hidden, ch->prec.w) > ml_mul(ch, m->hidden, 24))
        return false;
    const mlg_llava_projector P = {.autocast = ch->prec.autocast,
                                   .keeps_hidden = ml__ck_llava_keeps_hidden(ch, m, vd->B),
                                   .cast = ch->prec.a != ch->prec.w,
                                   .bias = m->vision.proj_bias,
                                   .tokens = vd->T,
                                   .images = n_img,
                                   .width = vd->D,
                                   .summed = ml_add(ch, vd->D, d->D)};
    ml__kit_llava_projector(&G->g, &P);
    if (!ml__ck_graph_sized(ch, m, d, G))
        return false;
    G->programs = false; /* the block rule, as the builders had it */
    return true;
}
