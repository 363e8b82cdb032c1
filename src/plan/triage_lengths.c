/* triage under a length distribution: the worst batch it triages, and the
 * two remedies only a distribution has, a token budget and length buckets,
 * each planned by the lengths code (docs/lengths.md, "Triage"). */
#include <stdio.h>
#include <string.h>

#include "memledger/lengths.h"
#include "memledger/plan.h"
#include "plan/triage_internal.h"

ml_status ml__triage_worst_batch(const ml_model *m, const ml_config *cfg,
                                 const ml_triage_request *req, ml_triage_result *r,
                                 ml_config *worst, ml_error *err)
{
    ml_status st = ml_lengths_plan(m, cfg, req->lengths, &req->batching, &r->lengths, err);
    if (st)
        return st;
    r->has_lengths = true;
    worst->training.micro_batch = r->lengths.max.micro_batch;
    worst->training.seq_len = r->lengths.max.seq_len;
    return ML_OK;
}

bool ml__triage_fixed_micro_batch(const ml_triage_request *req)
{
    return !req->lengths || req->batching.batching == ML_BATCHING_PACKED ||
           (req->batching.batching == ML_BATCHING_PADDED && !req->batching.max_tokens);
}

/* The batching remedy k plans; *applies false when it does not apply. Both
 * act on padded batches (packing has no padding; bucketed batches are
 * bucketed already); the token budget needs a device and a budget that
 * fits (ml_lengths_fit_tokens, as `fit --max-tokens auto`). */
static ml_status batching_of(const ml_triage_ctx *x, ml_remedy_kind k, ml_lengths_request *b,
                             bool *applies)
{
    const ml_triage_request *req = x->req;
    *b = req->batching;
    *applies = req->lengths && req->batching.batching == ML_BATCHING_PADDED;
    if (!*applies)
        return ML_OK;
    if (k == ML_REMEDY_LENGTH_BUCKETS) {
        b->batching = ML_BATCHING_BUCKETED;
        b->max_tokens = 0; /* b->buckets: the request's, default 4 */
        return ML_OK;
    }
    *applies = false;
    if (!x->given->device.present)
        return ML_OK;
    ml_status st = ml_lengths_fit_tokens(x->m, x->given, req->lengths, &b->max_tokens, NULL,
                                         x->err);
    if (st == ML_RANGE || st == ML_OVERFLOW)
        return ML_OK; /* a budget the lengths code does not plan: no remedy */
    *applies = !st && b->max_tokens > 0;
    return st;
}

#define U(v) ((unsigned long long)(v))

/* What the batching of rm (planned as lr) changes in training. */
static void describe(const ml_triage_ctx *x, ml_remedy *rm, const ml_lengths_result *lr)
{
    char *o = rm->changes;
    const size_t n = sizeof rm->changes;
    if (rm->kind == ML_REMEDY_TOKEN_BUDGET) {
        snprintf(rm->flags, sizeof rm->flags, "--max-tokens %llu", U(rm->batching.max_tokens));
        ml__triage_put(o, n, "batches filled up to %llu tokens, the largest budget whose worst batch fits "
                  "(as fit --max-tokens auto): floor(%llu / t) samples for a longest sample of "
                  "t tokens, so the micro-batch varies per batch: %llu at the median length "
                  "(%llu tokens), %llu at P99 (%llu), %llu in the worst batch (%llu)",
            U(rm->batching.max_tokens), U(rm->batching.max_tokens), U(lr->p50.micro_batch),
            U(lr->p50.seq_len), U(lr->p99.micro_batch), U(lr->p99.seq_len),
            U(lr->max.micro_batch), U(lr->max.seq_len));
    } else {
        snprintf(rm->flags, sizeof rm->flags, "--batching bucketed --buckets %u%s",
                 rm->batching.buckets, x->req->batching.max_tokens ? " (no --max-tokens)" : "");
        ml__triage_put(o, n, "%zu buckets of equal shares, each batch drawn from one bucket and padded "
                  "to its longest length:",
            lr->nbuckets);
        for (size_t i = 0; i < lr->nbuckets; i++)
            ml__triage_put(o, n, "%s %llu-%llu tokens x %llu", i ? "," : "", U(lr->buckets[i].lo),
                U(lr->buckets[i].hi), U(lr->buckets[i].point.micro_batch));
        ml__triage_put(o, n, "; the micro-batch varies per bucket (%s); batches are no longer uniformly "
                  "random (shuffle the buckets' batches)",
            x->given->device.present ? "the largest that fits at its longest length"
                                     : "the configured one without a device");
    }
    ml__triage_put(o, n, "; the effective batch varies with the micro-batch (normalise the loss per token "
              "or per sample); step time: none derived (the lengths code plans each batch "
              "shape's memory, not the time per sample)");
}

ml_status ml__triage_add_lengths_remedy(const ml_triage_ctx *x, ml_remedy_kind k,
                                        ml_triage_result *r)
{
    ml_lengths_request b;
    bool ok;
    ml_status st = batching_of(x, k, &b, &ok);
    if (st || !ok)
        return st;
    ml_lengths_result lr;
    st = ml_lengths_plan(x->m, x->given, x->req->lengths, &b, &lr, x->err);
    if (st == ML_RANGE || st == ML_OVERFLOW)
        return ML_OK;
    if (st)
        return st;
    /* as the other remedies (ml__triage_add_remedy): a lower total, or one
     * that fits where the current plan runs out in the simulation */
    const bool fits = x->given->device.present && lr.p_over_budget == 0 && lr.max.fits;
    if (lr.max.peak_total >= r->current.peak_total &&
        !(r->current.reserved_oom_weighed && fits))
        return ML_OK;
    ml_remedy *rm = &r->remedies[r->count++];
    memset(rm, 0, sizeof *rm);
    rm->kind = k;
    rm->config = *x->cfg;
    rm->config.training.micro_batch = lr.max.micro_batch;
    rm->config.training.seq_len = lr.max.seq_len;
    rm->batching = b;
    rm->peak = lr.max.peak;
    rm->peak_total = lr.max.peak_total;
    rm->has_device = x->given->device.present;
    rm->fits = fits;
    rm->in_focus = ml__triage_in_focus(x, k);
    /* one iteration's FLOPs and time vary with its batch: not derived */
    rm->flops_total = rm->flops_ratio = rm->step_time_s = rm->slowdown = -1;
    describe(x, rm, &lr);
    return ML_OK;
}
