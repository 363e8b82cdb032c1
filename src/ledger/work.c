/* The work of each block's ops (work.h; docs/time.md, "What each op does"). */
#include <stdlib.h>
#include <string.h>

#include "ledger/work.h"
#include "util/grow.h"

/* An op selective checkpointing runs again: the attention core's products
 * and whatever makes the core's tensors (its mask, softmax, dropout) */
static bool core_op(const ml_graph *g, const mlg_op *o)
{
    bool core = o->core;
    for (unsigned j = 0; j < o->nout && !core; j++)
        core = (g->t[o->out[j]].flags & MLG_T_CORE) != 0;
    return core;
}

/* A new item of op o (of graph g) in the chain's list; NULL: out of
 * memory (ch->nomem set). */
static ml_work_item *item_of(ml_chain *ch, const ml_graph *g, const mlg_op *o, uint8_t kind,
                             bool bwd, unsigned kernels)
{
    ml_work_item *v = ml_grow(ch->work, ch->nwork, &ch->workcap, sizeof *v, 64);
    if (!v) {
        ch->nomem = true;
        return NULL;
    }
    ch->work = v;
    ml_work_item *it = &ch->work[ch->nwork++];
    memset(it, 0, sizeof *it);
    it->kind = kind;
    it->bwd = bwd;
    it->core = core_op(g, o);
    it->causal = o->causal;
    it->kernels = (uint8_t)(kernels > 255 ? 255 : kernels);
    return it;
}

/* The repeated group's instances (graph.h, mlg_repeat), 0 without one */
static double instances(const ml_graph *g, const ml_graph_sizes *z)
{
    double n = 0;
    for (unsigned i = 0; g->rep.t1 != g->rep.t0 && i < z->nruns; i++)
        n += (double)z->runs[i].count;
    return n;
}

/* How many times op o runs: once, or once per instance of the repeated
 * group it is in (an expert's op) */
static double runs_of(const ml_graph *g, const ml_graph_sizes *z, const mlg_op *o)
{
    const double n = instances(g, z);
    return n > 0 && ml__graph_repeated_op(g, (uint16_t)(o - g->op)) ? n : 1;
}

/* The product's shape from its output: (m x n) the last two dimensions,
 * batch the rest, or, for a linear layer (a parameter operand), one
 * product of all rows; k from the FLOPs, 2 m n k each. */
typedef struct {
    double m, n, k, batch;
    unsigned esize;
} gemm_shape;

static bool product_shape(const ml_graph *g, const ml_graph_sizes *z, const mlg_op *o,
                          double flops, gemm_shape *s)
{
    if (!o->nout || flops <= 0)
        return false;
    const mlg_tensor *t = &g->t[o->out[0]];
    bool ov = false;
    const double numel = (double)ml__graph_numel(g, z, o->out[0], &ov);
    if (ov || numel <= 0 || t->ndim == 0)
        return false;
    s->n = (double)z->dim[t->dim[t->ndim - 1]];
    if (s->n <= 0)
        return false;
    if (o->nparam || t->ndim < 2) {
        s->m = numel / s->n;
        s->batch = 1;
    } else {
        s->m = (double)z->dim[t->dim[t->ndim - 2]];
        s->batch = s->m > 0 ? numel / (s->m * s->n) : 0;
    }
    if (s->m <= 0 || s->batch <= 0)
        return false;
    s->k = flops / (2.0 * numel);
    s->esize = z->bytes[t->dtype];
    /* the repeated group's op (an expert's linear) stands for all its
     * instances, its FLOPs theirs together (graph.h): one product each, on
     * an instance's rows on average */
    const double inst = runs_of(g, z, o);
    if (inst > 1 && o->nparam) {
        double rows = 0;
        for (unsigned i = 0; i < z->nruns; i++)
            rows += (double)z->runs[i].count * (double)z->runs[i].size;
        s->m = rows / inst;
        s->batch = inst;
        s->k = s->m > 0 ? flops / (2.0 * s->m * s->n * inst) : 0;
        return s->m > 0 && s->k > 0;
    }
    return true;
}

static void set_product(ml_work_item *it, double m, double n, double k, const gemm_shape *s)
{
    it->m = m;
    it->n = n;
    it->k = k;
    it->batch = s->batch;
    it->esize = (uint8_t)s->esize;
    it->flops = 2.0 * m * n * k * s->batch;
    it->bytes = (m * k + k * n + m * n) * s->batch * s->esize;
}

/* The op's forward: its traffic (ml__graph_traffic's), each instance's */
static void forward(ml_chain *ch, const ml_graph *g, const ml_graph_sizes *z, const mlg_op *o,
                    const ml_graph_traffic *tr)
{
    const double inst = runs_of(g, z, o);
    ml_work_item *it = item_of(ch, g, o, o->kind, false, (unsigned)(tr->kernels * inst));
    if (!it)
        return;
    it->flops = ml__graph_op_flops(o, z);
    gemm_shape s;
    if (o->kind == MLG_OP_MATMUL && product_shape(g, z, o, it->flops, &s))
        set_product(it, s.m, s.n, s.k, &s);
    else
        it->bytes = (double)(tr->read + tr->written) * inst;
}

/* The node of a product: the gradient of each operand is a product of the
 * same FLOPs, (m x n) by (n x k) for the first, (k x m) by (m x n) for the
 * second or the weight. */
static void backward_product(ml_chain *ch, const ml_graph *g, const ml_graph_sizes *z,
                             const mlg_op *o, double flops)
{
    gemm_shape s;
    if (!product_shape(g, z, o, flops, &s))
        return;
    /* a linear layer: its input's gradient when it takes one, its weight's;
     * a product of two activations (attention's): both, whichever tensors
     * the node lists (q and k may be views of one projection) */
    const unsigned grads = o->nparam ? o->ngin + 1u : o->nin >= 2 ? 2u : o->ngin;
    /* one launch each (a grouped expert's: one per instance) */
    const unsigned launches = (unsigned)runs_of(g, z, o);
    for (unsigned j = 0; j < grads && j < 2; j++) {
        ml_work_item *it = item_of(ch, g, o, MLG_OP_MATMUL, true, launches);
        if (!it)
            return;
        if (j == 0 && o->ngin)
            set_product(it, s.m, s.k, s.n, &s);
        else
            set_product(it, s.k, s.n, s.m, &s);
    }
}

/* Any other node reads its output's gradient and what it saved, and writes
 * its inputs' and parameters' gradients: one pass over each. */
static void backward(ml_chain *ch, const ml_graph *g, const ml_graph_sizes *z,
                     const uint64_t *tb, const mlg_op *o)
{
    const double flops = ml__graph_op_flops(o, z);
    if (o->kind == MLG_OP_MATMUL && flops > 0) {
        backward_product(ch, g, z, o, flops);
        return;
    }
    const double inst = runs_of(g, z, o);
    const unsigned kernels = (unsigned)((o->kernels ? o->kernels : 1) * inst);
    ml_work_item *it = item_of(ch, g, o, o->kind, true, kernels);
    if (!it)
        return;
    /* a fused attention kernel's backward: 2.5 times its forward's FLOPs
     * (FlashAttention-2, section 4.1: five products against two, one of
     * them the scores' recomputation) */
    it->flops = o->kind == MLG_OP_ATTENTION ? 2.5 * flops : 0;
    for (unsigned j = 0; j < o->nout; j++)
        it->bytes += (double)tb[o->out[j]];
    for (unsigned j = 0; j < o->nsave; j++)
        it->bytes += (double)tb[ml__graph_storage(g, o->save[j])];
    for (unsigned j = 0; j < o->ngin; j++)
        it->bytes += (double)tb[o->gin[j]];
    /* a loss op (no node): its first input's gradient */
    if (!o->node && o->nin)
        it->bytes += (double)tb[o->in[0]];
    it->bytes *= inst;
    for (unsigned j = 0; j < o->nparam; j++)
        it->bytes += (double)tb[o->param[j]];
}

void ml__work_graph(ml_chain *ch, ml_cblock *b, const ml_graph *g, const ml_graph_sizes *z,
                    const uint64_t *tb)
{
    const size_t first = ch->nwork;
    ml_graph_traffic per_op[MLG_MAX_OPS], total;
    ml__graph_traffic(g, tb, ch->eval_mode, per_op, &total);
    for (uint16_t k = 0; k < g->nop; k++)
        if (per_op[k].kernels) /* not a view, nor dropout in eval mode */
            forward(ch, g, z, &g->op[k], &per_op[k]);
    const size_t nfwd = ch->nwork - first;
    /* the loss's ops name no nodes (the block's backward is one rule,
     * chain_head.c), but each has its backward kernels */
    const bool loss = b->fwd_phase == ML_PHASE_LOSS;
    for (uint16_t k = g->nop; k-- > 0 && !ch->eval_mode;) {
        const mlg_op *o = &g->op[k];
        /* a fused attention kernel names no node of its own (its saved
         * tensors are the kernel's): its backward runs all the same */
        if ((o->node || loss || o->kind == MLG_OP_ATTENTION) && o->kind != MLG_OP_VIEW &&
            o->kernels)
            backward(ch, g, z, tb, o);
    }
    if (ch->nomem || ch->nwork > UINT32_MAX)
        return;
    b->work_first = (uint32_t)first;
    b->work_fwd = (uint32_t)nfwd;
    b->work_bwd = (uint32_t)(ch->nwork - first - nfwd);
    b->work_known = true;
}
