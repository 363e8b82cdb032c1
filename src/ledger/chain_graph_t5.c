/* T5's blocks from the op graph (graph/kit_t5.h; docs/graph.md, "T5's
 * layers"): the embeddings, the layers, the encoder's final norm and the
 * head, each sized at the chain's shape (chain_graph.c). */
#include "graph/kit_embed.h"
#include "graph/kit_t5.h"
#include "ledger/chain_kit.h"

bool ml__ck_graph_t5_embedding(ml_chain *ch, const ml_model *m, const ml_ck_dims *d, bool shared,
                               ml_ck_graph *G)
{
    /* T5Stack's embed_tokens then its dropout: no positions, no scale */
    const mlg_embed E = {.dropout = d->drop, .autocast = ch->prec.autocast};
    ml__kit_embedding(&G->g, &E);
    for (uint16_t t = 0; shared && t < G->g.nt; t++)
        if (G->g.t[t].role == MLG_PARAMETER)
            G->g.t[t].flags |= MLG_T_SHARED;
    if (!ml__ck_graph_sized(ch, m, d, G))
        return false;
    ml__ck_graph_dtype_bytes(ch, G);
    G->programs = false; /* the builders had none: the block rule */
    return true;
}

bool ml__ck_graph_t5(ml_chain *ch, const ml_model *m, const ml_ck_dims *d, uint64_t Ts,
                     bool decoder, bool first, ml_ck_graph *G)
{
    mlg_t5 L;
    const mlg_config c = ml__ck_graph_config(ch, m);
    if (!ml__family_t5_layer(m, &c, decoder, first, &L))
        return false;
    ml__kit_t5_layer(&G->g, &L);
    if (!ml__ck_graph_sized(ch, m, d, G))
        return false;
    G->z.dim[MLG_TS] = Ts;
    G->z.dim[MLG_NB] = m->rel_buckets;
    ml__ck_graph_dtype_bytes(ch, G);
    /* the block rule's transients, as the chain builders had them */
    G->programs = false;
    return true;
}

bool ml__ck_graph_t5_final(ml_chain *ch, const ml_model *m, const ml_ck_dims *d, ml_ck_graph *G)
{
    mlg_t5 L;
    const mlg_config c = ml__ck_graph_config(ch, m);
    if (!ml__family_t5_layer(m, &c, false, false, &L))
        return false;
    ml__kit_t5_final(&G->g, &L);
    if (!ml__ck_graph_sized(ch, m, d, G))
        return false;
    ml__ck_graph_dtype_bytes(ch, G);
    G->programs = false; /* the block rule, as the builders had it */
    return true;
}

bool ml__ck_graph_t5_head(ml_chain *ch, const ml_model *m, const ml_ck_dims *d, ml_ck_graph *G)
{
    mlg_t5 L;
    const mlg_config c = ml__ck_graph_config(ch, m);
    if (!ml__family_t5_layer(m, &c, true, false, &L))
        return false;
    ml__kit_t5_head(&G->g, &L, m->tied_embeddings);
    if (!ml__ck_graph_sized(ch, m, d, G))
        return false;
    ml__ck_graph_dtype_bytes(ch, G);
    G->programs = false; /* the block rule, as the builders had it */
    return true;
}
