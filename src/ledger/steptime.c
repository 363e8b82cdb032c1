/* The per-op step-time model (docs/time.md): each block's work items
 * (work.h) priced at the device's rates on the GPU, dispatched by the host
 * at a cost per kernel, the two combined as a pipeline. */
#include <math.h>
#include <string.h>

#include "ledger/replay.h"
#include "graph/graph.h"
#include "ledger/steptime.h"
#include "ledger/time_rates.h"
#include "memledger/calib.h"
#include "util/grow.h"

/* ---- the pipeline ------------------------------------------------------ */

/* A run of kernels as the pipeline sees it: the host's time H, the GPU's
 * G, and P, the longest of (the host's time to issue kernel i) + (the
 * GPU's time from kernel i on) over i: started with the host at h and the
 * GPU free at g, the run ends on the GPU at max(g + G, h + P) and on the
 * host at h + H (a two-stage flow line with an unbounded queue). */
typedef struct {
    double H, G, P;
    double gemm, mem, floor;
    double kernels;
} ml_trun;

static void run_add(ml_trun *r, double h, double g)
{
    /* appending kernel (h, g): P' = max(P, H + h) + g */
    r->P = fmax(r->P, r->H + h) + g;
    r->H += h;
    r->G += g;
}

static void run_lead(ml_trun *r, double h)
{
    r->H += h;
    r->P += h;
}

typedef struct {
    double host, gpu;
    double by_phase[ML_TPHASE_COUNT];
    double gpu_sum, host_sum, gemm, mem, floor;
    double kernels[ML_TPHASE_COUNT];
    bool serial; /* one processor: each run's host time then its compute */
    double host_wins, gpu_wins; /* runs whose end the host's dispatch set, or the GPU's */
} ml_clock;

static void clock_run(ml_clock *c, const ml_trun *r, ml_time_phase ph)
{
    const double end = c->serial ? c->gpu + r->H + r->G : fmax(c->gpu + r->G, c->host + r->P);
    if (!c->serial && c->host + r->P > c->gpu + r->G)
        c->host_wins++;
    else
        c->gpu_wins++;
    c->by_phase[ph] += end - c->gpu;
    c->gpu = end;
    c->host = c->serial ? end : c->host + r->H;
    c->gpu_sum += r->G;
    c->host_sum += r->H;
    c->gemm += r->gemm;
    c->mem += r->mem;
    c->floor += r->floor;
    c->kernels[ph] += r->kernels;
}

/* GPU time g of kernels whose floor is floor_s, in its share of the run:
 * at the floor, in products (compute), else memory-bound */
static void account(ml_trun *r, double g, double floor_s, bool compute)
{
    if (g <= floor_s)
        r->floor += g;
    else if (compute)
        r->gemm += g;
    else
        r->mem += g;
}

/* The items [first, first + n) as one run, each kernel dispatched at h;
 * core_only: the attention core's (selective recompute). */
static ml_trun items_run(const ml_time_rates *tr, const ml_work_item *w, size_t n, double h,
                        bool core_only)
{
    ml_trun r = {0, 0, 0, 0, 0, 0, 0};
    for (size_t i = 0; i < n; i++) {
        if (core_only && !w[i].core)
            continue;
        bool compute;
        const double g = ml__time_item(tr, &w[i], &compute);
        const double k = w[i].kernels ? w[i].kernels : 1;
        run_add(&r, h * k, g);
        r.kernels += k;
        account(&r, g, tr->kernel_floor_s * k, compute);
    }
    return r;
}

/* A block without items: its FLOPs at the large-GEMM rate, one kernel */
static ml_trun flops_run(const ml_time_rates *tr, double flops, double h)
{
    ml_trun r = {0, 0, 0, 0, 0, 0, 0};
    const double g = flops > 0 ? flops / tr->gemm_flops : 0;
    if (g > 0) {
        run_add(&r, h, g);
        r.gemm = g;
        r.kernels = 1;
    }
    return r;
}

/* The FLOPs of block b its items do not list (ops whose backward node
 * the graph leaves to a block-level rule: a mixture of experts' routed
 * products, a classifier's head), so that every FLOP the chain counts is
 * timed: the forward's are the sum of its ops'; the backward's are the
 * chain's flops_bwd less what the items list (a product's gradients at its
 * FLOPs each, fused attention's 2.5 times as twice, and twice every other
 * op's forward FLOPs). */
static void unlisted(const ml_cblock *b, const ml_work_item *w, double *fwd, double *bwd)
{
    double f = 0, g = 0, other = 0;
    for (uint32_t i = 0; i < b->work_fwd + b->work_bwd; i++) {
        const ml_work_item *it = &w[i];
        const bool product = it->kind == MLG_OP_MATMUL || it->kind == MLG_OP_ATTENTION;
        if (!it->bwd) {
            f += it->flops;
            other += product ? 0 : it->flops;
        } else {
            g += it->kind == MLG_OP_ATTENTION ? it->flops / 1.25 : it->flops;
        }
    }
    const double rf = b->flops_fwd - f, rb = b->flops_bwd - g - 2 * other;
    *fwd = rf > 1e-3 * b->flops_fwd ? rf : 0;
    *bwd = rb > 1e-3 * b->flops_bwd ? rb : 0;
}

/* FLOPs the items do not list, as one more product at the large-GEMM rate */
static void add_unlisted(const ml_time_rates *tr, double flops, ml_trun *r)
{
    if (flops > 0) {
        run_add(r, 0, flops / tr->gemm_flops);
        r->gemm += flops / tr->gemm_flops;
    }
}

/* ---- the optimizer step ------------------------------------------------ */

/* Per parameter element: the passes over memory of one step and the
 * kernels per tensor list (docs/time.md, "The optimizer step"). */
static void step_shape(const ml_training *t, double *passes, double *ops)
{
    switch (t->optimizer) {
    case ML_OPT_SGD:
        *passes = 3, *ops = 1;
        break;
    case ML_OPT_SGD_MOMENTUM:
        *passes = 8, *ops = 3;
        break;
    case ML_OPT_ADAM:
        *passes = 22, *ops = 8;
        break;
    case ML_OPT_LION:
        *passes = 12, *ops = 5;
        break;
    case ML_OPT_ADAFACTOR:
        *passes = 14, *ops = 12;
        break;
    case ML_OPT_ADAM_8BIT:
        *passes = 7, *ops = 1;
        break;
    default: /* AdamW */
        *passes = 21, *ops = 8;
        break;
    }
    if (t->optimizer_impl == ML_IMPL_FUSED) {
        *passes = t->optimizer == ML_OPT_SGD ? 3 : t->optimizer == ML_OPT_SGD_MOMENTUM ? 5 : 7;
        *ops = 1;
    }
}

/* multi_tensor_apply's launches for one foreach op over n tensors and e
 * elements: a launch per 320 chunks of 65536 elements (MultiTensorApply.cuh) */
static double foreach_launches(double tensors, double elems)
{
    const double chunks = ceil(elems / 65536.0) + tensors;
    return fmax(1.0, ceil(chunks / 320.0));
}

static ml_trun step_run(const ml_time_rates *tr, const ml_chain *ch, const ml_training *t)
{
    ml_trun r = {0, 0, 0, 0, 0, 0, 0};
    double tensors = 0, elems = 0;
    for (size_t i = 0; i < ch->nparams; i++)
        if (!ch->params[i].frozen && !ch->params[i].nograd) {
            tensors += 1;
            elems += (double)ch->params[i].numel;
        }
    if (tensors == 0)
        return r;
    /* the ranks a shard spans (HSDP's group, times cp; at least 1) */
    if (t->zero >= 1) { /* the experts' over the ranks that hold them */
        const uint64_t N = ml__shard_group(t), Ne = ml__ep_ranks(ch, N);
        const double Pe = (double)ml__ep_expert_params(ch);
        elems = (elems - Pe) / (double)N + (Pe > 0 && Ne ? Pe / (double)Ne : 0);
    }
    double passes, ops;
    step_shape(t, &passes, &ops);
    const unsigned eb = ch->prec.master ? ch->prec.master : ch->prec.param;
    const double bytes = passes * elems * (double)(eb > ch->prec.state ? eb : ch->prec.state);
    double kernels, host;
    if (t->optimizer_impl == ML_IMPL_FOR_LOOP) {
        kernels = ops * tensors;
        host = kernels * tr->host.step_tensor_s * 4;
    } else {
        kernels = ops * foreach_launches(tensors, elems);
        host = ops * tr->host.step_call_s + ops * tensors * tr->host.step_tensor_s;
    }
    const double g = fmax(bytes / tr->bw[MLG_OP_ELEMENTWISE], kernels * tr->kernel_floor_s);
    run_add(&r, host, g);
    r.kernels = kernels;
    account(&r, g, kernels * tr->kernel_floor_s, false);
    return r;
}

/* ---- the iteration ----------------------------------------------------- */

/* Each distinct block's runs, priced once a plan: a decoder's layers list
 * the same items (same_work), so a plan prices the embedding, one layer,
 * the head and the loss. */
#define MEMO_SLOTS 8
typedef struct {
    const ml_cblock *b;
    ml_trun fwd, bwd, rec;
    bool has_rec;
} ml_run_memo;

typedef struct {
    ml_run_memo slot[MEMO_SLOTS];
    unsigned n, next;
    const ml_time_rates *tr;
    const ml_chain *ch;
    bool selective;
} ml_run_cache;

/* Whether a and b price the same: the same items, or a block-level FLOPs
 * run of equal FLOPs */
static bool same_work(const ml_chain *ch, const ml_cblock *a, const ml_cblock *b)
{
    if (a == b)
        return true;
    if (a->work_known != b->work_known || a->work_fwd != b->work_fwd ||
        a->work_bwd != b->work_bwd)
        return false;
    if (!a->work_known)
        return a->flops_fwd == b->flops_fwd && a->flops_bwd == b->flops_bwd &&
               a->flops_core == b->flops_core;
    return a->work_first == b->work_first ||
           !memcmp(&ch->work[a->work_first], &ch->work[b->work_first],
                   (a->work_fwd + a->work_bwd) * sizeof *ch->work);
}

/* a block's own host time (its modules' calls) comes before its first
 * kernel: it adds to every term of P */
static ml_run_memo *block_runs(ml_run_cache *c, const ml_cblock *b)
{
    for (unsigned i = 0; i < c->n; i++)
        if (same_work(c->ch, c->slot[i].b, b))
            return &c->slot[i];
    ml_run_memo *m = &c->slot[c->n < MEMO_SLOTS ? c->n++ : (c->next++ % MEMO_SLOTS)];
    const ml_time_rates *tr = c->tr;
    const ml_work_item *w = c->ch->work + b->work_first;
    m->b = b;
    m->has_rec = false;
    if (b->work_known) {
        m->fwd = items_run(tr, w, b->work_fwd, tr->host.forward_op_s, false);
        m->bwd = items_run(tr, w + b->work_fwd, b->work_bwd, tr->host.backward_op_s, false);
        double fwd, bwd;
        unlisted(b, w, &fwd, &bwd);
        add_unlisted(tr, fwd, &m->fwd);
        add_unlisted(tr, bwd, &m->bwd);
    } else {
        m->fwd = flops_run(tr, b->flops_fwd, tr->host.forward_op_s);
        m->bwd = flops_run(tr, b->flops_bwd, tr->host.backward_op_s);
    }
    run_lead(&m->fwd, tr->host.forward_block_s);
    run_lead(&m->bwd, tr->host.backward_block_s);
    return m;
}

/* The block's recomputation: its forward again (the attention core alone
 * under selective checkpointing), after the checkpoint's own host time */
static const ml_trun *recompute_run(ml_run_cache *c, ml_run_memo *m)
{
    const ml_time_rates *tr = c->tr;
    const ml_cblock *b = m->b;
    if (!m->has_rec) {
        if (b->work_known) {
            const ml_work_item *w = c->ch->work + b->work_first;
            m->rec = items_run(tr, w, b->work_fwd, tr->host.forward_op_s, c->selective);
            double fwd, bwd;
            unlisted(b, w, &fwd, &bwd);
            add_unlisted(tr, c->selective ? 0 : fwd, &m->rec);
        } else
            m->rec = flops_run(tr, c->selective ? b->flops_core : b->flops_fwd,
                               tr->host.forward_op_s);
        run_lead(&m->rec, tr->host.forward_block_s + tr->host.recompute_block_s);
        m->has_rec = true;
    }
    return &m->rec;
}

/* What one micro-batch's run of the blocks needs (ml__step_time). */
typedef struct {
    ml_run_cache *cache;
    const ml_chain *ch;
    const int *seg;
    bool selective;
    ml_step_time *st;
    double *fl;
} micro_ctx;

/* One micro-batch: each block's forward, then its backward (with its
 * recomputation) in reverse; map, when not NULL, gets the FLOPs' clock. */
static void micro_batch(const micro_ctx *x, ml_clock *c, ml_time_map *mp)
{
    const ml_chain *ch = x->ch;
    ml__time_map_add(mp, *x->fl, c->gpu);
    for (size_t k = 0; k < ch->n; k++) {
        const ml_cblock *b = &ch->blocks[k];
        clock_run(c, &block_runs(x->cache, b)->fwd, ML_TPHASE_FORWARD);
        *x->fl += b->flops_fwd;
        ml__time_map_add(mp, *x->fl, c->gpu);
    }
    for (size_t k = ch->n; k-- > 0;) {
        const ml_cblock *b = &ch->blocks[k];
        if (b->fwd_only || b->frozen)
            continue;
        ml_run_memo *m = block_runs(x->cache, b);
        if (x->selective ? b->core_bytes > 0 && b->ckpt_index >= 0 : x->seg[k] >= 0) {
            clock_run(c, recompute_run(x->cache, m), ML_TPHASE_RECOMPUTE);
            x->st->recomputed_blocks += 1;
            *x->fl += x->selective ? b->flops_core : b->flops_fwd;
            ml__time_map_add(mp, *x->fl, c->gpu);
        }
        clock_run(c, &m->bwd, ML_TPHASE_BACKWARD);
        *x->fl += b->flops_bwd;
        ml__time_map_add(mp, *x->fl, c->gpu);
    }
}

/* Every later micro-batch will move the clock as the last one did (from a
 * to b): one processor (no overlap to settle); the host's lead over the
 * GPU the same after it as before (to the last bits the sums keep); or
 * every run's end set by one side while the lead moves that side further
 * ahead (the GPU's runs with the host falling behind, the host's with the
 * host drawing ahead), so that no run's choice can change. */
static bool steady(const ml_clock *a, const ml_clock *b)
{
    if (b->serial)
        return true;
    const double lead_a = a->host - a->gpu, lead_b = b->host - b->gpu, d = lead_b - lead_a;
    const double tol = 1e-12 * (b->gpu > 1 ? b->gpu : 1);
    if (fabs(d) <= tol)
        return true;
    const double hw = b->host_wins - a->host_wins, gw = b->gpu_wins - a->gpu_wins;
    return (hw == 0 && d < 0) || (gw == 0 && d > 0);
}

/* k more micro-batches, each moving the clock as the last one did (from
 * a to c) */
static void clock_advance(ml_clock *c, const ml_clock *a, double k)
{
    const ml_clock d = *c;
    c->host += k * (d.host - a->host);
    c->gpu += k * (d.gpu - a->gpu);
    c->gpu_sum += k * (d.gpu_sum - a->gpu_sum);
    c->host_sum += k * (d.host_sum - a->host_sum);
    c->gemm += k * (d.gemm - a->gemm);
    c->mem += k * (d.mem - a->mem);
    c->floor += k * (d.floor - a->floor);
    c->host_wins += k * (d.host_wins - a->host_wins);
    c->gpu_wins += k * (d.gpu_wins - a->gpu_wins);
    for (int p = 0; p < ML_TPHASE_COUNT; p++) {
        c->by_phase[p] += k * (d.by_phase[p] - a->by_phase[p]);
        c->kernels[p] += k * (d.kernels[p] - a->kernels[p]);
    }
}

void ml__step_time(const ml_chain *ch, const ml_config *cfg, const int *seg, ml_summary *s,
                   ml_time_map *map)
{
    ml_step_time *st = &s->time;
    memset(st, 0, sizeof *st);
    st->flops_s = s->step_time_s;
    ml_time_rates tr;
    if (!ml__time_rates(cfg, &tr))
        return;
    const ml_training *t = &cfg->training;
    const bool selective = t->checkpoint.kind == ML_CKPT_SELECTIVE;
    ml_clock c;
    memset(&c, 0, sizeof c);
    c.serial = tr.serial;
    const double A = (double)t->grad_accum;
    ml_run_cache cache;
    cache.n = cache.next = 0;
    cache.tr = &tr;
    cache.ch = ch;
    cache.selective = selective;
    for (size_t k = 0; k < ch->n; k++)
        st->flops_only_blocks += !ch->blocks[k].work_known && (ch->blocks[k].flops_fwd > 0);
    /* each micro-batch's forward, then its backward: the next forward's
     * host time overlaps the GPU's backward; the timeline's clock (map)
     * follows the FLOPs as the replay counts them, in the first micro-batch
     * and the last (the replay's events; fl counts every micro-batch's) */
    double fl = 0;
    micro_ctx mc = {&cache, ch, seg, selective, st, &fl};
    ml_clock before = c;
    double fl_before = 0, rec_before = 0;
    for (double a = 0; a < A; a++) {
        ml_time_map *mp = a == 0 || a == A - 1 ? map : NULL;
        /* once two micro-batches in a row have moved the clock alike (the
         * host's lead over the GPU no longer changes), every later one
         * moves it so too: all but the last at once (a pipeline stage's
         * thousands of micro-batches, docs/time.md) */
        if (a >= 3 && a < A - 1 && steady(&before, &c)) {
            const double k = A - 1 - a; /* the micro-batches to skip */
            clock_advance(&c, &before, k);
            fl += k * (fl - fl_before);
            st->recomputed_blocks += k * (st->recomputed_blocks - rec_before);
            a = A - 1;
            mp = map;
        }
        before = c;
        fl_before = fl;
        rec_before = st->recomputed_blocks;
        micro_batch(&mc, &c, mp);
    }
    /* an offloaded optimizer steps on the host (its transfers are timed
     * apart, ml__time_finish); its update is not timed */
    const ml_trun none = {0, 0, 0, 0, 0, 0, 0};
    const ml_trun step = t->offload == ML_OFFLOAD_NONE ? step_run(&tr, ch, t) : none;
    clock_run(&c, &step, ML_TPHASE_STEP);
    if (map)
        map->step_end = c.gpu;
    st->source = tr.source;
    st->gpu_s = c.gpu_sum;
    st->host_s = c.host_sum;
    st->host_bound = c.host_sum > c.gpu_sum;
    memcpy(st->by_phase, c.by_phase, sizeof st->by_phase);
    memcpy(st->kernels, c.kernels, sizeof st->kernels);
    st->gemm_s = c.gemm;
    st->memory_s = c.mem;
    st->floor_s = c.floor;
    /* the step's compute is the pipeline's: communication and host
     * transfers come after it (ml__time_finish, which sets step_s) */
    s->step_time_s = c.gpu;
    st->tokens_per_s = c.gpu > 0 ? A * (double)t->micro_batch * (double)t->seq_len / c.gpu : 0;
    st->mfu = c.gpu > 0 && tr.peak_flops > 0
                  ? (s->flops_forward + s->flops_backward) / c.gpu / tr.peak_flops
                  : -1;
    st->serial = tr.serial;
}
