/* Sizes, enum names and checkpoint policies: the small parsers shared by the
 * YAML loader and the command line. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memledger/model.h"
#include "util/text.h"

static ml_status usage(ml_error *err, ml_status code, const char *fmt, const char *arg)
{
    if (err) {
        err->code = code;
        err->line = err->col = 0;
        snprintf(err->msg, sizeof err->msg, fmt, arg);
    }
    return code;
}

static const struct {
    const char *suffix;
    uint64_t mult;
} units[] = {
    {"B", 1},
    {"KiB", 1ull << 10}, {"MiB", 1ull << 20}, {"GiB", 1ull << 30}, {"TiB", 1ull << 40},
    {"KB", 1000ull}, {"MB", 1000000ull}, {"GB", 1000000000ull}, {"TB", 1000000000000ull},
};

ml_status ml_parse_size(const char *text, uint64_t *out, ml_error *err)
{
    const char *p = text;
    while (isspace((unsigned char)*p))
        p++;
    if (*p == '-')
        return usage(err, ML_RANGE, "size '%s' is negative: sizes are at least 1 byte", text);
    /* integer part and optional fraction, parsed exactly enough: digits are
     * accumulated as integer + fraction so "6.5GiB" is exact. */
    uint64_t whole = 0;
    int ndig = 0;
    while (isdigit((unsigned char)*p)) {
        unsigned d = (unsigned)(*p - '0');
        if (whole > (UINT64_MAX - d) / 10)
            return usage(err, ML_RANGE, "size '%s' does not fit in 64 bits", text);
        whole = whole * 10 + d;
        p++;
        ndig++;
    }
    /* the fraction's digits (the first 64: the rest moves no byte of a
     * unit up to 1 TiB) */
    unsigned char fd[64];
    size_t nf = 0;
    bool frac = false;
    if (*p == '.') {
        p++;
        while (isdigit((unsigned char)*p)) {
            if (nf < sizeof fd)
                fd[nf++] = (unsigned char)(*p - '0');
            frac |= *p != '0';
            p++;
            ndig++;
        }
    }
    if (ndig == 0)
        return usage(err, ML_USAGE,
                     "'%s' is not a size: write a number and a unit, e.g. 8GiB, 512MiB, 16GB",
                     text);
    while (isspace((unsigned char)*p))
        p++;
    uint64_t mult = 1;
    if (*p) {
        size_t i;
        for (i = 0; i < sizeof units / sizeof units[0]; i++)
            if (strcmp(p, units[i].suffix) == 0)
                break;
        if (i == sizeof units / sizeof units[0])
            return usage(err, ML_USAGE,
                         "'%s': unknown unit; use B, KiB, MiB, GiB, TiB (binary) or KB, MB, GB, TB "
                         "(decimal)",
                         text);
        mult = units[i].mult;
    }
    uint64_t v;
    if (__builtin_mul_overflow(whole, mult, &v))
        return usage(err, ML_RANGE, "size '%s' does not fit in 64 bits", text);
    if (frac) {
        if (mult == 1)
            return usage(err, ML_USAGE, "size '%s' has a fraction of a byte", text);
        /* 0.d1 d2 ... dn x mult, rounded down to whole bytes, exactly: from
         * the last digit, b = (d_i mult + b) / 10, since adding a fraction
         * below one to a whole number moves no quotient by ten; each term
         * stays below 10 mult */
        uint64_t b = 0;
        for (size_t i = nf; i-- > 0;)
            b = (fd[i] * mult + b) / 10;
        if (__builtin_add_overflow(v, b, &v))
            return usage(err, ML_RANGE, "size '%s' does not fit in 64 bits", text);
    }
    if (v == 0)
        return usage(err, ML_RANGE,
                     frac ? "size '%s' is below one byte: sizes are at least 1 byte"
                          : "size '%s' is zero: sizes are at least 1 byte",
                     text);
    *out = v;
    return ML_OK;
}

static const char *const prec_names[ML_PREC_COUNT] = {
    "fp32", "amp-bf16", "amp-fp16", "bf16-master", "fp16-master", "bf16"};
static const char *const opt_names[ML_OPT_COUNT] = {
    "sgd", "sgd-momentum", "adam", "adamw", "adafactor", "adam-8bit", "lion"};
static const char *const impl_names[ML_IMPL_COUNT] = {"for-loop", "foreach", "fused"};
static const char *const offload_names[ML_OFFLOAD_COUNT] = {"none", "optimizer", "params"};
static const char *const logits_names[ML_LOGITS_COUNT] = {"kept", "released", "fused",
                                                           "through-backward"};
static const char *const allocator_names[ML_ALLOCATOR_COUNT] = {"none", "caching", "expandable"};
static const char *const zero_grad_names[ML_ZERO_GRAD_COUNT] = {"set_to_none", "zero"};
static const char *const vision_tower_names[ML_VT_COUNT] = {"same", "none", "full", "frozen"};

const char *ml_precision_name(ml_precision p)
{
    return (unsigned)p < ML_PREC_COUNT ? prec_names[p] : "?";
}
const char *ml_optimizer_name(ml_optimizer o)
{
    return (unsigned)o < ML_OPT_COUNT ? opt_names[o] : "?";
}
const char *ml_optimizer_impl_name(ml_optimizer_impl i)
{
    return (unsigned)i < ML_IMPL_COUNT ? impl_names[i] : "?";
}

const char *ml_offload_name(ml_offload o)
{
    return (unsigned)o < ML_OFFLOAD_COUNT ? offload_names[o] : "?";
}

const char *ml_logits_name(ml_logits l)
{
    return (unsigned)l < ML_LOGITS_COUNT ? logits_names[l] : "?";
}

const char *ml_zero_grad_name(ml_zero_grad z)
{
    return (unsigned)z < ML_ZERO_GRAD_COUNT ? zero_grad_names[z] : "?";
}

const char *ml_vision_tower_name(ml_vision_tower v)
{
    return (unsigned)v < ML_VT_COUNT ? vision_tower_names[v] : "?";
}

const char *ml_allocator_name(ml_allocator a)
{
    return (unsigned)a < ML_ALLOCATOR_COUNT ? allocator_names[a] : "?";
}

static bool lookup(const char *const *names, unsigned n, const char *s, unsigned *out)
{
    for (unsigned i = 0; i < n; i++)
        if (strcmp(names[i], s) == 0) {
            *out = i;
            return true;
        }
    return false;
}

bool ml_precision_parse(const char *s, ml_precision *out)
{
    unsigned i;
    if (!lookup(prec_names, ML_PREC_COUNT, s, &i))
        return false;
    *out = (ml_precision)i;
    return true;
}
bool ml_optimizer_parse(const char *s, ml_optimizer *out)
{
    unsigned i;
    if (!lookup(opt_names, ML_OPT_COUNT, s, &i))
        return false;
    *out = (ml_optimizer)i;
    return true;
}
bool ml_offload_parse(const char *s, ml_offload *out)
{
    unsigned i;
    if (!lookup(offload_names, ML_OFFLOAD_COUNT, s, &i))
        return false;
    *out = (ml_offload)i;
    return true;
}

bool ml_optimizer_impl_parse(const char *s, ml_optimizer_impl *out)
{
    unsigned i;
    if (!lookup(impl_names, ML_IMPL_COUNT, s, &i))
        return false;
    *out = (ml_optimizer_impl)i;
    return true;
}

static bool parse_u32(const char **pp, uint32_t *out)
{
    const char *p = *pp;
    if (!isdigit((unsigned char)*p))
        return false;
    uint64_t v = 0;
    while (isdigit((unsigned char)*p)) {
        v = v * 10 + (uint64_t)(*p - '0');
        if (v > 0xffffffffu)
            return false;
        p++;
    }
    *out = (uint32_t)v;
    *pp = p;
    return true;
}

static const char *skip_space(const char *p)
{
    while (isspace((unsigned char)*p))
        p++;
    return p;
}

/* Segments "[0-3] [8] [10-12]" (the form an optimal plan prints; commas
 * between groups allowed): ascending, not overlapping. */
static ml_status parse_segments(const char *text, const char *p, ml_checkpoint *c, ml_error *err)
{
    c->kind = ML_CKPT_SEGMENTS;
    for (p = skip_space(p); *p; p = skip_space(p)) {
        uint32_t a, b;
        if (*p++ != '[')
            return usage(err, ML_USAGE, "checkpoint '%s': expected a segment such as [0-3]",
                         text);
        p = skip_space(p);
        if (!parse_u32(&p, &a))
            return usage(err, ML_USAGE, "checkpoint '%s': a segment starts with a block index",
                         text);
        p = skip_space(p);
        b = a;
        if (*p == '-') {
            p = skip_space(p + 1);
            if (!parse_u32(&p, &b) || b < a)
                return usage(err, ML_USAGE,
                             "checkpoint '%s': a segment [A-B] needs whole A <= B", text);
            p = skip_space(p);
        }
        if (*p++ != ']')
            return usage(err, ML_USAGE, "checkpoint '%s': a segment ends with ]", text);
        if (c->count && a <= c->blocks[2 * c->count - 1])
            return usage(err, ML_USAGE,
                         "checkpoint '%s': segments must be in ascending order and must not "
                         "overlap",
                         text);
        if (c->count == ML_CKPT_LIST_MAX / 2)
            return usage(err, ML_RANGE, "checkpoint '%s': more than 128 segments", text);
        c->blocks[2 * c->count] = a;
        c->blocks[2 * c->count + 1] = b;
        c->count++;
        p = skip_space(p);
        if (*p == ',')
            p++;
    }
    if (!c->count)
        return usage(err, ML_USAGE, "checkpoint '%s': no segment", text);
    return ML_OK;
}

/* "optimal: [0-3] [8]", "[0-3] [8]", "[4-7]", "[2] [5]": a range, or more
 * than one bracket group (a list "[0, 3, 6]" has neither). */
static bool is_segments(const char *text)
{
    if (strncmp(text, "optimal:", 8) == 0)
        return true;
    const char *close = text[0] == '[' ? strchr(text, ']') : NULL;
    return close && (memchr(text, '-', (size_t)(close - text)) || strchr(close, '['));
}

ml_status ml_parse_checkpoint(const char *text, ml_checkpoint *out, ml_error *err)
{
    ml_checkpoint c;
    memset(&c, 0, sizeof c);
    const char *bad = "checkpoint '%s' is not a policy: use none, full, every-K (e.g. every-2), "
                      "sqrt, selective, optimal or a block list such as [0, 3, 6]";
    /* "optimal: none" is what an optimal plan that keeps everything prints */
    if (strcmp(text, "none") == 0 || strcmp(text, "optimal: none") == 0)
        c.kind = ML_CKPT_NONE;
    else if (strcmp(text, "full") == 0)
        c.kind = ML_CKPT_FULL;
    else if (strcmp(text, "sqrt") == 0)
        c.kind = ML_CKPT_SQRT;
    else if (strcmp(text, "selective") == 0)
        c.kind = ML_CKPT_SELECTIVE;
    else if (strcmp(text, "optimal") == 0)
        c.kind = ML_CKPT_OPTIMAL;
    else if (strncmp(text, "every-", 6) == 0) {
        const char *p = text + 6;
        if (!parse_u32(&p, &c.every) || *p || c.every == 0)
            return usage(err, ML_USAGE, "checkpoint '%s': every-K needs a whole K >= 1", text);
        c.kind = ML_CKPT_EVERY;
    } else if (is_segments(text)) {
        /* segments, as an optimal plan prints them ("optimal: [0-3] [8]") */
        ml_status st = parse_segments(text, text[0] == 'o' ? text + 8 : text, &c, err);
        if (st)
            return st;
    } else if (text[0] == '[') {
        const char *p = text + 1;
        c.kind = ML_CKPT_LIST;
        while (isspace((unsigned char)*p))
            p++;
        while (*p && *p != ']') {
            uint32_t v;
            if (!parse_u32(&p, &v))
                return usage(err, ML_USAGE, bad, text);
            if (c.count == ML_CKPT_LIST_MAX)
                return usage(err, ML_RANGE, "checkpoint '%s': more than 256 blocks listed", text);
            /* as segments: ascending, each block once (a repeat or a
             * reversed list would be echoed as given, planned as a set) */
            if (c.count && v <= c.blocks[c.count - 1])
                return usage(err, ML_USAGE,
                             "checkpoint '%s': list each block once, in ascending order "
                             "(e.g. [0, 3, 6])",
                             text);
            c.blocks[c.count++] = v;
            while (isspace((unsigned char)*p))
                p++;
            if (*p == ',') {
                p++;
                while (isspace((unsigned char)*p))
                    p++;
            }
        }
        if (*p != ']' || p[1])
            return usage(err, ML_USAGE, bad, text);
        if (!c.count) /* no block listed: none, and said so ("[]" is no policy's name) */
            c.kind = ML_CKPT_NONE;
    } else
        return usage(err, ML_USAGE, bad, text);
    *out = c;
    return ML_OK;
}

const ml_checkpoint_candidate *ml_checkpoint_candidates(size_t *count)
{
    static const ml_checkpoint_candidate table[] = {
        {"none", true, false},      {"full", true, false},       {"every-2", true, false},
        {"every-4", true, false},   {"sqrt", true, false},       {"selective", false, false},
        {"optimal", false, true},
    };
    *count = sizeof table / sizeof table[0];
    return table;
}

void ml_checkpoint_format(const ml_checkpoint *c, char *buf, size_t size)
{
    switch (c->kind) {
    case ML_CKPT_NONE: ml__name_join(buf, size, "none", ""); return;
    case ML_CKPT_FULL: ml__name_join(buf, size, "full", ""); return;
    case ML_CKPT_SQRT: ml__name_join(buf, size, "sqrt", ""); return;
    case ML_CKPT_SELECTIVE: ml__name_join(buf, size, "selective", ""); return;
    case ML_CKPT_OPTIMAL: ml__name_join(buf, size, "optimal", ""); return;
    case ML_CKPT_EVERY: snprintf(buf, size, "every-%u", c->every); return;
    case ML_CKPT_SEGMENTS: {
        size_t n = 0;
        if (size)
            buf[0] = '\0';
        for (uint32_t i = 0; i < c->count && i < ML_CKPT_LIST_MAX / 2 && n < size; i++) {
            const uint32_t a = c->blocks[2 * i], b = c->blocks[2 * i + 1];
            n += (size_t)(a == b ? snprintf(buf + n, size - n, "%s[%u]", i ? " " : "", a)
                                 : snprintf(buf + n, size - n, "%s[%u-%u]", i ? " " : "", a, b));
        }
        return;
    }
    case ML_CKPT_LIST:
    default: {
        size_t n = 0;
        n += (size_t)snprintf(buf, size, "[");
        for (uint32_t i = 0; i < c->count && n < size; i++)
            n += (size_t)snprintf(buf + n, size - n, "%s%u", i ? ", " : "", c->blocks[i]);
        if (n < size)
            snprintf(buf + n, size - n, "]");
        return;
    }
    }
}

ml_config ml_config_defaults(void)
{
    ml_config c;
    memset(&c, 0, sizeof c);
    c.training.micro_batch = 1;
    c.training.seq_len = 1;
    c.training.grad_accum = 1;
    c.training.precision = ML_PREC_FP32;
    c.training.optimizer = ML_OPT_ADAMW;
    c.training.optimizer_impl = ML_IMPL_FOREACH;
    c.training.checkpoint.kind = ML_CKPT_NONE;
    c.training.data_parallel = 1;
    c.training.tensor_parallel = 1;
    c.training.pipeline_parallel = 1;
    c.training.virtual_stages = 1;
    c.training.expert_imbalance = 1;
    c.training.zero = 0;
    c.training.offload = ML_OFFLOAD_NONE;
    c.training.reduce_bucket = 500000000;    /* DeepSpeed reduce_bucket_size */
    c.training.allgather_bucket = 500000000; /* DeepSpeed allgather_bucket_size */
    c.training.logits = ML_LOGITS_KEPT;
    c.device.runtime_reserve = 512ull << 20;
    c.device.blas_workspace = ML_BLAS_WORKSPACE_CUDA;
    c.device.efficiency = 1.0;
    c.device.allocator = ML_ALLOCATOR_CACHING;
    return c;
}

void ml_format_bytes(uint64_t bytes, char *buf, size_t size)
{
    static const char *const u[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (bytes < 1024) {
        snprintf(buf, size, "%llu B", (unsigned long long)bytes);
        return;
    }
    double v = (double)bytes / 1024.0;
    int i = 0;
    while (v >= 1024.0 && i < 5) {
        v /= 1024.0;
        i++;
    }
    snprintf(buf, size, "%.2f %s", v, u[i]);
}

void ml_format_flops(double flops, char *buf, size_t size)
{
    static const char *const u[] = {"FLOP", "KFLOP", "MFLOP", "GFLOP", "TFLOP", "PFLOP", "EFLOP"};
    int i = 0;
    double v = flops;
    while (fabs(v) >= 1000.0 && i < 6) {
        v /= 1000.0;
        i++;
    }
    snprintf(buf, size, i ? "%.2f %s" : "%.0f %s", v, u[i]);
}
