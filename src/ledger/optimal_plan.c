/* checkpoint: optimal on a chain: the solver's model of the chain (from
 * the replay's own quantities), the solve, the replay of its plan, and the
 * fallback to fixed policies (docs/optimal.md). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ledger/optimal.h"
#include "ledger/replay.h"
#include "util/error.h"

/* What block k keeps when not checkpointed, boundaries included. */
static uint64_t keep_of(const ml_chain *ch, size_t k)
{
    const ml_cblock *b = &ch->blocks[k];
    uint64_t out = k + 1 < ch->n && b->out_saved && !ch->blocks[k + 1].in_saved
                       ? ch->blocks[k + 1].in_bytes
                       : 0;
    return b->saved_bytes + (b->in_saved ? b->in_bytes : 0) + out;
}

/* The sizes every block's constraints share. */
typedef struct {
    bool accum;      /* gradients resident all iteration: accumulation, or
                        zero_grad: zero (backward adds through a transient) */
    bool gsh;        /* gradients sharded (ZeRO >= 2) */
    uint64_t N;      /* devices */
    uint64_t gather; /* ZeRO-3: the largest pair of gathered blocks */
    uint64_t reduce; /* ZeRO >= 2: the reduce bucket */
} opt_shared;

/* Block k's gradient as the device holds it. */
static uint64_t grad_of(const ml_chain *ch, const opt_shared *z, size_t k)
{
    return z->gsh ? ml__ep_grad_shard(ch, &ch->blocks[k], z->N) : ch->blocks[k].grad_bytes;
}

/* The tail (head, loss) above everything kept before it: its forward and
 * its backward high-water; the forward's with `fwd_extra` more held (what
 * the forward holds to the loss and frees before the backward). */
static uint64_t tail_need(const ml_chain *ch, const opt_shared *z, size_t hi, uint64_t fwd_extra)
{
    const size_t n = ch->n;
    uint64_t tail = 0, kept_tail = 0, g_tail = 0;
    for (size_t k = hi; k < n; k++) {
        const ml_cblock *b = &ch->blocks[k];
        uint64_t out = k + 1 < n ? ch->blocks[k + 1].in_bytes : 0;
        uint64_t f = fwd_extra + kept_tail + b->in_bytes + b->saved_bytes + b->ws_fwd + out;
        if (f > tail)
            tail = f;
        kept_tail += keep_of(ch, k) + (b->in_held && !b->in_saved ? b->in_bytes : 0);
    }
    for (size_t k = n; k-- > hi;) {
        const ml_cblock *b = &ch->blocks[k];
        uint64_t g = z->accum ? b->grad_accum_bytes : grad_of(ch, z, k);
        uint64_t bw = kept_tail + b->ws_bwd + g_tail + g + (z->gsh ? b->grad_bytes : 0) + z->reduce;
        if (bw > tail)
            tail = bw;
        g_tail += z->accum ? 0 : grad_of(ch, z, k);
    }
    return tail;
}

/* The shared sizes of a config. */
static opt_shared shared_of(const ml_chain *ch, const ml_training *t, const ml_summary *res)
{
    opt_shared z = {t->grad_accum > 1 || t->zero_grad == ML_ZERO_GRAD_ZERO, t->zero >= 2,
                    ml__shard_group(t), 0, 0};
    if (t->zero >= 3)
        for (size_t k = 0; k + 1 < ch->n; k++) {
            uint64_t e = (ch->blocks[k].params + ch->blocks[k + 1].params) * ch->prec.param;
            if (e > z.gather)
                z.gather = e;
        }
    if (z.gsh) {
        uint64_t e = t->reduce_bucket < res->params ? t->reduce_bucket : res->params;
        z.reduce = e * ch->prec.grad;
    }
    return z;
}

/* autocast's weight copies of blocks [lo, hi) */
static uint64_t cast_of(const ml_chain *ch, size_t lo, size_t hi)
{
    uint64_t c = 0;
    for (size_t k = lo; k < hi; k++)
        c += ch->blocks[k].cast_bytes;
    return c;
}

/* v * s / 16, without overflow for any v */
static uint64_t sixteenths(uint64_t v, unsigned s)
{
    return v / 16 * s + v % 16 * s / 16;
}

/* The chain model of ledger/optimal.h for this chain and config, with
 * cast16 sixteenths of autocast's copies (below). Quantities are the
 * replay's own (docs/optimal.md, "from the ledger"): the solver's plan is
 * then replayed and checked against the budget. */
static void opt_model(const ml_evalctx *x, const ml_summary *res, unsigned cast16,
                      ml_opt_block *ob, size_t *lo_out, size_t *hi_out, ml_opt_chain *oc)
{
    const ml_chain *ch = x->ch;
    const ml_training *t = &x->cfg->training;
    const size_t n = ch->n;
    const opt_shared z = shared_of(ch, t, res);
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
                 (z.accum ? res->bytes_grads : 0);
    uint64_t E = 0; /* kept by the blocks before the range (embedding) */
    for (size_t k = 0; k < lo; k++)
        E += keep_of(ch, k);
    /* logits: kept or through-backward — the model output the loop holds
     * through every block's backward */
    uint64_t held = 0;
    if (t->logits == ML_LOGITS_KEPT || t->logits == ML_LOGITS_THROUGH_BACKWARD)
        for (size_t k = hi; k < n; k++)
            if (ch->blocks[k].in_held)
                held += ch->blocks[k].in_bytes;
    /* gradients created after block k's backward has started: blocks > k */
    uint64_t later = 0;
    for (size_t k = n; k-- > hi;)
        later += z.accum ? 0 : grad_of(ch, &z, k);
    /* autocast's weight copies: a checkpointed block's stay in the cache
     * from its forward to the loss (docs/precision.md); a kept block's are
     * among its saved tensors. With cast16 = 16 the model holds every
     * earlier block's in the forward (cast_before: at least what the
     * replay holds, more by the kept blocks' own, which their saved bytes
     * count already), with 0 none, in between that share; none in the
     * backward, where the replay holds none */
    const uint64_t cast_all = cast_of(ch, lo, hi);
    uint64_t cast_before = cast_all;
    for (size_t k = hi; k-- > lo;) {
        const ml_cblock *b = &ch->blocks[k];
        ml_opt_block *o = &ob[k - lo];
        uint64_t out = k + 1 < n ? ch->blocks[k + 1].in_bytes : 0;
        o->keep = keep_of(ch, k);
        o->input = b->in_bytes;
        o->recomp = o->keep - (b->in_saved ? b->in_bytes : 0);
        cast_before -= b->cast_bytes;
        const uint64_t cast_held = sixteenths(cast_before, cast16);
        o->fwd = cast_held + b->in_bytes + b->saved_bytes + b->ws_fwd + out + z.gather;
        /* a transient found op by op holds the block's own copies already
         * (the walk keeps them: chain_fsteps.c) */
        const uint64_t own = b->ws_nograd_ops ? 0 : sixteenths(b->cast_bytes, cast16);
        o->fwd_ng = cast_held + own + b->in_bytes + b->ws_nograd + out + z.gather;
        uint64_t g = z.accum ? b->grad_accum_bytes : grad_of(ch, &z, k);
        o->bwd = b->ws_bwd + g + (z.gsh ? b->grad_bytes : 0) + z.gather + z.reduce;
        o->base_b = R + E + held + later;
        o->flops = b->flops_fwd;
        later += z.accum ? 0 : grad_of(ch, &z, k);
    }
    oc->n = hi - lo;
    oc->blk = ob;
    oc->base_f = R + E;
    oc->base_t = R + E + tail_need(ch, &z, hi, sixteenths(cast_all, cast16)) + z.gather;
    /* the replay checks the limit's rounding */
    oc->budget = res->budget < res->device_limit ? res->budget : res->device_limit;
    oc->budget = oc->budget > x->start_held ? oc->budget - x->start_held : 0;
}

/* One checkpoint: optimal evaluation in progress: the chain model, the
 * solver's memory, the plan (seg, whole chain) and the ledger its replays
 * write. */
typedef struct {
    ml_evalctx *x;
    ml_ledger *l;
    int *seg;
    int *oseg;   /* the solver's plan over the checkpointable range */
    int *best;   /* the best plan found to fit (relax) */
    ml_opt_work *ow;
    ml_opt_chain oc;
    size_t lo, hi; /* the checkpointable range of the chain */
    ml_error *err;
    ml_opt_block *ob; /* the model's blocks (oc.blk), rebuilt by solve_share */
} opt_run;

/* Solves the chain model at `budget`; when feasible, r->seg holds the plan. */
static ml_status solve_at(opt_run *r, uint64_t budget, bool *feasible)
{
    double cost = 0;
    r->oc.budget = budget;
    ml_status st = ml__opt_solve_in(r->ow, &r->oc, 0, r->oseg, &cost, feasible, NULL);
    if (st) /* the solver sets no message of its own */
        return ml__errorf(r->err, st,
                          st == ML_NOMEM ? "out of memory" : "too many blocks for the optimal solver");
    if (*feasible)
        for (size_t k = 0; k < r->x->ch->n; k++)
            r->seg[k] = k >= r->lo && k < r->hi ? r->oseg[k - r->lo] : -1;
    return ML_OK;
}

/* The model budgets tried: the largest at which the model found no plan,
 * and the least at which it found one whose replay did not fit (0: none). */
typedef struct {
    uint64_t rejected, over;
} opt_tried;

/* Solves at the target, replays, and tightens the model's budget by any
 * excess until the replay fits (a few rounds at most). */
static ml_status tighten(opt_run *r, uint64_t target, bool *fits, opt_tried *tr)
{
    uint64_t budget = target;
    for (int round = 0; round < 8 && !*fits; round++) {
        bool feasible = false;
        ml_status st = solve_at(r, budget, &feasible);
        if (st)
            return st;
        if (!feasible) {
            tr->rejected = budget;
            return ML_OK;
        }
        if ((st = ml__eval_run(r->x, r->seg, false, r->l, r->err)))
            return st;
        if (r->l->sum.fits) {
            *fits = true;
            return ML_OK;
        }
        tr->over = budget;
        const uint64_t peak = r->l->sum.peak;
        const uint64_t over = peak > target ? peak - target : 1;
        if (over >= budget)
            return ML_OK;
        budget -= over;
    }
    return ML_OK;
}

/* Replays r->seg; a fit is kept in r->best. */
static ml_status try_plan(opt_run *r, bool *fits)
{
    ml_status st = ml__eval_run(r->x, r->seg, false, r->l, r->err);
    *fits = !st && r->l->sum.fits;
    if (*fits)
        memcpy(r->best, r->seg, r->x->ch->n * sizeof *r->seg);
    return st;
}

/* The first budget from `from`, stepping by d = step, 2 step, 4 step ...
 * up to cap, up (sign 1) or down, at which the model finds a plan (want
 * true) or none (want false); 0 when none is. */
static ml_status probe(opt_run *r, uint64_t from, uint64_t step, uint64_t cap, bool up, bool want,
                       uint64_t *at, uint64_t *last)
{
    *at = 0;
    for (uint64_t d = step; d <= cap && d < from; d *= 2) {
        const uint64_t b = up ? from + d : from - d;
        bool feasible = false;
        ml_status st = solve_at(r, b, &feasible);
        if (st)
            return st;
        if (feasible == want) {
            *at = b;
            return ML_OK;
        }
        *last = b;
    }
    return ML_OK;
}

/* The tightening found no plan whose replay fits, but the model is coarser
 * than the replay, in both directions (docs/optimal.md, "Guarantee of the
 * verdict"). The least model budget at which it finds a plan is bracketed
 * (stepping from the budgets tried by 1/1024 of the target, doubling, up
 * to 1/16) and bisected; that plan, of the lowest model peak, is replayed,
 * and when it fits, the larger budgets up to the least whose plan was over
 * (less recompute) are bisected for the last that still fits. At most
 * 7 + 8 + 6 solves. */
static ml_status relax(opt_run *r, uint64_t target, const opt_tried *tr, bool *fits)
{
    const uint64_t step = target >> 10 > (1u << 20) ? target >> 10 : 1u << 20;
    const uint64_t cap = target >> 4;
    uint64_t bad = tr->rejected, good = tr->over, top = tr->over ? tr->over : target + cap;
    bool feasible = false;
    ml_status st = ML_OK;
    if (!good && (st = probe(r, bad, step, cap, true, true, &good, &bad)))
        return st;
    if (good && !bad && (st = probe(r, good, step, cap, false, false, &bad, &good)))
        return st;
    if (!good)
        return ML_OK;
    for (int i = 0; i < 8 && good - bad > 1; i++) {
        const uint64_t mid = bad + (good - bad) / 2;
        if ((st = solve_at(r, mid, &feasible)))
            return st;
        *(feasible ? &good : &bad) = mid;
    }
    if ((st = solve_at(r, good, &feasible)) || !feasible || (st = try_plan(r, fits)) || !*fits)
        return st;
    for (int i = 0; i < 6 && top > good + 1; i++) {
        const uint64_t mid = good + (top - good) / 2;
        bool ok = false;
        if ((st = solve_at(r, mid, &feasible)) || (feasible && (st = try_plan(r, &ok))))
            return st;
        *(ok ? &good : &top) = mid;
    }
    memcpy(r->seg, r->best, r->x->ch->n * sizeof *r->seg);
    return ML_OK;
}

/* Solves with a share (cast16 / 16) of autocast's copies in the model,
 * at the model budget target, and replays the plan: *fits when the model
 * found one and its replay fits. */
static ml_status solve_share(opt_run *r, const ml_summary *res, unsigned cast16, uint64_t target,
                             bool *feasible, bool *fits)
{
    size_t lo, hi;
    opt_model(r->x, res, cast16, r->ob, &lo, &hi, &r->oc);
    *fits = false;
    ml_status st = solve_at(r, target, feasible);
    if (!st && *feasible && !(st = ml__eval_run(r->x, r->seg, false, r->l, r->err)))
        *fits = r->l->sum.fits;
    return st;
}

/* With autocast's copies (docs/optimal.md, "Autocast's copies"), where
 * the tightening found no plan that fits: the model without them
 * understates a plan's forward, and with all of them counted overstates it
 * by the kept blocks' own. With all of them: when that plan fits, the
 * share between is bisected four times for a plan that fits and
 * recomputes less. *fits false when it does not (the model is then left
 * without them, for relax). */
static ml_status cast_shares(opt_run *r, const ml_summary *res, uint64_t target, bool *fits)
{
    const size_t n = r->x->ch->n;
    bool feasible = false;
    ml_status st = solve_share(r, res, 16, target, &feasible, fits);
    if (st || !*fits) {
        size_t lo, hi;
        opt_model(r->x, res, 0, r->ob, &lo, &hi, &r->oc);
        return st;
    }
    double best = r->l->sum.flops_recompute;
    memcpy(r->best, r->seg, n * sizeof *r->seg);
    unsigned over = 0, fit = 16;
    for (int i = 0; i < 4 && fit - over > 1; i++) {
        const unsigned mid = over + (fit - over) / 2;
        bool ok = false;
        if ((st = solve_share(r, res, mid, target, &feasible, &ok)))
            return st;
        if (ok && r->l->sum.flops_recompute < best) {
            best = r->l->sum.flops_recompute;
            memcpy(r->best, r->seg, n * sizeof *r->seg);
        }
        *(ok ? &fit : &over) = mid;
    }
    memcpy(r->seg, r->best, n * sizeof *r->seg);
    return ml__eval_run(r->x, r->seg, false, r->l, r->err);
}

/* The fixed segment policies: the one with the least recompute among those
 * whose replay fits, when it recomputes less than the plan in seg (*fits:
 * seg fits, recomputing rec); else, when nothing fits, the lowest peak (of
 * equal peaks, the least recompute); of equals, the first in the table. */
static ml_status fixed_fallback(ml_evalctx *x, int *seg, ml_ledger *l, bool *fits, double rec0,
                                ml_error *err)
{
    const ml_chain *ch = x->ch;
    const size_t n = ch->n;
    ml_status st = ML_OK;
    size_t ncand = 0;
    const ml_checkpoint_candidate *cands = ml_checkpoint_candidates(&ncand);
    uint64_t best = UINT64_MAX;
    double best_fit = *fits ? rec0 : INFINITY, best_rec = INFINITY;
    int *tmp = calloc(n ? n : 1, sizeof *tmp);
    if (!tmp) {
        return ml__errorf(err, ML_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < ncand; i++) {
        if (!cands[i].segments)
            continue;
        ml_checkpoint cp;
        ml_parse_checkpoint(cands[i].name, &cp, NULL);
        if ((st = ml__eval_segments(ch, &cp, tmp, err)) || (st = ml__eval_run(x, tmp, false, l, err)))
            break;
        const double rec = l->sum.flops_recompute;
        if (l->sum.fits && rec < best_fit) {
            best_fit = rec;
            *fits = true;
            memcpy(seg, tmp, n * sizeof *seg);
        } else if (!*fits && (l->sum.peak < best || (l->sum.peak == best && rec < best_rec))) {
            best = l->sum.peak;
            best_rec = rec;
            memcpy(seg, tmp, n * sizeof *seg);
        }
    }
    free(tmp);
    return st;
}

/* checkpoint: optimal. Solves on the chain model, replays the plan and
 * tightens the model's budget until the replay fits; where the model
 * rejects every plan at the budget, relaxes it (relax); then the fixed
 * policies, unless the first solve fitted: the least recompute that fits,
 * else the lowest peak. *fits tells whether the plan fits
 * (docs/optimal.md, "Guarantee of the verdict"). */
ml_status ml__eval_optimal(ml_evalctx *x, int *seg, ml_ledger *l, bool *fits, ml_error *err)
{
    const ml_chain *ch = x->ch;
    const size_t n = ch->n;
    for (size_t k = 0; k < n; k++)
        seg[k] = -1;
    /* residents from a plain replay */
    ml_status st = ml__eval_run(x, seg, false, l, err);
    if (st)
        return st;
    /* nothing checkpointed fits: no plan recomputes less (0 FLOPs, no
     * block), and no solve is needed (on a long chain under a roomy budget
     * every segment reaches the end: n^2 / 2 extensions) */
    *fits = l->sum.fits;
    if (*fits)
        return ML_OK;
    /* over the line at the optimizer step, the binding peak: no plan can
     * help (every activation is freed by then; the step's bytes are the
     * states', whatever the plan), so nothing is solved; the fixed
     * policies give the lowest peak */
    if (l->sum.binding == ML_PEAK_STEADY && l->sum.peak_phase == ML_PHASE_OPTIMIZER)
        return fixed_fallback(x, seg, l, fits, 0, err);
    ml_summary res = l->sum;
    ml_opt_block *ob = calloc(n ? n : 1, sizeof *ob);
    opt_run r = {x, l, seg, calloc(n ? n : 1, sizeof(int)), calloc(n ? n : 1, sizeof(int)),
                 ml__opt_work_create(), {0}, 0, 0, err, ob};
    if (!ob || !r.oseg || !r.best || !r.ow) {
        st = ml__errorf(err, ML_NOMEM, "out of memory");
        goto done;
    }
    opt_model(x, &res, 0, ob, &r.lo, &r.hi, &r.oc);
    const uint64_t target = r.oc.budget;
    opt_tried tr = {0, 0};
    *fits = false;
    /* autocast's copies are what the tightening missed only in the
     * allocated view: with a simulated cache allowed for (x->cache_allow,
     * verdict.c), the replay is over by the allowance, which relax treats */
    if ((st = tighten(&r, target, fits, &tr)) || *fits)
        goto done;
    const bool shares = cast_of(ch, r.lo, r.hi) && tr.rejected != target && !x->cache_allow;
    if (shares && !(st = cast_shares(&r, &res, target, fits)) && *fits) {
        /* the fixed policies still, where one fits with less recompute */
        st = fixed_fallback(x, seg, l, fits, l->sum.flops_recompute, err);
        goto done;
    }
    if (st || (st = relax(&r, target, &tr, fits)))
        goto done;
    double rec = 0;
    if (*fits && !(st = ml__eval_run(x, seg, false, l, err)))
        rec = l->sum.flops_recompute;
    if (!st)
        st = fixed_fallback(x, seg, l, fits, rec, err);
done:
    free(ob);
    free(r.oseg);
    free(r.best);
    ml__opt_work_destroy(r.ow);
    return st;
}
