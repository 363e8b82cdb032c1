/* The layout search's table (docs/search.md): each point planned in the
 * allocated view, the fitting ones that would enter the table planned
 * again as configured a pool at a time, the ten fastest kept. */
#include <stdlib.h>
#include <string.h>

#include "plan/layout_search.h"
#include "plan/layout_time.h"
#include "model/model_internal.h"

/* Whether a kept row is this one again (selective checkpointing with a
 * fused attention kernel drops nothing: the same plan as none). */
static bool seen(const ml_layout_result *out, const ml_layout_row *row)
{
    for (size_t i = 0; i < out->nrows; i++) {
        const ml_layout_row *o = &out->rows[i];
        if (o->tp == row->tp && o->pp == row->pp && o->dp == row->dp && o->vpp == row->vpp &&
            o->cp == row->cp && o->ep == row->ep && o->first_layers == row->first_layers &&
            o->last_layers == row->last_layers &&
            o->zero == row->zero && o->dist_optimizer == row->dist_optimizer &&
            o->micro_batch == row->micro_batch && o->peak == row->peak &&
            o->device_total == row->device_total && o->step_s == row->step_s)
            return true;
    }
    return false;
}

/* Keeps row among the fastest (without a time: the most headroom). */
static int faster(const void *pa, const void *pb);

static void keep(ml_layout_result *out, const ml_layout_row *row)
{
    if (seen(out, row))
        return;
    size_t at = out->nrows;
    while (at > 0 && faster(row, &out->rows[at - 1]) < 0)
        at--;
    if (at >= ML_LAYOUT_TOP)
        return;
    size_t n = out->nrows < ML_LAYOUT_TOP ? out->nrows : ML_LAYOUT_TOP - 1;
    memmove(&out->rows[at + 1], &out->rows[at], (n - at) * sizeof *row);
    out->rows[at] = *row;
    if (out->nrows < ML_LAYOUT_TOP)
        out->nrows++;
}

ml_config ml_layout_config(const ml_config *cfg, const ml_layout_row *w)
{
    ml_config c = *cfg;
    ml_training *t = &c.training;
    t->tensor_parallel = w->tp;
    t->pipeline_parallel = w->pp;
    t->data_parallel = w->dp;
    t->micro_batch = w->micro_batch;
    t->grad_accum = w->micro_batches;
    t->checkpoint = w->checkpoint;
    t->virtual_stages = w->vpp > 1 ? w->vpp : 1;
    if (w->vpp > 1)
        t->pp_schedule = ML_PP_INTERLEAVED;
    else if (t->pp_schedule == ML_PP_INTERLEAVED)
        t->pp_schedule = ML_PP_1F1B;
    t->zero = w->zero;
    t->dist_optimizer = w->dist_optimizer;
    t->context_parallel = w->cp > 1 ? w->cp : 1;
    t->expert_parallel = w->ep > 1 ? w->ep : 1;
    if (w->etp)
        t->expert_tensor_parallel = w->etp;
    t->npp_layers = 0;
    if (w->first_layers && w->pp >= 2 && w->pp <= ML_PP_MAX_STAGES) {
        /* the middle stages share the rest evenly (the search made it so) */
        const uint32_t p = (uint32_t)w->pp, mid = w->pp > 2 ? w->middle_layers : 0;
        for (uint32_t i = 0; i < p; i++)
            t->pp_layers[i] = i == 0 ? w->first_layers : i + 1 == p ? w->last_layers : mid;
        t->npp_layers = p;
    }
    return c;
}

ml_config ml__layout_config_of(const layout_search *x, const ml_layout_row *w)
{
    return ml_layout_config(x->cfg, w);
}

/* The row's figures from its plan. */
static void figures(const layout_search *x, const ml_ledger *l, ml_layout_row *w)
{
    const ml_summary *s = ml_ledger_summary(l);
    w->peak = s->peak;
    w->device_total = s->peak_total;
    w->headroom = s->headroom;
    w->bubble = w->pp > 1 && s->pipeline_bubble > 0 ? s->pipeline_bubble : 0;
    w->compute_s = w->pp > 1 ? s->pipeline_step_s : s->time_compute_s;
    w->comm_s = ml__layout_comm_time(x->cfg, x->req, l, w, &w->latency_s);
    w->step_s = w->compute_s < 0 ? -1 : w->compute_s + (w->comm_s > 0 ? w->comm_s : 0);
    const double tokens = (double)x->req->global_batch * (double)x->cfg->training.seq_len;
    w->tokens_per_s = w->step_s > 0 ? tokens / w->step_s : -1;
    const double peak = s->peak_tflops_used;
    w->mfu = w->step_s > 0 && peak > 0
                 ? (s->flops_forward + s->flops_backward) / w->step_s / (peak * 1e12)
                 : -1;
}

/* The faster of two candidates (without a time: the more headroom). */
static int faster(const void *pa, const void *pb)
{
    const ml_layout_row *a = pa, *b = pb;
    const bool ta = a->step_s >= 0, tb = b->step_s >= 0;
    if (ta != tb)
        return ta ? -1 : 1; /* timed rows first */
    if (ta && a->step_s != b->step_s)
        return a->step_s < b->step_s ? -1 : 1;
    return a->headroom > b->headroom ? -1 : a->headroom < b->headroom;
}

double ml__layout_table_bound(const ml_layout_result *out)
{
    return out->nrows == ML_LAYOUT_TOP ? out->rows[ML_LAYOUT_TOP - 1].step_s : -1;
}

/* Whether row, fitting in the allocated view, would enter the table as
 * it stands: its step not slower than the last row's (untimed: its
 * headroom, which the configured allocator only lowers). Planned as
 * configured, a pipeline's transfers are those of its fullest stage, which
 * the simulated allocator may name differently: its step can differ there
 * (docs/search.md). */
static bool enters(const ml_layout_result *out, const ml_layout_row *row)
{
    return out->nrows < ML_LAYOUT_TOP || faster(row, &out->rows[ML_LAYOUT_TOP - 1]) <= 0;
}

ml_status ml__layout_flush(layout_search *x, ml_error *err)
{
    if (x->npool)
        qsort(x->pool, x->npool, sizeof *x->pool, faster);
    const size_t n = x->npool;
    x->npool = 0;
    for (size_t i = 0; i < n; i++) {
        ml_layout_row *row = &x->pool[i];
        if (!enters(x->out, row))
            continue;
        if (x->cfg->device.allocator != ML_ALLOCATOR_NONE) {
            ml_config c = ml__layout_config_of(x, row);
            ml_ledger *l = NULL;
            ml_status st = ml_planner_evaluate(x->planner, &c, false, &l, err);
            x->out->evaluations++;
            if (st)
                return st;
            const bool fits = ml_ledger_summary(l)->fits;
            if (fits)
                figures(x, l, row);
            ml_ledger_destroy(l);
            if (!fits)
                continue;
        }
        keep(x->out, row);
    }
    return ML_OK;
}

/* A point that fits in the allocated view (the caching allocator's
 * simulation only adds to a peak): where it would enter the table, it
 * waits to be planned as configured, a pool at a time from the fastest (a
 * point a faster one pushes out of the table is never planned so). The
 * table ends as the fastest of all such points, whatever their order. */
static ml_status verdict(layout_search *x, const ml_layout_row *row, ml_error *err)
{
    if (!enters(x->out, row))
        return ML_OK;
    x->pool[x->npool++] = *row;
    return x->npool == LAYOUT_POOL ? ml__layout_flush(x, err) : ML_OK;
}

ml_status ml__layout_point(layout_search *x, const ml_layout_row *split, uint64_t b, uint64_t mb,
                           const ml_checkpoint *policy, bool *fits, double *bound_s,
                           ml_error *err)
{
    ml_layout_row row = *split;
    row.micro_batch = b, row.micro_batches = mb;
    row.checkpoint = *policy;
    ml_config c = ml__layout_config_of(x, &row);
    ml__device_allocated_view(&c.device);
    ml_ledger *l = NULL;
    ml_status st = ml_planner_evaluate(x->planner, &c, false, &l, err);
    x->out->evaluations++;
    if (st)
        return st;
    *fits = ml_ledger_summary(l)->fits;
    figures(x, l, &row);
    ml_ledger_destroy(l);
    *bound_s = row.step_s;
    if (!*fits)
        return ML_OK;
    x->out->fitting++;
    return verdict(x, &row, err);
}
