/* The tensors behind a node list's gradients (chain.h, ml_bnode.gin_id),
 * for the allocator simulation, which makes and frees each gradient as
 * the tensor it is (docs/allocator.md, "On the plan"). */
#include <string.h>

#include "ledger/chain_kit.h"

/* The id of tensor t's gradient (chain.h, ml_bnode.gin_id): the tensor
 * whose gradient a node makes, following the ops without a node (a
 * contiguous copy, a residual sum), whose input's gradient is their
 * output's, passed on (engine.cpp), or for a copy of several tensors into
 * one (q's and k's), part j of it; ML_GID_NONE where no node makes it
 * (the block's incoming gradient, which the residual sums pass on). */
/* A residual sum whose node casts the branch's gradient (autocast:
 * ml__kit_layer_residual) hands the stream's on unchanged: to t when t is
 * the sum's other input. */
static bool passes_on(const mlg_op *o, uint16_t t)
{
    if (o->kind != MLG_OP_ELEMENTWISE || o->nin != 2 || o->ngin != 1)
        return false;
    return o->gin[0] != t;
}

/* The first op that passes tensor t's gradient on (a sum without a node,
 * a copy, a residual sum that hands the stream's on), *at t's input index
 * in it; NULL: none. */
static const mlg_op *pass_of(const ml_graph *g, uint16_t t, unsigned *at)
{
    for (uint16_t k = 0; k < g->nop; k++) {
        const mlg_op *o = &g->op[k];
        for (unsigned j = 0; j < o->nin; j++)
            if (o->nout && o->in[j] == t && (!o->node || passes_on(o, t))) {
                *at = j;
                return o;
            }
    }
    return NULL;
}

/* Its output that takes t's gradient: t's own, or the one of a copy of
 * several into one. */
static uint16_t pass_out(const mlg_op *pass, unsigned at)
{
    return pass->nout == pass->nin ? pass->out[at] : pass->out[0];
}

uint16_t ml__ck_grad_id(const ml_graph *g, uint16_t t)
{
    _Static_assert(ML_GIDS == MLG_MAX_TENSORS, "one id per graph tensor");
    unsigned part = 0;
    for (unsigned depth = 0; depth < 8 && t < g->nt; depth++) {
        const uint16_t own = g->t[ml__graph_storage(g, t)].role == MLG_INPUT ? ML_GID_INPUT : t;
        bool plain = false, added = false;
        for (uint16_t k = 0; k < g->nop; k++) {
            const mlg_op *o = &g->op[k];
            for (unsigned j = 0; j < o->ngin; j++)
                if (o->node && o->gin[j] == t) {
                    /* made into the buffer (the repeated group's last
                     * instance makes it), or added to what it holds */
                    if (o->accum == t && !o->accum_but_last)
                        added = true;
                    else
                        plain = true;
                }
        }
        unsigned at = 0;
        const mlg_op *pass = pass_of(g, t, &at);
        /* the buffer holds the gradient a node made for t; where every
         * node's is added into one it already held, that one is a residual
         * sum's, passed on */
        if (plain || (added && !pass))
            return (uint16_t)(own + part * (ML_GIDS + 1));
        if (!pass)
            break;
        /* copies of several tensors: each into its own, or all into one */
        const uint16_t u = pass_out(pass, at);
        if (pass->kind == MLG_OP_COPY && pass->nout == 1 && pass->nin > 1 &&
            pass->nin <= ML_GID_PARTS && u < g->nt && g->t[u].factor == pass->nin)
            part = at;
        t = u;
    }
    return ML_GID_NONE;
}

/* The tensors of node n's gradients (the op o's at bytes tb): a tensor
 * that is a copy of several (chain.h) as its parts; accum: the
 * accumulation node recorded before it frees the one made for o->accum. */
void ml__ck_node_parts(ml_bnode *n, const ml_graph *g, const mlg_op *o, const uint64_t *tb,
                       bool accum)
{
    if (!n)
        return;
    unsigned m = 0;
    for (unsigned j = 0; j < o->ngin; j++) {
        const uint16_t t = o->gin[j], id = ml__ck_grad_id(g, t);
        /* a tensor the copy of several made: as many parts, each the
         * gradient of one input */
        unsigned parts = 1;
        for (uint16_t k = 0; k < g->nop && id == t; k++) {
            const mlg_op *c = &g->op[k];
            if (!c->node && c->kind == MLG_OP_COPY && c->nout && c->out[0] == t && c->nin > 1 &&
                c->nin <= ML_GID_PARTS && g->t[t].factor == c->nin && tb[t] % c->nin == 0)
                parts = c->nin;
        }
        /* a batched matmul of one copy of its two operands (nanoGPT's q
         * and k) makes mat2's part first, as BmmBackward0 does */
        const bool rev = o->kind == MLG_OP_MATMUL && !o->nparam && o->ngin == 1;
        for (unsigned i = 0; i < parts; i++, m++) {
            const unsigned p = rev ? parts - 1 - i : i;
            n->gin_id[m] = (uint16_t)(id + p * (ML_GIDS + 1));
            n->gin_b[m] = tb[t] / parts;
            if (accum && t == o->accum)
                n->gin_acc |= (uint8_t)(1u << m);
        }
    }
    for (unsigned j = 0; j < o->ngout; j++) {
        n->gout_id[j] = ml__ck_grad_id(g, o->gout[j]);
        n->gout_b[j] = tb[o->gout[j]];
    }
    n->ngin = (uint8_t)m;
    n->ngout = o->ngout;
}

uint16_t ml__ck_accum_shared(const ml_graph *g, uint16_t a)
{
    const mlg_op *A = &g->op[a];
    if (A->accum == MLG_NONE || ml__graph_repeated_op(g, a) ||
        ml__ck_grad_id(g, A->accum) != ML_GID_NONE)
        return MLG_NONE;
    uint16_t reader = MLG_NONE;
    for (uint16_t c = 0; c < a; c++) {
        const mlg_op *o = &g->op[c];
        /* the gradient the node reads, its output's, which it frees not
         * (no gout: a sum's buffer holds it) */
        const uint16_t out = o->nout ? o->out[0] : MLG_NONE;
        if (!o->node || ml__graph_repeated_op(g, c) || o->ngout || out == MLG_NONE ||
            ml__ck_grad_id(g, out) != ML_GID_NONE)
            continue;
        /* handed the buffer's tensor by sums that complete before the
         * accumulation: none of them makes the accumulated tensor */
        bool before = true;
        uint16_t t = out;
        for (unsigned depth = 0; depth < 8 && t != MLG_NONE && before; depth++) {
            before = ml__graph_storage(g, t) != ml__graph_storage(g, A->accum);
            unsigned at;
            const mlg_op *pass = pass_of(g, t, &at);
            t = pass ? pass_out(pass, at) : MLG_NONE;
        }
        if (before) {
            reader = c; /* the earliest in forward order: the last to run */
            break;
        }
    }
    return reader;
}

/* Whether a node of g makes t's gradient (not added into a buffer only). */
static bool grad_made(const ml_graph *g, uint16_t t)
{
    for (uint16_t k = 0; k < g->nop; k++)
        for (unsigned j = 0; j < g->op[k].ngin; j++)
            if (g->op[k].node && g->op[k].gin[j] == t && g->op[k].accum != t)
                return true;
    return false;
}

/* (ml__ck_accum_plan's answer) */
static uint16_t accum_incoming(const ml_graph *g)
{
    for (uint16_t a = g->nop; a-- > 0;) {
        const mlg_op *A = &g->op[a];
        if (!A->node || A->accum == MLG_NONE || ml__graph_repeated_op(g, a))
            continue;
        /* follow the sums that pass the target's gradient on */
        uint16_t t = A->accum;
        unsigned depth = 0, at;
        for (const mlg_op *pass; depth < 8 && (pass = pass_of(g, t, &at)) != NULL; depth++)
            t = pass_out(pass, at);
        if (depth > 0 && depth < 8 && !grad_made(g, t))
            return a;
    }
    return MLG_NONE;
}

uint16_t ml__ck_accum_plan(const ml_graph *g, const uint64_t *tb, bool *oop, uint64_t *carry)
{
    memset(oop, 0, MLG_MAX_OPS * sizeof *oop);
    memset(carry, 0, MLG_MAX_OPS * sizeof *carry);
    /* in backward order (the latest op first): once the new sum is made,
     * the buffer's sum is its alone, and later additions are in place */
    for (uint16_t a = g->nop; a-- > 0;) {
        const uint16_t c = g->op[a].node ? ml__ck_accum_shared(g, a) : MLG_NONE;
        if (c != MLG_NONE && !carry[c]) {
            oop[a] = true;
            carry[c] = tb[g->op[a].accum];
        }
    }
    return accum_incoming(g);
}

void ml__ck_accum_node(ml_chain *ch, ml_cblock *b, const ml_graph *g, const mlg_op *o,
                       const uint64_t *tb, bool oop, bool incoming)
{
    ml__ck_accum(ch, b, tb[o->accum]);
    ml_bnode *n = ml__ck_last_node(ch, b);
    ml__ck_accum_parts(n, g, o->accum, tb);
    if (n)
        n->into_incoming = incoming;
    if (n && oop) {
        n->what = "InputBuffer accumulation (out of place)";
        n->grad_in = tb[o->accum];
        n->accum_copy = true;
    }
}

void ml__ck_accum_parts(ml_bnode *n, const ml_graph *g, uint16_t t, const uint64_t *tb)
{
    if (!n)
        return;
    n->accum = true;
    n->ngout = 1;
    n->gout_id[0] = ml__ck_grad_id(g, t);
    n->gout_b[0] = tb[t];
}

uint16_t ml__ck_hand_gid(const ml_graph *g)
{
    for (uint16_t t = 0; t < g->nt; t++)
        if (g->t[t].role == MLG_INPUT && ml__graph_storage(g, t) == t) {
            const uint16_t id = ml__ck_grad_id(g, t);
            return id == ML_GID_NONE ? 0 : (uint16_t)(id + 1);
        }
    return 0;
}
