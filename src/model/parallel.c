/* The parallel layout (docs/parallel.md): the model file's `parallel:`
 * section, its compact form "tp8.pp4.dp16", and the keys ml_config_set
 * takes for it. Tensor (with or without sequence parallelism), pipeline
 * and data parallelism are planned; a context or expert split above one
 * rank is refused by name, never ignored. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memledger/model.h"
#include "model/model_internal.h"
#include "model/limits.h"
#include "model/schema.h"
#include "util/error.h"

uint64_t ml_training_shard(const ml_training *t)
{
    const uint64_t dp = t->data_parallel ? t->data_parallel : 1;
    return t->dp_shard && t->dp_shard < dp ? t->dp_shard : dp;
}

uint64_t ml_training_cp(const ml_training *t)
{
    return t->context_parallel > 1 ? t->context_parallel : 1;
}

uint64_t ml_training_devices(const ml_training *t)
{
    return (t->tensor_parallel > 1 ? t->tensor_parallel : 1) * ml_training_cp(t) *
           (t->pipeline_parallel > 1 ? t->pipeline_parallel : 1) *
           (t->data_parallel > 1 ? t->data_parallel : 1);
}

uint64_t ml_training_ep(const ml_training *t)
{
    return t->expert_parallel > 1 ? t->expert_parallel : 1;
}

uint64_t ml_training_etp(const ml_training *t)
{
    if (t->expert_tensor_parallel)
        return t->expert_tensor_parallel;
    return t->tensor_parallel > 1 ? t->tensor_parallel : 1;
}

uint64_t ml__training_devices(const ml_training *t)
{
    return (t->tensor_parallel > 1 ? t->tensor_parallel : 1) *
           (t->pipeline_parallel > 1 ? t->pipeline_parallel : 1) * ml_training_cp(t) *
           (t->data_parallel ? t->data_parallel : 1);
}

bool ml_training_sp(const ml_training *t)
{
    return t->tensor_parallel > 1 && t->sequence_parallel != ML_SP_OFF;
}

static const char *const schedules[ML_PP_COUNT] = {"1f1b", "gpipe", "interleaved"};
static const char *const engines[ML_ENGINE_COUNT] = {"eager", "megatron"};

const char *ml_engine_name(ml_engine e)
{
    return (unsigned)e < ML_ENGINE_COUNT ? engines[e] : "?";
}

bool ml_engine_parse(const char *s, ml_engine *out)
{
    for (unsigned i = 0; i < ML_ENGINE_COUNT; i++)
        if (!strcmp(s, engines[i])) {
            *out = (ml_engine)i;
            return true;
        }
    return false;
}

ml_status ml__schema_engine(ml_error *err, const ml_node *t, ml_training *tr)
{
    if (!ml__tree_get(t, "engine"))
        return ML_OK;
    unsigned e = 0;
    ml_status st = ml__tree_enum(err, t, "engine", "training", engines, ML_ENGINE_COUNT, &e);
    if (st)
        return st;
    tr->engine = (ml_engine)e;
    /* Megatron's gradient buffer lives all iteration: zeroed, not freed;
     * its optimizer is a fused one (Transformer Engine's or Apex's
     * FusedAdam, megatron/core/optimizer/__init__.py) */
    if (tr->engine == ML_ENGINE_MEGATRON && !ml__tree_get(t, "zero_grad"))
        tr->zero_grad = ML_ZERO_GRAD_ZERO;
    if (tr->engine == ML_ENGINE_MEGATRON && !ml__tree_get(t, "optimizer_impl"))
        tr->optimizer_impl = ML_IMPL_FUSED;
    /* and GPTModel's forward returns the loss, not the logits
     * (megatron/core/models/gpt/gpt_model.py): they go once it is computed */
    if (tr->engine == ML_ENGINE_MEGATRON && !ml__tree_get(t, "logits"))
        tr->logits = ML_LOGITS_RELEASED;
    return ML_OK;
}

const char *ml_pp_schedule_name(ml_pp_schedule s)
{
    return (unsigned)s < ML_PP_COUNT ? schedules[s] : "?";
}

bool ml_pp_schedule_parse(const char *s, ml_pp_schedule *out)
{
    for (unsigned i = 0; i < ML_PP_COUNT; i++)
        if (!strcmp(s, schedules[i])) {
            *out = (ml_pp_schedule)i;
            return true;
        }
    return false;
}

ml_status ml_pp_layers_parse(const char *text, ml_training *t, ml_error *err)
{
    uint32_t v[ML_PP_MAX_STAGES];
    uint32_t n = 0;
    const char *p = text;
    while (*p) {
        char *end = NULL;
        errno = 0;
        unsigned long long x = *p >= '0' && *p <= '9' ? strtoull(p, &end, 10) : 0;
        if (!end || end == p || errno || x == 0 || x > 100000 || (*end && *end != ','))
            return ml__errorf_at(err, ML_USAGE, 0, 0,
                                 "parallel.pp_layers: '%s' is not a list of each stage's layers, "
                                 "whole numbers of at least 1 joined by commas (7,8,8,9)",
                                 text);
        if (n == ML_PP_MAX_STAGES)
            return ml__errorf_at(err, ML_USAGE, 0, 0,
                                 "parallel.pp_layers: more than %d stages", ML_PP_MAX_STAGES);
        v[n++] = (uint32_t)x;
        p = *end ? end + 1 : end;
        if (*end && !*p)
            return ml__errorf_at(err, ML_USAGE, 0, 0, "parallel.pp_layers: '%s' ends with a comma",
                                 text);
    }
    if (!n)
        return ml__errorf_at(err, ML_USAGE, 0, 0, "parallel.pp_layers: empty; give each stage's "
                                                  "layers, e.g. 7,8,8,9");
    memcpy(t->pp_layers, v, n * sizeof v[0]);
    t->npp_layers = n;
    return ML_OK;
}

/* A whole number in [lo, hi] from the digits s[0..n); false if it is not. */
static bool digits(const char *s, size_t n, uint64_t lo, uint64_t hi, uint64_t *out)
{
    uint64_t v = 0;
    if (n == 0 || n > 10)
        return false;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    *out = v;
    return v >= lo && v <= hi;
}

ml_status ml_parallel_parse(const char *text, ml_training *t, ml_error *err)
{
    if (err)
        memset(err, 0, sizeof *err);
    if (!text || !t)
        return ml__errorf_at(err, ML_USAGE, 0, 0, "ml_parallel_parse: NULL argument");
    ml_training c = *t;
    /* the planned parts: their fields and ranges */
    struct {
        const char *name, *key;
        uint64_t *field;
        bool seen;
    } parts[] = {{"tp", "parallel.tp", &c.tensor_parallel, false},
                 {"dp", "training.data_parallel", &c.data_parallel, false},
                 {"pp", "parallel.pp", &c.pipeline_parallel, false},
                 {"vpp", "parallel.vpp", &c.virtual_stages, false},
                 {"cp", "parallel.cp", &c.context_parallel, false},
                 {"ep", "parallel.ep", &c.expert_parallel, false},
                 {"etp", "parallel.etp", &c.expert_tensor_parallel, false}};
    const size_t nparts = sizeof parts / sizeof parts[0];
    const char *p = text;
    if (!*p)
        return ml__errorf_at(err, ML_USAGE, 0, 0,
                             "parallel: empty; write the layout as parts like tp2.dp4");
    while (*p) {
        const char *dot = strchr(p, '.');
        size_t n = dot ? (size_t)(dot - p) : strlen(p);
        size_t a = 0;
        while (a < n && p[a] >= 'a' && p[a] <= 'z')
            a++;
        uint64_t v = 0;
        size_t j = 0;
        while (j < nparts && !(strlen(parts[j].name) == a && !strncmp(p, parts[j].name, a)))
            j++;
        if (j == nparts)
            return ml__errorf_at(err, ML_USAGE, 0, 0,
                                 "parallel: '%.*s' in '%s' is not a part of a layout; use tp, "
                                 "dp, pp, vpp, cp, ep and etp each followed by its size, joined "
                                 "by dots (tp2.dp4)",
                                 (int)(n > 40 ? 40 : n), p, text);
        if (parts[j].seen)
            return ml__errorf_at(err, ML_USAGE, 0, 0, "parallel: '%.*s' is given twice in '%s'",
                                 (int)a, p, text);
        parts[j].seen = true;
        uint64_t lo = 1, hi = 1;
        ml_config_range(parts[j].key, &lo, &hi);
        if (!digits(p + a, n - a, lo, hi, &v))
            return ml__errorf_at(err, ML_RANGE, 0, 0,
                                 "parallel: '%.*s' in '%s': %.*s takes a whole number between "
                                 "%llu and %llu",
                                 (int)(n > 40 ? 40 : n), p, text, (int)a, p,
                                 (unsigned long long)lo, (unsigned long long)hi);
        *parts[j].field = v;
        if (!dot)
            break;
        p = dot + 1;
        if (!*p)
            return ml__errorf_at(err, ML_USAGE, 0, 0, "parallel: '%s' ends with a dot", text);
    }
    if (c.virtual_stages > 1)
        c.pp_schedule = ML_PP_INTERLEAVED;
    *t = c;
    return ML_OK;
}

ml_status ml__parallel_set(const char *key, const char *v, ml_training *t, ml_error *err)
{
    const char *k = key + strlen("parallel.");
    if (!strcmp(k, "sp")) {
        if (!strcmp(v, "on") || !strcmp(v, "true"))
            t->sequence_parallel = ML_SP_ON;
        else if (!strcmp(v, "off") || !strcmp(v, "false"))
            t->sequence_parallel = ML_SP_OFF;
        else if (!strcmp(v, "auto"))
            t->sequence_parallel = ML_SP_AUTO;
        else
            return ml__errorf_at(err, ML_USAGE, 0, 0, "%s: '%s' is not a setting; use on, off "
                                 "or auto", key, v);
        return ML_OK;
    }
    if (!strcmp(k, "pp_schedule")) {
        if (!ml_pp_schedule_parse(v, &t->pp_schedule))
            return ml__errorf_at(err, ML_USAGE, 0, 0, "%s: '%s' is not a schedule; use 1f1b, "
                                 "gpipe or interleaved", key, v);
        return ML_OK;
    }
    if (!strcmp(k, "pp_layers"))
        return ml_pp_layers_parse(v, t, err);
    if (!strcmp(k, "tp") || !strcmp(k, "dp") || !strcmp(k, "pp") || !strcmp(k, "vpp") ||
        !strcmp(k, "cp") || !strcmp(k, "ep") || !strcmp(k, "etp")) {
        char part[48];
        snprintf(part, sizeof part, "%s%s", k, v);
        if (strlen(v) > 24 || strchr(v, '.'))
            return ml__errorf_at(err, ML_RANGE, 0, 0, "%s: '%s' is not a whole number", key, v);
        return ml_parallel_parse(part, t, err);
    }
    if (!strcmp(k, "layout"))
        return ml_parallel_parse(v, t, err);
    if (!strcmp(k, "dp_shard")) {
        uint64_t lo = 1, hi = 1;
        ml_config_range("training.data_parallel", &lo, &hi);
        char *end = NULL;
        const unsigned long long n = strtoull(v, &end, 10);
        if (!*v || *end || *v == '-' || n < lo || n > hi)
            return ml__errorf_at(err, ML_RANGE, 0, 0, "%s: '%s' is not a whole number from "
                                 "%llu to %llu", key, v, (unsigned long long)lo,
                                 (unsigned long long)hi);
        t->dp_shard = n;
        return ML_OK;
    }
    if (!strcmp(k, "overlap_grad_reduce")) {
        if (strcmp(v, "true") && strcmp(v, "false"))
            return ml__errorf_at(err, ML_USAGE, 0, 0, "%s: '%s' is not a setting; use true or "
                                 "false", key, v);
        t->overlap_grad_reduce = !strcmp(v, "true");
        return ML_OK;
    }
    if (!strcmp(k, "dist_optimizer")) {
        if (strcmp(v, "true") && strcmp(v, "false"))
            return ml__errorf_at(err, ML_USAGE, 0, 0, "%s: '%s' is not a setting; use true or "
                                 "false", key, v);
        t->dist_optimizer = !strcmp(v, "true");
        return ML_OK;
    }
    return ml__errorf_at(err, ML_USAGE, 0, 0, "%s: not a setting (parallel.tp, sp, dp, pp, vpp, "
                         "cp, ep, pp_schedule, pp_layers, layout, dist_optimizer, dp_shard or "
                         "overlap_grad_reduce)", key);
}

/* parallel.pp_schedule, micro_batches (the step's micro-batches:
 * training.grad_accum, given once) and pp_layers (a list of each stage's
 * layers). */
static ml_status pipeline_keys(ml_error *err, const ml_node *p, ml_training *t)
{
    ml_status st;
    unsigned e = 0;
    const ml_node *sched = ml__tree_get(p, "pp_schedule");
    if (sched) {
        if ((st = ml__tree_enum(err, p, "pp_schedule", "parallel", schedules, ML_PP_COUNT, &e)))
            return st;
        t->pp_schedule = (ml_pp_schedule)e;
    }
    const ml_node *mb = ml__tree_get(p, "micro_batches");
    if (mb) {
        uint64_t v = 1, lo = 1, hi = 1;
        ml_config_range("training.grad_accum", &lo, &hi);
        if ((st = ml__tree_uint(err, p, "micro_batches", "parallel", lo, hi, &v)))
            return st;
        if (t->grad_accum != 1 && t->grad_accum != v)
            return ml__error_at(err, mb, ML_SCHEMA,
                                "parallel.micro_batches: %llu, but training.grad_accum says %llu: "
                                "a pipeline's micro-batches are the step's accumulation; give "
                                "it once",
                                (unsigned long long)v, (unsigned long long)t->grad_accum);
        t->grad_accum = v;
    }
    const ml_node *pl = ml__tree_get(p, "pp_layers");
    if (!pl)
        return ML_OK;
    if (pl->type != ML_NODE_SEQ)
        return ml__error_at(err, pl, ML_SCHEMA,
                            "parallel.pp_layers: expected a list of each stage's layers, e.g. "
                            "[7, 8, 8, 9]");
    if (pl->count > ML_PP_MAX_STAGES || pl->count == 0)
        return ml__error_at(err, pl, ML_SCHEMA, "parallel.pp_layers: 1 to %d stages",
                            ML_PP_MAX_STAGES);
    for (size_t i = 0; i < pl->count; i++) {
        const ml_node *d = pl->items[i];
        char *end = NULL;
        errno = 0;
        unsigned long long v = d->type == ML_NODE_SCALAR && d->text[0] >= '0' && d->text[0] <= '9'
                                   ? strtoull(d->text, &end, 10)
                                   : 0;
        if (!end || *end || errno || v == 0 || v > 100000)
            return ml__error_at(err, d, ML_SCHEMA,
                                "parallel.pp_layers[%zu]: expected a stage's layers, a whole "
                                "number of at least 1",
                                i);
        t->pp_layers[i] = (uint32_t)v;
    }
    t->npp_layers = (uint32_t)pl->count;
    return ML_OK;
}

/* The section's cp, ep and etp. */
static ml_status split_keys(ml_error *err, const ml_node *p, ml_training *t)
{
    uint64_t lo = 1, hi = 1;
    ml_status st;
    ml_config_range("parallel.cp", &lo, &hi);
    if ((st = ml__tree_uint(err, p, "cp", "parallel", lo, hi, &t->context_parallel)))
        return st;
    ml_config_range("parallel.ep", &lo, &hi);
    if ((st = ml__tree_uint(err, p, "ep", "parallel", lo, hi, &t->expert_parallel)))
        return st;
    ml_config_range("parallel.etp", &lo, &hi);
    return ml__tree_uint(err, p, "etp", "parallel", lo, hi, &t->expert_tensor_parallel);
}

/* The YAML section: a mapping of the parts (tp: 8, sp: true, dp: 16, pp,
 * vpp, cp, ep, etp), or the compact form as a scalar. A pipeline's
 * own keys are refused with the reason. */
ml_status ml__schema_parallel(ml_error *err, const ml_node *p, ml_model *m)
{
    ml_training *t = &m->config.training;
    if (p->type == ML_NODE_SCALAR) {
        ml_error e;
        const uint64_t dp = t->data_parallel;
        ml_status st = ml_parallel_parse(p->text, t, &e);
        if (st)
            return ml__error_at(err, p, ML_SCHEMA, "%s", e.msg);
        if (dp != 1 && t->data_parallel != dp)
            return ml__error_at(err, p, ML_SCHEMA,
                                "parallel: dp%llu, but training.data_parallel says %llu; give "
                                "the data-parallel size once",
                                (unsigned long long)t->data_parallel, (unsigned long long)dp);
        return ML_OK;
    }
    static const char *const keys[] = {"tp",  "sp",  "dp",          "pp",
                                       "vpp", "cp",  "ep",          "etp",
                                       "pp_schedule", "micro_batches", "pp_layers",
                                       "dist_optimizer", "dp_shard", "overlap_grad_reduce"};
    ml_status st;
    if ((st = ml__tree_need_map(err, p, "parallel")) ||
        (st = ml__tree_check_keys(err, p, "parallel", keys, sizeof keys / sizeof keys[0])))
        return st;
    uint64_t lo = 1, hi = 1, v = 1;
    ml_config_range("parallel.tp", &lo, &hi);
    if ((st = ml__tree_uint(err, p, "tp", "parallel", lo, hi, &t->tensor_parallel)))
        return st;
    const ml_node *dp = ml__tree_get(p, "dp");
    if (dp) {
        ml_config_range("training.data_parallel", &lo, &hi);
        if ((st = ml__tree_uint(err, p, "dp", "parallel", lo, hi, &v)))
            return st;
        if (t->data_parallel != 1 && t->data_parallel != v)
            return ml__error_at(err, dp, ML_SCHEMA,
                                "parallel.dp: %llu, but training.data_parallel says %llu; give "
                                "the data-parallel size once",
                                (unsigned long long)v, (unsigned long long)t->data_parallel);
        t->data_parallel = v;
    }
    const ml_node *sp = ml__tree_get(p, "sp");
    if (sp) {
        bool on = false;
        if ((st = ml__tree_bool(err, p, "sp", "parallel", &on)))
            return st;
        t->sequence_parallel = on ? ML_SP_ON : ML_SP_OFF;
    }
    ml_config_range("parallel.pp", &lo, &hi);
    if ((st = ml__tree_uint(err, p, "pp", "parallel", lo, hi, &t->pipeline_parallel)) ||
        (st = ml__tree_uint(err, p, "vpp", "parallel", 1, 1024, &t->virtual_stages)))
        return st;
    if (t->virtual_stages > 1)
        t->pp_schedule = ML_PP_INTERLEAVED;
    if ((st = pipeline_keys(err, p, t)))
        return st;
    if ((st = split_keys(err, p, t)))
        return st;
    if (ml__tree_get(p, "overlap_grad_reduce") &&
        (st = ml__tree_bool(err, p, "overlap_grad_reduce", "parallel", &t->overlap_grad_reduce)))
        return st;
    if (ml__tree_get(p, "dp_shard")) {
        ml_config_range("training.data_parallel", &lo, &hi);
        if ((st = ml__tree_uint(err, p, "dp_shard", "parallel", lo, hi, &t->dp_shard)))
            return st;
    }
    /* Megatron's distributed optimizer: its conditions (engine megatron, no
     * ZeRO) are held when the plan is made, whatever the keys' order */
    if (ml__tree_get(p, "dist_optimizer"))
        return ml__tree_bool(err, p, "dist_optimizer", "parallel", &t->dist_optimizer);
    return ML_OK;
}
