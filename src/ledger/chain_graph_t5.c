/* T5's blocks from the op graph (graph/kit_t5.h; docs/graph.md, "T5's
 * layers"): the embeddings, the layers, the encoder's final norm and the
 * head, each sized at the chain's shape (chain_graph.c). */
#include <stdint.h>
#include <string.h>

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
    G->z.dim[MLG_NB] = m->t5.rel_buckets;
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
    ml__kit_t5_head(&G->g, &L, m->embed.tied);
    if (!ml__ck_graph_sized(ch, m, d, G))
        return false;
    ml__ck_graph_dtype_bytes(ch, G);
    G->programs = false; /* the block rule, as the builders had it */
    return true;
}

/* Whether each tensor of g has a gradient (rg[0 .. g->nt)): a parameter's,
 * and the outputs of an op with a backward node or that reads one that has. */
static void requires_grad(const ml_graph *g, bool *rg)
{
    for (uint16_t t = 0; t < g->nt; t++)
        rg[t] = g->t[t].role == MLG_PARAMETER;
    for (uint16_t k = 0; k < g->nop; k++) {
        const mlg_op *o = &g->op[k];
        bool r = o->node != NULL || o->nparam > 0;
        for (unsigned i = 0; i < o->nin; i++)
            r = r || rg[o->in[i]];
        for (unsigned i = 0; i < o->nout; i++)
            rg[o->out[i]] = r;
    }
}

/* A new entry of S for a tensor named name (NULL: S is full). */
static ml_ck_side *made(ml_ck_sides *S, const char *name)
{
    if (S->n == sizeof S->s / sizeof S->s[0]) {
        S->refused = true;
        return NULL;
    }
    ml_ck_side *e = &S->s[S->n++];
    *e = (ml_ck_side){.name = name, .first = SIZE_MAX};
    return e;
}

/* The latest entry of S named name (NULL: none, S refused). */
static ml_ck_side *latest(ml_ck_sides *S, const char *name)
{
    for (unsigned i = S->n; i-- > 0;)
        if (!strcmp(S->s[i].name, name))
            return &S->s[i];
    S->refused = true;
    return NULL;
}

/* Block `block` reads e where an op of g reads t; whether one saves it. */
static void reads(const ml_graph *g, uint16_t t, size_t block, ml_ck_side *e)
{
    for (uint16_t k = 0; k < g->nop; k++) {
        const mlg_op *o = &g->op[k];
        for (unsigned i = 0; i < o->nin; i++)
            if (o->in[i] == t) {
                e->first = e->first == SIZE_MAX || block < e->first ? block : e->first;
                e->last = block > e->last ? block : e->last;
            }
        for (unsigned i = 0; i < o->nsave; i++)
            e->saved = e->saved || o->save[i] == t;
    }
}

void ml__ck_t5_sides_note(const ml_ck_graph *G, size_t block, size_t scope, bool layer,
                          ml_ck_sides *S)
{
    const ml_graph *g = &G->g;
    bool rg[MLG_MAX_TENSORS];
    requires_grad(g, rg);
    for (uint16_t t = 0; t < g->nt; t++) {
        if (!(g->t[t].flags & MLG_T_SIDE))
            continue;
        const bool input = g->t[t].role == MLG_INPUT;
        ml_ck_side *e = input ? latest(S, g->t[t].name) : made(S, g->t[t].name);
        if (!e)
            return;
        if (!input) {
            e->bytes = G->tb[t];
            e->from = block;
            e->scope = scope;
            e->grad = rg[t];
        }
        e->arg = e->arg || layer;
        reads(g, t, block, e);
    }
}

/* A stack's local goes when the stack returns (its scope's forward ends);
 * what the stack returns the model's forward holds to its end, or, saved
 * by a reader's op (training), until the first reader's backward, the
 * last to run. An argument of the layers is kept by a checkpointed one
 * (ckpt_kept); its gradient, where the op that makes it is differentiable,
 * runs from the last reader's backward to the maker's. */
void ml__ck_t5_sides_add(ml_chain *ch, const ml_ck_sides *S, size_t loss)
{
    for (unsigned i = 0; i < S->n; i++) {
        const ml_ck_side *e = &S->s[i];
        const bool saved = e->scope == SIZE_MAX && e->saved && !ch->eval_mode;
        const size_t to = e->scope != SIZE_MAX ? e->scope : saved ? e->first : loss;
        ml_side *s = ml__ck_side(ch, e->name, e->bytes, e->from, to);
        if (!s) /* out of memory: ch->nomem */
            continue;
        s->graph = true;
        s->to_bwd = saved;
        s->ckpt_kept = e->arg;
        if (e->grad && e->arg && !ch->eval_mode) {
            s->grad = e->bytes;
            s->grad_from = (uint32_t)e->last;
            s->grad_to = (uint32_t)e->from;
        }
    }
}

bool ml__ck_graph_t5_stack(ml_chain *ch, const ml_model *m, const ml_ck_dims *d, uint64_t Ts,
                           bool decoder, ml_ck_graph *G)
{
    mlg_t5 L;
    const mlg_config c = ml__ck_graph_config(ch, m);
    if (!ml__family_t5_layer(m, &c, decoder, false, &L))
        return false;
    L.dropout = d->drop;
    ml__kit_t5_stack(&G->g, &L);
    if (!ml__ck_graph_sized(ch, m, d, G))
        return false;
    G->z.dim[MLG_TS] = Ts;
    ml__ck_graph_dtype_bytes(ch, G);
    return true;
}
