/* A pipeline's stages planned one by one (docs/parallel.md): each stage's
 * chain replayed once for one micro-batch's activations at the end of its
 * forward, then again with the other micro-batches the schedule keeps in
 * flight resident beside it; the plan is the fullest stage's. */
#include <stdlib.h>
#include <string.h>

#include "ledger/replay.h"
#include "util/error.h"

/* The input a stage after the first receives: its first layer's. */
static uint64_t received(const ml_chain *st)
{
    for (size_t k = 0; k < st->n; k++)
        if (st->blocks[k].ckpt_index >= 0)
            return st->blocks[k].in_bytes;
    return 0;
}

/* The output the stage sends (its "send" block's input; 0 on the last
 * stage): the size of the gradient it receives for it. */
static uint64_t sent(const ml_chain *st)
{
    return st->n && st->blocks[st->n - 1].fwd_only ? st->blocks[st->n - 1].in_bytes : 0;
}

/* Bytes stage r sends per iteration: its output forward (all but the last
 * stage) and its input's gradient back (all but the first), per
 * micro-batch; with v model chunks a stage, each chunk's (the model's last
 * chunk sends no output, its first receives no input). */
static double p2p_bytes(const ml_chain *st, const ml_training *t, uint64_t r, uint64_t p)
{
    const double m = (double)(t->grad_accum ? t->grad_accum : 1);
    if (t->virtual_stages > 1) { /* every transfer is the layers' stream */
        const double v = (double)t->virtual_stages;
        return m * (double)received(st) * ((v - (r + 1 == p ? 1 : 0)) + (v - (r == 0 ? 1 : 0)));
    }
    double per = 0;
    if (r + 1 < p) /* the send block's input: the stage's output */
        per += (double)st->blocks[st->n - 1].in_bytes;
    if (r > 0)
        per += (double)received(st);
    return per * m;
}

/* The sends of p2p_bytes: one a transfer, per micro-batch. */
static double p2p_sends(const ml_training *t, uint64_t r, uint64_t p)
{
    const double m = (double)(t->grad_accum ? t->grad_accum : 1);
    if (t->virtual_stages > 1) {
        const double v = (double)t->virtual_stages;
        return m * ((v - (r + 1 == p ? 1 : 0)) + (v - (r == 0 ? 1 : 0)));
    }
    return m * ((r + 1 < p ? 1 : 0) + (r > 0 ? 1 : 0));
}

static void rank_of(const ml_model *m, const ml_training *t, uint64_t r, const ml_chain *st,
                    uint64_t one, const ml_ledger *l, ml_rank_info *ri)
{
    const ml_summary *s = &l->sum;
    const uint64_t p = t->pipeline_parallel;
    uint64_t first = 0, count = 0;
    if (t->virtual_stages > 1) {
        count = m->layers / p;
        first = r * (count / t->virtual_stages);
    } else {
        ml__pp_stage_layers(m, t, r, &first, &count);
    }
    memset(ri, 0, sizeof *ri);
    ri->stage = (uint32_t)r;
    ri->first_layer = (uint32_t)first;
    ri->layers = (uint32_t)count;
    ri->embedding = r == 0;
    ri->head = r + 1 == p;
    ri->params = s->params;
    ri->in_flight = ml__pp_in_flight(t, r);
    ri->activations_saved = one;
    ri->peak = s->peak;
    ri->has_reserved = s->has_reserved;
    ri->reserved = s->reserved_peak;
    ri->device_total = s->peak_total;
    ri->has_device = s->has_device;
    ri->fits = s->fits;
    ri->headroom = s->headroom;
    ri->p2p_bytes = p2p_bytes(st, t, r, p);
    ri->p2p_sends = p2p_sends(t, r, p);
    ri->bytes_params = s->bytes_params;
    ri->bytes_master = s->bytes_master;
    ri->bytes_grads = s->bytes_grads;
    ri->bytes_optimizer = s->bytes_optimizer;
    const ml_step_time *tm = &s->time;
    ri->micro_s = tm->source == ML_TIME_NONE
                      ? -1
                      : (tm->by_phase[ML_TPHASE_FORWARD] + tm->by_phase[ML_TPHASE_BACKWARD] +
                         tm->by_phase[ML_TPHASE_RECOMPUTE]) /
                            (double)(t->grad_accum ? t->grad_accum : 1);
}

/* The pipeline's step: with 1F1B or GPipe the first micro-batch passes
 * every stage and the others follow at the slowest stage's pace,
 * (m - 1) max t + sum t; with v virtual stages the fill and drain are v
 * times shorter, (m + (p - 1) / v) max t (Narayanan et al. 2021,
 * "Efficient Large-Scale Language Model Training on GPU Clusters", section
 * 2.2); then the slowest optimizer step. The bubble: the share of it that
 * is not the planned stage's own work. */
static void pipeline_time(const ml_training *t, const ml_rank_info *ranks, size_t p,
                          const ml_summary *worst, ml_summary *s)
{
    s->pipeline_step_s = s->pipeline_bubble = -1;
    double sum = 0, max = 0, step = 0;
    for (size_t r = 0; r < p; r++) {
        if (ranks[r].micro_s < 0)
            return;
        sum += ranks[r].micro_s;
        max = ranks[r].micro_s > max ? ranks[r].micro_s : max;
    }
    const double m = (double)(t->grad_accum ? t->grad_accum : 1);
    const double v = t->virtual_stages > 1 ? (double)t->virtual_stages : 1;
    step = worst->time.by_phase[ML_TPHASE_STEP];
    const double pipe = v > 1 ? (m + (double)(p - 1) / v) * max : (m - 1) * max + sum;
    s->pipeline_step_s = pipe + step;
    /* the stages' idle share, averaged over them */
    s->pipeline_bubble = pipe > 0 ? 1 - m * sum / ((double)p * pipe) : 0;
    /* the throughput is the pipeline's: its step, not the stage's work */
    if (worst->time.step_s > 0 && s->pipeline_step_s > 0) {
        const double k = worst->time.step_s / s->pipeline_step_s;
        s->time.tokens_per_s *= k;
        if (s->time.mfu > 0)
            s->time.mfu *= k;
    }
}

/* Stage r's ledger: its chain replayed for one micro-batch, then with the
 * in-flight ones; *one gets one micro-batch's activations. */
static ml_status stage(const ml_model *m, const ml_config *cfg, const ml_chain *full, uint64_t r,
                       bool keep, bool whole, ml_chain *st, uint64_t *one, ml_ledger **out,
                       ml_error *err)
{
    ml_status s = ml__pp_stage_chain(full, m, &cfg->training, r, st);
    if (s == ML_RANGE)
        return ml__errorf(err, ML_RANGE, "parallel.pp: the chain of %s is not one stream of "
                                         "blocks that stages can split",
                          m->name);
    if (s)
        return ml__errorf(err, s, "out of memory");
    /* no simulation memo: the stages' simulations differ */
    if ((s = ml__stage_activations(m, cfg, st, whole, one, err)))
        return s;
    /* each micro-batch held: its activations and its share of the batch
     * (the first stage's inputs, the last's targets: the schedule keeps
     * every micro-batch's own) */
    const ml_training *t = &cfg->training;
    const double held = (double)*one + (double)st->batch_input + (double)st->batch_targets;
    const double first = (ml__pp_in_flight(t, r) - 1) * held;
    const double later = (ml__pp_in_flight_later(t, r) - 1) * held;
    if (first >= 9.2e18)
        return ml__errorf(err, ML_OVERFLOW, "parallel.pp: the in-flight activations exceed 64 "
                                            "bits");
    /* a later backward on a stage after the first: the previous one's
     * input gradient is still referenced until it returns (schedules.py's
     * input_tensor_grad, reassigned by the next backward_step) */
    /* in 1F1B's steady state (a forward after a backward: m > p - r) a
     * stage before the last still holds the output gradient it received
     * for the micro-batch before through the next forward, until the next
     * receive rebinds output_tensor_grad (schedules.py,
     * forward_backward_pipelining_without_interleaving); the interleaved
     * schedule's lists of them are not modelled (parallel.md) */
    const uint64_t p = t->pipeline_parallel, mb = t->grad_accum ? t->grad_accum : 1;
    const bool steady = t->pp_schedule != ML_PP_GPIPE && t->virtual_stages <= 1 && r + 1 < p &&
                        mb > p - r;
    ml_inflight in = {(uint64_t)first, (uint64_t)(later > 0 ? later : 0),
                      r > 0 ? received(st) : 0, steady ? sent(st) : 0};
    return ml__evaluate_stage(m, cfg, st, keep, whole, NULL, &in, out, err);
}

ml_status ml__pp_evaluate(const ml_model *m, const ml_config *cfg, const ml_chain *chain,
                          bool keep_events, bool whole, ml_ledger **out, ml_error *err)
{
    const uint64_t p = cfg->training.pipeline_parallel;
    ml_rank_info *ranks = calloc(p, sizeof *ranks);
    if (!ranks)
        return ml__errorf(err, ML_NOMEM, "out of memory");
    ml_ledger *worst = NULL;
    size_t wi = 0;
    ml_status st = ML_OK;
    for (uint64_t r = 0; r < p && st == ML_OK; r++) {
        ml_chain sc;
        uint64_t one = 0;
        memset(&sc, 0, sizeof sc);
        ml_ledger *l = NULL;
        st = stage(m, cfg, chain, r, keep_events, whole, &sc, &one, &l, err);
        if (st == ML_OK) {
            rank_of(m, &cfg->training, r, &sc, one, l, &ranks[r]);
            /* the fullest stage: the least headroom on a device, else the
             * largest device figure; between equals (the allocator's
             * segments round), the larger allocator peak, then the first */
            bool more = !worst;
            if (worst) {
                const ml_summary *a = &l->sum, *b = &worst->sum;
                int64_t ha = a->has_device ? a->headroom : -(int64_t)a->peak_total;
                int64_t hb = b->has_device ? b->headroom : -(int64_t)b->peak_total;
                more = ha < hb || (ha == hb && a->peak > b->peak);
            }
            if (more) {
                ml_ledger_destroy(worst);
                worst = l;
                wi = (size_t)r;
            } else {
                ml_ledger_destroy(l);
            }
        }
        if (sc.blocks)
            ml__chain_free(&sc);
    }
    if (st) {
        free(ranks);
        ml_ledger_destroy(worst);
        return st;
    }
    worst->ranks = ranks;
    worst->nranks = (size_t)p;
    worst->worst_rank = wi;
    pipeline_time(&cfg->training, ranks, (size_t)p, &worst->sum, &worst->sum);
    *out = worst;
    return ML_OK;
}

void ml__replay_stage_micro_batch(ml_replay *r, const ml_inflight *in, bool later)
{
    /* a pipeline stage: the micro-batches it holds meanwhile, and a later
     * one's earlier input gradient */
    const uint64_t held = later ? in->later : in->first, stale = later ? in->stale : 0;
    ml__replay_alloc(r, ML_CAT_ACTIVATIONS, held);
    ml__replay_alloc(r, ML_CAT_WORKSPACE, stale);
    /* 1F1B's steady state: the gradient the stage received for the
     * micro-batch before, still held (schedules.py's output_tensor_grad,
     * rebound by the next receive: recv_drop) */
    r->recv_prev = later ? in->recv : 0;
    ml__replay_alloc(r, ML_CAT_WORKSPACE, r->recv_prev);
    r->recv_prev_name =
        r->recv_prev && r->rsim ? ml__rsim_latest(r->rsim, ML_CAT_WORKSPACE) : 0;
    ml__replay_micro_batch(r);
    ml__replay_free(r, ML_CAT_WORKSPACE, stale);
    ml__replay_free(r, ML_CAT_ACTIVATIONS, held);
}
