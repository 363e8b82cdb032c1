/* The execution plan of one steady-state training iteration, replayed as
 * allocation and free events per category (docs/ledger.md). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ledger/chain.h"
#include "model/tree.h"
#include "util/grow.h"
#include "memledger/calib.h"
#include "ledger/optimal.h"

struct ml_ledger {
    ml_summary sum;
    ml_block_info *blocks;
    size_t nblocks;
    ml_event *events;
    size_t nevents, cap;
};

static const char *const cat_names[ML_CAT_COUNT] = {
    "params", "master_params", "grads", "optimizer_states", "activations_saved", "recompute",
    "workspace"};
static const char *const phase_names[ML_PHASE_COUNT] = {"forward", "loss", "backward",
                                                        "optimizer"};

const char *ml_category_name(ml_category c)
{
    return (unsigned)c < ML_CAT_COUNT ? cat_names[c] : "?";
}

const char *ml_phase_name(ml_phase p)
{
    return (unsigned)p < ML_PHASE_COUNT ? phase_names[p] : "?";
}

typedef struct {
    ml_ledger *l;
    const ml_chain *ch;
    uint64_t live[ML_CAT_COUNT];
    uint64_t total;
    ml_phase phase;
    int32_t block;
    uint32_t micro;
    const char *sub; /* "" or " (recompute)" */
    const char *peak_sub;
    bool keep, nomem, overflow, underflow;
} rstate;

static void event(rstate *r, ml_category c, int64_t delta)
{
    if (delta == 0)
        return;
    ml_summary *s = &r->l->sum;
    if (delta > 0) {
        uint64_t d = (uint64_t)delta;
        if (__builtin_add_overflow(r->live[c], d, &r->live[c]) ||
            __builtin_add_overflow(r->total, d, &r->total))
            r->overflow = true;
        if (r->live[c] > s->category_max[c])
            s->category_max[c] = r->live[c];
        if (r->total > s->peak) {
            s->peak = r->total;
            s->peak_phase = r->phase;
            s->peak_block = r->block;
            r->peak_sub = r->sub; /* peak_step is written once, at the end */
            memcpy(s->peak_breakdown, r->live, sizeof r->live);
        }
    } else {
        uint64_t d = (uint64_t)(-delta);
        if (d > r->live[c] || d > r->total) {
            r->underflow = true; /* a bug in the plan: caught by the tests */
            return;
        }
        r->live[c] -= d;
        r->total -= d;
    }
    if (!r->keep)
        return;
    ml_ledger *l = r->l;
    ml_event *grown = ml_grow(l->events, l->nevents, &l->cap, sizeof *grown, 256);
    if (!grown) {
        r->nomem = true;
        r->keep = false;
        return;
    }
    l->events = grown;
    ml_event *e = &l->events[l->nevents++];
    e->phase = r->phase;
    e->block = r->block;
    e->micro = r->micro;
    e->cat = c;
    e->delta = delta;
    memcpy(e->live, r->live, sizeof r->live);
}

static void alloc_(rstate *r, ml_category c, uint64_t b)
{
    if (b > (uint64_t)INT64_MAX) {
        r->overflow = true;
        return;
    }
    event(r, c, (int64_t)b);
}

static void free_(rstate *r, ml_category c, uint64_t b)
{
    if (b > (uint64_t)INT64_MAX) {
        r->overflow = true;
        return;
    }
    event(r, c, -(int64_t)b);
}

/* Which blocks sit in checkpoint segments: seg[i] = segment id or -1. */
static ml_status segments(const ml_chain *ch, const ml_checkpoint *cp, int *seg, ml_error *err)
{
    size_t n = ch->n, nc = ch->n_ckpt;
    for (size_t i = 0; i < n; i++)
        seg[i] = -1;
    uint64_t k = 0;
    switch (cp->kind) {
    case ML_CKPT_NONE:
    case ML_CKPT_SELECTIVE:
        return ML_OK;
    case ML_CKPT_FULL: k = 1; break;
    case ML_CKPT_EVERY: k = cp->every; break;
    case ML_CKPT_SQRT: {
        k = (uint64_t)ceil(sqrt((double)nc));
        while (k > 1 && (k - 1) * (k - 1) >= nc)
            k--;
        while (k * k < nc)
            k++;
        break;
    }
    case ML_CKPT_LIST:
        for (uint32_t j = 0; j < cp->count; j++) {
            if (cp->blocks[j] >= nc) {
                err->code = ML_RANGE;
                snprintf(err->msg, sizeof err->msg,
                         "training.checkpoint: block %u does not exist; the model has %zu "
                         "checkpointable blocks (0 to %zu)",
                         cp->blocks[j], nc, nc ? nc - 1 : 0);
                return ML_RANGE;
            }
            for (size_t i = 0; i < n; i++)
                if (ch->blocks[i].ckpt_index == (int)cp->blocks[j])
                    seg[i] = (int)cp->blocks[j];
        }
        return ML_OK;
    default:
        return ML_OK;
    }
    if (k == 0)
        k = 1;
    for (size_t i = 0; i < n; i++)
        if (ch->blocks[i].ckpt_index >= 0)
            seg[i] = (int)((uint64_t)ch->blocks[i].ckpt_index / k);
    return ML_OK;
}

/* Per-device sharding (docs/sharding.md). */
typedef struct {
    uint64_t N;            /* data-parallel degree */
    unsigned zero;
    bool grads_sharded;    /* zero >= 2 */
    bool gather_params;    /* zero == 3: all-gather each block's params */
    unsigned pbytes;       /* param dtype bytes */
    uint64_t reduce_ws;    /* reduce-scatter bucket during backward */
    int side_block;        /* first checkpointed block: keeps the side inputs */
    uint64_t side_bytes;   /* tensors every checkpoint keeps once (masks) */
} shard;

static uint64_t ceil_div(uint64_t a, uint64_t b)
{
    return a / b + (a % b != 0);
}

/* "none", "every-2", or for optimal the segments: "optimal: [0-3] [8]"
 * (checkpoint indices). */
static void describe_plan(const ml_chain *ch, const ml_checkpoint *cp, const int *seg, char *buf,
                          size_t size)
{
    ml_checkpoint_format(cp, buf, size);
    if (cp->kind != ML_CKPT_OPTIMAL)
        return;
    size_t o = strlen(buf);
    o += (size_t)snprintf(buf + o, size > o ? size - o : 0, ":");
    bool any = false;
    for (size_t k = 0; k < ch->n && o < size; k++) {
        if (seg[k] < 0 || (k > 0 && seg[k - 1] == seg[k]))
            continue;
        size_t e = k;
        while (e + 1 < ch->n && seg[e + 1] == seg[k])
            e++;
        int a = ch->blocks[k].ckpt_index, b = ch->blocks[e].ckpt_index;
        o += (size_t)(a == b ? snprintf(buf + o, size - o, " [%d]", a)
                             : snprintf(buf + o, size - o, " [%d-%d]", a, b));
        any = true;
    }
    if (!any && o < size)
        snprintf(buf + o, size - o, " none");
}

/* The rules of docs/ledger.md, "boundary tensors". */
typedef struct {
    bool alias;     /* the same storage as the previous boundary, which is kept */
    bool kept;      /* resident after its consumer's forward */
    ml_category cat;
    bool by_consumer; /* attributed to the consumer block */
} boundary;

/* ZeRO-3 / FSDP: a block's parameters are gathered for its forward and its
 * backward, with the next block's prefetched (docs/sharding.md). */
static uint64_t gathered(rstate *r, const shard *sh, size_t k, bool backward)
{
    if (!sh->gather_params)
        return 0;
    const ml_chain *ch = r->ch;
    uint64_t e = ch->blocks[k].params;
    if (backward ? k > 0 : k + 1 < ch->n)
        e += ch->blocks[backward ? k - 1 : k + 1].params;
    uint64_t b;
    if (__builtin_mul_overflow(e, (uint64_t)sh->pbytes, &b))
        r->overflow = true;
    return b;
}

static void micro_batch(rstate *r, const shard *sh, const int *seg, const boundary *bd,
                        bool selective, uint64_t *rb, uint64_t *bl, ml_category *blc,
                        double *flops_re, uint64_t *act_end)
{
    const ml_chain *ch = r->ch;
    const size_t n = ch->n;
    const ml_cblock *B = ch->blocks;
    r->sub = "";
    /* ---- forward */
    r->phase = ML_PHASE_FORWARD;
    r->block = 0;
    blc[0] = bd[0].kept ? bd[0].cat : ML_CAT_WORKSPACE;
    bl[0] = B[0].in_bytes;
    alloc_(r, blc[0], bl[0]);
    for (size_t k = 0; k < n; k++) {
        const ml_cblock *b = &B[k];
        r->phase = b->fwd_phase;
        r->block = (int32_t)k;
        /* a checkpointed block runs under no_grad: nothing is saved, and
         * what would be saved is transient */
        uint64_t ws = seg[k] < 0 ? b->ws_fwd : b->ws_nograd;
        uint64_t gat = gathered(r, sh, k, false);
        alloc_(r, ML_CAT_WORKSPACE, gat);
        alloc_(r, ML_CAT_WORKSPACE, ws);
        if (seg[k] < 0)
            alloc_(r, ML_CAT_ACTIVATIONS, b->saved_bytes - (selective ? b->core_bytes : 0));
        if ((int)k == sh->side_block)
            alloc_(r, ML_CAT_ACTIVATIONS, sh->side_bytes);
        if (k + 1 < n) {
            blc[k + 1] = bd[k + 1].kept ? bd[k + 1].cat : ML_CAT_WORKSPACE;
            bl[k + 1] = bd[k + 1].alias ? 0 : B[k + 1].in_bytes;
            alloc_(r, blc[k + 1], bl[k + 1]);
        }
        free_(r, ML_CAT_WORKSPACE, ws);
        free_(r, ML_CAT_WORKSPACE, gat);
        if (!bd[k].kept) {
            free_(r, blc[k], bl[k]);
            bl[k] = 0;
        }
    }
    *act_end = r->live[ML_CAT_ACTIVATIONS];
    /* ---- backward */
    r->phase = ML_PHASE_BACKWARD;
    r->block = (int32_t)(n - 1);
    alloc_(r, ML_CAT_WORKSPACE, sh->reduce_ws);
    for (size_t k = n; k-- > 0;) {
        const ml_cblock *b = &B[k];
        r->block = (int32_t)k;
        uint64_t gat = gathered(r, sh, k, true);
        alloc_(r, ML_CAT_WORKSPACE, gat);
        if (seg[k] >= 0 && (k + 1 == n || seg[k + 1] != seg[k])) {
            /* recompute the whole segment, one forward with grad */
            size_t s0 = k;
            while (s0 > 0 && seg[s0 - 1] == seg[k])
                s0--;
            r->sub = " (recompute)";
            for (size_t j = s0; j <= k; j++) {
                r->block = (int32_t)j;
                alloc_(r, ML_CAT_WORKSPACE, B[j].ws_fwd);
                alloc_(r, ML_CAT_RECOMPUTE, B[j].saved_bytes);
                if (j < k && (B[j].out_saved || B[j + 1].in_saved)) {
                    rb[j + 1] = B[j + 1].in_bytes;
                    alloc_(r, ML_CAT_RECOMPUTE, rb[j + 1]);
                }
                if (j == k && b->out_saved && k + 1 < n) {
                    rb[k + 1] = B[k + 1].in_bytes; /* a recomputed copy of the output */
                    alloc_(r, ML_CAT_RECOMPUTE, rb[k + 1]);
                }
                free_(r, ML_CAT_WORKSPACE, B[j].ws_fwd);
                *flops_re += B[j].flops_fwd;
            }
            r->sub = "";
            r->block = (int32_t)k;
        }
        if (selective && seg[k] < 0 && b->core_bytes) {
            r->sub = " (recompute)";
            alloc_(r, ML_CAT_RECOMPUTE, b->core_bytes);
            *flops_re += b->flops_core;
            r->sub = "";
        }
        alloc_(r, ML_CAT_WORKSPACE, b->ws_bwd);
        /* sharded gradients: the full gradient is a transient until its
         * reduce-scatter; the device keeps its 1/N partition */
        uint64_t gfull = sh->grads_sharded ? b->grad_bytes : 0;
        alloc_(r, ML_CAT_WORKSPACE, gfull);
        if (r->micro == 0)
            alloc_(r, ML_CAT_GRADS,
                   sh->grads_sharded ? ceil_div(b->grad_bytes, sh->N) : b->grad_bytes);
        else
            alloc_(r, ML_CAT_WORKSPACE, b->grad_accum_bytes);
        /* the block's saved tensors are released once its gradient is done */
        if (seg[k] >= 0) {
            free_(r, ML_CAT_RECOMPUTE, b->saved_bytes);
        } else {
            free_(r, ML_CAT_ACTIVATIONS, b->saved_bytes - (selective ? b->core_bytes : 0));
            if (selective)
                free_(r, ML_CAT_RECOMPUTE, b->core_bytes);
        }
        /* boundary k+1: both its users are done now */
        if (k + 1 < n) {
            if (rb[k + 1]) {
                free_(r, ML_CAT_RECOMPUTE, rb[k + 1]);
                rb[k + 1] = 0;
            }
            if (bl[k + 1]) {
                free_(r, blc[k + 1], bl[k + 1]);
                bl[k + 1] = 0;
            }
        }
        /* boundary k: free unless the producer's backward still needs it */
        if (k == 0 || !(B[k - 1].out_saved)) {
            if (rb[k]) {
                free_(r, ML_CAT_RECOMPUTE, rb[k]);
                rb[k] = 0;
            }
            if (bl[k]) {
                free_(r, blc[k], bl[k]);
                bl[k] = 0;
            }
        }
        if ((int)k == sh->side_block)
            free_(r, ML_CAT_ACTIVATIONS, sh->side_bytes);
        free_(r, ML_CAT_WORKSPACE, b->ws_bwd);
        free_(r, ML_CAT_WORKSPACE, gfull);
        if (r->micro != 0)
            free_(r, ML_CAT_WORKSPACE, b->grad_accum_bytes);
        free_(r, ML_CAT_WORKSPACE, gat);
    }
    free_(r, ML_CAT_WORKSPACE, sh->reduce_ws);
}

static const char *validate(const ml_config *cfg)
{
    const ml_training *t = &cfg->training;
    const ml_device *dv = &cfg->device;
    if (t->micro_batch == 0 || t->micro_batch > (1ull << 24))
        return "training.micro_batch: must be between 1 and 16777216";
    if (t->seq_len == 0 || t->seq_len > (1ull << 28))
        return "training.seq_len: must be between 1 and 268435456";
    if (t->grad_accum == 0 || t->grad_accum > (1ull << 20))
        return "training.grad_accum: must be between 1 and 1048576";
    if ((unsigned)t->precision >= ML_PREC_COUNT || (unsigned)t->optimizer >= ML_OPT_COUNT ||
        (unsigned)t->optimizer_impl >= ML_IMPL_COUNT ||
        (unsigned)t->checkpoint.kind >= ML_CKPT_COUNT)
        return "training: unknown precision, optimizer, implementation or checkpoint policy";
    if (t->data_parallel == 0 || t->data_parallel > (1u << 20))
        return "training.data_parallel: must be between 1 and 1048576";
    if (t->zero > 3)
        return "training.zero: must be 0, 1, 2 or 3";
    if ((unsigned)t->offload >= ML_OFFLOAD_COUNT)
        return "training.offload: unknown";
    if (t->offload == ML_OFFLOAD_PARAMS && t->zero != 3)
        return "training.offload: params offload needs zero: 3";
    if (t->reduce_bucket == 0 || t->allgather_bucket == 0)
        return "training: bucket sizes must be at least 1 element";
    if (t->checkpoint.kind == ML_CKPT_EVERY && t->checkpoint.every == 0)
        return "training.checkpoint: every-K needs K >= 1";
    if (t->checkpoint.kind == ML_CKPT_OPTIMAL && !dv->present)
        return "training.checkpoint: optimal needs a budget: give a device (--device SIZE or a "
               "device: section)";
    if (dv->present && dv->memory == 0)
        return "device.memory: must be at least 1 byte";
    if (dv->present && dv->budget > dv->memory)
        return "device.budget: above device.memory";
    if (dv->present && dv->runtime_reserve >= dv->memory)
        return "device.runtime_reserve: not below device.memory";
    if (!(dv->efficiency > 0 && dv->efficiency <= 1))
        return "device.efficiency: must be in (0, 1]";
    if (!(dv->fragmentation >= 0 && dv->fragmentation <= 1))
        return "device.fragmentation: must be in [0, 1]";
    if (!(dv->peak_tflops >= 0) || !isfinite(dv->peak_tflops))
        return "device.peak_tflops: must be a number >= 0";
    return NULL;
}

/* What one evaluation needs besides the segment plan. */
typedef struct {
    const ml_chain *ch;
    const ml_config *cfg;
    ml_optim_bytes ob;
    /* scratch, n + 1 entries each */
    boundary *bd;
    uint64_t *rb, *bl;
    ml_category *blc;
    int side_block; /* set by run_plan */
} evalctx;

/* Replays the chain under the plan seg[] into l (summary, blocks, events). */
static ml_status run_plan(evalctx *x, const int *seg, bool keep_events, ml_ledger *l,
                          ml_error *err)
{
    ml_chain *ch = (ml_chain *)x->ch; /* only the overflow flag changes */
    const ml_training *t = &x->cfg->training;
    const ml_device *dv = &x->cfg->device;
    const size_t n = ch->n;
    const bool selective = t->checkpoint.kind == ML_CKPT_SELECTIVE;
    boundary *bd = x->bd;
    memset(x->rb, 0, (n + 1) * sizeof *x->rb);
    memset(x->bl, 0, (n + 1) * sizeof *x->bl);
    for (size_t k = 0; k < n; k++) {
        const ml_cblock *b = &ch->blocks[k];
        bool prod = k > 0 && ch->blocks[k - 1].out_saved && seg[k - 1] < 0;
        bool cons = b->in_saved && seg[k] < 0;
        bool start = seg[k] >= 0 && (k == 0 || seg[k - 1] != seg[k]);
        bd[k].kept = prod || cons || start || b->in_held;
        bd[k].cat = (prod || cons || start) ? ML_CAT_ACTIVATIONS : ML_CAT_WORKSPACE;
        bd[k].by_consumer = !prod && (cons || start);
        bd[k].alias = k > 0 && ch->blocks[k - 1].identity && bd[k - 1].kept;
    }

    ml_summary *s = &l->sum;
    memset(s, 0, sizeof *s);
    l->nevents = 0;
    uint64_t P = 0;
    for (size_t i = 0; i < ch->nparams; i++)
        P = ml_add(ch, P, ch->params[i].numel);
    s->params = P;
    /* per device: ZeRO stage z shards states (z >= 1), gradients (z >= 2)
     * and parameters (z = 3) over N devices; offload moves them to the host */
    const uint64_t N = t->data_parallel ? t->data_parallel : 1;
    const unsigned z = t->zero;
    uint64_t params_all = ml_mul(ch, P, ch->prec.param);
    uint64_t master_all = ml_mul(ch, P, ch->prec.master);
    s->bytes_params = z >= 3 ? ceil_div(params_all, N) : params_all;
    s->bytes_master = z >= 1 ? ceil_div(master_all, N) : master_all;
    s->bytes_optimizer = z >= 1 ? ceil_div(x->ob.states, N) : x->ob.states;
    s->bytes_step_temp = z >= 1 ? ceil_div(x->ob.step_temp, N) : x->ob.step_temp;
    uint64_t grads_all = 0;
    for (size_t k = 0; k < n; k++)
        grads_all = ml_add(ch, grads_all, z >= 2 ? ceil_div(ch->blocks[k].grad_bytes, N)
                                                 : ch->blocks[k].grad_bytes);
    s->bytes_grads = grads_all;
    if (t->offload != ML_OFFLOAD_NONE) {
        /* ZeRO-Offload: fp32 master weights, states and the update live on
         * the host, with an fp32 copy of the gradient partition */
        s->bytes_host = ml_add(ch, ml_add(ch, s->bytes_master, s->bytes_optimizer),
                               ceil_div(ml_mul(ch, P, 4), z >= 1 ? N : 1));
        s->bytes_master = s->bytes_optimizer = s->bytes_step_temp = 0;
    }
    if (t->offload == ML_OFFLOAD_PARAMS) {
        s->bytes_host = ml_add(ch, s->bytes_host, s->bytes_params);
        s->bytes_params = 0;
    }
    /* the side inputs a checkpoint keeps (attention masks): once, with the
     * first checkpointed block (docs/ledger.md) */
    x->side_block = -1;
    for (size_t k = 0; k < n && ch->ckpt_side; k++)
        if (seg[k] >= 0) {
            x->side_block = (int)k;
            break;
        }
    shard sh = {N, z, z >= 2, z >= 3, ch->prec.param, 0, x->side_block, ch->ckpt_side};
    if (z >= 2) {
        uint64_t e = t->reduce_bucket < P ? t->reduce_bucket : P;
        sh.reduce_ws = ml_mul(ch, e, ch->prec.grad);
    }
    /* ring collectives send (N-1)/N of the buffer (docs/sharding.md) */
    {
        double f = (double)(N - 1) / (double)N, A = (double)t->grad_accum;
        double pg = (double)P * ch->prec.grad, pp = (double)P * ch->prec.param;
        if (N <= 1)
            s->comm_bytes = 0;
        else if (z == 0)
            s->comm_bytes = 2 * f * pg;                /* all-reduce, once per step */
        else if (z == 1)
            s->comm_bytes = f * pg + f * pp;           /* reduce-scatter + all-gather */
        else if (z == 2)
            s->comm_bytes = A * f * pg + f * pp;       /* per micro-batch reduce-scatter */
        else
            s->comm_bytes = A * (2 * f * pp + f * pg); /* gather fwd + bwd, reduce-scatter */
    }
    s->peak_block = -1;

    rstate r;
    memset(&r, 0, sizeof r);
    r.l = l;
    r.ch = ch;
    r.keep = keep_events;
    r.block = -1;
    r.sub = "";
    r.phase = ML_PHASE_FORWARD;
    alloc_(&r, ML_CAT_PARAMS, s->bytes_params);
    alloc_(&r, ML_CAT_MASTER, s->bytes_master);
    alloc_(&r, ML_CAT_OPTIMIZER, s->bytes_optimizer);
    double flops_re = 0;
    uint64_t act_end = 0;
    unsigned micros = t->grad_accum > 1 ? 2 : 1;
    for (unsigned mb = 0; mb < micros; mb++) {
        r.micro = mb;
        double fre = 0;
        micro_batch(&r, &sh, seg, bd, selective, x->rb, x->bl, x->blc, &fre, &act_end);
        flops_re = fre; /* identical for every micro-batch */
    }
    r.phase = ML_PHASE_OPTIMIZER;
    r.block = -1;
    /* ZeRO-1/2 all-gather the updated parameters through a bucket */
    uint64_t ag = 0;
    if (z == 1 || z == 2)
        ag = ml_mul(ch, t->allgather_bucket < P ? t->allgather_bucket : P, ch->prec.param);
    alloc_(&r, ML_CAT_WORKSPACE, s->bytes_step_temp);
    free_(&r, ML_CAT_WORKSPACE, s->bytes_step_temp);
    alloc_(&r, ML_CAT_WORKSPACE, ag);
    free_(&r, ML_CAT_WORKSPACE, ag);
    free_(&r, ML_CAT_GRADS, r.live[ML_CAT_GRADS]); /* zero_grad(set_to_none=True) */
    s->bytes_activations = act_end;
    if (s->peak_block >= 0)
        snprintf(s->peak_step, sizeof s->peak_step, "%s%s", ch->blocks[s->peak_block].name,
                 r.peak_sub ? r.peak_sub : "");
    else
        snprintf(s->peak_step, sizeof s->peak_step, "optimizer.step");
    if (r.nomem) {
        return ml_error_at(err, NULL, ML_NOMEM, "out of memory");
    }
    if (r.overflow || ch->overflow) {
        err->code = ML_OVERFLOW;
        snprintf(err->msg, sizeof err->msg,
                 "byte counts exceed 64 bits: use a smaller micro_batch or seq_len");
        return ML_OVERFLOW;
    }
    if (r.underflow || r.live[ML_CAT_GRADS] || r.live[ML_CAT_ACTIVATIONS] ||
        r.live[ML_CAT_RECOMPUTE] || r.live[ML_CAT_WORKSPACE]) {
        /* the schedule freed something twice or leaked: a planner bug */
        err->code = ML_RANGE;
        snprintf(err->msg, sizeof err->msg, "internal: the replay does not balance");
        return ML_RANGE;
    }

    /* FLOPs */
    double ff = 0, fb = 0;
    for (size_t k = 0; k < n; k++) {
        ff += ch->blocks[k].flops_fwd;
        fb += ch->blocks[k].flops_bwd;
    }
    double A = (double)t->grad_accum;
    s->flops_forward = ff * A;
    s->flops_backward = fb * A;
    s->flops_recompute = flops_re * A;
    s->flops_total = s->flops_forward + s->flops_backward + s->flops_recompute;
    s->flops_per_micro_batch = s->flops_total / A;
    s->step_time_s = dv->peak_tflops > 0
                         ? s->flops_total / (dv->peak_tflops * 1e12 * dv->efficiency)
                         : -1.0;
    s->calibrated_blocks = ch->calibrated;
    s->calibrated_c = ch->calib_c;
    s->calibrated_at_shape = ch->calib_exact;
    s->calibration_note = x->cfg->calib ? ch->calib_note : NULL;
    if (x->cfg->calib && ml_profile_achieved_tflops(x->cfg->calib) > 0) {
        /* measured throughput replaces peak x efficiency */
        s->step_time_s = s->flops_total / (ml_profile_achieved_tflops(x->cfg->calib) * 1e12);
        s->time_measured = true;
    }
    s->runtime_reserve = dv->runtime_reserve;
    /* the caching allocator's reserved bytes over its allocated peak */
    double frag = (double)s->peak * dv->fragmentation;
    s->fragmentation = frag < 1.8e19 ? (uint64_t)llround(frag) : UINT64_MAX;
    if (__builtin_add_overflow(s->peak, s->runtime_reserve, &s->peak_total) ||
        __builtin_add_overflow(s->peak_total, s->fragmentation, &s->peak_total)) {
        err->code = ML_OVERFLOW;
        snprintf(err->msg, sizeof err->msg,
                 "peak plus fragmentation allowance and runtime reserve exceeds 64 bits");
        return ML_OVERFLOW;
    }
    s->has_device = dv->present;
    if (dv->present) {
        s->memory = dv->memory;
        s->budget = ml_device_budget(dv);
        s->device_limit = ml_device_limit(dv);
        s->fits = s->peak <= s->budget && s->peak_total <= s->memory;
        int64_t h1 = (int64_t)s->budget - (int64_t)s->peak;
        int64_t h2 = (int64_t)s->memory - (int64_t)s->peak_total;
        s->headroom = h1 < h2 ? h1 : h2;
    }
    s->c_tokens = ch->c_tokens;
    s->c_width = ch->c_width;
    s->c_dtype_bytes = ch->prec.a;
    s->plan_fits_budget = !dv->present || s->fits;

    /* per-block report */
    double norm = (double)ch->c_tokens * (double)ch->c_width * (double)ch->prec.a;
    for (size_t k = 0; k < n; k++) {
        const ml_cblock *b = &ch->blocks[k];
        ml_block_info *bi = &l->blocks[k];
        memcpy(bi->name, b->name, sizeof bi->name);
        bi->params = b->params;
        bi->checkpointed = seg[k] >= 0;
        bi->segment = seg[k];
        bi->ckpt_index = b->ckpt_index;
        bi->measured = b->measured;
        bi->flops_forward = b->flops_fwd;
        /* inventory without a plan: a boundary counts with the block that
         * saves it first, the producer when it saves its own output (the
         * module running when autograd saved it) */
        uint64_t inv = b->saved_bytes;
        if (b->in_saved && !(k > 0 && ch->blocks[k - 1].out_saved))
            inv += b->in_bytes;
        if (b->out_saved && k + 1 < n)
            inv += ch->blocks[k + 1].in_bytes;
        bi->inventory_bytes = inv;
        bi->c = norm > 0 ? (double)inv / norm : 0;
        uint64_t kept = seg[k] < 0 ? b->saved_bytes - (selective ? b->core_bytes : 0) : 0;
        if (bd[k].kept && bd[k].cat == ML_CAT_ACTIVATIONS && bd[k].by_consumer && !bd[k].alias)
            kept += b->in_bytes;
        if (k + 1 < n && bd[k + 1].kept && bd[k + 1].cat == ML_CAT_ACTIVATIONS &&
            !bd[k + 1].by_consumer && !bd[k + 1].alias)
            kept += ch->blocks[k + 1].in_bytes;
        if ((int)k == x->side_block)
            kept += ch->ckpt_side;
        bi->activations_saved = kept;
    }
    l->nblocks = n;
    describe_plan(ch, &t->checkpoint, seg, s->plan, sizeof s->plan);
    return ML_OK;
}

/* The chain model of ledger/optimal.h for this chain and config. Quantities
 * are the replay's own (docs/optimal.md, "from the ledger"): the solver's
 * plan is then replayed and checked against the budget. */
static void opt_model(const evalctx *x, const ml_summary *res, ml_opt_block *ob, size_t *lo_out,
                      size_t *hi_out, ml_opt_chain *oc)
{
    const ml_chain *ch = x->ch;
    const ml_training *t = &x->cfg->training;
    const size_t n = ch->n;
    const uint64_t N = t->data_parallel;
    const bool accum = t->grad_accum > 1, gsh = t->zero >= 2;
    size_t lo = n, hi = 0;
    for (size_t k = 0; k < n; k++)
        if (ch->blocks[k].ckpt_index >= 0) {
            if (lo == n)
                lo = k;
            hi = k + 1;
        }
    *lo_out = lo;
    *hi_out = hi;
    /* resident: states, params, and with accumulation every gradient */
    uint64_t R = res->bytes_params + res->bytes_master + res->bytes_optimizer +
                 (accum ? res->bytes_grads : 0);
    uint64_t gather = 0; /* ZeRO-3: the largest pair of gathered blocks */
    if (t->zero >= 3)
        for (size_t k = 0; k + 1 < n; k++) {
            uint64_t e = (ch->blocks[k].params + ch->blocks[k + 1].params) * ch->prec.param;
            if (e > gather)
                gather = e;
        }
    uint64_t reduce = 0;
    if (gsh) {
        uint64_t e = t->reduce_bucket < res->params ? t->reduce_bucket : res->params;
        reduce = e * ch->prec.grad;
    }
    /* what a block keeps when not checkpointed, boundaries included */
#define KEEP(k)                                                                               \
    (ch->blocks[k].saved_bytes + (ch->blocks[k].in_saved ? ch->blocks[k].in_bytes : 0) +      \
     ((k) + 1 < n && ch->blocks[k].out_saved && !ch->blocks[(k) + 1].in_saved                 \
          ? ch->blocks[(k) + 1].in_bytes                                                      \
          : 0))
#define GRAD(k) (gsh ? ceil_div(ch->blocks[k].grad_bytes, N) : ch->blocks[k].grad_bytes)
    uint64_t E = 0; /* kept by the blocks before the range (embedding) */
    for (size_t k = 0; k < lo; k++)
        E += KEEP(k);
    /* gradients created after block k's backward has started: blocks > k */
    uint64_t later = 0;
    for (size_t k = n; k-- > hi;)
        later += accum ? 0 : GRAD(k);
    for (size_t k = hi; k-- > lo;) {
        const ml_cblock *b = &ch->blocks[k];
        ml_opt_block *o = &ob[k - lo];
        uint64_t out = k + 1 < n ? ch->blocks[k + 1].in_bytes : 0;
        o->keep = KEEP(k);
        o->input = b->in_bytes;
        o->recomp = o->keep - (b->in_saved ? b->in_bytes : 0);
        o->fwd = b->in_bytes + b->saved_bytes + b->ws_fwd + out + gather;
        o->fwd_ng = b->in_bytes + b->ws_nograd + out + gather;
        uint64_t g = accum ? b->grad_accum_bytes : GRAD(k);
        o->bwd = b->ws_bwd + g + (gsh ? b->grad_bytes : 0) + gather + reduce;
        o->base_b = R + E + later;
        o->flops = b->flops_fwd;
        later += accum ? 0 : GRAD(k);
    }
    /* the tail (head, loss): everything kept before it stays live */
    uint64_t tail = 0, kept_tail = 0, g_tail = 0;
    for (size_t k = hi; k < n; k++) {
        const ml_cblock *b = &ch->blocks[k];
        uint64_t out = k + 1 < n ? ch->blocks[k + 1].in_bytes : 0;
        uint64_t f = kept_tail + b->in_bytes + b->saved_bytes + b->ws_fwd + out;
        if (f > tail)
            tail = f;
        kept_tail += KEEP(k) + (b->in_held && !b->in_saved ? b->in_bytes : 0);
    }
    for (size_t k = n; k-- > hi;) {
        const ml_cblock *b = &ch->blocks[k];
        uint64_t g = accum ? b->grad_accum_bytes : GRAD(k);
        uint64_t bw = kept_tail + b->ws_bwd + g_tail + g + (gsh ? b->grad_bytes : 0) + reduce;
        if (bw > tail)
            tail = bw;
        g_tail += accum ? 0 : GRAD(k);
    }
#undef KEEP
#undef GRAD
    oc->n = hi - lo;
    oc->blk = ob;
    oc->base_f = R + E;
    oc->base_t = R + E + tail + gather;
    /* the replay checks the limit's rounding */
    oc->budget = res->budget < res->device_limit ? res->budget : res->device_limit;
}

/* checkpoint: optimal. Solves on the chain model, replays the plan, and
 * tightens the model's budget by any excess until the replay fits (a few
 * rounds at most). Otherwise falls back to the fixed policies: the one with
 * the least recompute that fits, else the one with the lowest peak; *fits
 * tells whether the plan fits. */
static ml_status plan_optimal(evalctx *x, int *seg, ml_ledger *l, bool *fits, ml_error *err)
{
    const ml_chain *ch = x->ch;
    const size_t n = ch->n;
    for (size_t k = 0; k < n; k++)
        seg[k] = -1;
    /* residents from a plain replay */
    ml_status st = run_plan(x, seg, false, l, err);
    if (st)
        return st;
    ml_summary res = l->sum;
    ml_opt_block *ob = calloc(n ? n : 1, sizeof *ob);
    int *oseg = calloc(n ? n : 1, sizeof *oseg);
    if (!ob || !oseg) {
        free(ob);
        free(oseg);
        return ml_error_at(err, NULL, ML_NOMEM, "out of memory");
    }
    size_t lo, hi;
    ml_opt_chain oc;
    opt_model(x, &res, ob, &lo, &hi, &oc);
    const uint64_t target = oc.budget;
    *fits = false;
    for (int round = 0; round < 8 && !*fits; round++) {
        bool feasible = false;
        double cost = 0;
        if ((st = ml_opt_solve(&oc, 0, oseg, &cost, &feasible)))
            break;
        if (!feasible)
            break;
        for (size_t k = 0; k < n; k++)
            seg[k] = k >= lo && k < hi ? oseg[k - lo] : -1;
        if ((st = run_plan(x, seg, false, l, err)))
            break;
        uint64_t peak = l->sum.peak;
        if (l->sum.fits) {
            *fits = true;
            break;
        }
        uint64_t over = peak > target ? peak - target : 1;
        if (over >= oc.budget)
            break;
        oc.budget -= over;
    }
    free(ob);
    free(oseg);
    if (st)
        return st;
    if (*fits)
        return ML_OK;
    /* the chain model found no plan under the line (it is conservative: the
     * replay can admit what the model rejects): the fixed policy with the
     * least recompute among those whose replay fits, else the lowest peak */
    static const ml_checkpoint_kind kinds[] = {ML_CKPT_FULL, ML_CKPT_SQRT, ML_CKPT_EVERY,
                                               ML_CKPT_EVERY, ML_CKPT_NONE};
    static const uint32_t every[] = {0, 0, 2, 4, 0};
    uint64_t best = UINT64_MAX;
    double best_fit = INFINITY;
    int *tmp = calloc(n ? n : 1, sizeof *tmp);
    if (!tmp) {
        return ml_error_at(err, NULL, ML_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        ml_checkpoint cp;
        memset(&cp, 0, sizeof cp);
        cp.kind = kinds[i];
        cp.every = every[i];
        if ((st = segments(ch, &cp, tmp, err)) || (st = run_plan(x, tmp, false, l, err)))
            break;
        if (l->sum.fits && l->sum.flops_recompute < best_fit) {
            best_fit = l->sum.flops_recompute;
            *fits = true;
            memcpy(seg, tmp, n * sizeof *seg);
        } else if (!*fits && l->sum.peak < best) {
            best = l->sum.peak;
            memcpy(seg, tmp, n * sizeof *seg);
        }
    }
    free(tmp);
    return st;
}

ml_status ml_ledger_evaluate(const ml_model *m, const ml_config *cfg, bool keep_events,
                             ml_ledger **out, ml_error *err)
{
    ml_error local;
    if (!err)
        err = &local;
    memset(err, 0, sizeof *err);
    const char *bad = validate(cfg);
    if (bad) {
        err->code = ML_RANGE;
        snprintf(err->msg, sizeof err->msg, "%s", bad);
        return ML_RANGE;
    }
    const ml_training *t = &cfg->training;
    ml_chain ch;
    ml_status st = ml_chain_build(m, cfg, &ch, err);
    if (st)
        return st;
    evalctx x;
    memset(&x, 0, sizeof x);
    x.ch = &ch;
    x.cfg = cfg;
    if ((st = ml_optim_bytes_of(&ch, t, &x.ob, err))) {
        ml_chain_free(&ch);
        return st;
    }
    ml_ledger *l = calloc(1, sizeof *l);
    int *seg = calloc(ch.n + 1, sizeof *seg);
    x.bd = calloc(ch.n + 1, sizeof *x.bd);
    x.rb = calloc(ch.n + 1, sizeof *x.rb);
    x.bl = calloc(ch.n + 1, sizeof *x.bl);
    x.blc = calloc(ch.n + 1, sizeof *x.blc);
    if (l)
        l->blocks = calloc(ch.n + 1, sizeof *l->blocks);
    if (!l || !seg || !x.bd || !x.rb || !x.bl || !x.blc || !l->blocks) {
        st = ML_NOMEM;
        ml_error_at(err, NULL, ML_NOMEM, "out of memory");
        goto done;
    }
    bool opt_fits = true;
    if (t->checkpoint.kind == ML_CKPT_OPTIMAL)
        st = plan_optimal(&x, seg, l, &opt_fits, err);
    else
        st = segments(&ch, &t->checkpoint, seg, err);
    if (st)
        goto done;
    if ((st = run_plan(&x, seg, keep_events, l, err)))
        goto done;
    if (t->checkpoint.kind == ML_CKPT_OPTIMAL)
        l->sum.plan_fits_budget = opt_fits;
    *out = l;
    l = NULL;
done:
    free(seg);
    free(x.bd);
    free(x.rb);
    free(x.bl);
    free(x.blc);
    ml_ledger_destroy(l);
    ml_chain_free(&ch);
    return st;
}

void ml_ledger_destroy(ml_ledger *l)
{
    if (!l)
        return;
    free(l->blocks);
    free(l->events);
    free(l);
}

const ml_summary *ml_ledger_summary(const ml_ledger *l)
{
    return &l->sum;
}

size_t ml_ledger_block_count(const ml_ledger *l)
{
    return l->nblocks;
}

const ml_block_info *ml_ledger_block(const ml_ledger *l, size_t i)
{
    return i < l->nblocks ? &l->blocks[i] : NULL;
}

size_t ml_ledger_event_count(const ml_ledger *l)
{
    return l->nevents;
}

const ml_event *ml_ledger_events(const ml_ledger *l)
{
    return l->events;
}
