/* ml_config_set: one training or device setting from its text, by its YAML
 * key. The command line's flags and a binding's keyword arguments say the
 * same settings as text; the values read here as the flags read them (a
 * whole number within ml_config_range, a size, a name). */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/decimal.h"
#include "memledger/model.h"
#include "model/schema.h"
#include "util/error.h"

/* A whole number within the key's range (ml_config_range). */
static ml_status whole(const char *key, const char *v, uint64_t *out, ml_error *err)
{
    uint64_t lo = 0, hi = UINT64_MAX;
    ml_config_range(key, &lo, &hi);
    const char *p = v;
    while (*p >= '0' && *p <= '9')
        p++;
    errno = 0;
    unsigned long long x = strtoull(v, NULL, 10);
    if (p == v || *p || errno || x < lo || x > hi)
        return ml__errorf_at(err, ML_RANGE, 0, 0, "%s: '%s' is not a whole number between %llu and %llu",
                         key, v, (unsigned long long)lo, (unsigned long long)hi);
    *out = x;
    return ML_OK;
}

static ml_status real(const char *key, const char *v, double lo, double hi, double *out,
                      ml_error *err)
{
    double x = 0;
    if (!ml__decimal(v, &x) || x < lo || x > hi)
        return ml__errorf_at(err, ML_RANGE, 0, 0, "%s: '%s' is not a number between %g and %g", key, v,
                         lo, hi);
    *out = x;
    return ML_OK;
}

/* v as a size into *out; a bad one's message names key and ends in hint. */
static ml_status size_hint(const char *key, const char *v, uint64_t *out, const char *hint,
                           ml_error *err)
{
    ml_error e;
    memset(&e, 0, sizeof e);
    ml_status st = ml_parse_size(v, out, &e);
    return st ? ml__errorf_at(err, st, 0, 0, "%s: %s%s", key, e.msg, hint) : ML_OK;
}

static ml_status size(const char *key, const char *v, uint64_t *out, ml_error *err)
{
    return size_hint(key, v, out, "", err);
}

/* Whether v is a zero, bare or with a unit ("0", "0B", "0GiB"); the unit
 * is checked as it would be on 1. */
static bool zero_size(const char *v)
{
    char *end = NULL;
    const double x = strtod(v, &end);
    char one[64];
    uint64_t ignored;
    ml_error e;
    return end != v && x == 0 && !strpbrk(v, "-xXpPnN") &&
           snprintf(one, sizeof one, "1%s", end) < (int)sizeof one &&
           (!*end || ml_parse_size(one, &ignored, &e) == ML_OK);
}

ml_status ml__size_or_none(const char *key, const char *v, uint64_t *out, ml_error *err)
{
    if (zero_size(v)) {
        *out = 0;
        return ML_OK;
    }
    return size_hint(key, v, out, " (or 0 for none)", err);
}

/* v among the n names name(0..n-1); *out its index. */
static ml_status named(const char *key, const char *v, const char *(*name)(unsigned), unsigned n,
                       unsigned *out, const char *hint, ml_error *err)
{
    for (unsigned i = 0; i < n; i++)
        if (!strcmp(v, name(i))) {
            *out = i;
            return ML_OK;
        }
    return ml__errorf_at(err, ML_USAGE, 0, 0, "%s: '%s' is unknown; use %s", key, v, hint);
}

static const char *logits_name(unsigned i) { return ml_logits_name((ml_logits)i); }
static const char *zero_grad_name(unsigned i) { return ml_zero_grad_name((ml_zero_grad)i); }
static const char *vision_tower_name(unsigned i)
{
    return ml_vision_tower_name((ml_vision_tower)i);
}
static const char *allocator_name(unsigned i) { return ml_allocator_name((ml_allocator)i); }

/* The training keys whose values are names. */
static ml_status training_named(const char *key, const char *k, const char *v, ml_training *t,
                                ml_error *err)
{
    unsigned u = 0;
    ml_status st = ML_OK;
    if (!strcmp(k, "precision")) {
        if (!ml_precision_parse(v, &t->precision))
            st = ml__errorf_at(err, ML_USAGE, 0, 0, "%s: '%s' is unknown; use fp32, amp-bf16, amp-fp16, "
                           "bf16-master, fp16-master or bf16", key, v);
    } else if (!strcmp(k, "optimizer")) {
        if (!ml_optimizer_parse(v, &t->optimizer))
            st = ml__errorf_at(err, ML_USAGE, 0, 0, "%s: '%s' is unknown; use sgd, sgd-momentum, adam, "
                           "adamw, adafactor, adam-8bit or lion", key, v);
    } else if (!strcmp(k, "optimizer_impl")) {
        if (!ml_optimizer_impl_parse(v, &t->optimizer_impl))
            st = ml__errorf_at(err, ML_USAGE, 0, 0, "%s: '%s' is unknown; use for-loop, foreach or fused",
                           key, v);
    } else if (!strcmp(k, "offload")) {
        if (!ml_offload_parse(v, &t->offload))
            st = ml__errorf_at(err, ML_USAGE, 0, 0, "%s: '%s' is unknown; use none, optimizer or params",
                           key, v);
    } else if (!strcmp(k, "logits")) {
        if (!(st = named(key, v, logits_name, ML_LOGITS_COUNT, &u, "kept, released or fused", err)))
            t->logits = (ml_logits)u;
    } else if (!strcmp(k, "vision_tower")) {
        if (!(st = named(key, v, vision_tower_name, ML_VT_COUNT, &u, "same, none, full or frozen",
                         err)))
            t->vision_tower = (ml_vision_tower)u;
    } else if (!strcmp(k, "engine")) {
        ml_engine e;
        if (!ml_engine_parse(v, &e))
            return ml__errorf_at(err, ML_USAGE, 0, 0, "%s: '%s' is not an engine; use eager or "
                                 "megatron", key, v);
        t->engine = e;
        if (e == ML_ENGINE_MEGATRON) { /* its gradient buffer: zeroed, not freed */
            t->zero_grad = ML_ZERO_GRAD_ZERO;
            t->optimizer_impl = ML_IMPL_FUSED; /* FusedAdam */
            t->logits = ML_LOGITS_RELEASED;    /* GPTModel returns the loss */
        }
    } else if (!strcmp(k, "zero_grad")) {
        if (!(st = named(key, v, zero_grad_name, ML_ZERO_GRAD_COUNT, &u, "set_to_none or zero",
                         err)))
            t->zero_grad = (ml_zero_grad)u;
    } else if (!strcmp(k, "checkpoint")) {
        ml_error e;
        memset(&e, 0, sizeof e);
        if (ml_parse_checkpoint(v, &t->checkpoint, &e))
            st = ml__errorf_at(err, ML_USAGE, 0, 0, "%s: %s", key, e.msg);
    } else {
        st = ml__errorf_at(err, ML_USAGE, 0, 0, "%s: not a setting", key);
    }
    return st;
}

static ml_status training_set(const char *key, const char *v, ml_training *t, ml_error *err)
{
    const char *k = key + strlen("training.");
    uint64_t x = 0;
    ml_status st;
    static const struct {
        const char *name;
        size_t off;
    } counts[] = {
        {"micro_batch", offsetof(ml_training, micro_batch)},
        {"seq_len", offsetof(ml_training, seq_len)},
        {"grad_accum", offsetof(ml_training, grad_accum)},
        {"data_parallel", offsetof(ml_training, data_parallel)},
        {"reduce_bucket_size", offsetof(ml_training, reduce_bucket)},
        {"allgather_bucket_size", offsetof(ml_training, allgather_bucket)},
        {"eval_batch", offsetof(ml_training, eval_batch)},
        {"eval_seq_len", offsetof(ml_training, eval_seq_len)},
        {"logits_chunk", offsetof(ml_training, logits_chunk)},
        {"target_len", offsetof(ml_training, target_len)},
    };
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++)
        if (!strcmp(k, counts[i].name)) {
            if (!strcmp(k, "eval_seq_len") && !t->eval_batch)
                return ml__errorf_at(err, ML_USAGE, 0, 0, "%s: needs an evaluation pass: set "
                                 "training.eval_batch first", key);
            if ((st = whole(key, v, &x, err)))
                return st;
            memcpy((char *)t + counts[i].off, &x, sizeof x);
            return ML_OK;
        }
    if (!strcmp(k, "expert_imbalance"))
        return real(key, v, 1, 1e6, &t->expert_imbalance, err);
    if (!strcmp(k, "expert_capacity"))
        return real(key, v, 0, 1e6, &t->expert_capacity, err);
    if (!strcmp(k, "expert_pad")) {
        if (strcmp(v, "true") && strcmp(v, "false"))
            return ml__errorf_at(err, ML_USAGE, 0, 0, "%s: '%s' is not a setting; use true or "
                                 "false", key, v);
        t->expert_pad = !strcmp(v, "true");
        return ML_OK;
    }
    if (!strcmp(k, "zero")) {
        if (!strcmp(v, "fsdp"))
            x = 3;
        else if ((st = whole(key, v, &x, err)))
            return st;
        t->zero = (unsigned)x;
        return ML_OK;
    }
    return training_named(key, k, v, t, err);
}

static ml_status device_set(const char *key, const char *v, ml_device *d, ml_error *err)
{
    const char *k = key + strlen("device.");
    ml_status st = ML_OK;
    unsigned u = 0;
    if (!strcmp(k, "memory") || !strcmp(k, "name")) {
        /* as the command line's --device NAME|SIZE: a preset's name sets its
         * memory, peaks and cuBLAS workspace; a size is memory only (no peak
         * or workspace of the model file's device carried over); either
         * invalidates a budget line set before it (back to memory - reserve) */
        if (ml_device_preset_find(v) ||
            (!isdigit((unsigned char)v[0]) && v[0] != '.' && v[0] != '-' && v[0] != '+'))
            return ml_device_preset_apply(v, d, err);
        if (!strcmp(k, "name"))
            return ml__errorf_at(err, ML_USAGE, 0, 0, "%s: '%s' is a size, not a device name",
                                 key, v);
        uint64_t memory = 0;
        if (!(st = size(key, v, &memory, err)))
            ml_device_of_size(d, memory);
    } else if (!strcmp(k, "budget")) {
        if (!d->present)
            return ml__errorf_at(err, ML_USAGE, 0, 0, "%s: needs a device: set device.memory first", key);
        st = size(key, v, &d->budget, err);
    } else if (!strcmp(k, "runtime_reserve")) {
        st = size(key, v, &d->runtime_reserve, err);
    } else if (!strcmp(k, "blas_workspace")) {
        st = ml__size_or_none(key, v, &d->blas_workspace, err);
    } else if (!strcmp(k, "peak_tflops")) {
        st = real(key, v, 0, 1e9, &d->peak_tflops, err);
    } else if (!strcmp(k, "interconnect_gbps")) {
        st = real(key, v, 1e-6, 1e6, &d->interconnect_gbps, err);
    } else if (!strcmp(k, "pcie_gbps")) {
        st = real(key, v, 1e-6, 1e6, &d->pcie_gbps, err);
    } else if (!strcmp(k, "efficiency")) {
        st = real(key, v, 1e-6, 1, &d->efficiency, err);
    } else if (!strcmp(k, "fragmentation")) {
        st = real(key, v, 0, 1, &d->fragmentation, err);
    } else if (!strcmp(k, "allocator")) {
        if (!(st = named(key, v, allocator_name, ML_ALLOCATOR_COUNT, &u,
                         "none, caching or expandable", err)))
            d->allocator = (ml_allocator)u;
    } else if (!strcmp(k, "max_split_size")) {
        uint64_t b = 0;
        if ((st = size(key, v, &b, err)))
            return st;
        if (b && b < (20ull << 20))
            return ml__errorf_at(err, ML_RANGE, 0, 0, "%s: must be at least 20MiB (PyTorch's "
                             "max_split_size_mb refuses less)", key);
        if (b > (1ull << 60)) /* as the model file and --max-split-size */
            return ml__errorf_at(err, ML_RANGE, 0, 0, "%s: must be at most 1 EiB (2^60 B): no "
                                 "device has a larger block", key);
        d->max_split_size = b;
    } else {
        st = ml__errorf_at(err, ML_USAGE, 0, 0, "%s: not a setting", key);
    }
    return st;
}

ml_status ml_config_set(ml_config *cfg, const char *key, const char *value, ml_error *err)
{
    if (err)
        memset(err, 0, sizeof *err);
    if (!cfg || !key || !value)
        return ml__errorf_at(err, ML_USAGE, 0, 0, "ml_config_set: NULL argument");
    /* the change is made on a copy: *cfg is written only on success */
    ml_config c = *cfg;
    ml_status st;
    if (!strncmp(key, "training.", strlen("training.")))
        st = training_set(key, value, &c.training, err);
    else if (!strncmp(key, "device.", strlen("device.")))
        st = device_set(key, value, &c.device, err);
    else if (!strncmp(key, "parallel.", strlen("parallel.")))
        st = ml__parallel_set(key, value, &c.training, err);
    else
        st = ml__errorf_at(err, ML_USAGE, 0, 0,
                           "%s: not a setting (training.KEY, device.KEY or parallel.KEY)", key);
    if (st == ML_OK)
        *cfg = c;
    return st;
}
