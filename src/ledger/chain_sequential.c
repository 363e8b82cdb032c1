/* Sequential chains (MLPs, ResNets, small attention stacks): a block per
 * `layers:` entry from its op graph (graph/kit_seq.c; docs/graph.md,
 * "Sequential layers"), then the loss block from the loss's graph; a layer
 * the graph declines is refused, never planned by another rule. Sources in
 * docs/inventory.md. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ledger/chain_kit.h"
#include "model/shape.h"
#include "util/error.h"

/* A tensor flowing between layers: the block boundary (see chain.h). */
typedef struct {
    uint64_t elems; /* whole micro-batch */
    unsigned bpe;
    bool model_input; /* needs no gradient */
} tref;

static uint64_t ref_bytes(ml_chain *ch, const tref *t)
{
    return ml_mul(ch, t->elems, t->bpe);
}

/* Block b from the op graph of layer l on x (graph/kit_seq.c,
 * chain_graph.c), x then its output; false when the graph declines the
 * layer (*overflow: a size past 64 bits). */
static bool graph_block(ml_chain *ch, ml_cblock *b, const ml_layer *l, tref *x, ml_shape *sh,
                        ml_ck_graph *G, bool *overflow)
{
    mlg_seq_block info;
    if (!ml__ck_graph_seq(ch, l, sh, x->bpe, x->model_input, G, &info)) {
        *overflow = info.overflow;
        return false;
    }
    b->inplace = info.inplace;
    b->identity = info.identity;
    b->nodes_off = info.nodes_off || (ch->record_nodes && info.nodes_off_recorded);
    /* the batch norms' buffers: running_mean and running_var (the
     * parameters' dtype), num_batches_tracked (int64;
     * torch/nn/modules/batchnorm.py) */
    uint64_t stats = ml_mul(ch, ml_mul(ch, 2, info.bn_channels), ch->prec.param);
    ch->buffer_bytes = ml_add(ch, ch->buffer_bytes, ml_add(ch, stats, ml_mul(ch, 8, info.nbn)));
    ml__ck_graph_emit(ch, b, G, G->tb[G->g.out]);
    /* backward FLOPs: a matmul's twice its forward, once on the model's
     * input; an attention layer's none (docs/graph.md) */
    for (uint16_t k = 0; k < G->g.nop; k++) {
        const double f = info.attn_op[k] ? 0 : ml__graph_op_flops(&G->g.op[k], &G->z);
        if (f > 0)
            b->flops_bwd += G->g.op[k].ngin ? 2 * f : f;
    }
    /* the builders' core FLOPs: one attention layer's however many the
     * block holds (all of one size; docs/graph.md, "Sequential layers") */
    if (info.attention) {
        b->flops_core = 0;
        for (uint16_t k = info.attn_last; k < G->g.nop; k++)
            if (G->g.op[k].core)
                b->flops_core += ml__graph_op_flops(&G->g.op[k], &G->z);
    }
    *sh = info.shape;
    if (!info.identity)
        *x = (tref){ml_mul(ch, ch->B, info.out_ps), info.out_bytes, false};
    return true;
}

/* The loss on the model output x: cross-entropy (log_softmax + nll_loss)
 * or mean squared error; its inventory the op graph's (graph/kit_head.c),
 * the figures the block rule's. ML_RANGE: the graph declines it. */
static ml_status seq_loss(ml_chain *ch, const ml_model *m, const tref *x, const ml_shape *sh,
                          uint64_t B, ml_error *err)
{
    ml_cblock *b = ml__ck_begin(ch, "loss", -1);
    if (!b)
        return ML_NOMEM;
    b->fwd_phase = ML_PHASE_LOSS;
    bool graph = false;
    const unsigned lsb = ch->prec.autocast ? 4 : ch->prec.w;
    const bool ce = m->loss == ML_LOSS_CROSS_ENTROPY;
    const uint64_t rows = ce && sh->rank == 2 ? ml_mul(ch, B, sh->d[0]) : B;
    if (ml__ck_seq_loss_graph(ch, b, ce, rows, x->elems, x->bpe, &graph))
        return ML_NOMEM;
    if (!graph && !ch->overflow)
        return ml__errorf(err, ML_RANGE, "%s: its loss is not modelled: the op graph declines it",
                          m->name);
    b->in_bytes = ml_mul(ch, x->elems, x->bpe);
    b->in_held = b->ws_formula = true; /* the caller holds the model output */
    b->ws_fwd = ch->prec.autocast ? ml_mul(ch, x->elems, 4) : 0;
    b->unit_fwd = b->ws_fwd;
    if (!ce) {
        /* the elementwise loss, then its mean (ATen's Loss.cpp) */
        b->unit_fwd = ml_mul(ch, x->elems, lsb);
        b->ws_fwd = ml_add(ch, b->ws_fwd, b->unit_fwd);
    }
    b->ws_bwd = ml_mul(ch, ml_mul(ch, x->elems, lsb), 2);
    /* no_grad: what the loss saves is transient, beside the fp32 cast */
    b->ws_nograd = ml_add(ch, b->ws_fwd, b->saved_bytes);
    b->unit = ml_mul(ch, x->elems, lsb);
    return ML_OK;
}

/* The layers' blocks, one graph at a time; ML_RANGE with err written
 * when the graph declines a layer. */
static ml_status seq_blocks(const ml_model *m, ml_chain *ch, tref *x, ml_shape *sh,
                            ml_error *err)
{
    ml_ck_graph *G = malloc(sizeof *G);
    if (!G)
        return ML_NOMEM;
    ml_status st = ML_OK;
    for (size_t i = 0; i < m->nseq && st == ML_OK && !ch->overflow && !ch->nomem; i++) {
        char name[48];
        snprintf(name, sizeof name, "%zu:%s", i, ml__layer_kind_name(m->seq[i].kind));
        ml_cblock *b = ml__ck_begin(ch, name, (int)i);
        if (!b) {
            st = ML_NOMEM;
            break;
        }
        b->in_bytes = ref_bytes(ch, x);
        b->in_nograd = x->model_input;
        bool overflow = false;
        if (graph_block(ch, b, &m->seq[i], x, sh, G, &overflow))
            continue;
        if (overflow)
            ch->overflow = true;
        else
            st = ml__errorf(err, ML_RANGE,
                            "%s: model.layers[%zu] (%s) is not modelled: the op graph declines "
                            "it (two attention layers of different sizes in one entry, or "
                            "more tensors than a block's graph holds) and no other rule plans "
                            "a sequential layer",
                            m->name, i, ml__layer_kind_name(m->seq[i].kind));
    }
    free(G);
    return st;
}

ml_status ml__chain_build_sequential(const ml_model *m, const ml_config *cfg, ml_chain *ch,
                                     ml_error *err)
{
    const uint64_t B = cfg->training.micro_batch;
    ml_shape sh;
    memset(&sh, 0, sizeof sh);
    sh.rank = (unsigned)m->ninput;
    for (size_t i = 0; i < m->ninput; i++)
        sh.d[i] = m->input[i];
    sh.ids = m->seq[0].kind == ML_L_EMBEDDING;
    const uint64_t in_ps = ml__shape_elems(&sh);
    ch->B = B;
    ch->T = 1;
    ch->c_tokens = B;
    ch->c_width = in_ps;
    tref x = {ml_mul(ch, B, in_ps), sh.ids ? 8 : ch->prec.w, true};
    /* the node-level backward (docs/ledger.md): fp32 layers for now */
    ch->record_nodes = ch->prec.a == 4 && ch->prec.w == 4 && !ch->prec.autocast;
    ml_status st = seq_blocks(m, ch, &x, &sh, err);
    ch->record_nodes = false;
    ch->n_ckpt = m->nseq;
    if (st == ML_OK && !ch->overflow && !ch->nomem)
        st = seq_loss(ch, m, &x, &sh, B, err);
    return st;
}
