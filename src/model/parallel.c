/* The parallel layout (docs/parallel.md): the model file's `parallel:`
 * section, its compact form "tp8.dp16", and the keys ml_config_set takes
 * for it. Tensor parallelism (with or without sequence parallelism) and
 * data parallelism are planned; a pipeline, context or expert split above
 * one rank is refused by name, never ignored. */
#include <stdio.h>
#include <string.h>

#include "memledger/model.h"
#include "model/limits.h"
#include "model/schema.h"
#include "util/error.h"

bool ml_training_sp(const ml_training *t)
{
    return t->tensor_parallel > 1 && t->sequence_parallel != ML_SP_OFF;
}

/* The splits the planner does not model yet: accepted at 1, refused above
 * with what to do instead. */
static const struct {
    const char *name, *what;
} unplanned[] = {
    {"pp", "pipeline parallelism"},
    {"vpp", "virtual pipeline stages"},
    {"cp", "context parallelism"},
    {"ep", "expert parallelism"},
    {"etp", "expert tensor parallelism"},
};

static ml_status refuse_unplanned(ml_error *err, const ml_node *n, size_t k, uint64_t v)
{
    return ml__error_at(err, n, ML_SCHEMA,
                        "parallel.%s: %llu: %s is not modelled yet; plan each rank with tensor "
                        "(tp) and data (dp) parallelism, or set it to 1",
                        unplanned[k].name, (unsigned long long)v, unplanned[k].what);
}

static size_t unplanned_index(const char *name, size_t n)
{
    for (size_t k = 0; k < sizeof unplanned / sizeof unplanned[0]; k++)
        if (strlen(unplanned[k].name) == n && !strncmp(unplanned[k].name, name, n))
            return k;
    return SIZE_MAX;
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
    uint64_t tp_lo = 1, tp_hi = 1, dp_lo = 1, dp_hi = 1;
    ml_config_range("parallel.tp", &tp_lo, &tp_hi);
    ml_config_range("training.data_parallel", &dp_lo, &dp_hi);
    ml_training c = *t;
    bool seen_tp = false, seen_dp = false, seen_other[5] = {false};
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
        size_t k = unplanned_index(p, a);
        bool is_tp = a == 2 && !strncmp(p, "tp", 2), is_dp = a == 2 && !strncmp(p, "dp", 2);
        bool *seen = is_tp ? &seen_tp : is_dp ? &seen_dp : k != SIZE_MAX ? &seen_other[k] : NULL;
        if (!seen)
            return ml__errorf_at(err, ML_USAGE, 0, 0,
                                 "parallel: '%.*s' in '%s' is not a part of a layout; use tp, "
                                 "dp, pp, vpp, cp, ep and etp each followed by its size, joined "
                                 "by dots (tp2.dp4)",
                                 (int)(n > 40 ? 40 : n), p, text);
        if (*seen)
            return ml__errorf_at(err, ML_USAGE, 0, 0, "parallel: '%.*s' is given twice in '%s'",
                                 (int)a, p, text);
        *seen = true;
        uint64_t lo = is_tp ? tp_lo : dp_lo, hi = is_tp ? tp_hi : is_dp ? dp_hi : 1048576;
        if (!digits(p + a, n - a, lo, hi, &v))
            return ml__errorf_at(err, ML_RANGE, 0, 0,
                                 "parallel: '%.*s' in '%s': %.*s takes a whole number between "
                                 "%llu and %llu",
                                 (int)(n > 40 ? 40 : n), p, text, (int)a, p,
                                 (unsigned long long)lo, (unsigned long long)hi);
        if (is_tp)
            c.tensor_parallel = v;
        else if (is_dp)
            c.data_parallel = v;
        else if (v != 1)
            return ml__errorf_at(err, ML_RANGE, 0, 0,
                                 "parallel: '%.*s' in '%s': %s is not modelled yet; plan each "
                                 "rank with tensor (tp) and data (dp) parallelism, or set it "
                                 "to 1",
                                 (int)n, p, text, unplanned[k].what);
        if (!dot)
            break;
        p = dot + 1;
        if (!*p)
            return ml__errorf_at(err, ML_USAGE, 0, 0, "parallel: '%s' ends with a dot", text);
    }
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
    if (!strcmp(k, "tp") || !strcmp(k, "dp") || unplanned_index(k, strlen(k)) != SIZE_MAX) {
        char part[48];
        snprintf(part, sizeof part, "%s%s", k, v);
        if (strlen(v) > 24 || strchr(v, '.'))
            return ml__errorf_at(err, ML_RANGE, 0, 0, "%s: '%s' is not a whole number", key, v);
        return ml_parallel_parse(part, t, err);
    }
    if (!strcmp(k, "layout"))
        return ml_parallel_parse(v, t, err);
    return ml__errorf_at(err, ML_USAGE, 0, 0, "%s: not a setting (parallel.tp, parallel.sp, "
                         "parallel.dp or parallel.layout)", key);
}

/* The YAML section: a mapping of the parts (tp: 8, sp: true, dp: 16, and
 * pp, vpp, cp, ep, etp at 1), or the compact form as a scalar. A pipeline's
 * own keys are refused with the reason. */
ml_status ml__schema_parallel(ml_error *err, const ml_node *p, ml_model *m)
{
    ml_training *t = &m->config.training;
    if (p->type == ML_NODE_SCALAR) {
        ml_error e;
        ml_status st = ml_parallel_parse(p->text, t, &e);
        return st ? ml__error_at(err, p, ML_SCHEMA, "%s", e.msg) : ML_OK;
    }
    static const char *const keys[] = {"tp",  "sp",  "dp",          "pp",
                                       "vpp", "cp",  "ep",          "etp",
                                       "pp_schedule", "micro_batches", "pp_layers",
                                       "dist_optimizer"};
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
    for (size_t k = 0; k < sizeof unplanned / sizeof unplanned[0]; k++) {
        const ml_node *n = ml__tree_get(p, unplanned[k].name);
        if (n && !(st = ml__tree_uint(err, p, unplanned[k].name, "parallel", 1, 1048576, &v)) &&
            v != 1)
            st = refuse_unplanned(err, n, k, v);
        if (st)
            return st;
    }
    static const char *const pipeline[] = {"pp_schedule", "micro_batches", "pp_layers"};
    for (size_t k = 0; k < sizeof pipeline / sizeof pipeline[0]; k++) {
        const ml_node *n = ml__tree_get(p, pipeline[k]);
        if (n)
            return ml__error_at(err, n, ML_SCHEMA,
                                "parallel.%s: pipeline parallelism is not modelled yet; remove "
                                "it (the plan is one rank of tensor and data parallelism)",
                                pipeline[k]);
    }
    const ml_node *dist = ml__tree_get(p, "dist_optimizer");
    if (dist)
        return ml__error_at(err, dist, ML_SCHEMA,
                            "parallel.dist_optimizer: Megatron's distributed optimizer is not "
                            "modelled yet; training.zero: 1 shards the optimizer states over "
                            "the data-parallel ranks the same way");
    return ML_OK;
}
