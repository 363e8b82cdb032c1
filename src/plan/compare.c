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

ml_status ml_compare(const ml_model *m, const ml_config *cfg, ml_compare_row *rows, size_t *nrows,
                     ml_error *err)
{
    size_t npol = 0;
    const ml_checkpoint_candidate *pols = ml_checkpoint_candidates(&npol);
    size_t n = 0;
    double base_total = 0;
    ml_reserved_memo memo; /* policies with one plan simulate it once */
    memset(&memo, 0, sizeof memo);
    for (size_t i = 0; i < npol; i++) {
        ml_config c = *cfg;
        ml_parse_checkpoint(pols[i].name, &c.training.checkpoint, NULL);
        ml_error why;
        if ((pols[i].needs_device && !c.device.present) ||
            ml__chain_refused(m, &c.training, &why) != ML_OK)
            continue; /* optimal without a budget, or for an encoder-decoder */
        ml_ledger *l = NULL;
        ml_status st = ml__ledger_evaluate_with(m, &c, false, false, &memo, &l, err);
        if (st) {
            ml__reserved_memo_free(&memo);
            return st;
        }
        const ml_summary *s = ml_ledger_summary(l);
        ml_compare_row *r = &rows[n++];
        memset(r, 0, sizeof *r);
        r->checkpoint = c.training.checkpoint;
        snprintf(r->plan, sizeof r->plan, "%s", s->plan);
        r->peak = s->peak;
        r->peak_total = s->peak_total;
        r->activations_saved = s->bytes_activations;
        r->flops_recompute = s->flops_recompute;
        r->flops_total = s->flops_total;
        if (i == 0)
            base_total = s->flops_total;
        r->recompute_pct = base_total > 0 ? 100.0 * s->flops_recompute / base_total : 0;
        r->step_time_s = s->step_time_s;
        r->time = s->time;
        r->has_device = s->has_device;
        r->fits = s->has_device ? (r->checkpoint.kind == ML_CKPT_OPTIMAL ? s->plan_fits_budget &&
                                                                                 s->fits
                                                                           : s->fits)
                                : false;
        r->cheaper = -1;
        r->headroom = s->has_device ? s->headroom : 0;
        ml_ledger_destroy(l);
    }
    ml__reserved_memo_free(&memo);
    mark_cheaper(rows, n);
    *nrows = n;
    return ML_OK;
}

ml_status ml_checkpoint_advice(const ml_model *m, const ml_config *cfg, const ml_summary *s,
                               ml_advice *out, ml_error *err)
{
    memset(out, 0, sizeof *out);
    if (!s->has_device || !s->fits || !(s->flops_recompute > 0) ||
        cfg->training.checkpoint.kind == ML_CKPT_OPTIMAL)
        return ML_OK;
    ml_compare_row rows[ML_COMPARE_ROWS];
    size_t n = 0;
    ml_status st = ml_compare(m, cfg, rows, &n, err);
    if (st)
        return st;
    for (size_t i = 0; i < n; i++)
        if (rows[i].fits && rows[i].flops_recompute < s->flops_recompute &&
            (!out->cheaper_fits || rows[i].flops_recompute < out->row.flops_recompute)) {
            out->cheaper_fits = true;
            out->row = rows[i];
        }
    return ML_OK;
}
