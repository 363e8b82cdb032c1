/* The layout search (docs/search.md): every split
 * of N devices into tensor x pipeline x data parallelism that the model
 * divides, every micro-batch that divides a data-parallel rank's share of
 * the global batch, and the checkpoint policies none, selective and full;
 * each point planned exactly (every pipeline stage), those that fit every
 * rank ranked by their step time. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ledger/chain.h" /* ml__cp_refused, ml__ep_refused */
#include "memledger/plan.h"
#include "plan/layout_time.h"
#include "model/model_internal.h" /* the layers, for the virtual stages */
#include "util/error.h"
#include "util/grow.h"

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
    /* the points that fit in the allocated view (the caching allocator's
     * simulation only adds to a peak), before the simulated verdict */
    ml_layout_row *cand;
    size_t ncand, cap;
    bool nomem;
    bool planned;      /* some point was planned (it fit or not) */
    ml_error refusal;  /* the first refusal of a point (a layout or a setting
                          the model does not take), said when nothing was
                          planned at all */
    bool refused;
    /* the divisors of a share of the global batch, ascending (divisors_of) */
    uint64_t *div;
    size_t ndiv, divcap;
    uint64_t div_of;
} search;

/* The divisors of n into x->div, ascending: trial division up to its
 * square root (a global batch of 2^40 is a million steps), once per
 * distinct share. False: out of memory. */
static bool push_divisor(search *x, uint64_t d)
{
    uint64_t *grown = ml_grow(x->div, x->ndiv, &x->divcap, sizeof *grown, 64);
    if (!grown)
        return false;
    x->div = grown;
    x->div[x->ndiv++] = d;
    return true;
}

static bool divisors_of(search *x, uint64_t n)
{
    if (x->ndiv && x->div_of == n)
        return true;
    x->ndiv = 0;
    /* those up to the square root ascending, then their pairs n / d, which
     * descend as d ascends: in all, ascending */
    for (uint64_t d = 1; d <= n / d; d++)
        if (n % d == 0 && !push_divisor(x, d))
            return false;
    for (size_t i = x->ndiv; i-- > 0;) {
        const uint64_t d = x->div[i];
        if (d != n / d && !push_divisor(x, n / d)) /* a square's root once */
            return false;
    }
    x->div_of = n;
    return true;
}

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

static ml_config config_of(const search *x, const ml_layout_row *w)
{
    return ml_layout_config(x->cfg, w);
}

/* The row's figures from its plan. */
static void figures(const search *x, const ml_ledger *l, ml_layout_row *w)
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

/* One point planned in the allocated view; ML_RANGE: the layout is not
 * one the model splits into (not an error of the search); *fits whether it
 * fits every rank so, and then it is a candidate. */
static ml_status point(search *x, const ml_layout_row *split, uint64_t b, uint64_t mb,
                       const ml_checkpoint *policy, bool *fits, ml_error *err)
{
    ml_layout_row row = *split;
    row.micro_batch = b, row.micro_batches = mb;
    row.checkpoint = *policy;
    ml_config c = config_of(x, &row);
    c.device.allocator = ML_ALLOCATOR_NONE;
    ml_ledger *l = NULL;
    ml_status st = ml_planner_evaluate(x->planner, &c, false, &l, err);
    x->out->evaluations++;
    if (st)
        return st;
    *fits = ml_ledger_summary(l)->fits;
    if (*fits) {
        figures(x, l, &row);
        ml_layout_row *grown = ml_grow(x->cand, x->ncand, &x->cap, sizeof *grown, 64);
        if (grown) {
            x->cand = grown;
            x->cand[x->ncand++] = row;
        } else {
            x->nomem = true;
        }
    }
    ml_ledger_destroy(l);
    return ML_OK;
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

/* The candidates from the fastest, each planned as configured (the
 * caching allocator simulated, unless none), the fitting ones kept until
 * the table is full. */
static ml_status verdicts(search *x, ml_error *err)
{
    if (x->ncand)
        qsort(x->cand, x->ncand, sizeof *x->cand, faster);
    for (size_t i = 0; i < x->ncand && x->out->nrows < ML_LAYOUT_TOP; i++) {
        ml_layout_row row = x->cand[i];
        if (x->cfg->device.allocator != ML_ALLOCATOR_NONE) {
            ml_config c = config_of(x, &row);
            ml_ledger *l = NULL;
            ml_status st = ml_planner_evaluate(x->planner, &c, false, &l, err);
            x->out->evaluations++;
            if (st)
                return st;
            const bool fits = ml_ledger_summary(l)->fits;
            if (fits)
                figures(x, l, &row);
            ml_ledger_destroy(l);
            if (!fits)
                continue;
        }
        keep(x->out, &row);
    }
    return ML_OK;
}

/* Every micro-batch and policy of a split (tp x pp x dp, its virtual
 * stages and sharding), the micro-batches from the smallest up to the
 * first that does not fit (the peak grows with the micro-batch: with a
 * pipeline the fewer micro-batches in flight hold as many samples, no fewer
 * bytes), which prunes the larger ones; *candidates counts the points,
 * planned or pruned. The interleaved schedule needs micro-batches a
 * multiple of the stages (Megatron-LM's condition): others are not
 * points. */
static ml_status layout(search *x, const ml_layout_row *split, uint64_t *candidates,
                        ml_error *err)
{
    const ml_layout_request *req = x->req;
    const uint64_t share = req->global_batch / split->dp;
    x->out->layouts++;
    if (!divisors_of(x, share))
        return ML_NOMEM;
    /* a step's micro-batches are training.grad_accum, at most its limit */
    uint64_t lo = 1, hi = 1;
    ml_config_range("training.grad_accum", &lo, &hi);
    const size_t npol = req->pin_checkpoint ? 1 : sizeof policies / sizeof policies[0];
    for (size_t pol = 0; pol < npol; pol++) {
        if (!req->pin_checkpoint && req->no_selective && !strcmp(policies[pol], "selective"))
            continue;
        bool pruned = false;
        for (size_t i = 0; i < x->ndiv; i++) {
            const uint64_t b = x->div[i], m = share / b;
            if ((req->micro_batch && b != req->micro_batch) || m > hi ||
                (split->vpp > 1 && m % split->pp))
                continue;
            (*candidates)++;
            if (pruned)
                continue;
            ml_checkpoint policy = req->checkpoint;
            if (!req->pin_checkpoint)
                ml_parse_checkpoint(policies[pol], &policy, NULL);
            bool fits = false;
            ml_status st = point(x, split, b, m, &policy, &fits, err);
            if (st == ML_RANGE) {
                if (!x->refused)
                    x->refusal = *err;
                x->refused = true;
                pruned = true; /* the model does not split this way, or not with this policy */
                continue;
            }
            if (st)
                return st;
            x->planned = true;
            if (!fits)
                pruned = true;
        }
    }
    return ML_OK;
}

/* The sharding of a split's data-parallel ranks: the config's when pinned
 * or with one rank; else ZeRO 0 to 3 (0 and 1 beside a pipeline, which
 * DeepSpeed's pipeline engine allows) or, under engine megatron, its
 * distributed optimizer off and on. */
static size_t shardings(const search *x, uint64_t pp, uint64_t dp, ml_layout_row *out)
{
    const ml_training *t = &x->cfg->training;
    if (x->req->pin_sharding || dp <= 1) {
        out[0].zero = t->zero, out[0].dist_optimizer = t->dist_optimizer;
        return 1;
    }
    if (t->engine == ML_ENGINE_MEGATRON) {
        out[0].zero = out[1].zero = 0;
        out[0].dist_optimizer = false, out[1].dist_optimizer = true;
        return 2;
    }
    const unsigned top = pp > 1 ? 1 : 3;
    for (unsigned z = 0; z <= top; z++)
        out[z].zero = z, out[z].dist_optimizer = false;
    return top + 1;
}

/* Context parallelism over cp ranks beside tp inside a node of G: pinned,
 * or searched where the model's attention and sequence allow it
 * (ml__cp_refused). */
static bool cp_tried(const search *x, uint64_t tp, uint64_t cp, uint64_t G)
{
    const ml_layout_request *req = x->req;
    if ((req->cp && cp != req->cp) || G % (tp * cp) || req->gpus % (tp * cp))
        return false;
    if (cp == 1 || req->cp) /* pinned: the plan says why it is refused */
        return true;
    ml_training t = x->cfg->training;
    t.context_parallel = cp;
    ml_error e;
    return ml__cp_refused(x->m, &t, &e) == ML_OK;
}

/* Expert parallelism over ep of a split's ranks: pinned, or for a mixture
 * of experts every ep dividing its experts with ep x etp dividing the tp x
 * cp x dp ranks (etp the split's, or tp's: Megatron's default), where the
 * split's sharding allows it (ZeRO, not the distributed optimizer:
 * ml__ep_refused); ep 1 always where etp covers tp (unless another is
 * pinned). */
static bool ep_tried(const search *x, const ml_layout_row *split, uint64_t ep)
{
    const ml_layout_request *req = x->req;
    const uint64_t dpc = split->dp * (split->cp > 1 ? split->cp : 1);
    if (req->ep && ep != req->ep)
        return false;
    ml_training t = config_of(x, split).training;
    t.expert_parallel = ep;
    const uint64_t etp = x->m->moe.experts ? ml_training_etp(&t) : 1;
    if ((split->tp * dpc) % (ep * etp))
        return false;
    if (ep == 1 && (!x->m->moe.experts || etp >= split->tp))
        return true;
    /* pinned beside a pinned sharding: the plan says why it is refused; a
     * searched sharding it does not take is not tried */
    if (req->ep && (req->pin_sharding || !split->dist_optimizer))
        return true;
    ml_error e;
    return ml__ep_refused(x->m, &t, &e) == ML_OK;
}

/* A mixture of experts' expert-tensor ranks under tp > 1: tp's (Megatron's
 * default: 0 here) and 1 (each expert whole, its ranks expert-parallel
 * ones); the configuration's where it gives one. */
static size_t etps_of(const search *x, uint64_t tp, uint64_t out[2])
{
    out[0] = x->m->moe.experts ? x->cfg->training.expert_tensor_parallel : 0;
    if (!x->m->moe.experts || tp <= 1 || out[0])
        return 1;
    out[1] = 1;
    return 2;
}

/* A count of splits and where the search stands (layouts, below). */
typedef struct {
    uint64_t n, total, candidates;
} tally;

/* The uneven splits of L layers over pp stages the search tries beside
 * the even one (Megatron's --decoder-first-pipeline-num-layers and
 * --decoder-last-pipeline-num-layers: the middle stages even): the first
 * stage, the last or both with r = 1 or 2 layers fewer than each middle
 * one, where the rest divides; into shapes (first, middle, last; middle 0
 * with 2 stages). Returns how many (at most 6). */
static size_t uneven_shapes(uint64_t L, uint64_t pp, uint32_t shapes[6][3])
{
    size_t n = 0;
    for (uint64_t r = 1; r <= 2 && pp >= 2; r++)
        for (int which = 0; which < 3; which++) { /* first, last, both */
            const uint64_t fewer = which == 2 ? 2 * r : r;
            if (which == 2 && pp == 2)
                continue; /* two stages: one holds what the other does not */
            if ((L + fewer) % pp)
                continue;
            const uint64_t m = (L + fewer) / pp;
            if (m <= r || m > UINT32_MAX)
                continue;
            const uint64_t f = which != 1 ? m - r : m, l = which != 0 ? m - r : m;
            shapes[n][0] = (uint32_t)f;
            shapes[n][1] = pp > 2 ? (uint32_t)m : 0;
            shapes[n][2] = (uint32_t)l;
            n++;
        }
    return n;
}

/* The splits with tp and cp: pp dividing the rest, its virtual stages, its
 * uneven splits and the data-parallel sharding, each searched (st not
 * NULL) and followed by the progress callback, or only counted; false once
 * *st is an error. */
static bool splits(search *x, uint64_t tp, uint64_t cp, tally *c, ml_status *st, ml_error *err)
{
    const ml_layout_request *req = x->req;
    const uint64_t L = x->m->layers, tc = tp * cp;
    for (uint64_t pp = 1; pp <= req->gpus / tc && pp <= ML_PP_MAX_STAGES; pp++) {
        if ((req->gpus / tc) % pp || (req->pp && pp != req->pp))
            continue;
        const uint64_t dp = req->gpus / (tc * pp);
        if (req->global_batch % dp)
            continue;
        /* virtual stages: a stage's layers in v equal chunks; with one, the
         * uneven splits too */
        for (uint64_t v = 1; v <= (pp > 1 && L ? L / pp : 1); v++) {
            if ((v > 1 && (L / pp) % v) || (req->vpp && v != req->vpp) || (v > 1 && L % pp))
                continue;
            uint32_t shapes[7][3] = {{0, 0, 0}};
            const size_t nshapes = 1 + (v == 1 ? uneven_shapes(L, pp, shapes + 1) : 0);
            for (size_t u = 0; u < nshapes; u++) {
                ml_layout_row split[4];
                memset(split, 0, sizeof split);
                /* the states shard over dp x cp ranks (ml__shard_group) */
            const size_t ns = shardings(x, pp, dp * cp, split);
                for (size_t k = 0; k < ns; k++) {
                    split[k].tp = tp, split[k].pp = pp, split[k].dp = dp, split[k].vpp = v;
                    split[k].cp = cp;
                    split[k].first_layers = shapes[u][0];
                    split[k].middle_layers = shapes[u][1];
                    split[k].last_layers = shapes[u][2];
                    /* (a model without experts: ep 1 alone) */
                    const uint64_t ep_top = x->m->moe.experts ? tp * dp * cp : 1;
                    uint64_t etps[2];
                    const size_t ne = etps_of(x, tp, etps);
                    for (size_t j = 0; j < ne; j++)
                        for (uint64_t ep = 1; ep <= ep_top; ep++) {
                            split[k].etp = etps[j];
                            if (!ep_tried(x, &split[k], ep))
                                continue;
                            split[k].ep = ep;
                            c->n++;
                            if (!st)
                                continue;
                            if ((*st = layout(x, &split[k], &c->candidates, err)))
                                return false;
                            if (req->progress)
                                req->progress(req->progress_ctx, c->n, c->total,
                                              x->out->nrows ? &x->out->rows[0] : NULL);
                        }
                }
            }
        }
    }
    return true;
}

/* The splits of req, each searched (st not NULL) and followed by the
 * progress callback, or only counted; returns how many. tp and cp stay
 * inside a node. */
static uint64_t layouts(const ml_layout_request *req, ml_status *st, search *x, ml_error *err)
{
    const uint64_t G = req->gpus_per_node ? req->gpus_per_node : 8;
    tally c = {0, st ? layouts(req, NULL, x, err) : 0, 0};
    for (uint64_t tp = 1; tp <= G && tp <= req->gpus; tp++) {
        if (G % tp || req->gpus % tp || (req->tp && tp != req->tp))
            continue;
        for (uint64_t cp = 1; tp * cp <= G && tp * cp <= req->gpus; cp++)
            if (cp_tried(x, tp, cp, G) && !splits(x, tp, cp, &c, st, err))
                return c.n;
    }
    if (st)
        x->out->candidates = c.candidates;
    return c.n;
}

/* What the search did, or why nothing fits, into out->note. */
static void write_note(const search *x, const ml_layout_request *req, ml_layout_result *out)
{
    if (!out->nrows && !x->planned)
        snprintf(out->note, sizeof out->note,
                 "no layout of %llu devices splits %s with a global batch of %llu (%llu "
                 "layouts tried%s%s): another device count or global batch",
                 (unsigned long long)req->gpus, x->m->name, (unsigned long long)req->global_batch,
                 (unsigned long long)out->layouts, x->refused ? "; the first refused: " : "",
                 x->refused ? x->refusal.msg : "");
    else if (!out->nrows)
        snprintf(out->note, sizeof out->note,
                 "no layout of %llu devices fits: %llu layouts, %llu plans; another device "
                 "count (one the global batch and the model divide), a smaller model state "
                 "(precision, optimizer, ZeRO) or a larger device",
                 (unsigned long long)req->gpus, (unsigned long long)out->layouts,
                 (unsigned long long)out->evaluations);
    else
        snprintf(out->note, sizeof out->note,
                 "%llu layouts of %llu devices, %llu candidates (micro-batch x policy), %llu "
                 "plans, %llu points fit in the allocated view (the fastest planned again "
                 "with the allocator as configured)",
                 (unsigned long long)out->layouts, (unsigned long long)req->gpus,
                 (unsigned long long)out->candidates, (unsigned long long)out->evaluations,
                 (unsigned long long)out->fitting);
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
        return ml__errorf(err, ML_USAGE, "device.memory: the layout search needs a device: give "
                                         "device.memory (a named device for the ranking by "
                                         "time)");
    if (!req->gpus || !req->global_batch)
        return ml__errorf(err, ML_USAGE, "global_batch: the layout search needs the devices "
                                         "(gpus) and the global batch (global_batch)");
    const uint64_t G = req->gpus_per_node ? req->gpus_per_node : 8;
    if (req->tp && (req->tp > G || G % req->tp))
        return ml__errorf(err, ML_USAGE,
                          "parallel.tp: %llu: the search keeps tensor parallelism inside a node "
                          "of %llu devices; pin a tp that divides it",
                          (unsigned long long)req->tp, (unsigned long long)G);
    search x = {.m = m, .cfg = cfg, .req = req, .out = out};
    out->comm_timed = cfg->device.interconnect_gbps > 0;
    ml_status st = ml_planner_create(m, &x.planner, err);
    if (st)
        return st;
    layouts(req, &st, &x, err);
    if (!st && x.nomem)
        st = ml__errorf(err, ML_NOMEM, "out of memory");
    /* nothing planned at all: with pinned parts a refusal (or a usage error
     * below); with none, no layout of these devices splits the model: the
     * note says so, with the first refusal */
    const bool pinned = req->tp || req->cp || req->pp || req->vpp || req->micro_batch || req->ep;
    if (!st && !x.planned && x.refused && pinned) {
        *err = x.refusal;
        st = ML_RANGE;
    }
    if (!st && !x.planned && pinned && !x.refused && (out->layouts == 0 || out->candidates == 0))
        st = ml__errorf(err, ML_USAGE,
                        "%s: the pinned parts leave %s of %llu devices and a global batch of "
                        "%llu (parallel.tp %llu, parallel.cp %llu, parallel.pp %llu, "
                        "parallel.vpp %llu, parallel.ep %llu, training.micro_batch %llu; 0: "
                        "searched): tp x cp must divide the node's devices and the devices, pp "
                        "the rest and the layers, vpp a stage's layers, ep the data-parallel "
                        "ranks (x cp) and the experts, and the micro-batch a data-parallel "
                        "rank's share",
                        req->micro_batch && out->layouts ? "training.micro_batch"
                        : req->ep                        ? "parallel.ep"
                        : req->vpp                       ? "parallel.vpp"
                        : req->pp                        ? "parallel.pp"
                        : req->cp                        ? "parallel.cp"
                                                         : "parallel.tp",
                        out->layouts ? "no micro-batch" : "no layout",
                        (unsigned long long)req->gpus, (unsigned long long)req->global_batch,
                        (unsigned long long)req->tp, (unsigned long long)req->cp,
                        (unsigned long long)req->pp, (unsigned long long)req->vpp,
                        (unsigned long long)req->ep, (unsigned long long)req->micro_batch);
    if (!st)
        st = verdicts(&x, err);
    out->fitting = x.ncand;
    ml_planner_destroy(x.planner);
    free(x.cand);
    free(x.div);
    if (st)
        return st;
    write_note(&x, req, out);
    return ML_OK;
}
