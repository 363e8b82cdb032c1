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
#include "model/model_internal.h" /* the layers, for the virtual stages */
#include "plan/layout_search.h"
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

/* The divisors of n into x->div, ascending: trial division up to its
 * square root (a global batch of 2^40 is a million steps), once per
 * distinct share. False: out of memory. */
static bool push_divisor(layout_search *x, uint64_t d)
{
    struct layout_divisor *grown = ml_grow(x->div, x->ndiv, &x->divcap, sizeof *grown, 64);
    if (!grown)
        return false;
    x->div = grown;
    x->div[x->ndiv++] = (struct layout_divisor){d, -1};
    return true;
}

static bool divisors_of(layout_search *x, uint64_t n)
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
        const uint64_t d = x->div[i].d;
        if (d != n / d && !push_divisor(x, n / d)) /* a square's root once */
            return false;
    }
    x->div_of = n;
    return true;
}

/* Every micro-batch and policy of a split (tp x pp x dp, its virtual
 * stages and sharding), the micro-batches from the smallest up to the
 * first that does not fit (the peak grows with the micro-batch: with a
 * pipeline the fewer micro-batches in flight hold as many samples, no fewer
 * bytes), which prunes the larger ones; *candidates counts the points,
 * planned or pruned. The interleaved schedule needs micro-batches a
 * multiple of the stages (Megatron-LM's condition): others are not
 * points. Unless the request is exhaustive, a point with recomputation is
 * passed over where the same micro-batch without it was planned (fitting
 * or not) and was already slower than the table's last row: recomputation
 * adds work to the step (a second forward of what it drops, its
 * collectives) and removes none, so the point is slower still. (With a
 * pipeline the transfers timed are the fullest stage's, and recomputation
 * may make another stage the fullest: the bound then assumes that the
 * transfers this moves are less than the compute it adds, which
 * test_layouts.c and the searches in docs/search.md hold.) */
static ml_status layout(layout_search *x, const ml_layout_row *split, uint64_t *candidates,
                        ml_error *err)
{
    const ml_layout_request *req = x->req;
    const uint64_t share = req->global_batch / split->dp;
    x->out->layouts++;
    if (!divisors_of(x, share))
        return ml__errorf(err, ML_NOMEM, "out of memory");
    /* a step's micro-batches are training.grad_accum, at most its limit */
    uint64_t lo = 1, hi = 1;
    ml_config_range("training.grad_accum", &lo, &hi);
    const size_t npol = req->pin_checkpoint ? 1 : sizeof policies / sizeof policies[0];
    for (size_t pol = 0; pol < npol; pol++) {
        if (!req->pin_checkpoint && req->no_selective && !strcmp(policies[pol], "selective"))
            continue;
        bool pruned = false;
        const bool bounding = !req->pin_checkpoint && pol == 0; /* none: the others' bound */
        for (size_t i = 0; i < x->ndiv; i++) {
            if (bounding)
                x->div[i].bound = -1;
            const uint64_t b = x->div[i].d, m = share / b;
            if ((req->micro_batch && b != req->micro_batch) || m > hi ||
                (split->vpp > 1 && m % split->pp))
                continue;
            (*candidates)++;
            if (pruned)
                continue;
            const double over = ml__layout_table_bound(x->out);
            if (!req->exhaustive && !req->pin_checkpoint && pol > 0 && over >= 0 &&
                x->div[i].bound > over) {
                x->out->passed_over++;
                continue;
            }
            ml_checkpoint policy = req->checkpoint;
            if (!req->pin_checkpoint)
                ml_parse_checkpoint(policies[pol], &policy, NULL);
            bool fits = false;
            double bound_s = -1;
            ml_status st = ml__layout_point(x, split, b, m, &policy, &fits, &bound_s, err);
            if (bounding && st == ML_OK)
                x->div[i].bound = bound_s;
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
 * DeepSpeed's pipeline engine allows; 0 and 1 for Megatron-LM's settings,
 * megatron_sharding) or, under engine megatron, its distributed optimizer
 * off and on. */
static size_t shardings(const layout_search *x, uint64_t pp, uint64_t dp, ml_layout_row *out)
{
    const ml_training *t = &x->cfg->training;
    /* a pinned ZeRO stage shards over dp x cp ranks above one (a layout of
     * one rank is planned without it: there is nothing to shard), and
     * stages 2 and 3 are tried without a pipeline (DeepSpeed's pipeline
     * engine runs 0 and 1), as the search tries its own; torchtitan's FSDP
     * (fsdp_sharding) on every layout */
    const bool deepspeed = x->req->pin_sharding && !x->req->fsdp_sharding;
    if (deepspeed && t->zero >= 2 && pp > 1 && dp > 1)
        return 0;
    if (x->req->pin_sharding || dp <= 1) {
        out[0].zero = deepspeed && dp <= 1 ? 0 : t->zero;
        out[0].dist_optimizer = t->dist_optimizer;
        return 1;
    }
    if (t->engine == ML_ENGINE_MEGATRON) {
        out[0].zero = out[1].zero = 0;
        out[0].dist_optimizer = false, out[1].dist_optimizer = true;
        return 2;
    }
    /* Megatron-LM's settings hold ZeRO 1 as its distributed optimizer, and
     * no later stage */
    const unsigned top = pp > 1 || x->req->megatron_sharding ? 1 : 3;
    for (unsigned z = 0; z <= top; z++)
        out[z].zero = z, out[z].dist_optimizer = false;
    return top + 1;
}

/* Context parallelism over cp ranks beside tp inside a node of G: pinned,
 * or searched where the model's attention and sequence allow it
 * (ml__cp_refused). */
static bool cp_tried(const layout_search *x, uint64_t tp, uint64_t cp, uint64_t G)
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
static bool ep_tried(const layout_search *x, const ml_layout_row *split, uint64_t ep)
{
    const ml_layout_request *req = x->req;
    const uint64_t dpc = split->dp * (split->cp > 1 ? split->cp : 1);
    if (req->ep && ep != req->ep)
        return false;
    ml_training t = ml__layout_config_of(x, split).training;
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
static size_t etps_of(const layout_search *x, uint64_t tp, uint64_t out[2])
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

/* The splits with tp and cp for one expert split (etp, ep; 1 and 1 for a
 * dense model): pp dividing the rest, its virtual stages, its uneven
 * splits and the data-parallel sharding, each searched (st not NULL) and
 * followed by the progress callback, or only counted; false once *st is an
 * error. The expert split is the outer loop (layouts, below) because the
 * planner keeps a mixture of experts' chains by it and the micro-batch,
 * whatever the pipeline and the sharding: a split's chains are built once
 * for all its pipelines. */
static bool splits(layout_search *x, uint64_t tp, uint64_t cp, uint64_t etp, uint64_t ep, tally *c,
                   ml_status *st, ml_error *err)
{
    const ml_layout_request *req = x->req;
    const uint64_t L = x->m->layers, tc = tp * cp;
    for (uint64_t pp = 1; pp <= req->gpus / tc && pp <= ML_PP_MAX_STAGES; pp++) {
        if ((req->gpus / tc) % pp || (req->pp && pp != req->pp))
            continue;
        const uint64_t dp = req->gpus / (tc * pp);
        if (req->global_batch % dp)
            continue;
        /* (a model without experts: ep 1 alone) */
        if (ep > (x->m->moe.experts ? tp * dp * cp : 1))
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
                    split[k].etp = etp;
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
    return true;
}

/* The expert splits of tp and cp (etp, ep), each with its pipelines and
 * shardings (splits); false once *st is an error. An unpinned ep that
 * does not divide the experts is no split (ml__ep_refused says so). */
static bool expert_splits(layout_search *x, uint64_t tp, uint64_t cp, tally *c, ml_status *st,
                          ml_error *err)
{
    const uint64_t E = x->m->moe.experts;
    const uint64_t ep_top = E ? x->req->gpus : 1;
    uint64_t etps[2];
    const size_t ne = etps_of(x, tp, etps);
    for (size_t j = 0; j < ne; j++)
        for (uint64_t ep = 1; ep <= ep_top; ep++) {
            if (E && !x->req->ep && E % ep)
                continue;
            if (!splits(x, tp, cp, etps[j], ep, c, st, err))
                return false;
        }
    return true;
}

/* The splits of req, each searched (st not NULL) and followed by the
 * progress callback, or only counted; returns how many. tp and cp stay
 * inside a node. */
static uint64_t layouts(const ml_layout_request *req, ml_status *st, layout_search *x,
                        ml_error *err)
{
    const uint64_t G = req->gpus_per_node ? req->gpus_per_node : 8;
    tally c = {0, st ? layouts(req, NULL, x, err) : 0, 0};
    for (uint64_t tp = 1; tp <= G && tp <= req->gpus; tp++) {
        if (G % tp || req->gpus % tp || (req->tp && tp != req->tp))
            continue;
        for (uint64_t cp = 1; tp * cp <= G && tp * cp <= req->gpus; cp++)
            if (cp_tried(x, tp, cp, G) && !expert_splits(x, tp, cp, &c, st, err))
                return c.n;
    }
    if (st)
        x->out->candidates = c.candidates;
    return c.n;
}

/* Nothing planned at all: a pinned ZeRO 2 or 3 beside a pinned pipeline;
 * with pinned parts their refusal (or a usage error naming them); where the
 * settings alone are refused, whatever the split (a sharding, an engine,
 * expert settings or a sequence the model refuses planned on one device
 * too), that refusal, as plan gives it; else ML_OK, and the note says no
 * layout of these devices splits the model, with the first refusal. */
static ml_status nothing_planned(const ml_model *m, const ml_config *cfg,
                                 const ml_layout_request *req, const layout_search *x,
                                 const ml_layout_result *out, ml_error *err)
{
    ml_status st = ML_OK;
    const bool pinned = req->tp || req->cp || req->pp || req->vpp || req->micro_batch || req->ep;
    if (!st && req->pin_sharding && !req->fsdp_sharding &&
        cfg->training.zero >= 2 && req->pp > 1)
        st = ml__errorf(err, ML_USAGE,
                        "training.zero %u with parallel.pp %llu: ZeRO 2 and 3 are searched "
                        "without a pipeline (DeepSpeed's pipeline engine runs ZeRO 0 and 1): "
                        "pin training.zero 1, or leave parallel.pp to the search",
                        cfg->training.zero, (unsigned long long)req->pp);
    if (!st && x->refused) {
        ml_error own;
        if (pinned) {
            *err = x->refusal;
            st = ML_RANGE;
        } else {
            /* the settings planned on one device, as they are */
            ml_ledger *one = NULL;
            const ml_status o = ml_ledger_evaluate(m, cfg, false, &one, &own);
            ml_ledger_destroy(one);
            if (o == ML_RANGE || o == ML_USAGE) {
                *err = own;
                st = o;
            }
        }
    }
    if (!st && pinned && !x->refused && (out->layouts == 0 || out->candidates == 0))
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
    return st;
}

/* What the search did, or why nothing fits, into out->note. */
static void write_note(const layout_search *x, const ml_layout_request *req, ml_layout_result *out)
{
    char passed[96] = "";
    if (out->passed_over)
        snprintf(passed, sizeof passed,
                 ", %llu passed over (bounded slower than the table's last row)",
                 (unsigned long long)out->passed_over);
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
                 "with the allocator as configured)%s",
                 (unsigned long long)out->layouts, (unsigned long long)req->gpus,
                 (unsigned long long)out->candidates, (unsigned long long)out->evaluations,
                 (unsigned long long)out->fitting, passed);
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
    layout_search x = {.m = m, .cfg = cfg, .req = req, .out = out};
    out->comm_timed = ml_device_interconnect(&cfg->device) > 0;
    x.pool = malloc(LAYOUT_POOL * sizeof *x.pool);
    if (!x.pool)
        return ml__errorf(err, ML_NOMEM, "out of memory");
    ml_status st = ml_planner_create(m, &x.planner, err);
    if (st) {
        free(x.pool);
        return st;
    }
    layouts(req, &st, &x, err);
    if (!st)
        st = ml__layout_flush(&x, err);
    if (!st && !x.planned)
        st = nothing_planned(m, cfg, req, &x, out, err);
    ml_planner_destroy(x.planner);
    free(x.pool);
    free(x.div);
    if (st)
        return st;
    write_note(&x, req, out);
    return ML_OK;
}
