/* triage: what the peak of a configuration is made of, and every remedy that
 * applies, each re-planned with the exact ledger and ranked (docs/cli.md,
 * "triage"). This file: the entry point, the observed figures and the
 * ranking; the remedies are in triage_remedies.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "memledger/plan.h"
#include "model/model_internal.h"
#include "plan/triage_internal.h"
#include "util/error.h"

static const char *const phase_names[ML_TRIAGE_PHASE_COUNT] = {"any", "forward", "backward",
                                                               "optimizer", "eval"};

/* Reserved above allocated by more than this fraction: fragmentation worth
 * naming (docs/cli.md, "triage"). */
#define FRAGMENTED 0.2

const char *ml_triage_phase_name(ml_triage_phase p)
{
    return (unsigned)p < ML_TRIAGE_PHASE_COUNT ? phase_names[p] : "?";
}

bool ml_triage_phase_parse(const char *s, ml_triage_phase *out)
{
    for (unsigned p = 0; p < ML_TRIAGE_PHASE_COUNT; p++)
        if (!strcmp(s, phase_names[p])) {
            *out = (ml_triage_phase)p;
            return true;
        }
    return false;
}

ml_triage_request ml_triage_request_defaults(void)
{
    ml_triage_request r;
    memset(&r, 0, sizeof r);
    r.oom_phase = ML_TRIAGE_ANY;
    r.host_bandwidth = 25e9;
    r.batching = ml_lengths_request_defaults();
    return r;
}

/* The traits (triage_internal.h) of a sequential model's layers, nested
 * groups included. */
static void scan_layers(const ml_layer *l, size_t n, ml_triage_traits *t)
{
    for (size_t i = 0; i < n; i++) {
        t->batchnorm |= l[i].kind == ML_L_BATCHNORM;
        t->attention |= l[i].kind == ML_L_ATTENTION;
        t->dropout |= (l[i].kind == ML_L_DROPOUT || l[i].kind == ML_L_ATTENTION) && l[i].p > 0;
        scan_layers(l[i].body, l[i].nbody, t);
        scan_layers(l[i].shortcut, l[i].nshortcut, t);
    }
}

static ml_triage_traits traits_of(const ml_model *m)
{
    ml_triage_traits t = {0};
    t.transformer = t.attention = m->type != ML_MODEL_SEQUENTIAL;
    t.dropout = t.transformer && m->dropout > 0;
    if (!t.transformer)
        scan_layers(m->seq, m->nseq, &t);
    return t;
}

/* a - b, saturated to +-INT64_MAX */
static int64_t difference(uint64_t a, uint64_t b)
{
    if (a >= b)
        return a - b > INT64_MAX ? INT64_MAX : (int64_t)(a - b);
    return b - a > INT64_MAX ? -INT64_MAX : -(int64_t)(b - a);
}

/* The failing run's figures against the plan's. */
static void observe(const ml_triage_request *req, ml_triage_result *r)
{
    ml_triage_observed *o = &r->observed;
    const ml_summary *s = &r->current;
    r->has_observed = req->allocated || req->reserved;
    o->has_allocated = req->allocated > 0;
    o->has_reserved = req->reserved > 0;
    o->allocated = req->allocated;
    o->reserved = req->reserved;
    o->planned_allocated = r->peak;
    o->reserved_simulated = s->has_reserved;
    o->planned_reserved = s->has_reserved ? s->reserved_peak : r->peak + s->fragmentation;
    o->allocated_error = difference(o->planned_allocated, req->allocated);
    o->reserved_error = difference(o->planned_reserved, req->reserved);
    if (o->has_allocated && o->has_reserved) {
        o->fragmentation = (double)req->reserved / (double)req->allocated - 1;
        o->fragmented = o->fragmentation > FRAGMENTED;
    }
}

/* Whether a ranks before b: those that fit first; within each group those in
 * the focus phase first; then the least slowdown (fitting; a slowdown not
 * derived after the known ones) or the lowest peak total (not fitting, or no
 * device); then the table's order. */
static bool before(const ml_remedy *a, const ml_remedy *b)
{
    if (a->fits != b->fits)
        return a->fits;
    if (a->in_focus != b->in_focus)
        return a->in_focus;
    if (a->fits && (a->slowdown < 0) != (b->slowdown < 0))
        return b->slowdown < 0; /* not derived: after those whose slowdown is known */
    if (a->fits && a->slowdown >= 0 && b->slowdown >= 0 &&
        fabs(a->slowdown - b->slowdown) > 1e-9 * fmax(a->slowdown, b->slowdown))
        return a->slowdown < b->slowdown;
    if (!a->fits && a->peak_total != b->peak_total)
        return a->peak_total < b->peak_total;
    return a->kind < b->kind;
}

static void rank(ml_triage_result *r)
{
    for (size_t i = 1; i < r->count; i++) {
        ml_remedy tmp = r->remedies[i];
        size_t j = i;
        for (; j > 0 && before(&tmp, &r->remedies[j - 1]); j--)
            r->remedies[j] = r->remedies[j - 1];
        r->remedies[j] = tmp;
    }
}

ml_status ml_triage(const ml_model *m, const ml_config *cfg, const ml_triage_request *req,
                    ml_triage_result *out, ml_error *err)
{
    ml_error local;
    if (!err)
        err = &local;
    memset(err, 0, sizeof *err);
    if ((unsigned)req->oom_phase >= ML_TRIAGE_PHASE_COUNT || !(req->host_bandwidth > 0))
        return ml__errorf(err, ML_RANGE, "triage: unknown phase, or a host bandwidth not above 0");
    /* a failure in a pass the plan does not have has no peak to triage */
    if (req->oom_phase == ML_TRIAGE_EVAL && !cfg->training.eval_batch)
        return ml__errorf(err, ML_USAGE,
                          "oom phase eval: the plan has no evaluation pass; give the failing "
                          "run's evaluation batch (training.eval_batch) and, where it differs, "
                          "its length (training.eval_seq_len), or name the phase it failed in");
    ml_triage_result *r = calloc(1, sizeof *r);
    if (!r)
        return ml__errorf(err, ML_NOMEM, "out of memory");
    ml_config worst = *cfg; /* the configuration triaged */
    ml_status st = req->lengths ? ml__triage_worst_batch(m, cfg, req, r, &worst, err) : ML_OK;
    if (!st)
        st = ml__triage_evaluate(m, &worst, &r->current, err);
    if (st) {
        free(r);
        return st;
    }
    r->peak = ml_summary_binding_peak(&r->current);
    r->host_transfer = r->current.host_transfer_bytes;
    ml_triage_ctx x = {m, &worst, req, r, traits_of(m), err, cfg};
    r->step_time_s = ml__triage_step_time(&x, &r->current);
    r->focus = req->oom_phase;
    observe(req, r);
    for (unsigned k = 0; k < ML_REMEDY_COUNT && !st; k++)
        st = ml__triage_add_remedy(&x, (ml_remedy_kind)k, r);
    if (!st) {
        rank(r);
        *out = *r;
    }
    free(r);
    return st;
}
