/* Reading a calibration profile's YAML (docs/calibration.md, "What a profile
 * may claim"): every key checked with its position, then the fit recomputed
 * from the raw points (profile.c). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/decimal.h"
#include "memledger/calib.h"
#include "memledger/model.h"
#include "model/tree.h"
#include "profile/profile_internal.h"

static ml_status num(ml_error *err, const ml_node *map, const char *key, const char *where,
                     bool required, double *out)
{
    const ml_node *n = ml__tree_get(map, key);
    if (!n) {
        if (required)
            return ml__error_at(err, map, ML_SCHEMA, "%s.%s: missing", where, key);
        return ML_OK;
    }
    double v = NAN;
    if (n->type != ML_NODE_SCALAR || !ml__decimal(n->text, &v) || v < 0)
        return ml__error_at(err, n, ML_SCHEMA, "%s.%s: expected a number >= 0", where, key);
    *out = v;
    return ML_OK;
}

static ml_status u64(ml_error *err, const ml_node *map, const char *key, const char *where,
                     bool required, uint64_t *out)
{
    double v = 0;
    ml_status st = num(err, map, key, where, required, &v);
    if (st)
        return st;
    if (v > 1.8e19 || v != floor(v))
        return ml__error_at(err, ml__tree_get(map, key), ML_SCHEMA, "%s.%s: expected a whole number",
                            where, key);
    *out = (uint64_t)v;
    return ML_OK;
}

/* What a profile may claim (docs/calibration.md, "What a profile may
 * claim"). 1 PiB of bytes: some 3,900 times the largest single
 * accelerator's memory (288 GB), and every count stays exact in a double.
 * 100,000 TFLOP/s (100 PFLOP/s): five times the highest figure quoted for
 * one device (about 20 PFLOP/s, sparse FP4); a GEMM figure past it would
 * make the step time vanish (1e300 did). */
#define PROFILE_MAX_BYTES (1ull << 50)
#define PROFILE_MAX_TFLOPS 1e5

static ml_status bytes(ml_error *err, const ml_node *map, const char *key, const char *where,
                       bool required, uint64_t *out)
{
    ml_status st = u64(err, map, key, where, required, out);
    if (!st && *out > PROFILE_MAX_BYTES)
        return ml__error_at(err, ml__tree_get(map, key), ML_RANGE,
                            "%s.%s: %llu B is past 1 PiB (2^50 B), thousands of times any "
                            "device's memory: a unit mistake?",
                            where, key, (unsigned long long)*out);
    return st;
}

static ml_status tflops(ml_error *err, const ml_node *map, const char *key, const char *where,
                        bool required, double *out)
{
    ml_status st = num(err, map, key, where, required, out);
    if (!st && *out > PROFILE_MAX_TFLOPS)
        return ml__error_at(err, ml__tree_get(map, key), ML_RANGE,
                            "%s%s%s: %g TFLOP/s is past 100000 (100 PFLOP/s), five times the "
                            "fastest device's quoted figure (about 20 PFLOP/s, sparse FP4): a "
                            "unit or timing mistake; measure it again",
                            where, *where ? "." : "", key, *out);
    return st;
}

static uint64_t gcd64(uint64_t a, uint64_t b)
{
    while (b) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* Whether two points have the same B*T*D, exactly: B*T fits 64 bits (B <=
 * 2^24, T <= 2^28, checked on reading), the product with D (<= 2^20) may
 * not. With da, db coprime, x*da == y*db exactly when db divides x, da
 * divides y and the quotients agree. */
static bool same_size(const ml_profile_point *a, const ml_profile_point *b)
{
    uint64_t x = a->B * a->T, y = b->B * b->T, g = gcd64(a->D, b->D);
    uint64_t da = a->D / g, db = b->D / g;
    return x % db == 0 && y % da == 0 && x / db == y / da;
}


#define NTOP 17
/* The keys a profile may have at its top. */
static const char *const top_keys[NTOP] = {
    "profile_version", "name", "backend", "device", "dtype", "driver", "library", "created",
    "notes", "precision", "peak_tflops", "achieved_tflops", "efficiency", "gemm", "layers",
    "host", "memory_gbps"};

/* Every top key is known, the version is 1, and the metadata (each a
 * string) has a known dtype and precision. */
static ml_status read_header(const ml_node *r, ml_profile *p, ml_error *err)
{
    for (size_t i = 0; i < r->count; i++) {
        size_t j;
        for (j = 0; j < NTOP; j++)
            if (!strcmp(r->keys[i]->text, top_keys[j]))
                break;
        if (j == NTOP)
            return ml__error_at(err, r->keys[i], ML_SCHEMA, "%s: unknown key in a profile",
                       r->keys[i]->text);
    }
    double ver = 0;
    ml_status st = num(err, r, "profile_version", "profile", true, &ver);
    if (st)
        return st;
    if (ver != 1)
        return ml__error_at(err, ml__tree_get(r, "profile_version"), ML_SCHEMA,
                   "profile_version: %g is not supported (this memledger reads version 1)", ver);
    for (int i = 0; i < ML_PROFILE_NMETA; i++) {
        const char *key = ml__profile_meta_keys[i];
        const ml_node *n = ml__tree_get(r, key);
        if (!n)
            continue;
        if (n->type != ML_NODE_SCALAR)
            return ml__error_at(err, n, ML_SCHEMA, "%s: expected a string", key);
        if (ml_profile_set(p, key, n->text))
            return ml__error_at(err, n, ML_NOMEM, "out of memory");
    }
    const char *dt = ml_profile_get(p, "dtype");
    if (strcmp(dt, "fp32") && strcmp(dt, "bf16") && strcmp(dt, "fp16"))
        return ml__error_at(err, ml__tree_get(r, "dtype") ? ml__tree_get(r, "dtype") : r, ML_SCHEMA,
                   "dtype: '%s' is not fp32, bf16 or fp16", dt);
    const char *pr = ml_profile_get(p, "precision");
    ml_precision pp;
    if (*pr && !ml_precision_parse(pr, &pp))
        return ml__error_at(err, ml__tree_get(r, "precision"), ML_SCHEMA,
                            "precision: '%s' is not a precision policy (fp32, amp-bf16, amp-fp16, "
                            "bf16-master, fp16-master, bf16)",
                            pr);
    return ML_OK;
}

/* peak_tflops and the measured GEMMs. */
static ml_status read_gemm(const ml_node *r, ml_profile *p, ml_error *err)
{
    double peak = 0;
    ml_status st;
    if ((st = tflops(err, r, "peak_tflops", "", false, &peak)))
        return st;
    ml_profile_set_peak(p, peak);
    double gbps = 0;
    if ((st = num(err, r, "memory_gbps", "profile", false, &gbps)))
        return st;
    ml_profile_set_memory_gbps(p, gbps);
    const ml_node *g = ml__tree_get(r, "gemm");
    if (g && g->type != ML_NODE_SEQ)
        return ml__error_at(err, g, ML_SCHEMA, "gemm: expected a list of {m, n, k, tflops}");
    for (size_t i = 0; g && i < g->count; i++) {
        ml_profile_gemm q;
        if ((st = u64(err, g->items[i], "m", "gemm[]", true, &q.m)) ||
            (st = u64(err, g->items[i], "n", "gemm[]", true, &q.n)) ||
            (st = u64(err, g->items[i], "k", "gemm[]", true, &q.k)) ||
            (st = tflops(err, g->items[i], "tflops", "gemm[]", true, &q.tflops)))
            return st;
        if (ml_profile_add_gemm(p, &q))
            return ml__error_at(err, g, ML_NOMEM, "out of memory");
    }
    return ML_OK;
}

/* Point j of layer kind `kind` (its key node: key), q, added to p. */
static ml_status read_point(const ml_node *q, const char *kind, size_t j, const ml_node *key,
                            ml_profile *p, ml_error *err)
{
    ml_profile_point pt;
    memset(&pt, 0, sizeof pt);
    char where[64];
    snprintf(where, sizeof where, "layers.%s.points[%zu]", kind, j);
    if (!q || q->type != ML_NODE_MAP)
        return ml__error_at(err, q, ML_SCHEMA, "%s: expected a mapping", where);
    ml_status st;
    if ((st = u64(err, q, "B", where, true, &pt.B)) ||
        (st = u64(err, q, "T", where, true, &pt.T)) ||
        (st = u64(err, q, "D", where, true, &pt.D)) ||
        (st = u64(err, q, "H", where, false, &pt.H)) ||
        (st = u64(err, q, "F", where, false, &pt.F)) ||
        (st = bytes(err, q, "saved_bytes", where, true, &pt.saved_bytes)) ||
        (st = bytes(err, q, "cast_bytes", where, false, &pt.cast_bytes)) ||
        (st = bytes(err, q, "peak_forward", where, false, &pt.peak_forward)) ||
        (st = bytes(err, q, "peak_backward", where, false, &pt.peak_backward)) ||
        (st = bytes(err, q, "peak_step", where, false, &pt.peak_step)) ||
        (st = bytes(err, q, "device_peak", where, false, &pt.device_peak)) ||
        (st = num(err, q, "time_s", where, false, &pt.time_s)))
        return st;
    if (!pt.B || !pt.T || !pt.D || pt.B > (1u << 24) || pt.T > (1u << 28) ||
        pt.D > (1u << 20) || pt.H > (1u << 16) || pt.F > (1u << 22))
        return ml__error_at(err, q, ML_RANGE,
                            "%s: B, T and D must be at least 1 and within memledger's limits",
                            where);
    st = ml_profile_add_point(p, kind, &pt);
    if (st == ML_USAGE)
        return ml__error_at(err, key, ML_SCHEMA,
                            "layers.%s: unknown layer kind; expected one of: %s", kind,
                            ML_PROFILE_KINDS);
    if (st)
        return ml__error_at(err, q, ML_NOMEM, "out of memory");
    return ML_OK;
}

/* The fit needs B*T*D to vary: with one size every model's first column is
 * constant (and a B*T*D past 2^53 rounded apart made a fit of noise). */
static ml_status check_sizes_vary(const ml_profile *p, const char *kind, const ml_node *key,
                                  ml_error *err)
{
    const ml_profile_kind *kr = ml_profile_find(p, kind);
    size_t np = kr ? kr->npoints : 0, j = 1;
    while (j < np && same_size(&kr->points[0], &kr->points[j]))
        j++;
    if (j >= np) {
        char sz[96] = "";
        if (np > 1)
            snprintf(sz, sizeof sz, ", all of one size B*T*D = %llu*%llu*%llu",
                     (unsigned long long)kr->points[0].B, (unsigned long long)kr->points[0].T,
                     (unsigned long long)kr->points[0].D);
        return ml__error_at(err, key, ML_RANGE,
                            "layers.%s: %zu point%s%s; the fit needs at least 2 points of "
                            "different sizes B*T*D: measure at another micro-batch or "
                            "sequence length",
                            kind, np, np == 1 ? "" : "s", sz);
    }
    return ML_OK;
}

/* layers: each known kind once, with its points. */
static ml_status read_layers(const ml_node *r, const ml_node *ls, ml_profile *p, ml_error *err)
{
    if (!ls || ls->type != ML_NODE_MAP)
        return ml__error_at(err, ls ? ls : r, ML_SCHEMA,
                            "layers: missing; a profile maps layer kinds (%s) to their measured "
                            "points",
                            ML_PROFILE_KINDS);
    if (!ls->count)
        return ml__error_at(err, ls, ML_SCHEMA,
                            "layers: no layer kind; a profile maps layer kinds (%s) to their "
                            "measured points",
                            ML_PROFILE_KINDS);
    const ml_node *seen[ML_PK_COUNT] = {NULL};
    ml_status st;
    for (size_t i = 0; i < ls->count; i++) {
        const char *kind = ls->keys[i]->text;
        ml_profile_kind_id ki;
        if (!ml_profile_kind_parse(kind, &ki))
            return ml__error_at(err, ls->keys[i], ML_SCHEMA,
                                "layers.%s: unknown layer kind; expected one of: %s", kind,
                                ML_PROFILE_KINDS);
        /* both lists were merged into one fit (a second transformer_block
         * 1000 times larger flipped gpt2-small's verdict unnoticed) */
        if (seen[ki])
            return ml__error_at(err, ls->keys[i], ML_SCHEMA,
                                "layers.%s: given twice (first at line %u, column %u); merge the "
                                "two lists of points under one key",
                                kind, seen[ki]->line, seen[ki]->col);
        seen[ki] = ls->keys[i];
        const ml_node *k = ls->items[i];
        const ml_node *pts = ml__tree_get(k, "points");
        if (!pts || pts->type != ML_NODE_SEQ)
            return ml__error_at(err, k ? k : ls->keys[i], ML_SCHEMA, "layers.%s.points: missing",
                                kind);
        for (size_t j = 0; j < pts->count; j++)
            if ((st = read_point(pts->items[j], kind, j, ls->keys[i], p, err)))
                return st;
        if ((st = check_sizes_vary(p, kind, ls->keys[i], err)))
            return st;
    }
    return ML_OK;
}

/* The host's dispatch costs (docs/time.md), in microseconds: all seven
 * keys, none other. */
#define NHOST 7
#define HOST_KEYS                                                                              \
    "forward_op_us, backward_op_us, forward_block_us, backward_block_us, "                     \
    "recompute_block_us, step_call_us, step_tensor_us"
static ml_status read_host(const ml_node *r, ml_profile *p, ml_error *err)
{
    static const char *const keys[NHOST] = {
        "forward_op_us",      "backward_op_us", "forward_block_us", "backward_block_us",
        "recompute_block_us", "step_call_us",   "step_tensor_us"};
    const ml_node *h = ml__tree_get(r, "host");
    if (!h)
        return ML_OK;
    if (h->type != ML_NODE_MAP)
        return ml__error_at(err, h, ML_SCHEMA,
                            "host: expected a mapping of " HOST_KEYS);
    for (size_t i = 0; i < h->count; i++) {
        size_t j = 0;
        while (j < NHOST && strcmp(h->keys[i]->text, keys[j]))
            j++;
        if (j == NHOST)
            return ml__error_at(err, h->keys[i], ML_SCHEMA,
                                "host.%s: unknown key (host takes " HOST_KEYS ")",
                                h->keys[i]->text);
    }
    double v[NHOST];
    for (int j = 0; j < NHOST; j++) {
        ml_status st = num(err, h, keys[j], "host", true, &v[j]);
        if (st)
            return st;
        /* a second per kernel or block is no host's: a unit mistaken */
        if (v[j] > 1e6)
            return ml__error_at(err, ml__tree_get(h, keys[j]), ML_SCHEMA,
                                "host.%s: %g us is more than a second; the costs are in "
                                "microseconds",
                                keys[j], v[j]);
    }
    const ml_profile_host c = {v[0] * 1e-6, v[1] * 1e-6, v[2] * 1e-6, v[3] * 1e-6,
                               v[4] * 1e-6, v[5] * 1e-6, v[6] * 1e-6};
    ml_profile_set_host(p, &c);
    return ML_OK;
}

static ml_status read_profile(const ml_node *r, ml_profile *p, ml_error *err)
{
    if (!r || r->type != ML_NODE_MAP)
        return ml__error_at(err, r, ML_SCHEMA,
                            "a profile is a mapping (profile_version, device, layers, ...)");
    ml_status st;
    if ((st = read_header(r, p, err)) || (st = read_gemm(r, p, err)) ||
        (st = read_host(r, p, err)))
        return st;
    const ml_node *ls = ml__tree_get(r, "layers");
    if ((st = read_layers(r, ls, p, err)))
        return st;
    st = ml_profile_fit(p, err);
    if (st && !err->line) {
        err->line = ls->line;
        err->col = ls->col;
    }
    return st;
}

ml_status ml_profile_load_string(const char *text, size_t len, const char *name, ml_profile **out,
                                 ml_error *err)
{
    ml_error local;
    if (!err)
        err = &local;
    memset(err, 0, sizeof *err);
    snprintf(err->path, sizeof err->path, "%s", name ? name : "<profile>");
    ml_node *root = NULL;
    ml_status st = ml__tree_parse(text, len, &root, err);
    if (st)
        return st;
    ml_profile *p = ml_profile_new();
    if (!p) {
        ml__tree_free(root);
        return ml__error_at(err, NULL, ML_NOMEM, "out of memory");
    }
    /* a key given twice anywhere is refused, not read either way (a layer
     * kind twice gets its own message from read_profile) */
    st = read_profile(root, p, err);
    if (st == ML_OK)
        st = ml__tree_check_unique(err, root);
    ml__tree_free(root);
    if (st) {
        ml_profile_destroy(p);
        return st;
    }
    *out = p;
    return ML_OK;
}

ml_status ml_profile_load_file(const char *path, ml_profile **out, ml_error *err)
{
    ml_error local;
    if (!err)
        err = &local;
    size_t len = 0;
    char *buf = ml__read_file(path, &len, err);
    if (!buf)
        return err->code;
    ml_status st = ml_profile_load_string(buf, len, path, out, err);
    free(buf);
    return st;
}
