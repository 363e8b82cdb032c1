/* The layout search (docs/search.md): every split
 * of N devices into tensor x pipeline x data parallelism that the model
 * divides, every micro-batch that divides a data-parallel rank's share of
 * the global batch, and the checkpoint policies none, selective and full;
 * each point planned exactly (every pipeline stage), those that fit every
 * rank ranked by their step time. */
#include <stdio.h>
#include <string.h>

#include "memledger/plan.h"
#include "util/error.h"

ml_layout_request ml_layout_request_defaults(void)
{
    ml_layout_request r;
    memset(&r, 0, sizeof r);
    r.gpus_per_node = 8;
    return r;
}

static const char *const policies[] = {"none", "selective", "full"};

typedef struct {
    const ml_model *m;
    const ml_config *cfg;
    const ml_layout_request *req;
    ml_layout_result *out;
    ml_planner *planner; /* chains built once per tensor split and policy,
                            derived for each micro-batch */
} search;

/* Bytes over a link of gbps GB/s; -1 when the link is unknown. */
static double over(double bytes, double gbps)
{
    if (bytes <= 0)
        return 0;
    return gbps > 0 ? bytes / (gbps * 1e9) : -1;
}

/* The transfers' time: tensor parallelism inside a node, the pipeline's
 * p2p and data parallelism's collectives over the network once their
 * groups leave the node (tp innermost, then pp, then dp). */
static double comm_time(const search *x, const ml_ledger *l, const ml_layout_row *row)
{
    const ml_summary *s = ml_ledger_summary(l);
    const double intra = x->cfg->device.interconnect_gbps;
    const double net = x->req->network_gbps > 0 ? x->req->network_gbps : intra;
    const uint64_t G = x->req->gpus_per_node ? x->req->gpus_per_node : 8;
    double p2p = 0;
    for (size_t i = 0; i < ml_ledger_rank_count(l); i++)
        if (ml_ledger_rank(l, i)->p2p_bytes > p2p)
            p2p = ml_ledger_rank(l, i)->p2p_bytes;
    const double parts[3] = {over(s->tp_comm_bytes, intra),
                             over(p2p, row->tp * row->pp > G ? net : intra),
                             over(s->comm_bytes, row->tp * row->pp * row->dp > G ? net : intra)};
    double t = 0;
    for (int i = 0; i < 3; i++) {
        if (parts[i] < 0)
            return -1;
        t += parts[i];
    }
    return t;
}

/* Whether a kept row is this one again (selective checkpointing with a
 * fused attention kernel drops nothing: the same plan as none). */
static bool seen(const ml_layout_result *out, const ml_layout_row *row)
{
    for (size_t i = 0; i < out->nrows; i++) {
        const ml_layout_row *o = &out->rows[i];
        if (o->tp == row->tp && o->pp == row->pp && o->dp == row->dp &&
            o->micro_batch == row->micro_batch && o->peak == row->peak &&
            o->device_total == row->device_total && o->step_s == row->step_s)
            return true;
    }
    return false;
}

/* Keeps row among the fastest (without a time: the most headroom). */
static void keep(ml_layout_result *out, const ml_layout_row *row)
{
    if (seen(out, row))
        return;
    size_t at = out->nrows;
    while (at > 0) {
        const ml_layout_row *o = &out->rows[at - 1];
        bool before = row->step_s >= 0 && o->step_s >= 0
                          ? row->step_s < o->step_s ||
                                (row->step_s == o->step_s && row->headroom > o->headroom)
                          : row->headroom > o->headroom;
        if (!before)
            break;
        at--;
    }
    if (at >= ML_LAYOUT_TOP)
        return;
    size_t n = out->nrows < ML_LAYOUT_TOP ? out->nrows : ML_LAYOUT_TOP - 1;
    memmove(&out->rows[at + 1], &out->rows[at], (n - at) * sizeof *row);
    out->rows[at] = *row;
    if (out->nrows < ML_LAYOUT_TOP)
        out->nrows++;
}

/* One point planned; ML_RANGE: the layout is not one the model splits
 * into (not an error of the search); *fits whether it fits every rank. */
static ml_status point(search *x, uint64_t tp, uint64_t pp, uint64_t dp, uint64_t b, uint64_t mb,
                       size_t policy, bool *fits, ml_error *err)
{
    ml_config c = *x->cfg;
    ml_training *t = &c.training;
    t->tensor_parallel = tp;
    t->pipeline_parallel = pp;
    t->data_parallel = dp;
    t->micro_batch = b;
    t->grad_accum = mb;
    ml_parse_checkpoint(policies[policy], &t->checkpoint, NULL);
    ml_ledger *l = NULL;
    ml_status st = ml_planner_evaluate(x->planner, &c, false, &l, err);
    x->out->evaluations++;
    if (st)
        return st;
    const ml_summary *s = ml_ledger_summary(l);
    *fits = s->fits;
    if (s->fits) {
        ml_layout_row row;
        memset(&row, 0, sizeof row);
        row.tp = tp, row.pp = pp, row.dp = dp, row.micro_batch = b, row.micro_batches = mb;
        row.checkpoint = t->checkpoint;
        row.peak = s->peak;
        row.device_total = s->peak_total;
        row.headroom = s->headroom;
        row.bubble = pp > 1 && s->pipeline_bubble > 0 ? s->pipeline_bubble : 0;
        row.compute_s = pp > 1 ? s->pipeline_step_s : s->time_compute_s;
        row.comm_s = comm_time(x, l, &row);
        row.step_s = row.compute_s < 0 ? -1 : row.compute_s + (row.comm_s > 0 ? row.comm_s : 0);
        const double tokens = (double)x->req->global_batch * (double)t->seq_len;
        row.tokens_per_s = row.step_s > 0 ? tokens / row.step_s : -1;
        const double peak = s->peak_tflops_used;
        row.mfu = row.step_s > 0 && peak > 0
                      ? (s->flops_forward + s->flops_backward) / row.step_s / (peak * 1e12)
                      : -1;
        x->out->fitting++;
        keep(x->out, &row);
    }
    ml_ledger_destroy(l);
    return ML_OK;
}

/* Every micro-batch and policy of the layout tp x pp x dp, the
 * micro-batches from the smallest up to the first that does not fit (the
 * peak grows with the micro-batch: with a pipeline the fewer micro-batches
 * in flight hold as many samples, no fewer bytes). */
static ml_status layout(search *x, uint64_t tp, uint64_t pp, uint64_t dp, ml_error *err)
{
    const uint64_t share = x->req->global_batch / dp;
    x->out->layouts++;
    for (size_t pol = 0; pol < sizeof policies / sizeof policies[0]; pol++)
        for (uint64_t b = 1; b <= share; b++) {
            if (share % b)
                continue;
            bool fits = false;
            ml_status st = point(x, tp, pp, dp, b, share / b, pol, &fits, err);
            if (st == ML_RANGE)
                break; /* the model does not split this way, or not with this policy */
            if (st)
                return st;
            if (!fits)
                break;
        }
    return ML_OK;
}

/* The layouts of req: counted (st NULL), or searched, each followed by
 * the progress callback; returns how many. */
static uint64_t layouts(const ml_layout_request *req, ml_status *st, search *x, ml_error *err)
{
    const uint64_t G = req->gpus_per_node ? req->gpus_per_node : 8;
    uint64_t n = 0, total = st ? layouts(req, NULL, x, err) : 0;
    for (uint64_t tp = 1; tp <= G && tp <= req->gpus; tp++) {
        if (G % tp || req->gpus % tp)
            continue;
        for (uint64_t pp = 1; pp <= req->gpus / tp && pp <= ML_PP_MAX_STAGES; pp++) {
            if ((req->gpus / tp) % pp)
                continue;
            const uint64_t dp = req->gpus / (tp * pp);
            if (req->global_batch % dp)
                continue;
            n++;
            if (!st)
                continue;
            if ((*st = layout(x, tp, pp, dp, err)))
                return n;
            if (req->progress)
                req->progress(req->progress_ctx, n, total,
                              x->out->nrows ? &x->out->rows[0] : NULL);
        }
    }
    return n;
}

ml_status ml_layout_search(const ml_model *m, const ml_config *cfg, const ml_layout_request *req,
                           ml_layout_result *out, ml_error *err)
{
    memset(out, 0, sizeof *out);
    ml_error local;
    if (!err)
        err = &local;
    memset(err, 0, sizeof *err);
    if (!cfg->device.present)
        return ml__errorf(err, ML_USAGE, "the layout search needs a device: give --device");
    if (!req->gpus || !req->global_batch)
        return ml__errorf(err, ML_USAGE, "the layout search needs the devices (--gpus N) and "
                                         "the global batch (--global-batch B)");
    search x = {m, cfg, req, out, NULL};
    out->comm_timed = cfg->device.interconnect_gbps > 0;
    ml_status st = ml_planner_create(m, &x.planner, err);
    if (st)
        return st;
    layouts(req, &st, &x, err);
    ml_planner_destroy(x.planner);
    if (st)
        return st;
    if (!out->nrows)
        snprintf(out->note, sizeof out->note,
                 "no layout of %llu devices fits: %llu layouts, %llu plans; more devices, a "
                 "smaller global batch or another precision",
                 (unsigned long long)req->gpus, (unsigned long long)out->layouts,
                 (unsigned long long)out->evaluations);
    else
        snprintf(out->note, sizeof out->note,
                 "%llu layouts of %llu devices, %llu plans, %llu fitting points",
                 (unsigned long long)out->layouts, (unsigned long long)req->gpus,
                 (unsigned long long)out->evaluations, (unsigned long long)out->fitting);
    return ML_OK;
}
