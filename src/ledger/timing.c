/* Time beyond the FLOPs: the collectives of data parallelism and ZeRO, the
 * host transfers of offload, each timed at its bandwidth where it happens
 * on the timeline, serially (no overlap with compute), and every event's
 * time (docs/sharding.md, "Time"; docs/ledger.md, "Time"). */
#include <math.h>

#include "ledger/replay.h"
#include "ledger/steptime.h"

/* Bytes each device sends per step: ring collectives send (N-1)/N of the
 * buffer, all-reduce twice that (docs/sharding.md). */
/* HSDP: the sharded gradient's all-reduce over the R replicas of a shard
 * group, once per step, 2 (R - 1)/R of G / N (docs/sharding.md) */
static double replicas_bytes(const ml_training *t, double G)
{
    const uint64_t N = ml__shard_group(t);
    const uint64_t D = (t->data_parallel ? t->data_parallel : 1) *
                       ml_training_cp(t);
    const double R = (double)(D / N);
    return R > 1 ? 2 * (R - 1) / R * G / (double)N : 0;
}

double ml__eval_communication(const ml_chain *ch, const ml_training *t, uint64_t P)
{
    const uint64_t N = ml__shard_group(t);
    const unsigned z = ml__zero_stage(t); /* Megatron's: ZeRO-1's collectives */
    double f = (double)(N - 1) / (double)N, A = (double)t->grad_accum;
    double pg = (double)P * ch->prec.grad, pp = (double)P * ch->prec.param;
    const double rep = replicas_bytes(t, pg);
    if (N <= 1)
        return rep;
    if (z == 0) /* all-reduce, once per step */
        return 2 * f * pg - ml__ep_saving(ch, t, 2, ch->prec.grad);
    if (z == 1) /* reduce-scatter + all-gather */
        return f * pg + f * pp + rep - ml__ep_saving(ch, t, 1, ch->prec.grad) -
               ml__ep_saving(ch, t, 1, ch->prec.param);
    if (z == 2) /* per micro-batch reduce-scatter */
        return A * f * pg + f * pp + rep - ml__ep_saving(ch, t, A, ch->prec.grad) -
               ml__ep_saving(ch, t, 1, ch->prec.param);
    return A * (2 * f * pp + f * pg) + rep - /* gather fwd + bwd, reduce-scatter */
           ml__ep_saving(ch, t, 2 * A, ch->prec.param) -
           ml__ep_saving(ch, t, A, ch->prec.grad);
}

/* ceil(x / per), at least one call for x > 0 */
static double calls(double x, double per)
{
    return x > 0 ? (per > 0 ? ceil(x / per) : 1) : 0;
}

void ml__eval_collective_calls(const ml_chain *ch, const ml_training *t, uint64_t P,
                               double *allreduces, double *halves)
{
    *allreduces = *halves = 0;
    const uint64_t N = ml__shard_group(t), D = (t->data_parallel ? t->data_parallel : 1) *
                                                ml_training_cp(t);
    if (D <= 1)
        return;
    const double A = (double)(t->grad_accum ? t->grad_accum : 1), p = (double)P;
    const double v = (double)(t->virtual_stages > 1 ? t->virtual_stages : 1);
    /* HSDP: the shard groups' all-reduce once a step */
    const double replicas = N < D ? 1 : 0;
    if (t->engine == ML_ENGINE_MEGATRON) {
        /* megatron/core/distributed/distributed_data_parallel.py: a bucket a
         * model chunk, or with overlap_grad_reduce max(40e6, 1e6 dp)
         * parameters a bucket; an all-reduce each, or with the distributed
         * optimizer a reduce-scatter and an all-gather */
        const double per = fmax(40e6, 1e6 * (double)N);
        const double buckets = t->overlap_grad_reduce ? fmax(v, calls(p, per)) : v;
        if (t->dist_optimizer || t->zero == 1) /* ZeRO-1's: the distributed optimizer's */
            *halves = 2 * buckets;
        else
            *allreduces = buckets;
        *allreduces += replicas;
        return;
    }
    if (t->zero == 0 || N <= 1) {
        /* torch DDP: a first bucket of 1 MiB, then 25 MiB (bucket_cap_mb) of
         * gradients (torch/nn/parallel/distributed.py); shard groups of one
         * rank: those all-reduces are the replicas' */
        const double g = p * ch->prec.grad, first = 1048576;
        *allreduces = 1 + calls(g - first, 25.0 * 1048576) + (N > 1 ? replicas : 0);
        return;
    }
    /* DeepSpeed's buckets of reduce_bucket_size and allgather_bucket_size
     * elements; ZeRO-3 gathers each block's parameters in forward and
     * backward and reduce-scatters its gradient, every micro-batch */
    if (t->zero == 3) {
        double blocks = 0;
        for (size_t k = 0; k < ch->n; k++)
            blocks += ch->blocks[k].params > 0;
        *halves = A * 3 * blocks;
    } else {
        *halves = (t->zero == 2 ? A : 1) * calls(p, (double)t->reduce_bucket) +
                  calls(p, (double)t->allgather_bucket);
    }
    *allreduces = replicas;
}

double ml__eval_grad_reduce_bytes(const ml_chain *ch, const ml_training *t, uint64_t P)
{
    const uint64_t N = ml__shard_group(t);
    const unsigned z = ml__zero_stage(t);
    const double f = (double)(N - 1) / (double)N, pg = (double)P * ch->prec.grad;
    const double rep = replicas_bytes(t, pg);
    if (z == 0)
        return N > 1 ? 2 * f * pg - ml__ep_saving(ch, t, 2, ch->prec.grad) : 0;
    if (z == 1)
        return (N > 1 ? f * pg - ml__ep_saving(ch, t, 1, ch->prec.grad) : 0) + rep;
    return rep; /* 2, 3: reduced in every backward */
}

double ml__dp_hidden_s(const ml_summary *s, const ml_training *t, double bytes_per_s)
{
    if (!t->overlap_grad_reduce || !(bytes_per_s > 0) || !(s->comm_grad_bytes > 0) ||
        !(s->time_compute_s > 0))
        return 0;
    const double A = (double)(t->grad_accum ? t->grad_accum : 1);
    /* the last micro-batch's backward: the per-op model's, else its share
     * of the FLOPs */
    const double bwd = s->time.source != ML_TIME_NONE && s->time.by_phase[ML_TPHASE_BACKWARD] > 0
                           ? s->time.by_phase[ML_TPHASE_BACKWARD] / A
                       : s->flops_total > 0
                           ? s->time_compute_s * (s->flops_backward / s->flops_total) / A
                           : 0;
    const double grad = s->comm_grad_bytes / bytes_per_s;
    return grad < bwd ? grad : bwd;
}

/* Bytes over the host link per iteration, per device, of a plan's offload
 * (docs/sharding.md, "Offload"): optimizer offload sends the gradient
 * partition down and the updated parameters up once per step; parameter
 * offload (ZeRO-3) sends the gradient partition down and brings each
 * block's parameter partition up for every micro-batch's forward and
 * backward, the update staying on the host. */
double ml__eval_host_transfer(const ml_training *t, const ml_prec *p, uint64_t P)
{
    double N = t->zero >= 1 ? (double)ml__shard_group(t) : 1.0;
    double n = (double)P;
    if (t->offload == ML_OFFLOAD_OPTIMIZER)
        return n * (p->grad + p->param) / N;
    if (t->offload == ML_OFFLOAD_PARAMS)
        return n * p->grad / N + 2.0 * (double)t->grad_accum * n * p->param / N;
    return 0;
}

static double host_shards(const ml_training *t)
{
    return t->zero >= 1 ? (double)ml__shard_group(t) : 1.0;
}

void ml__time_before_step(ml_replay *r, const ml_training *t, uint64_t P)
{
    const ml_shard *sh = r->sh;
    const double G = (double)P * r->ch->prec.grad;
    /* DDP's all-reduce (no_sync while accumulating) and ZeRO-1's
     * reduce-scatter, after the last backward; stages 2 and 3 reduce-scatter
     * block by block in backward (replay.c) */
    if (sh->zero == 0)
        r->comm_done += 2 * sh->ring * G - ml__ep_saving(r->ch, t, 2, r->ch->prec.grad);
    else if (sh->zero == 1)
        r->comm_done += sh->ring * G - ml__ep_saving(r->ch, t, 1, r->ch->prec.grad);
    /* HSDP: the shard's gradient all-reduced over the replicas */
    r->comm_done += replicas_bytes(t, G);
    /* offload: the gradient partition goes down to the host's update */
    if (t->offload != ML_OFFLOAD_NONE)
        r->host_done += G / host_shards(t);
}

void ml__time_after_step(ml_replay *r, const ml_training *t, uint64_t P)
{
    const ml_shard *sh = r->sh;
    const double W = (double)P * r->ch->prec.param;
    /* optimizer offload: the updated parameter partition comes back up */
    if (t->offload == ML_OFFLOAD_OPTIMIZER)
        r->host_done += W / host_shards(t);
    /* ZeRO-1/2: the updated partitions are all-gathered */
    if (sh->zero == 1 || sh->zero == 2)
        r->comm_done += sh->ring * W - ml__ep_saving(r->ch, t, 1, r->ch->prec.param);
}

void ml__time_finish(const ml_config *cfg, ml_ledger *l, const ml_time_map *map)
{
    const ml_device *dv = &cfg->device;
    const ml_training *t = &cfg->training;
    ml_summary *s = &l->sum;
    const double ic = ml_device_interconnect(dv) * 1e9, hb = dv->pcie_gbps * 1e9;
    /* data parallelism's group leaves a node of 8 once the devices do: a
     * preset's network there (docs/devices.md, "Links") */
    const double dl = ml_device_dp_link(dv, ml_training_devices(t)) * 1e9;
    s->time_compute_s = s->step_time_s;
    s->time_communication_s = !(s->comm_bytes > 0) ? 0 : dl > 0 ? s->comm_bytes / dl : -1;
    s->time_host_transfer_s =
        !(s->host_transfer_bytes > 0) ? 0 : hb > 0 ? s->host_transfer_bytes / hb : -1;
    /* tensor parallelism's collectives, inside a node (docs/parallel.md) */
    s->time_tp_s = !(s->tp_comm_bytes > 0) ? 0 : ic > 0 ? s->tp_comm_bytes / ic : -1;
    /* context parallelism's ring, inside a node, not overlapped */
    s->time_cp_s = !(s->cp_comm_bytes > 0) ? 0 : ic > 0 ? s->cp_comm_bytes / ic : -1;
    /* expert parallelism's all-to-alls, inside a node, not overlapped */
    s->time_ep_s = !(s->ep_comm_bytes > 0) ? 0 : ic > 0 ? s->ep_comm_bytes / ic : -1;
    /* expert tensor parallelism's, the same */
    s->time_etp_s = !(s->etp_comm_bytes > 0) ? 0 : ic > 0 ? s->etp_comm_bytes / ic : -1;
    /* with overlap_grad_reduce, what the last backward covers */
    s->time_comm_hidden_s = s->time_communication_s > 0 ? ml__dp_hidden_s(s, t, dl) : 0;
    if (s->step_time_s >= 0)
        s->step_time_s += fmax(s->time_communication_s, 0) - s->time_comm_hidden_s +
                          fmax(s->time_host_transfer_s, 0) + fmax(s->time_tp_s, 0) +
                          fmax(s->time_cp_s, 0) + fmax(s->time_ep_s, 0) +
                          fmax(s->time_etp_s, 0);
    /* the per-op model's step: throughput and MFU over the whole of it */
    if (s->time.source != ML_TIME_NONE) {
        s->time.step_s = s->step_time_s;
        const double share = s->step_time_s > 0 ? s->time_compute_s / s->step_time_s : 0;
        s->time.tokens_per_s *= share;
        s->time.mfu *= share;
    }
    /* each event's time: its FLOPs at the step's throughput, plus what was
     * sent before it at the bandwidths given; on the per-op model's clock,
     * the events after the optimizer step's compute (its temporaries'
     * release on) at that step's end, since it times the step */
    const double rate = s->time_compute_s > 0 ? s->flops_total / s->time_compute_s : 0;
    const bool clock = map && map->n;
    for (size_t i = 0; i < l->nevents; i++) {
        ml_event *e = &l->events[i];
        const bool after_step = clock && !map->nomem && map->step_end >= 0 &&
                                i >= l->step_done && e->phase == ML_PHASE_OPTIMIZER;
        const double tc = after_step ? map->step_end
                          : clock    ? ml__time_at(map, e->flops_before)
                          : rate > 0 ? e->flops_before / rate
                                     : -1;
        /* the collectives of tensor, context and expert parallelism go with
         * the compute: the event's share of them is its share of the FLOPs */
        const double tp = ic > 0 && s->flops_total > 0
                              ? (s->tp_comm_bytes + s->cp_comm_bytes + s->ep_comm_bytes +
                                 s->etp_comm_bytes) *
                                    (e->flops_before / s->flops_total) / ic
                              : 0;
        /* the data-parallel transfers before it; from the optimizer step on
         * less what the last backward hid of them (overlap_grad_reduce), as
         * the step time counts them */
        double dp = dl > 0 ? e->comm_before / dl : 0;
        if (e->phase == ML_PHASE_OPTIMIZER)
            dp = fmax(dp - s->time_comm_hidden_s, 0);
        e->t_s = tc >= 0 ? tc + tp + dp + (hb > 0 ? e->host_before / hb : 0) : -1;
    }
}
