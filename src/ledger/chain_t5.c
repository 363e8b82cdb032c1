/* T5's chain (HF T5ForConditionalGeneration, transformers 4.5x
 * modeling_t5.py): the encoder's embedding and blocks, its final norm, the
 * decoder's embedding and blocks (self-attention, cross-attention over the
 * encoder's output, feed-forward), the head and the loss. What each op
 * keeps for its backward: docs/inventory.md, "T5". The tensors that live
 * beside the stream of blocks (the position biases the stacks' loops hold,
 * the encoder's output every cross-attention reads, and their gradients)
 * are the chain's side tensors (docs/ledger.md, "Side tensors"), derived
 * from the op graphs that make and read them (chain_graph_t5.c; docs/
 * graph.md, "T5's side tensors"). The layers, the embeddings,
 * encoder.final and the head come from the op graph alone (graph/kit_t5.c,
 * kit_embed.c; t5_stack below): a block it declines, or side tensors it
 * cannot derive, are not modelled and the chain is refused (ML_RANGE). The
 * blocks keep the block-level backward rule. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "ledger/chain_kit.h"
#include "util/error.h"

typedef struct {
    uint64_t B, Ts, Td, D, I, F, H, V;
    unsigned a, w; /* the compute dtype's and the residual stream's bytes */
    bool drop;
} t5d;

/* Starts a block reading `in` bytes. */
static ml_cblock *begin(ml_chain *ch, const char *name, int ckpt, uint64_t in)
{
    ml_cblock *b = ml__ck_begin(ch, name, ckpt);
    if (b)
        b->in_bytes = in;
    return b;
}

/* An embedding of B*T ids into the shared table (dropout after), from the
 * op graph (graph/kit_embed.c): the ids are its input (saved). shared: the
 * table's gradient is not created here (its dense gradient is added into
 * .grad, a transient). ML_RANGE (why set) when the graph declines it. */
static ml_status t5_embedding(ml_chain *ch, const ml_model *m, const t5d *t, ml_ck_graph *G,
                              const char *name, uint64_t T, bool params, bool creates_grad,
                              const char **why)
{
    uint64_t BT = ml_mul(ch, t->B, T), BTD = ml_mul(ch, BT, t->D);
    ml_cblock *b = begin(ch, name, -1, ml_mul(ch, BT, 8));
    if (!b)
        return ML_NOMEM;
    b->in_nograd = true;
    const ml_ck_dims d = {.B = t->B, .T = T, .BT = BT, .D = t->D, .V = t->V, .drop = t->drop,
                          .sp = 1, .BTs = BT};
    if (!ml__ck_graph_t5_embedding(ch, m, &d, !params, G)) {
        *why = params ? "the encoder's embedding" : "the decoder's embedding";
        return ML_RANGE;
    }
    ml__ck_graph_emit(ch, b, G, ml_mul(ch, BTD, t->w));
    uint64_t g = ml_mul(ch, ml_mul(ch, t->V, t->D), ch->prec.grad);
    if (params) {
        b->grad_bytes -= g;
        b->grad_accum_bytes -= g;
    }
    if (creates_grad) {
        b->grad_bytes = ml_add(ch, b->grad_bytes, g);
        b->grad_accum_bytes = ml_add(ch, b->grad_accum_bytes, g);
    } else {
        b->ws_bwd = ml_add(ch, b->ws_bwd, g);
    }
    return ML_OK;
}

/* The name "encoder.block.<i>" or "decoder.block.<i>". */
static void stack_name(char name[48], const char *stack, uint64_t i)
{
    snprintf(name, 48, "%s.block.%llu", stack, (unsigned long long)i);
}

/* A stack's layers from T5's op graphs (graph/kit_t5.h; docs/graph.md):
 * the first layer emitted from its graph, the second from the other
 * layers' graph, the rest copies of the second (ml__ck_graph_repeat); the
 * side tensors their graphs make and read noted in S. */
typedef struct {
    ml_ck_graph *G;
    ml_ck_dims d;   /* the stack's tokens, T5's widths */
    bool decoder;
    size_t proto, pfirst, pcount; /* the second layer's block, its parameters */
    ml_ck_sides *S;
    size_t scope; /* the stack's closing block (its final_layer_norm's) */
    const char **why; /* what the graph declined */
} t5_stack;

static t5_stack stack_of(ml_chain *ch, const ml_model *m, const t5d *t, ml_ck_graph *G,
                         bool decoder, ml_ck_sides *S, const char **why)
{
    const uint64_t T = decoder ? t->Td : t->Ts;
    t5_stack s = {.G = G, .decoder = decoder, .S = S, .why = why};
    s.d = (ml_ck_dims){.B = t->B,
                       .T = T,
                       .BT = ml_mul(ch, t->B, T),
                       .sp = 1,
                       .BTs = ml_mul(ch, t->B, T),
                       .D = t->D,
                       .F = t->F,
                       .H = t->H,
                       .Hkv = t->H,
                       .dh = m->attn.head_dim,
                       .Dkv = t->I,
                       .V = t->V,
                       .drop = t->drop};
    return s;
}

/* T5Stack's own tensors (graph/kit_t5.h), made where its embedding runs
 * (the block before its first layer) and held to its closing block;
 * ML_RANGE when the graph declines them. */
static ml_status note_stack(ml_chain *ch, const ml_model *m, const t5d *t, t5_stack *s)
{
    const size_t emb = ch->n - 1;
    s->scope = ch->n + (s->decoder ? m->t5.dec_layers : m->layers);
    if (!ml__ck_graph_t5_stack(ch, m, &s->d, t->Ts, s->decoder, s->G)) {
        *s->why = s->decoder ? "the decoder stack's own tensors"
                             : "the encoder stack's own tensors";
        return ML_RANGE;
    }
    ml__ck_t5_sides_note(s->G, emb, s->scope, false, s->S);
    return ML_OK;
}

/* Layer i of stack s into b from the graph (out: its output's bytes);
 * ML_RANGE when the graph declines the layer. */
static ml_status graph_layer(ml_chain *ch, const ml_model *m, const t5d *t, t5_stack *s,
                             ml_cblock *b, uint64_t i, uint64_t out)
{
    const size_t k = (size_t)(b - ch->blocks);
    if (i >= 2) { /* G is still the second layer's */
        ml__ck_graph_repeat(ch, b, s->proto, s->pfirst, s->pcount);
        ml__ck_t5_sides_note(s->G, k, s->scope, true, s->S);
        return ML_OK;
    }
    if (!ml__ck_graph_t5(ch, m, &s->d, t->Ts, s->decoder, i == 0, s->G)) {
        *s->why = s->decoder ? "a decoder layer" : "an encoder layer";
        return ML_RANGE;
    }
    const size_t p0 = ch->nparams;
    ml__ck_graph_emit(ch, b, s->G, out);
    ml__ck_t5_sides_note(s->G, k, s->scope, true, s->S);
    s->pfirst = p0;
    s->pcount = ch->nparams - p0;
    s->proto = k;
    return ML_OK;
}

static ml_status encoder(ml_chain *ch, const ml_model *m, const t5d *t, ml_ck_graph *G,
                         ml_ck_sides *S, const char **why)
{
    t5_stack s = stack_of(ch, m, t, G, false, S, why);
    uint64_t BTD = ml_mul(ch, ml_mul(ch, t->B, t->Ts), t->D);
    ml_status st = t5_embedding(ch, m, t, G, "embedding", t->Ts, true, false, why);
    if (st || (st = note_stack(ch, m, t, &s)))
        return st;
    for (uint64_t i = 0; i < m->layers; i++) {
        char name[48];
        stack_name(name, "encoder", i);
        ml_cblock *b = begin(ch, name, (int)i, ml_mul(ch, BTD, t->w));
        if (!b)
            return ML_NOMEM;
        if ((st = graph_layer(ch, m, t, &s, b, i, ml_mul(ch, BTD, t->w))))
            return st;
    }
    /* final_layer_norm, dropout: the encoder's output */
    ml_cblock *b = begin(ch, "encoder.final", -1, ml_mul(ch, BTD, t->w));
    if (!b)
        return ML_NOMEM;
    /* its output is a side tensor; its boundary is the decoder's ids */
    if (!ml__ck_graph_t5_final(ch, m, &s.d, G)) {
        *why = "the encoder's final norm";
        return ML_RANGE;
    }
    ml__ck_graph_emit(ch, b, G, 0);
    ml__ck_t5_sides_note(G, (size_t)(b - ch->blocks), SIZE_MAX, false, S);
    b->bwd_in = 0;
    return ML_OK;
}

static ml_status decoder(ml_chain *ch, const ml_model *m, const t5d *t, ml_ck_graph *G,
                         ml_ck_sides *S, const char **why)
{
    t5_stack s = stack_of(ch, m, t, G, true, S, why);
    uint64_t BTD = ml_mul(ch, ml_mul(ch, t->B, t->Td), t->D);
    /* _shift_right(labels): the decoder's ids */
    ml_status st =
        t5_embedding(ch, m, t, G, "decoder.embedding", t->Td, false, !m->embed.tied, why);
    if (st || (st = note_stack(ch, m, t, &s)))
        return st;
    for (uint64_t i = 0; i < m->t5.dec_layers; i++) {
        char name[48];
        stack_name(name, "decoder", i);
        ml_cblock *b = begin(ch, name, (int)(m->layers + i), ml_mul(ch, BTD, t->w));
        if (!b)
            return ML_NOMEM;
        if ((st = graph_layer(ch, m, t, &s, b, i, ml_mul(ch, BTD, t->w))))
            return st;
        /* use_cache: the evaluation output holds the block's self- and
         * cross-attention keys and values (EncoderDecoderCache), H x dkv
         * wide over Td and Ts rows */
        if (m->attn.kv_cache)
            b->cache_bytes = ml_mul(ch, ml__ck_mul3(ch, 2, t->B, ml_add(ch, t->Td, t->Ts)),
                                    ml_mul(ch, t->I, t->a));
    }
    return ML_OK;
}

/* The decoder's final_layer_norm and dropout, the rescale by D^-0.5 when
 * the head is tied to the shared table (a Python float: nothing saved), and
 * lm_head; then the cross-entropy. */
static ml_status head(ml_chain *ch, const ml_model *m, const t5d *t, const ml_ck_dims *d,
                      ml_ck_graph *G, const char **why)
{
    uint64_t BT = ml_mul(ch, t->B, t->Td);
    ml_cblock *b = begin(ch, "head", -1, ml_mul(ch, ml_mul(ch, BT, t->D), t->w));
    if (!b)
        return ML_NOMEM;
    if (!ml__ck_graph_t5_head(ch, m, d, G)) {
        *why = "the head";
        return ML_RANGE;
    }
    ml__ck_graph_emit(ch, b, G, ml_mul(ch, ml_mul(ch, BT, t->V), t->a));
    if (m->embed.tied) { /* the shared table's .grad is created here */
        uint64_t g = ml_mul(ch, ml_mul(ch, t->V, t->D), ch->prec.grad);
        b->grad_bytes = ml_add(ch, b->grad_bytes, g);
        b->grad_accum_bytes = ml_add(ch, b->grad_accum_bytes, g);
    }
    ml_status st = ml__ck_ce_loss(ch, m, d, BT, t->V);
    if (st == ML_RANGE)
        *why = "the loss";
    return st;
}

/* T5's blocks from the op graphs, the side tensors noted in S; ML_RANGE
 * (why set) when the graph declines one. */
static ml_status t5_blocks(ml_chain *ch, const ml_model *m, const t5d *t, const ml_ck_dims *d,
                           ml_ck_sides *S, const char **why)
{
    ml_ck_graph *G = malloc(sizeof *G);
    if (!G)
        return ML_NOMEM;
    ml_status st = encoder(ch, m, t, G, S, why);
    if (st == ML_OK)
        st = decoder(ch, m, t, G, S, why);
    if (st == ML_OK)
        st = head(ch, m, t, d, G, why);
    free(G);
    return st;
}

ml_status ml__chain_build_t5(const ml_model *m, const ml_config *cfg, ml_chain *ch,
                             ml_error *err)
{
    const ml_training *tr = &cfg->training;
    t5d t = {.B = tr->micro_batch,
             .Ts = tr->seq_len,
             .Td = tr->target_len ? tr->target_len : tr->seq_len,
             .D = m->hidden,
             .I = ml_mul(ch, m->attn.heads, m->attn.head_dim),
             .F = m->mlp.ffn,
             .H = m->attn.heads,
             .V = m->embed.vocab,
             .a = ch->prec.a,
             .w = ch->prec.w,
             .drop = m->dropout > 0 && !ch->eval_mode};
    ml_ck_dims d = {.B = t.B, .T = t.Td, .BT = ml_mul(ch, t.B, t.Td), .D = t.D, .V = t.V,
                    .sp = 1};
    d.BTs = d.BT;
    ch->B = t.B;
    ch->T = t.Ts;
    ch->c_tokens = ml_mul(ch, t.B, t.Ts);
    ch->c_width = t.D;
    ch->record_nodes = false;
    /* every block from the op graphs: no chain builder writes T5's */
    const char *why = "its side tensors";
    ml_ck_sides S = {.refused = false};
    ml_status st = t5_blocks(ch, m, &t, &d, &S, &why);
    if (st == ML_OK && !ch->overflow && S.refused)
        st = ML_RANGE;
    if (st == ML_RANGE)
        return ml__errorf(err, ML_RANGE,
                          "%s: %s at this shape and precision is not modelled: the op graph "
                          "declines it and no other rule plans T5's blocks",
                          m->name, why);
    if (st != ML_OK || ch->overflow)
        return st;
    ch->n_ckpt = m->layers + m->t5.dec_layers;
    ml__ck_t5_sides_add(ch, &S, ch->n - 1);
    for (size_t i = 0; i < ch->n; i++)
        if (ch->blocks[i].flops_bwd == 0)
            ch->blocks[i].flops_bwd = 2.0 * ch->blocks[i].flops_fwd;
    return ML_OK;
}
