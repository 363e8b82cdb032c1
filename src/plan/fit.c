/* fit: the largest micro-batch and the accumulation steps, a search over the
 * exact ledger. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ledger/chain.h"
#include "plan/fit_search.h"
#include "memledger/plan.h"
#include "util/error.h"

ml_fit_request ml_fit_request_defaults(void)
{
    ml_fit_request r;
    memset(&r, 0, sizeof r);
    r.max_micro_batch = 65536;
    return r;
}


/* training.grad_accum's limit, the one ml_config_problem checks
 * (src/ledger/check.c): a global batch that needs more steps is refused
 * naming the global batch, not the accumulation the search derived. */
#define FIT_MAX_ACCUM (1ull << 20)

/* Whether s->cfg's plan cannot fit with the allocator simulated, seen without
 * it: its peak alone is over the budget, or with the reserve over the memory
 * (the simulation only adds to both: verdict, evaluate.c). False if unsure. */
static bool over_without_cache(search *s)
{
    const ml_device *dv = &s->cfg.device;
    if (dv->allocator == ML_ALLOCATOR_NONE || !dv->present || dv->memory > (1ull << 62))
        return false;
    ml_config c = s->cfg;
    ml__device_allocated_view(&c.device);
    ml_ledger *l = NULL;
    if (ml_planner_evaluate(s->planner, &c, false, &l, NULL) != ML_OK)
        return false;
    const ml_summary *x = ml_ledger_summary(l);
    uint64_t peak = x->peak_total - x->runtime_reserve - x->fragmentation; /* no wrap */
    bool over = peak > x->budget || peak > x->memory || x->memory - peak < x->runtime_reserve;
    ml_ledger_destroy(l);
    return over;
}

/* Evaluates at micro-batch b (without sum, unsimulated if over_without_cache;
 * the plan that fit last, when its config is this one, not planned again). */
static ml_status try_b(search *s, uint64_t b, bool *fits, ml_summary *sum)
{
    s->cfg.training.micro_batch = b;
    ml_ledger *l = NULL;
    s->evals++;
    if (s->has_fit && !memcmp(&s->fit_cfg, &s->cfg, sizeof s->cfg)) {
        *fits = true;
        if (sum)
            *sum = s->fit_sum;
        return ML_OK;
    }
    if (!sum && over_without_cache(s)) {
        *fits = false;
        return ML_OK;
    }
    ml_status st = ml__planner_evaluate_with(s->planner, &s->cfg, false, s->memo, &l, s->err);
    if (st == ML_OVERFLOW) {
        *fits = false; /* too large to represent is too large to fit */
        return ML_OK;
    }
    if (st)
        return st;
    const ml_summary *x = ml_ledger_summary(l);
    *fits = x->fits;
    if (sum)
        *sum = *x;
    if (x->fits) {
        s->has_fit = true;
        memcpy(&s->fit_cfg, &s->cfg, sizeof s->cfg); /* the bytes memcmp compares */
        s->fit_sum = *x;
    }
    ml_ledger_destroy(l);
    return ML_OK;
}

/* The largest b in [lo, hi) that fits, lo fitting and hi not: bisection. */
static ml_status bisect(search *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
    bool ok;
    while (hi - lo > 1) {
        uint64_t mid = lo + (hi - lo) / 2;
        ml_status st = try_b(s, mid, &ok, NULL);
        if (st)
            return st;
        if (ok)
            lo = mid;
        else
            hi = mid;
    }
    *out = lo;
    return ML_OK;
}

/* Largest b in [1, cap] that fits, 0 when none: doubling, then bisection.
 * Valid because the peak never decreases as b grows (every tensor's size is
 * non-decreasing in b; tests/unit/test_fit.c checks it on every preset). */
static ml_status doubling(search *s, uint64_t cap, uint64_t *out)
{
    bool ok;
    ml_status st = try_b(s, 1, &ok, NULL);
    if (st || !ok) {
        *out = 0;
        return st;
    }
    uint64_t lo = 1, hi = 0; /* lo fits; hi (if set) does not */
    while (!hi) {
        uint64_t b = lo * 2 > cap ? cap : lo * 2;
        if (b == lo) {
            *out = lo;
            return ML_OK;
        }
        if ((st = try_b(s, b, &ok, NULL)))
            return st;
        if (ok)
            lo = b;
        else
            hi = b;
        if (ok && b == cap) {
            *out = cap;
            return ML_OK;
        }
    }
    return bisect(s, lo, hi, out);
}

/* The same, its answer kept for the same config and cap (search.top). */
static ml_status largest_from_one(search *s, uint64_t cap, uint64_t *out)
{
    ml_config key = s->cfg;
    key.training.micro_batch = 0;
    if (s->has_top && s->top_cap == cap && !memcmp(&s->top_cfg, &key, sizeof key)) {
        *out = s->top;
        return ML_OK;
    }
    ml_status st = doubling(s, cap, out);
    if (!st) {
        s->has_top = true;
        memcpy(&s->top_cfg, &key, sizeof key);
        s->top_cap = cap;
        s->top = *out;
    }
    return st;
}

/* Largest b in [1, top] that fits, 0 when none, searching down from top:
 * top, then steps of 1, 2, 4, ... below it until one fits, then bisection
 * between that one and the last that did not. */
static ml_status largest_below(search *s, uint64_t top, uint64_t *out)
{
    bool ok;
    ml_status st = try_b(s, top, &ok, NULL);
    if (st || ok) {
        *out = st ? 0 : top;
        return st;
    }
    uint64_t hi = top, lo = 0, d = 1; /* hi does not fit; lo (if set) does */
    while (!lo) {
        uint64_t b = hi > d ? hi - d : 1;
        if ((st = try_b(s, b, &ok, NULL)))
            return st;
        if (ok)
            lo = b;
        else if (b == 1) {
            *out = 0;
            return ML_OK;
        } else {
            hi = b;
            d *= 2;
        }
    }
    return bisect(s, lo, hi, out);
}

/* Largest b in [1, cap] that fits, 0 when none. With the allocator
 * simulated and a device, the allocated view is searched first, without
 * the simulation: a plan that fits with its cache fits without it (the
 * simulation only adds to what the budget and the device hold: verdict.c),
 * so the answer is at most the allocated view's, and the simulated search
 * runs down from there (docs/allocator.md, "The verdict"). */
static ml_status largest(search *s, uint64_t cap, uint64_t *out)
{
    const ml_device a = s->cfg.device;
    if (a.allocator == ML_ALLOCATOR_NONE || !a.present)
        return largest_from_one(s, cap, out);
    ml__device_allocated_view(&s->cfg.device);
    uint64_t top = 0;
    ml_status st = largest_from_one(s, cap, &top);
    s->cfg.device = a;
    if (st || !top) {
        *out = 0;
        return st;
    }
    return largest_below(s, top, out);
}

/* A device's share of the global batch over dp data-parallel ranks,
 * rounded up where it does not split evenly. */
static uint64_t per_device(const ml_fit_request *req, uint64_t dp)
{
    return req->global_batch / dp + (req->global_batch % dp != 0);
}

static uint64_t largest_divisor_at_most(uint64_t n, uint64_t cap)
{
    for (uint64_t d = cap < n ? cap : n; d > 1; d--)
        if (n % d == 0)
            return d;
    return 1;
}

/* Micro-batch and accumulation for one policy. */
/* The micro-batch and the accumulation steps for the largest micro-batch
 * r->max_micro_batch (per: the per-device share of the global batch):
 * without a global batch, the largest; else the largest dividing per, or
 * the batch rounded up. ML_RANGE when the steps pass FIT_MAX_ACCUM. */
static ml_status split_batch(search *s, const ml_fit_request *req, ml_fit_result *r, uint64_t per)
{
    const uint64_t dp = s->cfg.training.data_parallel;
    if (!req->global_batch) {
        r->micro_batch = r->max_micro_batch;
        r->grad_accum = s->cfg.training.grad_accum;
    } else if (per / largest_divisor_at_most(per, r->max_micro_batch) <= FIT_MAX_ACCUM) {
        /* (per rounded up where the global batch does not split evenly over
         * the devices: the effective batch is then per x devices, the
         * smallest even split above it; finish says so) */
        r->micro_batch = largest_divisor_at_most(per, r->max_micro_batch);
        r->grad_accum = per / r->micro_batch;
        if (r->micro_batch * 2 <= r->max_micro_batch) {
            uint64_t acc = per / r->max_micro_batch + (per % r->max_micro_batch != 0);
            snprintf(r->note, sizeof r->note,
                     "%llu is the largest micro-batch dividing %llu per device; micro-batch %llu "
                     "x %llu steps would fit too but makes the effective batch %llu",
                     (unsigned long long)r->micro_batch, (unsigned long long)per,
                     (unsigned long long)r->max_micro_batch, (unsigned long long)acc,
                     (unsigned long long)(r->max_micro_batch * acc * dp));
        }
    } else {
        /* also when the divisor of per is so small that its steps pass the
         * limit: the largest micro-batch, the batch rounded up */
        r->micro_batch = r->max_micro_batch;
        r->grad_accum = per / r->micro_batch + (per % r->micro_batch != 0);
        r->exact = false;
    }
    if (r->grad_accum > FIT_MAX_ACCUM) {
        uint64_t most;
        if (__builtin_mul_overflow(r->max_micro_batch, FIT_MAX_ACCUM, &most) ||
            __builtin_mul_overflow(most, dp, &most))
            most = UINT64_MAX;
        s->accum_over = true;
        return ml__errorf(s->err, ML_RANGE,
                          "global_batch %llu: needs %llu accumulation steps of micro-batch %llu "
                          "(the largest that fits, up to max_micro_batch) on %llu device%s, "
                          "past the limit of %llu steps (training.grad_accum): the global batch "
                          "can be at most %llu here (micro-batch x %llu x devices); give a "
                          "smaller global_batch or more devices (training.data_parallel)",
                          (unsigned long long)req->global_batch,
                          (unsigned long long)r->grad_accum,
                          (unsigned long long)r->max_micro_batch, (unsigned long long)dp,
                          dp == 1 ? "" : "s", FIT_MAX_ACCUM, (unsigned long long)most,
                          FIT_MAX_ACCUM);
    }
    return ML_OK;
}

/* The divisor of the per-device batch split_batch chose, below the largest
 * micro-batch that fits, need not fit itself: near the device's capacity
 * the simulated verdict is not monotone in the micro-batch (allocator.md,
 * "The verdict"). Then the next smaller divisor that fits, with its
 * accumulation steps; when none does, a note that says so. */
static ml_status divisor_that_fits(search *s, const ml_fit_request *req, ml_fit_result *r,
                                   uint64_t per)
{
    if (!req->global_batch || !r->exact || r->micro_batch == r->max_micro_batch)
        return ML_OK; /* the largest itself, which the search found fitting */
    const uint64_t chosen = r->micro_batch;
    for (uint64_t d = chosen;; d = largest_divisor_at_most(per, d - 1)) {
        if (per / d > FIT_MAX_ACCUM)
            break;
        bool ok = false;
        s->cfg.training.grad_accum = per / d;
        ml_status st = try_b(s, d, &ok, NULL);
        if (st)
            return st;
        if (ok) {
            if (d != chosen) {
                r->micro_batch = d;
                r->grad_accum = per / d;
                snprintf(r->note, sizeof r->note,
                         "micro-batch %llu divides %llu per device but does not fit with its "
                         "cache (near the limit the verdict is not monotone in the "
                         "micro-batch); %llu is the largest divisor below it that fits",
                         (unsigned long long)chosen, (unsigned long long)per,
                         (unsigned long long)d);
            }
            return ML_OK;
        }
        if (d == 1)
            break;
    }
    snprintf(r->note, sizeof r->note,
             "micro-batch %llu fits, but no micro-batch dividing %llu per device does (with its "
             "accumulation steps): give a global batch whose per-device share has a fitting "
             "divisor",
             (unsigned long long)r->max_micro_batch, (unsigned long long)per);
    return ML_OK;
}

/* The result for the chosen micro-batch: the effective batch, a note where
 * it is not the global batch asked for, and the plan's figures. */
static ml_status finish(search *s, const ml_fit_request *req, ml_fit_result *r, uint64_t per)
{
    const uint64_t dp = s->cfg.training.data_parallel;
    ml_status st;
    s->cfg.training.grad_accum = r->grad_accum;
    r->data_parallel = dp;
    r->effective_batch = r->micro_batch * r->grad_accum * dp;
    if (req->global_batch && r->effective_batch != req->global_batch &&
        req->global_batch % dp == 0) {
        /* per splits evenly, but only by a micro-batch too small for the
         * accumulation limit (above) */
        r->exact = false;
        snprintf(r->note, sizeof r->note,
                 "no micro-batch up to %llu divides %llu per device in at most %llu steps: the "
                 "effective batch becomes %llu (micro-batch %llu x %llu steps x %llu devices)",
                 (unsigned long long)r->max_micro_batch, (unsigned long long)per, FIT_MAX_ACCUM,
                 (unsigned long long)r->effective_batch, (unsigned long long)r->micro_batch,
                 (unsigned long long)r->grad_accum, (unsigned long long)dp);
    } else if (req->global_batch && r->effective_batch != req->global_batch) {
        /* the choice's own note (a larger micro-batch that fits too) stays
         * after this one */
        char was[sizeof r->note];
        snprintf(was, sizeof was, "%s", r->note);
        r->exact = false;
        snprintf(r->note, sizeof r->note,
                 "global batch %llu does not split evenly over %llu devices: the effective batch "
                 "becomes %llu (micro-batch %llu x %llu steps x %llu devices)%s%s",
                 (unsigned long long)req->global_batch, (unsigned long long)dp,
                 (unsigned long long)r->effective_batch, (unsigned long long)r->micro_batch,
                 (unsigned long long)r->grad_accum, (unsigned long long)dp, was[0] ? "; " : "",
                 was);
    }
    ml_summary sum;
    bool ok;
    if ((st = try_b(s, r->micro_batch, &ok, &sum)))
        return st;
    r->fits = ok;
    r->peak_total = sum.peak_total;
    r->peak = sum.peak;
    r->budget = sum.budget;
    r->headroom = sum.headroom;
    r->flops_recompute = sum.flops_recompute;
    r->step_time_s = ml_summary_step_time(&sum);
    snprintf(r->plan, sizeof r->plan, "%s", sum.plan);
    return ML_OK;
}

static ml_status fit_policy(search *s, const ml_fit_request *req, ml_fit_result *r)
{
    const uint64_t dp = s->cfg.training.data_parallel;
    const uint64_t asked = req->max_micro_batch ? req->max_micro_batch : 65536;
    uint64_t cap = asked;
    uint64_t lim = ml_model_max_micro_batch(s->m);
    if (lim && cap > lim)
        cap = lim; /* a sequence classifier without pad_token_id */
    /* the effective batch stays below 2^64 (ml_config_problem): at 2^20
     * steps on 2^20 devices the largest micro-batch is 2^24 - 1 */
    const uint64_t most = UINT64_MAX / (s->cfg.training.grad_accum * dp);
    if (!req->global_batch && cap > most)
        cap = lim = most;
    uint64_t per = 0;
    ml_status st;
    r->exact = true;
    r->note[0] = '\0';
    if (req->global_batch) {
        per = per_device(req, dp);
        if (per < cap)
            cap = per;
        /* no accumulation needed if the whole per-device batch fits */
        s->cfg.training.grad_accum = 1;
        bool ok = false;
        if (per <= cap && (st = try_b(s, per, &ok, NULL)))
            return st;
        if (ok && req->global_batch % dp == 0) {
            r->at_global_batch = true;
            r->max_micro_batch = per;
            r->micro_batch = per;
            r->grad_accum = 1;
            return finish(s, req, r, per);
        }
        /* accumulation keeps gradients resident across micro-batches: search
         * with it on (any count > 1 has the same peak) */
        s->cfg.training.grad_accum = 2;
    }
    if ((st = largest(s, cap, &r->max_micro_batch)))
        return st;
    /* stopped by the search's upper end, not by the device (a cap from the
     * model or the global batch is no search limit) */
    r->at_search_limit = r->max_micro_batch == asked && (!req->global_batch || per > asked) &&
                         (!lim || lim > asked);
    /* stopped by the global batch: the whole of it per device fits */
    r->at_global_batch = req->global_batch && r->max_micro_batch == per;
    if (!r->max_micro_batch)
        return ML_OK;
    if ((st = split_batch(s, req, r, per)) || (st = divisor_that_fits(s, req, r, per)))
        return st;
    return finish(s, req, r, per);
}

/* Whether s->cfg's policy could be better than best (a larger micro-batch,
 * or as large with less recompute), seen first without the allocator
 * simulation: its micro-batch there is at least the simulated one (a plan
 * that fits with its cache fits without it, and the choice from the
 * largest is non-decreasing in it), and its recompute is the same (a fixed
 * policy) or less (optimal, which must leave room for a cache). True when
 * unsure: the search without the simulation failed. */
static bool could_beat(search *s, const ml_fit_request *req, const ml_fit_result *best)
{
    const ml_allocator a = s->cfg.device.allocator;
    if (a == ML_ALLOCATOR_NONE)
        return true;
    const ml_config keep = s->cfg;
    ml__device_allocated_view(&s->cfg.device);
    ml_error *err = s->err, local;
    s->err = &local;
    ml_fit_result r;
    memset(&r, 0, sizeof r);
    ml_status st = fit_policy(s, req, &r);
    s->err = err;
    s->cfg = keep;
    s->accum_over = false;
    if (st)
        return true;
    return r.micro_batch > best->micro_batch ||
           (r.micro_batch == best->micro_batch && r.flops_recompute < best->flops_recompute);
}

/* Nothing fits: the result says so, with the budget and why (ml__fit_explain). */
static ml_status explain_miss(search *s, const ml_config *cfg, const ml_fit_request *req,
                              ml_fit_result *best)
{
    best->fits = false;
    best->data_parallel = cfg->training.data_parallel;
    best->budget = ml_device_budget(&cfg->device); /* the line nothing fits under */
    best->checkpoint = cfg->training.checkpoint;
    s->cfg = *cfg;
    /* micro-batch 1 as the search planned it: accumulating where the global
     * batch's share of a device is more than one sample (any count above 1
     * has the same peak), else the configured steps */
    if (req->global_batch)
        s->cfg.training.grad_accum = per_device(req, cfg->training.data_parallel) > 1 ? 2 : 1;
    ml_status st = ml__fit_explain(s, best);
    best->evaluations = s->evals;
    return st;
}

static ml_status fit(search *sp, const ml_model *m, const ml_config *cfg,
                     const ml_fit_request *req, ml_fit_result *out, ml_error *err)
{
    search s = *sp;
    ml_fit_result best;
    memset(&best, 0, sizeof best);
    ml_status st;
    if (!req->auto_checkpoint) {
        if ((st = fit_policy(&s, req, &best)))
            return st;
        best.checkpoint = cfg->training.checkpoint;
    } else {
        /* the cheapest policy (recompute FLOPs) that admits the largest
         * useful micro-batch; of equals, the first in the table */
        size_t ncand = 0;
        const ml_checkpoint_candidate *cands = ml_checkpoint_candidates(&ncand);
        bool have = false;
        /* a policy admitting too small a micro-batch for the global batch's
         * steps is passed over; if none admits one, the message of the one
         * with the largest micro-batch (the highest limit) stands */
        ml_error over;
        uint64_t over_b = 0;
        bool any_over = false;
        for (size_t i = 0; i < ncand; i++) {
            ml_fit_result r;
            memset(&r, 0, sizeof r);
            s.cfg = *cfg;
            s.accum_over = false;
            ml_parse_checkpoint(cands[i].name, &s.cfg.training.checkpoint, NULL);
            ml_error why;
            if (ml__chain_refused(m, &s.cfg.training, &why) != ML_OK)
                continue; /* a policy the model refuses (optimal, for T5) */
            if (have && !could_beat(&s, req, &best))
                continue;
            if ((st = fit_policy(&s, req, &r)) == ML_RANGE && s.accum_over) {
                if (!any_over || r.max_micro_batch > over_b) {
                    over = *err;
                    over_b = r.max_micro_batch;
                }
                any_over = true;
                continue;
            }
            if (st)
                return st;
            if (!r.max_micro_batch)
                continue;
            r.checkpoint = s.cfg.training.checkpoint;
            /* the chosen micro-batch is already capped at what the global
             * batch can use */
            bool better = !have || r.micro_batch > best.micro_batch ||
                          (r.micro_batch == best.micro_batch &&
                           r.flops_recompute < best.flops_recompute);
            if (better) {
                best = r;
                have = true;
            }
        }
        if (!have && any_over) {
            *err = over;
            return over.code;
        }
    }
    best.evaluations = s.evals;
    if (!best.max_micro_batch && (st = explain_miss(&s, cfg, req, &best)))
        return st;
    *out = best;
    return ML_OK;
}

ml_status ml_fit(const ml_model *m, const ml_config *cfg, const ml_fit_request *req,
                 ml_fit_result *out, ml_error *err)
{
    ml_error local;
    if (!err)
        err = &local;
    memset(err, 0, sizeof *err);
    if (!cfg->device.present) {
        return ml__errorf(err, ML_USAGE,
                          "fit needs a device: give device.memory");
    }
    /* a pipeline's memory depends on the micro-batches a step (in flight):
     * the accumulation the global batch would choose changes the plan */
    if (req->global_batch && cfg->training.pipeline_parallel > 1)
        return ml__errorf(err, ML_RANGE,
                          "global_batch: with a pipeline (parallel.pp %llu) the micro-batches "
                          "a step set how many the stages hold in flight; give them "
                          "(--micro-batches) without a global batch, and fit finds the largest "
                          "micro-batch at that count, or search the layout (fit --gpus N)",
                          (unsigned long long)cfg->training.pipeline_parallel);
    ml_reserved_memo memo;
    memset(&memo, 0, sizeof memo);
    search s = {.m = m, .cfg = *cfg, .err = err, .memo = &memo}; /* the rest zero */
    ml_status st = ml_planner_create(m, &s.planner, err);
    if (st == ML_OK)
        st = fit(&s, m, cfg, req, out, err);
    ml__reserved_memo_free(&memo);
    ml_planner_destroy(s.planner);
    return st;
}
