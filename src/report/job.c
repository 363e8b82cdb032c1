/* ml_job: a model, its settings and the verbs' JSON reports in memory
 * (json.h). The reports are the writers the command line uses, run on a
 * memory stream, so a binding reads what --format json prints. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memledger/json.h"
#include "memledger/report.h"
#include "model/model_internal.h"
#include "util/error.h"

struct ml_job {
    const ml_model *model; /* borrowed */
    ml_config cfg;
    ml_fit_request req;
    ml_profile *calib; /* owned; cfg.calib points at it */
    /* the keys of `given_keys` ml_job_set set (bit i: given_keys[i]): a verb
     * that would not use one refuses it, as it refuses the pairings the
     * command line refuses */
    unsigned given;
};

/* The keys a verb may refuse, alone (fit's micro-batch, compare's policy)
 * or in pairs the command line refuses (a layout given twice, steps the
 * global batch derives, a size nothing uses: job_conflicts). */
enum {
    G_MICRO_BATCH, G_CHECKPOINT, G_LAYOUT, G_SIZE_FIRST, G_SIZE_LAST = G_SIZE_FIRST + 7, G_GRAD_ACCUM,
    G_GLOBAL_BATCH, G_MAX_MICRO, G_REDUCE_BUCKET, G_ALLGATHER_BUCKET, G_BLAS, G_COUNT
};
static const char *const given_keys[G_COUNT] = {
    [G_MICRO_BATCH] = "training.micro_batch",
    [G_CHECKPOINT] = "training.checkpoint",
    [G_LAYOUT] = "parallel.layout",
    [G_SIZE_FIRST] = "parallel.tp", "parallel.pp", "parallel.vpp", "parallel.cp", "parallel.ep",
    "parallel.etp", "parallel.dp", [G_SIZE_LAST] = "training.data_parallel",
    [G_GRAD_ACCUM] = "training.grad_accum",
    [G_GLOBAL_BATCH] = "global_batch",
    [G_MAX_MICRO] = "max_micro_batch",
    [G_REDUCE_BUCKET] = "training.reduce_bucket_size",
    [G_ALLGATHER_BUCKET] = "training.allgather_bucket_size",
    [G_BLAS] = "device.blas_workspace",
};

static void note_given(ml_job *j, const char *key)
{
    for (unsigned i = 0; i < G_COUNT; i++)
        if (!strcmp(key, given_keys[i]))
            j->given |= 1u << i;
}

static bool given(const ml_job *j, unsigned i)
{
    return j->given >> i & 1;
}

/* The pairings of settings the command line refuses (with its flags'
 * names; here the keys'): a verb refuses them the same way, whatever order
 * they were set in. fit: the verb is fit. */
static ml_status job_conflicts(const ml_job *j, bool fit, ml_error *err)
{
    if (given(j, G_LAYOUT))
        for (unsigned i = G_SIZE_FIRST; i <= G_SIZE_LAST; i++)
            if (given(j, i))
                return ml__errorf_at(err, ML_USAGE, 0, 0,
                                     "parallel.layout: the layout is given once; drop %s (and "
                                     "the other sizes), or drop parallel.layout",
                                     given_keys[i]);
    if (!fit && (given(j, G_GLOBAL_BATCH) || given(j, G_MAX_MICRO)))
        return ml__errorf_at(err, ML_USAGE, 0, 0,
                             "%s: bounds fit's search of the micro-batch; this verb plans one",
                             given_keys[given(j, G_GLOBAL_BATCH) ? G_GLOBAL_BATCH : G_MAX_MICRO]);
    if (fit && given(j, G_GLOBAL_BATCH) && given(j, G_GRAD_ACCUM))
        return ml__errorf_at(err, ML_USAGE, 0, 0,
                             "training.grad_accum: fit's global_batch derives the accumulation "
                             "steps from the micro-batch it finds: drop training.grad_accum (or "
                             "fit without global_batch at that accumulation)");
    const ml_training *t = &j->cfg.training;
    /* a bucket size the job or the model file gave */
    ml_status st = ml__model_check_buckets(
        j->model, t,
        given(j, G_REDUCE_BUCKET)      ? given_keys[G_REDUCE_BUCKET]
        : given(j, G_ALLGATHER_BUCKET) ? given_keys[G_ALLGATHER_BUCKET]
                                       : NULL,
        err);
    if (st)
        return st;
    if (given(j, G_BLAS) && j->cfg.device.allocator == ML_ALLOCATOR_NONE)
        return ml__errorf_at(err, ML_USAGE, 0, 0,
                             "device.blas_workspace: applies to a simulated allocator only: set "
                             "device.allocator caching (or expandable)");
    return ML_OK;
}

ml_status ml_job_create(const ml_model *m, ml_job **out, ml_error *err)
{
    if (err)
        memset(err, 0, sizeof *err);
    if (!m || !out)
        return ml__errorf_at(err, ML_USAGE, 0, 0, "ml_job_create: NULL argument");
    ml_job *j = calloc(1, sizeof *j);
    if (!j)
        return ml__errorf_at(err, ML_NOMEM, 0, 0, "out of memory");
    j->model = m;
    j->cfg = ml_model_config(m);
    j->cfg.calib = NULL;
    j->req = ml_fit_request_defaults();
    *out = j;
    return ML_OK;
}

void ml_job_destroy(ml_job *j)
{
    if (!j)
        return;
    ml_profile_destroy(j->calib);
    free(j);
}

/* A whole number of fit's request, in the flags' range. */
static ml_status request_count(const char *key, const char *v, uint64_t hi, uint64_t *out,
                               ml_error *err)
{
    char *end = NULL;
    unsigned long long x = v[0] >= '0' && v[0] <= '9' ? strtoull(v, &end, 10) : 0;
    if (!end || *end || x < 1 || x > hi)
        return ml__errorf_at(err, ML_RANGE, 0, 0,
                             "%s: '%s' is not a whole number between 1 and %llu", key, v,
                             (unsigned long long)hi);
    *out = x;
    return ML_OK;
}

static ml_status set_calib(ml_job *j, const char *path, ml_error *err)
{
    ml_profile *p = NULL;
    ml_status st = ml_profile_load_file(path, &p, err);
    if (st)
        return st;
    ml_profile_destroy(j->calib);
    j->calib = p;
    j->cfg.calib = p;
    return ML_OK;
}

ml_status ml_job_set(ml_job *j, const char *key, const char *value, ml_error *err)
{
    if (err)
        memset(err, 0, sizeof *err);
    if (!j || !key || !value)
        return ml__errorf_at(err, ML_USAGE, 0, 0, "ml_job_set: NULL argument");
    /* the same ranges as fit's --global-batch and --max-micro-batch */
    if (!strcmp(key, "global_batch") || !strcmp(key, "max_micro_batch")) {
        const bool global = !strcmp(key, "global_batch");
        ml_status st = request_count(key, value, global ? 1ull << 40 : 1u << 24,
                                     global ? &j->req.global_batch : &j->req.max_micro_batch, err);
        if (!st)
            note_given(j, key);
        return st;
    }
    if (!strcmp(key, "calib"))
        return set_calib(j, value, err);
    if (!strcmp(key, "training.checkpoint") && !strcmp(value, "auto")) {
        j->req.auto_checkpoint = true;
        note_given(j, key);
        return ML_OK;
    }
    ml_status st = ml_config_set(&j->cfg, key, value, err);
    /* a sequence where the model fixes its own is refused, as the model
     * file and the command line refuse it */
    if (st == ML_OK)
        st = ml_model_check_seq(j->model, &j->cfg.training, err);
    if (st == ML_OK && !strcmp(key, "training.checkpoint"))
        j->req.auto_checkpoint = false;
    if (st == ML_OK)
        note_given(j, key);
    return st;
}

/* The report that write() puts on a memory stream, as a string. */
typedef int (*writer)(FILE *f, const void *ctx);

static ml_status to_string(writer write, const void *ctx, char **out, size_t *len,
                           ml_error *err)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f)
        return ml__errorf_at(err, ML_NOMEM, 0, 0, "out of memory (a memory stream)");
    /* a memory stream fails a write only when it cannot grow */
    int w = write(f, ctx);
    if (fclose(f) != 0 || w != 0) {
        free(buf);
        return ml__errorf_at(err, ML_NOMEM, 0, 0, "out of memory (writing the report)");
    }
    *out = buf;
    if (len)
        *len = n;
    return ML_OK;
}

/* What every verb but fit refuses: fit's own settings, and the pairings. */
static ml_status no_auto(const ml_job *j, const char *verb, ml_error *err)
{
    if (j->req.auto_checkpoint)
        return ml__errorf_at(err, ML_USAGE, 0, 0,
                             "training.checkpoint: auto is for fit, not %s", verb);
    return job_conflicts(j, false, err);
}

typedef struct {
    const ml_job *j;
    const ml_ledger *l;
    const ml_advice *advice;
} plan_ctx;

static int write_plan(FILE *f, const void *ctx)
{
    const plan_ctx *c = ctx;
    return ml_report_json_advice(f, c->j->model, &c->j->cfg, c->l, c->advice);
}

ml_status ml_job_plan_json(const ml_job *j, char **out, size_t *len, ml_error *err)
{
    if (err)
        memset(err, 0, sizeof *err);
    if (!j || !out)
        return ml__errorf_at(err, ML_USAGE, 0, 0, "ml_job_plan_json: a job and an output pointer");
    ml_status st = no_auto(j, "plan", err);
    ml_ledger *l = NULL;
    if (st || (st = ml_ledger_evaluate(j->model, &j->cfg, false, &l, err)))
        return st;
    ml_advice advice;
    memset(&advice, 0, sizeof advice);
    st = ml_checkpoint_advice(j->model, &j->cfg, ml_ledger_summary(l), &advice, err);
    plan_ctx c = {j, l, &advice};
    if (!st)
        st = to_string(write_plan, &c, out, len, err);
    ml_ledger_destroy(l);
    return st;
}

typedef struct {
    const ml_job *j;
    const ml_fit_result *r;
} fit_ctx;

static int write_fit(FILE *f, const void *ctx)
{
    const fit_ctx *c = ctx;
    return ml_report_fit_json(f, c->j->model, &c->j->req, c->r);
}

ml_status ml_job_fit_json(const ml_job *j, char **out, size_t *len, ml_error *err)
{
    if (err)
        memset(err, 0, sizeof *err);
    if (!j || !out)
        return ml__errorf_at(err, ML_USAGE, 0, 0, "ml_job_fit_json: a job and an output pointer");
    if (given(j, G_MICRO_BATCH))
        return ml__errorf_at(err, ML_USAGE, 0, 0,
                             "training.micro_batch: fit searches the micro-batch; bound it with "
                             "max_micro_batch, or plan one");
    ml_status conflict = job_conflicts(j, true, err);
    if (conflict)
        return conflict;
    ml_fit_result *r = malloc(sizeof *r);
    if (!r)
        return ml__errorf_at(err, ML_NOMEM, 0, 0, "out of memory");
    ml_status st = ml_fit(j->model, &j->cfg, &j->req, r, err);
    fit_ctx c = {j, r};
    if (!st)
        st = to_string(write_fit, &c, out, len, err);
    free(r);
    return st;
}

typedef struct {
    const ml_compare_row *rows;
    size_t n;
} compare_ctx;

static int write_compare(FILE *f, const void *ctx)
{
    const compare_ctx *c = ctx;
    return ml_report_compare_json(f, c->rows, c->n);
}

ml_status ml_job_compare_json(const ml_job *j, char **out, size_t *len, ml_error *err)
{
    if (err)
        memset(err, 0, sizeof *err);
    if (!j || !out)
        return ml__errorf_at(err, ML_USAGE, 0, 0, "ml_job_compare_json: a job and an output pointer");
    ml_compare_row rows[ML_COMPARE_ROWS];
    compare_ctx c = {rows, 0};
    ml_status st = ML_OK;
    if (given(j, G_CHECKPOINT))
        st = ml__errorf_at(err, ML_USAGE, 0, 0,
                           "training.checkpoint: compare plans every checkpoint policy side by "
                           "side; plan one instead");
    if (!st)
        st = no_auto(j, "compare", err);
    if (!st)
        st = ml_compare(j->model, &j->cfg, rows, &c.n, err);
    if (!st)
        st = to_string(write_compare, &c, out, len, err);
    return st;
}

static int write_timeline(FILE *f, const void *ctx)
{
    return ml_report_timeline_json(f, ctx);
}

typedef struct {
    const ml_job *j;
    const ml_ledger *l;
} svg_ctx;

static int write_svg(FILE *f, const void *ctx)
{
    const svg_ctx *c = ctx;
    return ml_report_timeline_svg(f, c->j->model, &c->j->cfg, c->l);
}

/* The timeline's events, as JSON (svg false) or drawn (svg true). */
static ml_status timeline(const ml_job *j, bool svg, char **out, size_t *len, ml_error *err)
{
    if (err)
        memset(err, 0, sizeof *err);
    if (!j || !out)
        return ml__errorf_at(err, ML_USAGE, 0, 0, "ml_job_timeline_%s: a job and an output pointer",
                             svg ? "svg" : "json");
    ml_status st = no_auto(j, "timeline", err);
    ml_ledger *l = NULL;
    if (st || (st = ml_ledger_evaluate(j->model, &j->cfg, true, &l, err)))
        return st;
    svg_ctx c = {j, l};
    st = svg ? to_string(write_svg, &c, out, len, err) : to_string(write_timeline, l, out, len, err);
    ml_ledger_destroy(l);
    return st;
}

ml_status ml_job_timeline_json(const ml_job *j, char **out, size_t *len, ml_error *err)
{
    return timeline(j, false, out, len, err);
}

ml_status ml_job_timeline_svg(const ml_job *j, char **out, size_t *len, ml_error *err)
{
    return timeline(j, true, out, len, err);
}

typedef struct {
    size_t n;
    const ml_points_fit *r;
    uint64_t budget, at;
} points_ctx;

static int write_points(FILE *f, const void *ctx)
{
    const points_ctx *c = ctx;
    return ml_report_points_json(f, c->n, c->r, c->budget, c->at);
}

ml_status ml_points_json(const char *text, size_t len, const char *name, uint64_t budget,
                         uint64_t at, char **out, size_t *out_len, ml_error *err)
{
    ml_point *p = NULL;
    size_t n = 0;
    ml_status st = ml_points_parse_csv(text, len, name, &p, &n, err);
    if (st)
        return st;
    ml_points_fit r;
    if ((st = ml_points_analyse(p, n, budget, at, &r, err)) == ML_OK) {
        points_ctx c = {n, &r, budget, at};
        st = to_string(write_points, &c, out, out_len, err);
    } else if (err) {
        snprintf(err->path, sizeof err->path, "%s", name);
    }
    free(p);
    return st;
}

void ml_json_free(char *s)
{
    free(s);
}
