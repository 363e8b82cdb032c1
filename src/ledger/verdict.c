/* The verdict of a plan (docs/ledger.md, "The verdict"; docs/cli.md, "Two
 * lines, two figures") and the plan it is given on: its segments, its
 * replay and, with PyTorch's caching allocator simulated (the default),
 * its reserved peak; for checkpoint optimal, the search again with the
 * simulated cache counted (docs/allocator.md, "The verdict"). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ledger/replay.h"
#include "util/error.h"

uint64_t ml_summary_binding_peak(const ml_summary *s)
{
    return s->binding == ML_PEAK_EVAL              ? s->peak_eval
           : s->binding == ML_PEAK_FIRST_ITERATION ? s->peak_first_iteration
                                                   : s->peak;
}

uint64_t ml_summary_budget_figure(const ml_summary *s)
{
    return s->has_reserved ? s->peak_total - s->runtime_reserve : ml_summary_binding_peak(s);
}

/* The peak total (fragmentation allowance, runtime reserve) and whether it
 * fits the device. */
ml_status ml__eval_verdict(const ml_chain *ch, const ml_device *dv, uint64_t cache_allow,
                           ml_summary *s, ml_error *err)
{
    s->runtime_reserve = dv->runtime_reserve;
    /* the largest of the steady, first-iteration and evaluation peaks */
    uint64_t peak = s->peak;
    s->binding = ML_PEAK_STEADY;
    if (s->peak_first_iteration > peak) {
        peak = s->peak_first_iteration;
        s->binding = ML_PEAK_FIRST_ITERATION;
    }
    if (s->has_eval && s->peak_eval > peak) {
        peak = s->peak_eval;
        s->binding = ML_PEAK_EVAL;
    }
    /* the caching allocator's reserved bytes over its allocated peak: the
     * allowance given, else the simulated reserved peak (docs/allocator.md) */
    double frag = (double)peak * dv->fragmentation;
    s->fragmentation = frag < 1.8e19 ? (uint64_t)llround(frag) : UINT64_MAX;
    if (s->has_reserved && !(dv->fragmentation > 0) && s->reserved_peak > peak)
        s->fragmentation = s->reserved_peak - peak;
    else if (!s->has_reserved && cache_allow > s->fragmentation)
        s->fragmentation = cache_allow;
    if (__builtin_add_overflow(peak, s->runtime_reserve, &s->peak_total) ||
        __builtin_add_overflow(s->peak_total, s->fragmentation, &s->peak_total)) {
        return ml__errorf(err, ML_OVERFLOW,
                          "peak plus fragmentation allowance and runtime reserve exceeds 64 "
                          "bits");
    }
    s->has_device = dv->present;
    /* the simulation running out of the device decides only where its
     * cache is weighed: an allowance takes its place (cli.md) */
    s->reserved_oom_weighed = s->reserved_oom && !(dv->fragmentation > 0);
    if (dv->present) {
        s->memory = dv->memory;
        s->budget = ml_device_budget(dv);
        s->device_limit = ml_device_limit(dv);
        /* the budget holds the allocator peak; with the caching allocator
         * simulated (device.allocator), what it has reserved: the peak and
         * the cache over it — the simulated cache, or device.fragmentation's
         * allowance where one is given, which takes its place above
         * (docs/cli.md, "Two lines, two figures") */
        const uint64_t held =
            s->has_reserved || cache_allow ? s->peak_total - s->runtime_reserve : peak;
        s->fits = held <= s->budget && s->peak_total <= s->memory && !s->reserved_oom_weighed;
        int64_t h1 = 0, h2 = 0;
        if (!ml__headroom(s->budget, held, &h1) || !ml__headroom(s->memory, s->peak_total, &h2))
            return ml__errorf(err, ML_OVERFLOW, "the peak is more than 8 EiB (2^63 B) over the "
                                               "device: its headroom does not fit 64 bits");
        s->headroom = h1 < h2 ? h1 : h2;
        /* the simulated allocator ran out of the device with room on both
         * lines (its cache fragmented): at least a byte short */
        if (!s->fits && s->headroom >= 0)
            s->headroom = -1;
    }
    s->c_tokens = ch->c_tokens;
    s->c_width = ch->c_width;
    s->c_dtype_bytes = ch->prec.a;
    s->plan_fits_budget = !dv->present || s->fits;
    return ML_OK;
}

/* One replay of the plan seg, and with the allocator simulated its
 * reserved peak and the verdict on it. */
static ml_status run_plan(const ml_model *m, ml_evalctx *x, const int *seg, bool keep_events,
                          ml_ledger *l, ml_error *err)
{
    const ml_device *dv = &x->cfg->device;
    ml_status st = ml__eval_run(x, seg, keep_events, l, err);
    /* a stage's first pass needs no simulation (ml__stage_activations) */
    const bool sim = dv->allocator != ML_ALLOCATOR_NONE && !x->activations_only;
    x->aev_to = keep_events ? l : NULL;
    if (!st && sim && !(st = ml__eval_reserved(m, x, seg, &l->sum, err)))
        st = ml__eval_verdict(x->ch, dv, 0, &l->sum, err);
    x->aev_to = NULL;
    return st;
}

/* Checkpoint optimal's plan over, with its cache simulated: the segment
 * policy that recomputes least among those that fit with theirs, into seg
 * (kept when none does). Each is replayed first without the simulation: a
 * policy over the budget there is over it with its cache too, and its
 * recompute is the same either way; the others are simulated in order of
 * recompute (the first of equals first) until one fits, which is then the
 * answer. */
static ml_status simulated_fallback(const ml_model *m, ml_evalctx *x, int *seg, ml_ledger *l,
                                    bool *fits, ml_error *err)
{
    const size_t n = x->ch->n;
    size_t ncand = 0;
    const ml_checkpoint_candidate *cands = ml_checkpoint_candidates(&ncand);
    int *tmp = calloc(n + 1, sizeof *tmp);
    size_t *order = calloc(ncand + 1, sizeof *order);
    double *rec = calloc(ncand + 1, sizeof *rec);
    ml_status st = ML_OK;
    if (!tmp || !order || !rec)
        st = ml__errorf(err, ML_NOMEM, "out of memory");
    size_t k = 0;
    for (size_t i = 0; i < ncand && !st; i++) {
        ml_checkpoint cp;
        if (!cands[i].segments || ml_parse_checkpoint(cands[i].name, &cp, NULL) != ML_OK)
            continue;
        if ((st = ml__eval_segments(x->ch, &cp, tmp, err)) ||
            (st = ml__eval_run(x, tmp, false, l, err)))
            break;
        if (!l->sum.fits)
            continue;
        /* by recompute, then candidate order (insertion: a handful) */
        size_t j = k++;
        for (; j > 0 && l->sum.flops_recompute < rec[j - 1]; j--) {
            order[j] = order[j - 1];
            rec[j] = rec[j - 1];
        }
        order[j] = i;
        rec[j] = l->sum.flops_recompute;
    }
    *fits = false;
    for (size_t j = 0; j < k && !st && !*fits; j++) {
        ml_checkpoint cp;
        ml_parse_checkpoint(cands[order[j]].name, &cp, NULL);
        if ((st = ml__eval_segments(x->ch, &cp, tmp, err)) ||
            (st = run_plan(m, x, tmp, false, l, err)))
            break;
        if (l->sum.fits) {
            *fits = true;
            memcpy(seg, tmp, n * sizeof *seg);
        }
    }
    free(tmp);
    free(order);
    free(rec);
    return st;
}

/* Checkpoint optimal's plan seg over with its cache simulated: the same
 * blocks, each its own segment. It recomputes the same FLOPs, and each
 * block's backward recreates its own saved tensors alone where a longer
 * segment recreates all of them at once; it keeps more segment inputs to
 * the loss. Taken into seg (*fits) when it fits, simulated; nothing is
 * tried when seg has no segment of more than one block. */
static ml_status split_segments(const ml_model *m, ml_evalctx *x, int *seg, bool keep_events,
                                ml_ledger *l, bool *fits, ml_error *err)
{
    const size_t n = x->ch->n;
    bool longer = false;
    for (size_t k = 1; k < n && !longer; k++)
        longer = seg[k] >= 0 && seg[k] == seg[k - 1];
    *fits = false;
    if (!longer)
        return ML_OK;
    int *one = calloc(n + 1, sizeof *one);
    if (!one)
        return ml__errorf(err, ML_NOMEM, "out of memory");
    for (size_t k = 0; k < n; k++)
        one[k] = seg[k] < 0 ? -1 : (int)k;
    /* over the budget unsimulated, it is over with its cache too */
    ml_status st = ml__eval_run(x, one, false, l, err);
    if (!st && l->sum.fits && !(st = run_plan(m, x, one, keep_events, l, err)) && l->sum.fits) {
        *fits = true;
        memcpy(seg, one, n * sizeof *seg);
    }
    free(one);
    return st;
}

/* The plan's segments, its replay and, with the allocator simulated, its
 * reserved peak and the verdict on it. Checkpoint optimal searches by the
 * allocator peak; where the simulated cache puts its plan over the budget,
 * it searches again with that cache added to every plan's peak
 * (x->cache_allow; where the simulation ran out of the device, as much as
 * asks for a lower peak), up to three times more, and then takes the
 * segment policy that fits with its own cache simulated, if one does
 * (docs/allocator.md, "The verdict"). */
ml_status ml__eval_plan(const ml_model *m, ml_evalctx *x, int *seg, bool keep_events,
                        ml_ledger *l, ml_error *err)
{
    const ml_config *cfg = x->cfg;
    const bool optimal = cfg->training.checkpoint.kind == ML_CKPT_OPTIMAL;
    const bool sim = cfg->device.allocator != ML_ALLOCATOR_NONE;
    bool opt_fits = true;
    ml_status st;
    for (int round = 0;; round++) {
        st = optimal ? ml__eval_optimal(x, seg, l, &opt_fits, err)
                     : ml__eval_segments(x->ch, &cfg->training.checkpoint, seg, err);
        const uint64_t allowed = x->cache_allow;
        x->cache_allow = 0;
        if (st || (st = run_plan(m, x, seg, keep_events, l, err)) || !optimal)
            return st;
        const ml_summary *s = &l->sum;
        if (!sim || s->fits || !s->has_device)
            break;
        /* the cache the search did not see; a simulation that ran out of
         * the device asks for a peak below this plan's */
        uint64_t cache = s->fragmentation > s->start_allocated ? s->fragmentation - s->start_allocated
                                                               : 0;
        if (s->reserved_oom && s->budget > s->peak && s->budget - s->peak + 1 > cache)
            cache = s->budget - s->peak + 1;
        /* the cache's layout may turn down a long segment's recompute where
         * the same blocks on their own fit: the same recompute, the model's
         * least at this round's budget; a later round, with the cache
         * counted, rarely recomputes less */
        bool split = false;
        if ((st = split_segments(m, x, seg, keep_events, l, &split, err)))
            return st;
        if (split)
            break;
        if (round == 3 || cache <= allowed) {
            bool any = false;
            if ((st = simulated_fallback(m, x, seg, l, &any, err)) ||
                (st = run_plan(m, x, seg, keep_events, l, err)))
                return st;
            break;
        }
        x->cache_allow = cache;
    }
    /* with the cache simulated the rounds after the first solve with it
     * counted (x->cache_allow), where the solver may find nothing that its
     * model says fits while the plan it hands over fits once replayed and
     * simulated: the replay is the judge */
    l->sum.plan_fits_budget = sim ? l->sum.fits : opt_fits;
    return ML_OK;
}

