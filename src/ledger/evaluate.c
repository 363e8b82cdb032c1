/* The plan of one steady-state training iteration: checks the config,
 * builds the chain, chooses the checkpoint segments, and replays the
 * iteration (model states, each micro-batch through replay.c, the
 * optimizer step) into a ledger with its summary, per-block table and
 * events (docs/ledger.md). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ledger/dist_optimizer.h"
#include "ledger/replay.h"
#include "ledger/steptime.h"
#include "memledger/calib.h"
#include "util/error.h"

uint64_t ml__ceil_div(uint64_t a, uint64_t b)
{
    return a / b + (a % b != 0);
}

/* Which blocks sit in checkpoint segments under the policy cp: seg[i] =
 * segment id or -1. */
static ml_status policy_segments(const ml_chain *ch, const ml_checkpoint *cp, int *seg,
                                 ml_error *err)
{
    size_t n = ch->n, nc = ch->n_ckpt;
    for (size_t i = 0; i < n; i++)
        seg[i] = -1;
    uint64_t k = 0;
    switch (cp->kind) {
    case ML_CKPT_NONE:
    case ML_CKPT_SELECTIVE:
        return ML_OK;
    case ML_CKPT_FULL: k = 1; break;
    case ML_CKPT_EVERY: k = cp->every; break;
    case ML_CKPT_SQRT: {
        k = (uint64_t)ceil(sqrt((double)nc));
        while (k > 1 && (k - 1) * (k - 1) >= nc)
            k--;
        while (k * k < nc)
            k++;
        break;
    }
    case ML_CKPT_LIST:
        for (uint32_t j = 0; j < cp->count; j++) {
            if (cp->blocks[j] >= nc) {
                return ml__errorf(err, ML_RANGE,
                                  "training.checkpoint: block %u does not exist; the model has "
                                  "%zu checkpointable blocks (0 to %zu)",
                                  cp->blocks[j], nc, nc ? nc - 1 : 0);
            }
            for (size_t i = 0; i < n; i++)
                if (ch->blocks[i].ckpt_index == (int)cp->blocks[j])
                    seg[i] = (int)cp->blocks[j];
        }
        return ML_OK;
    case ML_CKPT_SEGMENTS:
        for (uint32_t j = 0; j < cp->count && j < ML_CKPT_LIST_MAX / 2; j++) {
            const uint32_t a = cp->blocks[2 * j], b = cp->blocks[2 * j + 1];
            if (b >= nc)
                return ml__errorf(err, ML_RANGE,
                                  "training.checkpoint: segment [%u-%u] reaches past the last "
                                  "block; the model has %zu checkpointable blocks (0 to %zu)",
                                  a, b, nc, nc ? nc - 1 : 0);
            for (size_t i = 0; i < n; i++)
                if (ch->blocks[i].ckpt_index >= (int)a && ch->blocks[i].ckpt_index <= (int)b)
                    seg[i] = (int)a;
        }
        return ML_OK;
    default:
        return ML_OK;
    }
    if (k == 0)
        k = 1;
    /* a multimodal model's tower (checkpoint indices below mask_ckpt0):
     * Hugging Face's CLIPEncoder checkpoints each layer on its own
     * (modeling_clip.py: one _gradient_checkpointing_func call per
     * encoder_layer), so a tower layer is a segment of one whatever K; the
     * decoder's segments of K count from its first layer (mask_ckpt0) */
    const uint64_t m0 = ch->mask_ckpt0;
    for (size_t i = 0; i < n; i++) {
        const int c = ch->blocks[i].ckpt_index;
        if (c < 0)
            continue;
        seg[i] = (uint64_t)c < m0 ? c : (int)(m0 + ((uint64_t)c - m0) / k);
    }
    return ML_OK;
}

ml_status ml__eval_segments(const ml_chain *ch, const ml_checkpoint *cp, int *seg, ml_error *err)
{
    ml_status st = policy_segments(ch, cp, seg, err);
    if (!st) /* a multimodal model's tower may have a policy of its own */
        ml__eval_stack_segments(ch, seg);
    return st;
}

/* "none", "every-2", or for optimal the segments: "optimal: [0-3] [8]"
 * (checkpoint indices). */
static void describe_plan(const ml_chain *ch, const ml_checkpoint *cp, const int *seg, char *buf,
                          size_t size)
{
    ml_checkpoint_format(cp, buf, size);
    if (cp->kind != ML_CKPT_OPTIMAL)
        return;
    size_t o = strlen(buf);
    o += (size_t)snprintf(buf + o, size > o ? size - o : 0, ":");
    bool any = false;
    for (size_t k = 0; k < ch->n && o < size; k++) {
        if (seg[k] < 0 || (k > 0 && seg[k - 1] == seg[k]))
            continue;
        size_t e = k;
        while (e + 1 < ch->n && seg[e + 1] == seg[k])
            e++;
        int a = ch->blocks[k].ckpt_index, b = ch->blocks[e].ckpt_index;
        o += (size_t)(a == b ? snprintf(buf + o, size - o, " [%d]", a)
                             : snprintf(buf + o, size - o, " [%d-%d]", a, b));
        any = true;
    }
    if (!any && o < size)
        snprintf(buf + o, size - o, " none");
}

/* Parameters, master weights, gradients, optimizer states and step
 * temporaries per device: ZeRO stage z shards states (z >= 1), gradients
 * (z >= 2) and parameters (z = 3) over N devices; offload moves them to the
 * host (docs/sharding.md). */
/* Megatron's distributed optimizer (dist_optimizer.c): the parameter and
 * gradient buffers whole, padding included; master weights, states and the
 * step's temporaries over the fullest rank's shard. */
static void dist_optimizer_states(ml_chain *ch, const ml_training *t, const ml_optim_bytes *ob,
                                  ml_summary *s)
{
    ml_dopt d;
    if (ml__dopt_layout(ch, ml__shard_group(t), t->virtual_stages, &d, NULL, 0)) {
        ch->nomem = true;
        return;
    }
    const ml_param_sums ps = ml__param_sums(ch);
    const uint64_t Pg = ps.with_grad ? ps.with_grad : 1;
    s->bytes_params = ml_mul(ch, d.padded, ch->prec.param);
    s->bytes_grads = ml_mul(ch, d.padded, ch->prec.grad);
    s->bytes_master = ml_mul(ch, d.shard, ch->prec.master);
    /* per element alike (Adam's two, SGD's momentum): exact */
    s->bytes_optimizer = ml_mul(ch, ob->states / Pg, d.shard);
    s->bytes_step_temp = ml_mul(ch, ob->step_temp / Pg, d.shard);
}

void ml__eval_model_states(ml_chain *ch, const ml_training *t, const ml_optim_bytes *ob,
                           ml_summary *s)
{
    const ml_param_sums ps = ml__param_sums(ch);
    const uint64_t P = ps.all, Pt = ps.trained; /* a frozen tower's do not train */
    s->params = P;
    s->bytes_batch = ml_add(ch, ch->batch_input, ch->batch_targets);
    s->bytes_buffers = ch->buffer_bytes;
    const uint64_t N = ml__shard_group(t); /* HSDP: the shard group's */
    const unsigned z = t->zero;
    uint64_t params_all = ml_mul(ch, P, ch->prec.param);
    uint64_t master_all = ml_mul(ch, Pt, ch->prec.master);
    /* expert parallelism: the experts' shards span the dp x cp / ep ranks
     * that hold them (ml__ep_shard); states alike per element */
    const uint64_t Pe = ml__ep_expert_params(ch);
    s->bytes_params =
        z >= 3 ? ml__ep_shard(ch, t, params_all, ml_mul(ch, Pe, ch->prec.param)) : params_all;
    const uint64_t se = Pt ? ml_mul(ch, ob->states / Pt, Pe) : 0;
    const uint64_t te = Pt ? ml_mul(ch, ob->step_temp / Pt, Pe) : 0;
    s->bytes_master =
        z >= 1 ? ml__ep_shard(ch, t, master_all, ml_mul(ch, Pe, ch->prec.master)) : master_all;
    s->bytes_optimizer = z >= 1 ? ml__ep_shard(ch, t, ob->states, se) : ob->states;
    s->bytes_step_temp = z >= 1 ? ml__ep_shard(ch, t, ob->step_temp, te) : ob->step_temp;
    uint64_t grads_all = 0;
    const bool views = ml__grad_views(t);
    for (size_t k = 0; k < ch->n; k++) {
        const ml_cblock *b = &ch->blocks[k];
        grads_all = ml_add(ch, grads_all, z >= 2 ? ml__ep_grad_shard(ch, b, N) : b->grad_bytes);
        if (views)
            grads_all = ml_add(ch, grads_all, b->grad_view);
    }
    s->bytes_grads = grads_all;
    if (t->dist_optimizer)
        dist_optimizer_states(ch, t, ob, s);
    if (t->offload != ML_OFFLOAD_NONE) {
        /* ZeRO-Offload: fp32 master weights, states and the update live on
         * the host, with an fp32 copy of the gradient partition */
        s->bytes_host = ml_add(ch, ml_add(ch, s->bytes_master, s->bytes_optimizer),
                               ml__ceil_div(ml_mul(ch, Pt, 4), z >= 1 ? N : 1));
        s->bytes_master = s->bytes_optimizer = s->bytes_step_temp = 0;
    }
    if (t->offload == ML_OFFLOAD_PARAMS) {
        s->bytes_host = ml_add(ch, s->bytes_host, s->bytes_params);
        s->bytes_params = 0;
    }
}

ml_tensor_split ml__states_split(const ml_training *t)
{
    return t->dist_optimizer ? ML_T_SHARD : t->zero >= 1 ? ML_T_ONE : ML_T_GRAD_PARAMS;
}

/* The resident model states: parameters and master weights, as one tensor
 * per parameter tensor unless sharded into flat buffers; with `states`, the
 * optimizer states too (state_tensors per parameter tensor). */
void ml__eval_residents(ml_replay *r, const ml_evalctx *x, const ml_summary *s, bool states)
{
    const ml_training *t = &x->cfg->training;
    const bool dopt = t->dist_optimizer; /* Megatron's buffers and shard pieces */
    ml__replay_alloc_as(r, ML_CAT_PARAMS, s->bytes_params,
                        t->zero >= 3 || dopt ? ML_T_ONE : ML_T_ALL_PARAMS, 0, 1);
    ml__replay_alloc_as(r, ML_CAT_MASTER, s->bytes_master,
                        dopt ? ML_T_SHARD : t->zero >= 1 ? ML_T_ONE : ML_T_TRAINED_PARAMS, 0, 1);
    ml__replay_alloc(r, ML_CAT_BUFFERS, s->bytes_buffers);
    if (states)
        ml__replay_alloc_as(r, ML_CAT_OPTIMIZER, s->bytes_optimizer, ml__states_split(t), 0,
                            x->ob.state_tensors);
    ml__eval_batch(r, x->ch);
}

/* The iteration's events after the resident states: each micro-batch (two
 * stand for any accumulation: the second one's are every later one's), the
 * optimizer step (which first creates the states when create_states: the
 * first iteration), zero_grad. Returns the recompute FLOPs of one
 * micro-batch. */
double ml__eval_iteration(ml_replay *r, const ml_evalctx *x, const ml_summary *s,
                          bool create_states)
{
    const ml_training *t = &x->cfg->training;
    const ml_chain *ch = r->ch;
    double flops_re = 0;
    unsigned micros = t->grad_accum > 1 ? 2 : 1;
    for (unsigned mb = 0; mb < micros; mb++) {
        r->micro = mb;
        /* the later micro-batch stands for the last one: the middle ones
         * (identical) have run before it */
        if (mb == 1) {
            r->flops_done *= (double)(t->grad_accum - 1);
            r->comm_done *= (double)(t->grad_accum - 1);
            r->host_done *= (double)(t->grad_accum - 1);
        }
        r->flops_recompute = 0;
        ml__replay_stage_micro_batch(r, &x->inflight, mb > 0);
        flops_re = r->flops_recompute; /* identical for every micro-batch */
    }
    r->phase = ML_PHASE_OPTIMIZER;
    r->block = -1;
    ml__time_before_step(r, t, s->params);
    /* the first iteration's step() creates the states: from here on it
     * holds what the steady iteration holds */
    if (create_states)
        ml__replay_alloc_as(r, ML_CAT_OPTIMIZER, s->bytes_optimizer, ml__states_split(t), 0,
                            x->ob.state_tensors);
    if (r->total > r->peak_first)
        r->peak_first = r->total;
    /* the step holds at least what it starts with, also when it allocates
     * nothing (plain SGD): both iterations' optimizer phase */
    ml__replay_phase_point(r, r->total);
    /* ZeRO-1/2 all-gather the updated parameters through a bucket */
    uint64_t ag = 0;
    if (t->zero == 1 || t->zero == 2)
        ag = ml_mul((ml_chain *)ch, t->allgather_bucket < s->params ? t->allgather_bucket
                                                                     : s->params,
                    ch->prec.param);
    ml__replay_alloc_as(r, ML_CAT_WORKSPACE, s->bytes_step_temp,
                        x->ob.temp_per_tensor && t->zero == 0 ? ML_T_GRAD_PARAMS : ML_T_ONE, 0, 1);
    /* the step runs with its temporaries: what follows is after it */
    r->l->step_done = r->l->nevents;
    ml__replay_free(r, ML_CAT_WORKSPACE, s->bytes_step_temp);
    ml__replay_alloc(r, ML_CAT_WORKSPACE, ag);
    ml__time_after_step(r, t, s->params);
    ml__replay_free(r, ML_CAT_WORKSPACE, ag);
    if (t->zero_grad == ML_ZERO_GRAD_SET_TO_NONE)
        ml__replay_free(r, ML_CAT_GRADS, r->live[ML_CAT_GRADS]); /* zero_grad(set_to_none=True) */
    else
        r->grads_exist = true; /* zero_grad(set_to_none=False): zeroed in place */
    /* logits: kept — the loop's reference ends with the iteration */
    ml__replay_drop_prev(r);
    return flops_re;
}

/* Out of memory or overflow. */
static ml_status replay_failed(const ml_replay *r, const ml_chain *ch, ml_error *err)
{
    if (r->nomem)
        return ml__errorf(err, ML_NOMEM, "out of memory");
    if (r->overflow || ch->overflow)
        return ml__errorf(err, ML_OVERFLOW,
                          "byte counts exceed 64 bits: use a smaller micro_batch or seq_len");
    return ML_OK;
}

/* ... or a replay that does not balance. */
static ml_status replay_status(const ml_replay *r, const ml_chain *ch, uint64_t grads_kept,
                               ml_error *err)
{
    ml_status st = replay_failed(r, ch, err);
    if (st)
        return st;
    if (r->underflow || r->live[ML_CAT_GRADS] != grads_kept || r->live[ML_CAT_ACTIVATIONS] ||
        r->live[ML_CAT_RECOMPUTE] || r->live[ML_CAT_WORKSPACE]) {
        /* the schedule freed something twice or leaked: a planner bug */
        return ml__errorf(err, ML_RANGE, "internal: the replay does not balance");
    }
    return ML_OK;
}

/* FLOPs of the step and its time: peak x efficiency, or a profile's
 * measured throughput (docs/flops.md). */
static void flops_and_time(const ml_chain *ch, const ml_config *cfg, double flops_re,
                           ml_summary *s)
{
    const ml_training *t = &cfg->training;
    const ml_device *dv = &cfg->device;
    double ff = 0, fb = 0;
    for (size_t k = 0; k < ch->n; k++) {
        ff += ch->blocks[k].flops_fwd;
        fb += ch->blocks[k].flops_bwd;
    }
    double A = (double)t->grad_accum;
    s->flops_forward = ff * A;
    s->flops_backward = fb * A;
    s->flops_recompute = flops_re * A;
    s->flops_total = s->flops_forward + s->flops_backward + s->flops_recompute;
    s->flops_per_micro_batch = s->flops_total / A;
    s->peak_tflops_used = ml_device_peak(dv, t->precision);
    s->step_time_s = s->peak_tflops_used > 0
                         ? s->flops_total / (s->peak_tflops_used * 1e12 * dv->efficiency)
                         : -1.0;
    s->calibrated_blocks = ch->calibrated;
    s->calibrated_c = ch->calib_c;
    s->calibrated_at_shape = ch->calib_exact;
    s->calibration_note = cfg->calib ? ch->calib_note : NULL;
    if (cfg->calib && ml_profile_achieved_tflops(cfg->calib) > 0) {
        s->time_note = ml_profile_time_mismatch(cfg->calib, cfg);
        if (!s->time_note) {
            /* measured throughput replaces peak x efficiency */
            s->step_time_s = s->flops_total / (ml_profile_achieved_tflops(cfg->calib) * 1e12);
            s->time_measured = true;
            s->peak_tflops_used = 0;
        }
    }
}

void ml__eval_setup(ml_evalctx *x, const int *seg, ml_ledger *l, ml_shard *sh, ml_replay *r)
{
    const ml_chain *ch = x->ch;
    const ml_training *t = &x->cfg->training;
    const size_t n = ch->n;
    const uint64_t N = ml__shard_group(t); /* the collectives' group */
    const unsigned z = ml__zero_stage(t);
    memset(x->recomputed, 0, (n + 1) * sizeof *x->recomputed);
    memset(x->held, 0, (n + 1) * sizeof *x->held);
    const bool held = t->logits == ML_LOGITS_KEPT || t->logits == ML_LOGITS_THROUGH_BACKWARD;
    ml__eval_boundaries(ch, seg, held, x->bd);
    /* the side inputs a checkpoint keeps (attention masks): once, with the
     * first checkpointed block (docs/ledger.md) */
    x->side_block = -1;
    for (size_t k = 0; k < n && ch->ckpt_side; k++)
        if (seg[k] >= 0 && ch->blocks[k].ckpt_index >= (int)ch->mask_ckpt0) {
            x->side_block = (int)k;
            break;
        }
    *sh = (ml_shard){N, z, z >= 2, z >= 3, ch->prec.param, 0, x->side_block, ch->ckpt_side,
                     (double)(N - 1) / (double)N, t->offload == ML_OFFLOAD_PARAMS,
                     ml__grad_views(t)};
    if (z >= 2) {
        uint64_t e = t->reduce_bucket < l->sum.params ? t->reduce_bucket : l->sum.params;
        sh->reduce_ws = ml_mul((ml_chain *)ch, e, ch->prec.grad);
    }
    memset(r, 0, sizeof *r);
    r->l = l;
    r->ch = ch;
    r->sh = sh;
    r->seg = seg;
    r->bd = x->bd;
    r->selective = t->checkpoint.kind == ML_CKPT_SELECTIVE;
    r->keep_output = held;
    r->drop_output = t->logits == ML_LOGITS_THROUGH_BACKWARD;
    /* HF's use_cache in training: transformers turns it off under gradient
     * checkpointing; counted for eager PyTorch without model parallelism
     * (HF's modeling code on each data-parallel rank) */
    r->train_cache = t->checkpoint.kind == ML_CKPT_NONE && t->engine == ML_ENGINE_EAGER &&
                     t->tensor_parallel <= 1 && ml_training_cp(t) == 1 &&
                     t->pipeline_parallel <= 1;
    r->held = x->held;
    r->held_cat = x->held_cat;
    r->recomputed = x->recomputed;
    r->block = -1;
    r->sub = "";
    r->phase = ML_PHASE_FORWARD;
    r->whole = x->whole;
    if (x->runs) {
        ml__run_flags(r, x->runs);
        r->runs = x->runs;
    }
}

/* A pipeline stage's first pass (ml__stage_activations): the replay to
 * the end of the last micro-batch's forward, the first one whole before it
 * (what it leaves, the loop's reference to its output, is there then).
 * The replay is left unfinished: no balance to check (the second pass,
 * over the same chain, checks it). */
static ml_status activations_pass(ml_replay *r, const ml_evalctx *x, ml_summary *s,
                                  ml_error *err)
{
    if (x->cfg->training.grad_accum > 1) {
        r->micro = 0;
        ml__replay_micro_batch(r);
        r->micro = 1;
    }
    r->sub = "";
    ml__replay_forward(r);
    s->bytes_activations = r->act_end;
    return replay_failed(r, x->ch, err);
}

ml_status ml__eval_run(ml_evalctx *x, const int *seg, bool keep_events, ml_ledger *l,
                       ml_error *err)
{
    ml_chain *ch = (ml_chain *)x->ch; /* only the overflow flag changes */
    const ml_training *t = &x->cfg->training;
    ml_summary *s = &l->sum;
    memset(s, 0, sizeof *s);
    s->pipeline_step_s = s->pipeline_bubble = -1; /* no pipeline (pipeline_eval.c) */
    l->nevents = 0;
    l->step_done = SIZE_MAX;
    ml__eval_model_states(ch, t, &x->ob, s);
    ml_shard sh;
    ml_replay r;
    ml__eval_setup(x, seg, l, &sh, &r);
    s->peak_block = -1;
    r.keep = keep_events;
    ml__eval_residents(&r, x, s, true);
    const bool zero = t->zero_grad == ML_ZERO_GRAD_ZERO;
    if (zero) { /* the gradients the previous iteration left, zeroed */
        ml__replay_alloc_as(&r, ML_CAT_GRADS, s->bytes_grads,
                            t->zero >= 2 || t->dist_optimizer ? ML_T_ONE : ML_T_GRAD_PARAMS, 0,
                            1);
        r.grads_exist = true;
    }
    if (x->activations_only)
        return activations_pass(&r, x, s, err);
    s->comm_bytes = ml__eval_communication(ch, t, s->params);
    s->comm_grad_bytes = ml__eval_grad_reduce_bytes(ch, t, s->params);
    s->tp_comm_bytes = ml__tp_communication(ch, t, seg, &s->tp_allreduces, &s->tp_halves);
    s->cp_comm_bytes = ml__cp_communication(ch, t, seg, &s->cp_halves, &s->cp_sends);
    s->ep_comm_bytes = ml__ep_communication(ch, t, seg, &s->ep_calls);
    s->etp_comm_bytes = ml__etp_communication(ch, t, seg, &s->etp_calls);
    ml__eval_collective_calls(ch, t, s->params, &s->dp_allreduces, &s->dp_halves);
    s->host_transfer_bytes = ml__eval_host_transfer(t, &ch->prec, s->params);
    double flops_re = ml__eval_iteration(&r, x, s, false);
    /* one micro-batch's (the last replayed), without the stage's others */
    s->bytes_activations = r.act_end - (t->grad_accum > 1 ? x->inflight.later : x->inflight.first);
    if (s->peak_block >= 0)
        ml__name_join(s->peak_step, sizeof s->peak_step, ch->blocks[s->peak_block].name,
                      r.peak_sub ? r.peak_sub : "");
    else
        ml__name_join(s->peak_step, sizeof s->peak_step, "optimizer.step", "");
    ml_status st = replay_status(&r, ch, zero ? s->bytes_grads : 0, err);
    if (st)
        return st;
    ml__replay_phase_names(&r, s);
    s->peak_first_iteration = zero ? ml__eval_first_without_grads(x, seg, s->phase_first) : r.peak_first;
    s->has_eval = x->has_eval;
    s->peak_eval = x->eval_peak;
    if (x->has_eval)
        memcpy(s->phase_eval, x->eval_phases, sizeof s->phase_eval);
    flops_and_time(ch, x->cfg, flops_re, s);
    /* the timeline's clock: the per-op model's, when it times the step */
    ml_time_map map = {NULL, 0, 0, false, -1};
    ml__step_time(ch, x->cfg, seg, s, keep_events ? &map : NULL); /* docs/time.md */
    ml__time_finish(x->cfg, l, &map); /* docs/ledger.md, "Time" */
    free(map.p);
    if ((st = ml__eval_verdict(ch, &x->cfg->device, x->cache_allow, s, err)))
        return st;
    ml__eval_block_table(x, seg, l);
    describe_plan(ch, &t->checkpoint, seg, s->plan, sizeof s->plan);
    return ML_OK;
}

ml_status ml__evaluate_chain(const ml_model *m, const ml_config *cfg, const ml_chain *chain,
                             bool keep_events, bool whole, ml_reserved_memo *memo, ml_ledger **out,
                             ml_error *err)
{
    if (cfg->training.pipeline_parallel > 1)
        return ml__pp_evaluate(m, cfg, chain, keep_events, whole, out, err);
    return ml__evaluate_stage(m, cfg, chain, keep_events, whole, memo, NULL, out, err);
}

static ml_status stage_eval(const ml_model *m, const ml_config *cfg, const ml_chain *chain,
                            bool keep_events, bool whole, ml_reserved_memo *memo,
                            const ml_inflight *inflight, bool activations_only, ml_ledger **out,
                            ml_error *err)
{
    const ml_training *t = &cfg->training;
    ml_chain ch = *chain; /* a copy for its overflow flag; the arrays stay the caller's */
    ml_evalctx x = {.ch = &ch, .cfg = cfg, .whole = whole, .memo = memo,
                    .activations_only = activations_only};
    if (inflight)
        x.inflight = *inflight;
    /* checkpoint optimal's search counts what the process holds */
    if (cfg->device.allocator != ML_ALLOCATOR_NONE && t->checkpoint.kind == ML_CKPT_OPTIMAL)
        x.start_held = ml__rsim_process_held(&cfg->device);
    ml_status st;
    if ((st = ml__optim_bytes_of(&ch, t, &x.ob, err)) ||
        (!activations_only && (st = ml__eval_pass(m, &x, err))))
        return st;
    /* the ledger and its block table (n + 1 rows) in one allocation */
    const size_t m1 = ch.n + 1;
    ml_ledger *l = m1 <= (SIZE_MAX - sizeof *l) / sizeof *l->blocks
                       ? calloc(1, sizeof *l + m1 * sizeof *l->blocks)
                       : NULL;
    if (l)
        l->blocks = (ml_block_info *)(l + 1);
    /* the scratch arrays, n + 1 entries each, in one allocation (the
     * widest first: each array starts aligned); on the stack for a chain of
     * up to 128 blocks */
    enum { ENTRY = 2 * sizeof(uint64_t) + sizeof(ml_boundary) + sizeof(ml_category) +
                   sizeof(int) + 1, ON_STACK = 128 };
    uint64_t stack[(ON_STACK * ENTRY + sizeof(uint64_t) - 1) / sizeof(uint64_t)];
    void *heap = m1 > ON_STACK ? calloc(m1, ENTRY) : NULL;
    void *scratch = m1 > ON_STACK ? heap : memset(stack, 0, m1 * ENTRY);
    int *seg = NULL;
    if (scratch) {
        x.recomputed = scratch;
        x.held = x.recomputed + m1;
        x.bd = (ml_boundary *)(x.held + m1);
        x.held_cat = (ml_category *)(x.bd + m1);
        seg = (int *)(x.held_cat + m1);
        x.runs = (unsigned char *)(seg + m1);
    }
    if (!l || !scratch) {
        st = ML_NOMEM;
        ml__errorf(err, ML_NOMEM, "out of memory");
        goto done;
    }
    if ((st = ml__eval_plan(m, &x, seg, keep_events, l, err)))
        goto done;
    *out = l;
    l = NULL;
done:
    free(heap);
    ml_ledger_destroy(l);
    return st;
}

ml_status ml__evaluate_stage(const ml_model *m, const ml_config *cfg, const ml_chain *chain,
                             bool keep_events, bool whole, ml_reserved_memo *memo,
                             const ml_inflight *inflight, ml_ledger **out, ml_error *err)
{
    return stage_eval(m, cfg, chain, keep_events, whole, memo, inflight, false, out, err);
}

ml_status ml__stage_activations(const ml_model *m, const ml_config *cfg, const ml_chain *chain,
                                bool whole, uint64_t *bytes, ml_error *err)
{
    ml_ledger *l = NULL;
    /* checkpoint optimal chooses its segments by the whole plan */
    const bool only = cfg->training.checkpoint.kind != ML_CKPT_OPTIMAL;
    ml_status st = stage_eval(m, cfg, chain, false, whole, NULL, NULL, only, &l, err);
    if (st == ML_OK)
        *bytes = l->sum.bytes_activations;
    ml_ledger_destroy(l);
    return st;
}

ml_status ml__ledger_evaluate_with(const ml_model *m, const ml_config *cfg, bool keep, bool whole,
                                   ml_reserved_memo *memo, ml_ledger **out, ml_error *err)
{
    ml_error local;
    if (!err)
        err = &local;
    ml__error_clear(err);
    ml_status st = ml_config_check(cfg, err);
    if (st)
        return st;
    ml_chain ch;
    if ((st = ml__chain_build(m, cfg, &ch, err)))
        return st;
    st = ml__evaluate_chain(m, cfg, &ch, keep, whole, memo, out, err);
    ml__chain_free(&ch);
    return st;
}

ml_status ml_ledger_evaluate(const ml_model *m, const ml_config *cfg, bool keep_events,
                             ml_ledger **out, ml_error *err)
{
    return ml__ledger_evaluate_with(m, cfg, keep_events, false, NULL, out, err);
}

ml_status ml__ledger_evaluate_whole(const ml_model *m, const ml_config *cfg, ml_ledger **out,
                                    ml_error *err)
{
    return ml__ledger_evaluate_with(m, cfg, false, true, NULL, out, err);
}
