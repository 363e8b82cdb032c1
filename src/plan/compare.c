/* compare: checkpoint policies side by side, and the advice a plan gets
 * when a cheaper policy fits too (docs/choosing.md, "When recompute is not
 * worth it"). */
#include <stdio.h>
#include <string.h>

#include "ledger/chain.h"
#include "ledger/replay.h"
#include "memledger/plan.h"

/* Each fitting row whose recompute another fitting row undercuts points at
 * the fitting row with the least recompute (the first of equals). */
static void mark_cheaper(ml_compare_row *rows, size_t n)
{
    int best = -1;
    for (size_t i = 0; i < n; i++)
        if (rows[i].fits && (best < 0 || rows[i].flops_recompute < rows[best].flops_recompute))
            best = (int)i;
    for (size_t i = 0; best >= 0 && i < n; i++)
        if (rows[i].fits && rows[best].flops_recompute < rows[i].flops_recompute)
            rows[i].cheaper = best;
}

/* cfg with candidate pol's checkpoint policy into *c; false when the
 * candidate does not apply (optimal without a budget, an encoder-decoder). */
static bool candidate_config(const ml_model *m, const ml_config *cfg,
                             const ml_checkpoint_candidate *pol, ml_config *c)
{
    *c = *cfg;
    ml_parse_checkpoint(pol->name, &c->training.checkpoint, NULL);
    ml_error why;
    return !(pol->needs_device && !c->device.present) &&
           ml__chain_refused(m, &c->training, &why) == ML_OK;
}

/* c's plan as a row; recompute_pct against base_total (none's FLOPs). */
static ml_status plan_row(const ml_model *m, const ml_config *c, double base_total,
                          ml_reserved_memo *memo, ml_compare_row *r, ml_error *err)
{
    ml_ledger *l = NULL;
    ml_status st = ml__ledger_evaluate_with(m, c, false, false, memo, &l, err);
    if (st)
        return st;
    const ml_summary *s = ml_ledger_summary(l);
    memset(r, 0, sizeof *r);
    r->checkpoint = c->training.checkpoint;
    snprintf(r->plan, sizeof r->plan, "%s", s->plan);
    r->peak = s->peak;
    r->peak_total = s->peak_total;
    r->activations_saved = s->bytes_activations;
    r->flops_recompute = s->flops_recompute;
    r->flops_total = s->flops_total;
    r->recompute_pct = base_total > 0 ? 100.0 * s->flops_recompute / base_total : 0;
    r->step_time_s = ml_summary_step_time(s);
    r->time = s->time;
    r->has_device = s->has_device;
    r->fits = s->has_device ? (r->checkpoint.kind == ML_CKPT_OPTIMAL ? s->plan_fits_budget &&
                                                                             s->fits
                                                                       : s->fits)
                            : false;
    r->cheaper = -1;
    r->headroom = s->has_device ? s->headroom : 0;
    ml_ledger_destroy(l);
    return ML_OK;
}

ml_status ml_compare(const ml_model *m, const ml_config *cfg, ml_compare_row *rows, size_t *nrows,
                     ml_error *err)
{
    size_t npol = 0;
    const ml_checkpoint_candidate *pols = ml_checkpoint_candidates(&npol);
    size_t n = 0;
    double base_total = 0;
    /* a setting the model refuses whatever the policy is the settings'
     * refusal, as plan gives it; a policy the model refuses (optimal for
     * T5, under pipeline stages) only leaves its row out */
    ml_config base = *cfg;
    ml_parse_checkpoint("none", &base.training.checkpoint, NULL);
    ml_status st = ml__chain_refused(m, &base.training, err);
    if (st)
        return st;
    ml_reserved_memo memo; /* policies with one plan simulate it once */
    memset(&memo, 0, sizeof memo);
    for (size_t i = 0; i < npol && !st; i++) {
        ml_config c;
        if (!candidate_config(m, cfg, &pols[i], &c))
            continue;
        if (!(st = plan_row(m, &c, base_total, &memo, &rows[n], err)) && i == 0)
            base_total = rows[n].flops_total;
        n += !st;
    }
    ml__reserved_memo_free(&memo);
    if (st)
        return st;
    mark_cheaper(rows, n);
    *nrows = n;
    return ML_OK;
}

/* The advice is the fitting candidate with the least recompute (the first
 * of equals) below the plan's own. With the caching allocator simulated,
 * each candidate is first planned without it: its allocated peak is at most
 * its reserved one, so a candidate that does not fit then does not fit
 * with it, and its recompute there is a floor (a fixed policy's recompute
 * is the same; optimal's can only rise with a cache to fit). Candidates are
 * then simulated in order of that floor, until none left can undercut the
 * best that fits: the same advice as ml_compare's rows give, most often
 * for one simulation instead of seven. */
ml_status ml_checkpoint_advice(const ml_model *m, const ml_config *cfg, const ml_summary *s,
                               ml_advice *out, ml_error *err)
{
    memset(out, 0, sizeof *out);
    if (!s->has_device || !s->fits || !(s->flops_recompute > 0) ||
        cfg->training.checkpoint.kind == ML_CKPT_OPTIMAL)
        return ML_OK;
    size_t npol = 0;
    const ml_checkpoint_candidate *pols = ml_checkpoint_candidates(&npol);
    ml_config floor_cfg = *cfg;
    ml__device_allocated_view(&floor_cfg.device);
    const bool exact = cfg->device.allocator == ML_ALLOCATOR_NONE;
    ml_compare_row rows[ML_COMPARE_ROWS];
    size_t idx[ML_COMPARE_ROWS], n = 0;
    double base_total = 0;
    ml_status st = ML_OK;
    ml_reserved_memo memo; /* candidates with one plan simulate it once */
    memset(&memo, 0, sizeof memo);
    for (size_t i = 0; i < npol && n < ML_COMPARE_ROWS && !st; i++) {
        ml_config c;
        if (!candidate_config(m, &floor_cfg, &pols[i], &c))
            continue;
        if ((st = plan_row(m, &c, base_total, NULL, &rows[n], err)))
            break;
        if (i == 0)
            base_total = rows[n].flops_total;
        if (rows[n].fits && rows[n].flops_recompute < s->flops_recompute)
            idx[n++] = i; /* a candidate; the others cannot be the advice */
    }
    /* by floor, then candidate order (insertion: seven at most) */
    for (size_t a = 1; a < n; a++)
        for (size_t b = a; b > 0 && rows[b].flops_recompute < rows[b - 1].flops_recompute; b--) {
            ml_compare_row t = rows[b];
            size_t ti = idx[b];
            rows[b] = rows[b - 1], idx[b] = idx[b - 1];
            rows[b - 1] = t, idx[b - 1] = ti;
        }
    size_t best_i = 0;
    for (size_t k = 0; k < n && !st; k++) {
        if (out->cheaper_fits && (rows[k].flops_recompute > out->row.flops_recompute ||
                                  (rows[k].flops_recompute == out->row.flops_recompute &&
                                   idx[k] > best_i)))
            break; /* the rest cannot undercut the best */
        ml_compare_row r = rows[k]; /* exact without the cache */
        ml_config c;
        if (!exact) {
            /* the candidate applies: it did without the cache, which its
             * conditions do not read */
            candidate_config(m, cfg, &pols[idx[k]], &c);
            if ((st = plan_row(m, &c, base_total, &memo, &r, err)))
                break;
        }
        if (r.fits && r.flops_recompute < s->flops_recompute &&
            (!out->cheaper_fits || r.flops_recompute < out->row.flops_recompute ||
             (r.flops_recompute == out->row.flops_recompute && idx[k] < best_i))) {
            out->cheaper_fits = true;
            out->row = r;
            best_i = idx[k];
        }
    }
    ml__reserved_memo_free(&memo);
    return st;
}
