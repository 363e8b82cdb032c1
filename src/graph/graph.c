/* The op graph (graph.h): building a block's list of ops, and the passes
 * that need nothing but the graph and the sizes. docs/graph.md. */
#include <stdarg.h>
#include <string.h>

#include "graph/graph.h"

void ml__graph_init(ml_graph *g)
{
    g->nt = g->nop = 0;
    g->group = 0;
    g->full = false;
    g->out = MLG_NONE;
    g->nlit = 0;
    g->rep = (mlg_repeat){0, 0, 0, 0};
    g->grad_view = MLG_NONE;
}

uint8_t ml__graph_lit(ml_graph *g, uint64_t v)
{
    if (g->nlit >= MLG_NLIT) {
        g->full = true;
        return MLG_L0;
    }
    g->lit[g->nlit] = v;
    return (uint8_t)(MLG_L0 + g->nlit++);
}

void ml__graph_repeat(ml_graph *g, uint16_t t0, uint16_t t1, uint16_t o0, uint16_t o1)
{
    if (g->rep.t1 != g->rep.t0 || g->rep.o1 != g->rep.o0 || t1 < t0 || o1 < o0)
        g->full = true; /* one group a graph */
    g->rep = (mlg_repeat){t0, t1, o0, o1};
}

bool ml__graph_repeated_tensor(const ml_graph *g, uint16_t t)
{
    return t >= g->rep.t0 && t < g->rep.t1;
}

bool ml__graph_repeated_op(const ml_graph *g, uint16_t k)
{
    return k >= g->rep.o0 && k < g->rep.o1;
}

static uint16_t tensor_va(ml_graph *g, const char *name, uint8_t dtype, uint8_t role,
                          uint16_t base, unsigned ndim, va_list ap)
{
    if (g->nt >= MLG_MAX_TENSORS || ndim > 6) {
        /* the builders index what they are given: a slot past the
         * declared ones, which ml__graph_valid refuses */
        g->full = true;
        memset(&g->t[MLG_MAX_TENSORS], 0, sizeof g->t[0]);
        g->t[MLG_MAX_TENSORS].base = MLG_NONE;
        return MLG_MAX_TENSORS;
    }
    mlg_tensor *t = &g->t[g->nt];
    memset(t, 0, sizeof *t);
    t->name = name;
    t->dtype = dtype;
    t->role = role;
    t->factor = 1;
    t->ndim = (uint8_t)ndim;
    t->base = base;
    t->group = g->group;
    for (unsigned i = 0; i < ndim; i++)
        t->dim[i] = (uint8_t)va_arg(ap, int);
    return g->nt++;
}

uint16_t ml__graph_tensor(ml_graph *g, const char *name, uint8_t dtype, uint8_t role,
                          unsigned ndim, ...)
{
    va_list ap;
    va_start(ap, ndim);
    uint16_t t = tensor_va(g, name, dtype, role, MLG_NONE, ndim, ap);
    va_end(ap);
    return t;
}

uint16_t ml__graph_view(ml_graph *g, const char *name, uint16_t base, unsigned ndim, ...)
{
    va_list ap;
    va_start(ap, ndim);
    uint8_t dtype = base < g->nt ? g->t[base].dtype : MLG_COMPUTE;
    uint16_t t = tensor_va(g, name, dtype, MLG_VIEW, base, ndim, ap);
    va_end(ap);
    return t;
}

mlg_op *ml__graph_op(ml_graph *g, uint8_t kind, const char *name)
{
    if (g->nop >= MLG_MAX_OPS) {
        g->full = true;
        memset(&g->sink, 0, sizeof g->sink);
        return &g->sink;
    }
    mlg_op *o = &g->op[g->nop++];
    memset(o, 0, sizeof *o);
    o->name = name;
    o->kind = kind;
    o->accum = MLG_NONE;
    o->kernels = kind == MLG_OP_VIEW ? 0 : 1;
    return o;
}

mlg_op *ml__graph_step(ml_graph *g, uint8_t kind, const char *name, uint16_t x, uint16_t y,
                       const char *node)
{
    mlg_op *o = ml__graph_op(g, kind, name);
    ml__op_in(o, x);
    ml__op_out(o, y);
    if (node) {
        ml__op_node(o, node);
        ml__op_gin(o, x);
        ml__op_gout(o, y);
    }
    return o;
}

mlg_op *ml__graph_release(ml_graph *g, const char *name)
{
    return ml__graph_op(g, MLG_OP_VIEW, name);
}

/* The fixed arrays of an op: a builder that lists more is a bug, caught by
 * the graph tests (tests/unit/test_graph.c); the extra entries are dropped. */
#define PUSH(arr, n, v)                                                  \
    do {                                                                 \
        if ((v) == MLG_NONE)                                             \
            break;                                                       \
        if ((n) < sizeof(arr) / sizeof((arr)[0]))                        \
            (arr)[(n)++] = (v);                                          \
        else                                                             \
            o->overfull = true;                                          \
    } while (0)

void ml__op_in(mlg_op *o, uint16_t t) { PUSH(o->in, o->nin, t); }
void ml__op_out(mlg_op *o, uint16_t t) { PUSH(o->out, o->nout, t); }
void ml__op_save(mlg_op *o, uint16_t t) { PUSH(o->save, o->nsave, t); }
void ml__op_free(mlg_op *o, uint16_t t) { PUSH(o->free, o->nfree, t); }
void ml__op_param(mlg_op *o, uint16_t t) { PUSH(o->param, o->nparam, t); }
void ml__op_gin(mlg_op *o, uint16_t t) { PUSH(o->gin, o->ngin, t); }
void ml__op_gout(mlg_op *o, uint16_t t) { PUSH(o->gout, o->ngout, t); }

/* A softmax's backward on the GPU writes grad * output into a temporary
 * as large as its input's gradient, beside grad_input
 * (aten/src/ATen/native/cuda/SoftMax.cu, softmax_backward_cuda_out): one
 * scratch tensor. Node lists exist without autocast only, where the
 * softmax's input and output share a dtype. */
void ml__op_node(mlg_op *o, const char *node)
{
    o->node = node;
    if (o->kind == MLG_OP_SOFTMAX)
        o->scratch_in = 1;
}

void ml__op_flops(mlg_op *o, double k, unsigned ndim, ...)
{
    va_list ap;
    va_start(ap, ndim);
    o->flops = k;
    o->nfdim = (uint8_t)(ndim > 6 ? 6 : ndim);
    for (unsigned i = 0; i < o->nfdim; i++)
        o->fdim[i] = (uint8_t)va_arg(ap, int);
    va_end(ap);
}

static bool ids_valid(const ml_graph *g, const uint16_t *ids, unsigned n)
{
    for (unsigned i = 0; i < n; i++)
        if (ids[i] >= g->nt)
            return false;
    return true;
}

/* The repeated group: within the arrays; its tensors' storages and entries its own,
 * none a transient; saved by its ops only; what its ops save outside it
 * kept (mlg_repeat). */
static bool repeat_valid(const ml_graph *g)
{
    const mlg_repeat *r = &g->rep;
    if (r->t1 > g->nt || r->o1 > g->nop)
        return false;
    for (uint16_t t = r->t0; t < r->t1; t++)
        if (!ml__graph_repeated_tensor(g, ml__graph_entry(g, t)) ||
            (g->t[t].flags & MLG_T_TMP))
            return false;
    for (uint16_t k = 0; k < g->nop; k++)
        for (unsigned j = 0; j < g->op[k].nsave; j++) {
            const uint16_t e = ml__graph_entry(g, g->op[k].save[j]);
            const bool in = ml__graph_repeated_tensor(g, e);
            if (ml__graph_repeated_op(g, k) ? !in && !(g->t[e].flags & MLG_T_KEPT) : in)
                return false;
        }
    return true;
}

bool ml__graph_valid(const ml_graph *g)
{
    if (g->full)
        return false;
    for (uint16_t k = 0; k < g->nop; k++) {
        const mlg_op *o = &g->op[k];
        if (o->overfull || !ids_valid(g, o->in, o->nin) || !ids_valid(g, o->out, o->nout) ||
            !ids_valid(g, o->save, o->nsave) || !ids_valid(g, o->free, o->nfree) ||
            !ids_valid(g, o->param, o->nparam) || !ids_valid(g, o->gin, o->ngin) ||
            !ids_valid(g, o->gout, o->ngout) || (o->accum != MLG_NONE && o->accum >= g->nt))
            return false;
    }
    for (uint16_t t = 0; t < g->nt; t++)
        if (g->t[t].base != MLG_NONE && g->t[t].base >= g->nt)
            return false;
    for (uint16_t k = 0; k < g->nop; k++)
        for (unsigned j = 0; j < g->op[k].nsave; j++)
            if (ml__graph_entry(g, g->op[k].save[j]) >= g->nt)
                return false;
    return repeat_valid(g);
}

/* ---- passes ------------------------------------------------------------ */

uint64_t ml__graph_numel(const ml_graph *g, const ml_graph_sizes *z, uint16_t t, bool *overflow)
{
    const mlg_tensor *p = &g->t[t];
    const bool shard = p->seq && z->seq_div > 1;
    uint64_t n = p->factor;
    for (unsigned k = 0; k < p->ndim; k++) {
        uint64_t v = z->dim[p->dim[k]];
        if (shard && p->dim[k] == MLG_T) /* a longer shard first, as padded */
            v = v / z->seq_div + (v % z->seq_div != 0);
        if (__builtin_mul_overflow(n, v, &n))
            *overflow = true;
    }
    return n;
}

static bool has_dim(const mlg_tensor *p, uint8_t d)
{
    for (unsigned k = 0; k < p->ndim; k++)
        if (p->dim[k] == d)
            return true;
    return false;
}

bool ml__graph_tp_split(const ml_graph *g, uint16_t t)
{
    /* MLG_FS: Megatron's shared experts are an MLP over the tp ranks
     * (megatron/core/transformer/moe/shared_experts.py) */
    static const uint8_t split[] = {MLG_H, MLG_HKV, MLG_DQ, MLG_DKV, MLG_QKV, MLG_F,
                                    MLG_F2, MLG_V, MLG_VO, MLG_KVB, MLG_FS};
    for (size_t i = 0; i < sizeof split; i++)
        if (has_dim(&g->t[t], split[i]))
            return true;
    return false;
}

void ml__graph_shard_sequence(ml_graph *g, uint64_t div)
{
    g->seq_div = div;
    for (uint16_t i = 0; i < g->nt; i++) {
        mlg_tensor *p = &g->t[i];
        p->seq = p->role == MLG_INPUT && has_dim(p, MLG_T) && has_dim(p, MLG_D) &&
                 !ml__graph_tp_split(g, i);
    }
    for (uint16_t k = 0; k < g->nop; k++) {
        const mlg_op *o = &g->op[k];
        bool split_in = false, seq_in = false;
        for (unsigned j = 0; j < o->nin; j++) {
            split_in |= ml__graph_tp_split(g, o->in[j]);
            seq_in |= g->t[o->in[j]].seq || g->t[o->in[j]].local;
        }
        for (unsigned j = 0; j < o->nparam; j++)
            split_in |= ml__graph_tp_split(g, o->param[j]);
        g->op[k].sp_site = MLG_SP_NONE;
        if (seq_in && o->nout && ml__graph_tp_split(g, o->out[0]))
            g->op[k].sp_site = MLG_SP_COLUMN;
        for (unsigned j = 0; j < o->nout; j++) {
            mlg_tensor *p = &g->t[o->out[j]];
            if (p->role == MLG_VIEW && p->base != MLG_NONE)
                p->seq = g->t[p->base].seq && has_dim(p, MLG_T);
            else if (ml__graph_tp_split(g, o->out[j]) || !has_dim(p, MLG_T))
                p->seq = false;
            else if (split_in) { /* row-parallel: reduce-scattered over the tokens */
                p->seq = has_dim(p, MLG_D);
                if (p->seq && j == 0)
                    g->op[k].sp_site = MLG_SP_ROW;
            } else {
                p->seq = seq_in;
            }
        }
    }
}

static void bytes_of(const ml_graph *g, ml_graph_sizes *z, uint64_t *tb, uint16_t from,
                     uint16_t to)
{
    for (uint16_t i = from; i < to; i++) {
        const mlg_tensor *t = &g->t[i];
        uint64_t n = ml__graph_numel(g, z, i, &z->overflow);
        if (__builtin_mul_overflow(n, (uint64_t)z->bytes[t->dtype], &n))
            z->overflow = true;
        if (t->flags & MLG_T_HALF)
            n /= 2;
        tb[i] = z->overflow ? 0 : n;
    }
}

void ml__graph_bytes(const ml_graph *g, ml_graph_sizes *z, uint64_t *tb)
{
    bytes_of(g, z, tb, 0, g->nt);
}

void ml__graph_instance_bytes(const ml_graph *g, ml_graph_sizes *z, uint64_t size, uint64_t *tb)
{
    z->dim[MLG_NE] = size;
    bytes_of(g, z, tb, g->rep.t0, g->rep.t1);
}

uint16_t ml__graph_storage(const ml_graph *g, uint16_t t)
{
    return g->t[t].role == MLG_VIEW ? g->t[t].base : t;
}

uint16_t ml__graph_entry(const ml_graph *g, uint16_t t)
{
    uint16_t s = ml__graph_storage(g, t);
    return g->t[s].base != MLG_NONE ? g->t[s].base : s;
}

static void put(ml_graph_live *l, uint64_t b)
{
    if (__builtin_add_overflow(l->live, b, &l->live))
        l->bad = true;
    if (l->live > l->peak)
        l->peak = l->live;
}

static void drop(ml_graph_live *l, uint64_t b)
{
    if (b > l->live)
        l->bad = true;
    else
        l->live -= b;
}

/* In eval mode (model.eval()) a dropout returns its input: its output is
 * an alias of it, and the op skipped. */
static bool eval_identity(const mlg_op *o, bool eval, uint16_t *alias)
{
    if (!eval || o->kind != MLG_OP_DROPOUT)
        return false;
    if (o->nout && o->nin)
        alias[o->out[0]] = alias[o->in[0]];
    return true;
}

/* One step into st (false: no list, or no room). */
static bool step(mlg_step *st, size_t cap, size_t *n, uint64_t bytes, uint16_t tok, unsigned part,
                 bool alloc)
{
    if (!st || *n >= cap)
        return false;
    st[(*n)++] = (mlg_step){bytes, tok, (uint8_t)part, alloc};
    return true;
}

/* The allocations op o makes its output t in: one per part for a tensor
 * of several that PyTorch makes as several (LayerNorm's mean and rstd,
 * native_layer_norm's two outputs; a copy of several inputs into one
 * storage, matmul's copies of q and k for bmm); else one (a factor that
 * counts views of one storage, torch.where's indices, stays one). */
static unsigned parts_of(const ml_graph *g, const mlg_op *o, uint16_t t, const uint64_t *tb)
{
    const unsigned f = g->t[t].factor;
    if (f < 2 || f > MLG_STEP_PARTS || tb[t] % f != 0)
        return 1;
    return o->kind == MLG_OP_NORM || (o->kind == MLG_OP_COPY && o->nin == f) ? f : 1;
}

/* The forward's walk (ml__graph_forward), and with st its steps
 * (ml__graph_forward_steps): *steps false once the list cannot be made
 * (no room, a storage made twice, a free of one never made). */
static void walk(const ml_graph *g, const uint64_t *tb, bool grad, bool eval, mlg_step *st,
                 size_t cap, size_t *n, bool *steps, ml_graph_live *out)
{
    bool saved[MLG_MAX_TENSORS] = {false};
    uint8_t held[MLG_MAX_TENSORS] = {0}; /* the parts a live storage was made in */
    uint16_t alias[MLG_MAX_TENSORS];
    ml_graph_live l = {0, 0, g->full || g->rep.t1 != g->rep.t0};
    *n = 0;
    *steps = st != NULL;
    for (uint16_t i = 0; i < g->nt; i++)
        alias[i] = i;
    for (uint16_t k = 0; k < g->nop; k++) {
        const mlg_op *o = &g->op[k];
        if (eval_identity(o, eval, alias))
            continue;
        /* a row-parallel op writes its whole output, reduce-scatters it
         * into the shard (made while the whole lives), then frees it
         * (Megatron's _reduce_scatter_along_first_dim,
         * tensor_parallel/mappings.py) */
        uint64_t whole = 0;
        if (o->sp_site == MLG_SP_ROW && o->nout &&
            __builtin_mul_overflow(tb[o->out[0]], g->seq_div, &whole))
            l.bad = true;
        put(&l, whole);
        *steps = *steps && (!whole || step(st, cap, n, whole, MLG_STEP_WHOLE, 0, true));
        for (unsigned i = 0; i < o->nout; i++) {
            /* a dropout makes its mask first, then its output (Dropout.cu,
             * dropout_cuda; the CPU's native_dropout alike) */
            const unsigned j = o->kind == MLG_OP_DROPOUT ? o->nout - 1 - i : i;
            const uint16_t t = o->out[j];
            if (g->t[t].role == MLG_VIEW)
                continue; /* its storage is its base's */
            const unsigned parts = parts_of(g, o, t, tb);
            put(&l, tb[t]);
            if (!tb[t])
                continue; /* nothing to allocate */
            *steps = *steps && !held[t];
            for (unsigned p = 0; p < parts; p++)
                *steps = *steps && step(st, cap, n, tb[t] / parts, t, p, true);
            held[t] = (uint8_t)parts;
        }
        drop(&l, whole);
        *steps = *steps && (!whole || step(st, cap, n, whole, MLG_STEP_WHOLE, 0, false));
        for (unsigned j = 0; grad && j < o->nsave; j++)
            saved[ml__graph_storage(g, alias[o->save[j]])] = true;
        for (unsigned j = 0; j < o->nfree; j++) {
            const uint16_t t = ml__graph_storage(g, alias[o->free[j]]);
            /* autocast's cache holds its weight copies to the region's
             * end, with grad or without (autocast_mode.cpp, cached_cast) */
            if (saved[t] || (g->t[t].flags & MLG_T_WCAST))
                continue;
            drop(&l, tb[t]);
            const unsigned parts = held[t];
            *steps = *steps && (parts || !tb[t]);
            for (unsigned p = 0; p < parts; p++)
                *steps = *steps && step(st, cap, n, tb[t] / parts, t, p, false);
            held[t] = 0;
        }
    }
    *steps = *steps && !l.bad;
    *out = l;
}

void ml__graph_forward(const ml_graph *g, const uint64_t *tb, bool grad, bool eval,
                       ml_graph_live *out)
{
    size_t n;
    bool steps;
    walk(g, tb, grad, eval, NULL, 0, &n, &steps, out);
}

size_t ml__graph_forward_steps(const ml_graph *g, const uint64_t *tb, bool grad, bool eval,
                               mlg_step *st, size_t cap, ml_graph_live *out)
{
    size_t n;
    bool steps;
    walk(g, tb, grad, eval, st, cap, &n, &steps, out);
    return steps ? n : 0;
}

void ml__graph_traffic(const ml_graph *g, const uint64_t *tb, bool eval,
                       ml_graph_traffic *per_op, ml_graph_traffic *total)
{
    ml_graph_traffic sum = {0, 0, 0};
    for (uint16_t k = 0; k < g->nop; k++) {
        const mlg_op *o = &g->op[k];
        ml_graph_traffic t = {0, 0, 0};
        if (o->kind != MLG_OP_VIEW && !(eval && o->kind == MLG_OP_DROPOUT)) {
            for (unsigned j = 0; j < o->nin; j++)
                t.read += tb[o->in[j]];
            for (unsigned j = 0; j < o->nparam; j++)
                t.read += tb[o->param[j]];
            for (unsigned j = 0; j < o->nout; j++)
                t.written += tb[o->out[j]];
            t.kernels = o->kernels;
        }
        if (per_op)
            per_op[k] = t;
        sum.read += t.read;
        sum.written += t.written;
        sum.kernels += t.kernels;
    }
    *total = sum;
}

double ml__graph_op_flops(const mlg_op *o, const ml_graph_sizes *z)
{
    double f = o->flops;
    for (unsigned i = 0; i < o->nfdim; i++)
        f *= (double)z->dim[o->fdim[i]];
    return f;
}
