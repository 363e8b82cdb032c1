/* Calibration profiles: built by the runner, saved as YAML, read back by
 * the planner. The fitted values are always recomputed from the raw points. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memledger/calib.h"
#include "memledger/model.h"
#include "model/tree.h"
#include "util/grow.h"

#define NKEYS 9
static const char *const meta_keys[NKEYS] = {"name",    "backend", "device", "dtype",    "driver",
                                             "library", "created", "notes",  "precision"};

typedef struct {
    char kind[32];
    ml_profile_point *pts;
    size_t n, cap;
    ml_linfit fit;
    double attn; /* bytes per B*H*T^2*b element; 0 when not fitted */
    double mask; /* bytes per T^2 element, whatever the batch; 0 when not fitted */
    double pos;  /* bytes per position, whatever the batch (lm_head); 0 when not fitted */
    double tokens; /* bytes per token whatever D; 0 when not fitted */
    ml_profile_kind view;
} kindrec;

struct ml_profile {
    char *meta[NKEYS];
    kindrec kinds[8];
    size_t nkinds;
    ml_profile_gemm *gemm;
    size_t ngemm, gcap;
    double peak_tflops;
};

static const char *const kinds_known[] = {"linear", "mlp", "transformer_block", "lm_head",
                                          "llama_block"};

ml_profile *ml_profile_new(void)
{
    return calloc(1, sizeof(ml_profile));
}

void ml_profile_destroy(ml_profile *p)
{
    if (!p)
        return;
    for (int i = 0; i < NKEYS; i++)
        free(p->meta[i]);
    for (size_t i = 0; i < p->nkinds; i++)
        free(p->kinds[i].pts);
    free(p->gemm);
    free(p);
}

static int meta_index(const char *key)
{
    for (int i = 0; i < NKEYS; i++)
        if (!strcmp(meta_keys[i], key))
            return i;
    return -1;
}

ml_status ml_profile_set(ml_profile *p, const char *key, const char *value)
{
    int i = meta_index(key);
    if (i < 0)
        return ML_USAGE;
    char *v = strdup(value ? value : "");
    if (!v)
        return ML_NOMEM;
    free(p->meta[i]);
    p->meta[i] = v;
    return ML_OK;
}

const char *ml_profile_get(const ml_profile *p, const char *key)
{
    int i = meta_index(key);
    return i >= 0 && p->meta[i] ? p->meta[i] : "";
}

static kindrec *kind_of(ml_profile *p, const char *kind, bool create)
{
    for (size_t i = 0; i < p->nkinds; i++)
        if (!strcmp(p->kinds[i].kind, kind))
            return &p->kinds[i];
    if (!create || p->nkinds == 8)
        return NULL;
    bool known = false;
    for (size_t i = 0; i < sizeof kinds_known / sizeof kinds_known[0]; i++)
        known = known || !strcmp(kinds_known[i], kind);
    if (!known)
        return NULL;
    kindrec *k = &p->kinds[p->nkinds++];
    memset(k, 0, sizeof *k);
    snprintf(k->kind, sizeof k->kind, "%s", kind);
    return k;
}

ml_status ml_profile_add_point(ml_profile *p, const char *kind, const ml_profile_point *pt)
{
    kindrec *k = kind_of(p, kind, true);
    if (!k)
        return ML_USAGE;
    ml_profile_point *np = ml_grow(k->pts, k->n, &k->cap, sizeof *np, 16);
    if (!np)
        return ML_NOMEM;
    k->pts = np;
    k->pts[k->n++] = *pt;
    return ML_OK;
}

ml_status ml_profile_add_gemm(ml_profile *p, const ml_profile_gemm *g)
{
    ml_profile_gemm *ng = ml_grow(p->gemm, p->ngemm, &p->gcap, sizeof *ng, 8);
    if (!ng)
        return ML_NOMEM;
    p->gemm = ng;
    p->gemm[p->ngemm++] = *g;
    return ML_OK;
}

void ml_profile_set_peak(ml_profile *p, double peak_tflops)
{
    p->peak_tflops = peak_tflops > 0 && isfinite(peak_tflops) ? peak_tflops : 0;
}

unsigned ml_profile_dtype_bytes(const ml_profile *p)
{
    const char *d = ml_profile_get(p, "dtype");
    return !strcmp(d, "bf16") || !strcmp(d, "fp16") ? 2 : 4;
}

/* The kinds with attention keep tensors of B*H*T^2 elements (scores,
 * probabilities, dropout masks) besides those of B*T*D. */
static bool has_attention(const char *kind)
{
    return !strcmp(kind, "transformer_block") || !strcmp(kind, "llama_block");
}

#define FITK_MAX 4

/* y = fixed + sum_j coef[j] * x[j] by least squares over n points and k <= 4
 * regressors, on centred and scaled columns (normal equations, Gaussian
 * elimination with partial pivoting). Returns false when the regressors are
 * (nearly) collinear over the points, e.g. all points at one T. */
static bool fitk(double *const *x, size_t k, const double *y, size_t n, double *coef, ml_linfit *f)
{
    if (n < k + 1)
        return false;
    if (k > FITK_MAX)
        return false;
    double mean[FITK_MAX] = {0}, scale[FITK_MAX] = {0}, my = 0;
    for (size_t i = 0; i < n; i++) {
        my += y[i];
        for (size_t j = 0; j < k; j++)
            mean[j] += x[j][i];
    }
    my /= (double)n;
    for (size_t j = 0; j < k; j++) {
        mean[j] /= (double)n;
        for (size_t i = 0; i < n; i++)
            scale[j] += (x[j][i] - mean[j]) * (x[j][i] - mean[j]);
        scale[j] = sqrt(scale[j]);
        /* relative: a column whose values are equal but rounded apart (a
         * product past 2^53) varies by noise, not by shape */
        if (!(scale[j] > 1e-12 * fabs(mean[j]) * sqrt((double)n)))
            return false;
    }
    /* A (k x k) | rhs, of unit-norm centred columns: A is their Gram matrix */
    double A[FITK_MAX][FITK_MAX + 1] = {{0}};
    double syy = 0;
    for (size_t i = 0; i < n; i++) {
        double z[FITK_MAX], dy = y[i] - my;
        for (size_t j = 0; j < k; j++)
            z[j] = (x[j][i] - mean[j]) / scale[j];
        for (size_t r = 0; r < k; r++) {
            for (size_t c = 0; c < k; c++)
                A[r][c] += z[r] * z[c];
            A[r][k] += z[r] * dy;
        }
        syy += dy * dy;
    }
    for (size_t c = 0; c < k; c++) {
        size_t piv = c;
        for (size_t r = c + 1; r < k; r++)
            if (fabs(A[r][c]) > fabs(A[piv][c]))
                piv = r;
        /* the Gram matrix of unit columns has a unit diagonal: a pivot this
         * small means one column is a combination of the others */
        if (!(fabs(A[piv][c]) > 1e-9))
            return false;
        for (size_t j = 0; j <= k; j++) {
            double t = A[c][j];
            A[c][j] = A[piv][j];
            A[piv][j] = t;
        }
        for (size_t r = 0; r < k; r++) {
            if (r == c)
                continue;
            double m = A[r][c] / A[c][c];
            for (size_t j = c; j <= k; j++)
                A[r][j] -= m * A[c][j];
        }
    }
    /* a term worth less than 1e-9 of the largest measurement is rounding
     * noise of an exact zero (bytes are whole numbers): it is reported as 0 */
    double ymax = 0;
    for (size_t i = 0; i < n; i++)
        ymax = fmax(ymax, fabs(y[i]));
    f->fixed = my;
    for (size_t j = 0; j < k; j++) {
        double xmax = 0;
        for (size_t i = 0; i < n; i++)
            xmax = fmax(xmax, fabs(x[j][i]));
        coef[j] = A[j][k] / A[j][j] / scale[j];
        if (fabs(coef[j]) * xmax < 1e-9 * ymax)
            coef[j] = 0;
        f->fixed -= coef[j] * mean[j];
    }
    /* bytes are whole: an exact fit's fixed term is an integer up to noise */
    if (fabs(f->fixed - round(f->fixed)) < 1e-9 * ymax)
        f->fixed = round(f->fixed) + 0.0; /* + 0.0: no -0 */
    double ssr = 0, maxr = 0;
    for (size_t i = 0; i < n; i++) {
        double r = y[i] - f->fixed;
        for (size_t j = 0; j < k; j++)
            r -= coef[j] * x[j][i];
        ssr += r * r;
        double rel = y[i] != 0 ? fabs(r) / fabs(y[i]) : fabs(r);
        if (rel > maxr)
            maxr = rel;
    }
    f->slope = coef[0];
    f->r2 = syy > 0 ? 1 - ssr / syy : 1;
    f->max_rel_residual = maxr;
    f->n = n;
    return true;
}

/* The models the fit tries, fullest first, as columns of: 0 B*T*D*b, 1 B*T
 * (bytes per token whatever D: the norms' statistics, int64 ids), 2 the
 * attention's B*H*T^2*b (lm_head: its T position ids), 3 T^2 (a causal mask
 * whatever B). B*T is separable from B*T*D only over points at two or more
 * D; the first model the points determine is used. */
static const signed char fit_heads[][5] = {{0, 1, 2, 3, -1}, {0, 1, 2, -1}, {0, 2, 3, -1},
                                           {0, 2, -1},       {0, 1, -1}};
static const signed char fit_lm[][5] = {{0, 1, 2, -1}, {0, 2, -1}, {0, 1, -1}};
static const signed char fit_plain[][5] = {{0, 1, -1}};

ml_status ml_profile_fit(ml_profile *p, ml_error *err)
{
    /* a run whose every point was skipped (out of device memory) must not
     * write a profile of no layers over a measured one */
    if (!p->nkinds)
        return ml_errorf_at(err, ML_RANGE, 0, 0,
                            "the profile has no measured point (were they all skipped?): a "
                            "profile needs points of at least one layer kind (%s)",
                            ML_PROFILE_KINDS);
    double b = ml_profile_dtype_bytes(p);
    for (size_t i = 0; i < p->nkinds; i++) {
        kindrec *k = &p->kinds[i];
        double *x[FITK_MAX], *y = malloc(k->n * sizeof *y);
        bool ok = y != NULL;
        for (int j = 0; j < FITK_MAX; j++) {
            x[j] = malloc(k->n * sizeof *x[j]);
            ok = ok && x[j];
        }
        if (!ok) {
            for (int j = 0; j < FITK_MAX; j++)
                free(x[j]);
            free(y);
            return ML_NOMEM;
        }
        bool heads = has_attention(k->kind), lm = !strcmp(k->kind, "lm_head");
        for (size_t j = 0; j < k->n; j++) {
            const ml_profile_point *q = &k->pts[j];
            double T = (double)q->T;
            x[0][j] = (double)q->B * T * (double)q->D * b;
            x[1][j] = (double)q->B * T;
            /* lm_head's third term: its position ids, T of them whatever B */
            x[2][j] = lm ? T : (double)q->B * (double)q->H * T * T * b;
            x[3][j] = T * T;
            y[j] = (double)q->saved_bytes;
            heads = heads && q->H > 0;
        }
        const signed char(*models)[5] = heads ? fit_heads : lm ? fit_lm : fit_plain;
        size_t nmodels = heads ? sizeof fit_heads / sizeof fit_heads[0]
                       : lm    ? sizeof fit_lm / sizeof fit_lm[0]
                               : sizeof fit_plain / sizeof fit_plain[0];
        double all[FITK_MAX] = {0};
        bool fitted = false;
        for (size_t mi = 0; mi < nmodels && !fitted; mi++) {
            double *cols[FITK_MAX], coef[FITK_MAX] = {0};
            size_t nk = 0;
            while (nk < FITK_MAX && models[mi][nk] >= 0) {
                cols[nk] = x[models[mi][nk]];
                nk++;
            }
            if (fitk(cols, nk, y, k->n, coef, &k->fit)) {
                fitted = true;
                for (size_t c = 0; c < nk; c++)
                    all[models[mi][c]] = coef[c];
            }
        }
        ml_status st = ML_OK;
        if (!fitted)
            st = ml_linfit_points(x[0], y, k->n, &k->fit, err);
        k->tokens = all[1];
        k->attn = heads ? all[2] : 0;
        k->mask = heads ? all[3] : 0;
        k->pos = lm ? all[2] : 0;
        for (int j = 0; j < FITK_MAX; j++)
            free(x[j]);
        free(y);
        if (st) {
            if (err)
                snprintf(err->msg, sizeof err->msg,
                         "layers.%s: the fit needs at least 2 points of different sizes", k->kind);
            return st;
        }
    }
    return ML_OK;
}

double ml_profile_kind_saved(const ml_profile_kind *k, uint64_t B, uint64_t T, uint64_t D,
                             uint64_t H, unsigned b)
{
    double bt = (double)B * (double)T * (double)b;
    return k->fit.fixed + k->fit.slope * bt * (double)D + k->attn * bt * (double)H * (double)T +
           k->mask * (double)T * (double)T + k->pos * (double)T +
           k->tokens * (double)B * (double)T;
}

size_t ml_profile_kind_count(const ml_profile *p)
{
    return p->nkinds;
}

const ml_profile_kind *ml_profile_kind_at(const ml_profile *p, size_t i)
{
    if (i >= p->nkinds)
        return NULL;
    kindrec *k = (kindrec *)&p->kinds[i];
    k->view.kind = k->kind;
    k->view.npoints = k->n;
    k->view.points = k->pts;
    k->view.fit = k->fit;
    k->view.attn = k->attn;
    k->view.mask = k->mask;
    k->view.pos = k->pos;
    k->view.tokens = k->tokens;
    return &k->view;
}

const ml_profile_kind *ml_profile_find(const ml_profile *p, const char *kind)
{
    for (size_t i = 0; i < p->nkinds; i++)
        if (!strcmp(p->kinds[i].kind, kind))
            return ml_profile_kind_at(p, i);
    return NULL;
}

double ml_profile_achieved_tflops(const ml_profile *p)
{
    double best = 0;
    for (size_t i = 0; i < p->ngemm; i++)
        if (p->gemm[i].tflops > best)
            best = p->gemm[i].tflops;
    return best;
}

double ml_profile_efficiency(const ml_profile *p)
{
    return p->peak_tflops > 0 ? ml_profile_achieved_tflops(p) / p->peak_tflops : 0;
}

size_t ml_profile_gemm_count(const ml_profile *p)
{
    return p->ngemm;
}

const ml_profile_gemm *ml_profile_gemm_at(const ml_profile *p, size_t i)
{
    return i < p->ngemm ? &p->gemm[i] : NULL;
}

/* ---- YAML out */

static void qstr(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fputc('\\', f);
        if ((unsigned char)*s >= 0x20)
            fputc(*s, f);
    }
    fputc('"', f);
}

int ml_profile_write(FILE *f, const ml_profile *p)
{
    fputs("# memledger calibration profile (docs/calibration.md). The fitted values are\n"
          "# recomputed from the raw points when the profile is read.\n",
          f);
    fputs("profile_version: 1\n", f);
    for (int i = 0; i < NKEYS; i++) {
        fprintf(f, "%s: ", meta_keys[i]);
        qstr(f, p->meta[i] ? p->meta[i] : "");
        fputc('\n', f);
    }
    fprintf(f, "peak_tflops: %.17g\nachieved_tflops: %.17g\nefficiency: %.17g\n", p->peak_tflops,
            ml_profile_achieved_tflops(p), ml_profile_efficiency(p));
    fputs("gemm:\n", f);
    for (size_t i = 0; i < p->ngemm; i++)
        fprintf(f, "  - {m: %llu, n: %llu, k: %llu, tflops: %.17g}\n",
                (unsigned long long)p->gemm[i].m, (unsigned long long)p->gemm[i].n,
                (unsigned long long)p->gemm[i].k, p->gemm[i].tflops);
    if (!p->ngemm)
        fputs("  []\n", f);
    fputs("layers:\n", f);
    for (size_t i = 0; i < p->nkinds; i++) {
        const kindrec *k = &p->kinds[i];
        /* the fitted values are informative (recomputed on reading): 10
         * digits for the coefficients, past the fit's rounding noise */
        fprintf(f, "  %s:\n    c: %.10g\n", k->kind, k->fit.slope);
        if (k->attn != 0)
            fprintf(f, "    c_attention: %.10g\n", k->attn);
        if (k->mask != 0)
            fprintf(f, "    c_mask: %.10g\n", k->mask);
        if (k->pos != 0)
            fprintf(f, "    c_positions: %.10g\n", k->pos);
        if (k->tokens != 0)
            fprintf(f, "    c_tokens: %.10g\n", k->tokens);
        fprintf(f, "    fixed_bytes: %.10g\n    r2: %.12g\n    max_rel_residual: %.12g\n"
                   "    points:\n",
                k->fit.fixed, k->fit.r2, k->fit.max_rel_residual);
        for (size_t j = 0; j < k->n; j++) {
            const ml_profile_point *q = &k->pts[j];
            fprintf(f, "      - {B: %llu, T: %llu, D: %llu, ", (unsigned long long)q->B,
                    (unsigned long long)q->T, (unsigned long long)q->D);
            if (q->H)
                fprintf(f, "H: %llu, ", (unsigned long long)q->H);
            if (q->F)
                fprintf(f, "F: %llu, ", (unsigned long long)q->F);
            if (q->cast_bytes)
                fprintf(f, "cast_bytes: %llu, ", (unsigned long long)q->cast_bytes);
            fprintf(f, "saved_bytes: %llu, peak_forward: %llu, "
                       "peak_backward: %llu, peak_step: %llu, device_peak: %llu, time_s: %.9g}\n",
                    (unsigned long long)q->saved_bytes, (unsigned long long)q->peak_forward,
                    (unsigned long long)q->peak_backward, (unsigned long long)q->peak_step,
                    (unsigned long long)q->device_peak, q->time_s);
        }
    }
    if (!p->nkinds)
        fputs("  {}\n", f);
    return ferror(f) ? -1 : 0;
}

/* ---- YAML in */


static const ml_node *get(const ml_node *map, const char *key)
{
    for (size_t i = 0; map && map->type == ML_NODE_MAP && i < map->count; i++)
        if (!strcmp(map->keys[i]->text, key))
            return map->items[i];
    return NULL;
}

static ml_status num(ml_error *err, const ml_node *map, const char *key, const char *where,
                     bool required, double *out)
{
    const ml_node *n = get(map, key);
    if (!n) {
        if (required)
            return ml_error_at(err, map, ML_SCHEMA, "%s.%s: missing", where, key);
        return ML_OK;
    }
    char *end = NULL;
    errno = 0;
    double v = n->type == ML_NODE_SCALAR ? strtod(n->text, &end) : NAN;
    if (n->type != ML_NODE_SCALAR || !end || *end || end == n->text || !isfinite(v) || v < 0 ||
        errno)
        return ml_error_at(err, n, ML_SCHEMA, "%s.%s: expected a number >= 0", where, key);
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
        return ml_error_at(err, get(map, key), ML_SCHEMA, "%s.%s: expected a whole number", where, key);
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
        return ml_error_at(err, get(map, key), ML_RANGE,
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
        return ml_error_at(err, get(map, key), ML_RANGE,
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

static ml_status read_profile(const ml_node *r, ml_profile *p, ml_error *err)
{
    if (!r || r->type != ML_NODE_MAP)
        return ml_error_at(err, r, ML_SCHEMA, "a profile is a mapping (profile_version, device, layers, "
                                      "...)");
    static const char *const top[] = {"profile_version", "name", "backend", "device", "dtype",
                                      "driver", "library", "created", "notes", "precision", "peak_tflops",
                                      "achieved_tflops", "efficiency", "gemm", "layers"};
    for (size_t i = 0; i < r->count; i++) {
        size_t j;
        for (j = 0; j < sizeof top / sizeof top[0]; j++)
            if (!strcmp(r->keys[i]->text, top[j]))
                break;
        if (j == sizeof top / sizeof top[0])
            return ml_error_at(err, r->keys[i], ML_SCHEMA, "%s: unknown key in a profile",
                       r->keys[i]->text);
    }
    double ver = 0;
    ml_status st = num(err, r, "profile_version", "profile", true, &ver);
    if (st)
        return st;
    if (ver != 1)
        return ml_error_at(err, get(r, "profile_version"), ML_SCHEMA,
                   "profile_version: %g is not supported (this memledger reads version 1)", ver);
    for (int i = 0; i < NKEYS; i++) {
        const ml_node *n = get(r, meta_keys[i]);
        if (!n)
            continue;
        if (n->type != ML_NODE_SCALAR)
            return ml_error_at(err, n, ML_SCHEMA, "%s: expected a string", meta_keys[i]);
        if (ml_profile_set(p, meta_keys[i], n->text))
            return ml_error_at(err, n, ML_NOMEM, "out of memory");
    }
    const char *dt = ml_profile_get(p, "dtype");
    if (strcmp(dt, "fp32") && strcmp(dt, "bf16") && strcmp(dt, "fp16"))
        return ml_error_at(err, get(r, "dtype") ? get(r, "dtype") : r, ML_SCHEMA,
                   "dtype: '%s' is not fp32, bf16 or fp16", dt);
    const char *pr = ml_profile_get(p, "precision");
    ml_precision pp;
    if (*pr && !ml_precision_parse(pr, &pp))
        return ml_error_at(err, get(r, "precision"), ML_SCHEMA,
                           "precision: '%s' is not a precision policy (fp32, amp-bf16, amp-fp16, "
                           "bf16-master, fp16-master, bf16)",
                           pr);
    double peak = 0;
    if ((st = tflops(err, r, "peak_tflops", "", false, &peak)))
        return st;
    ml_profile_set_peak(p, peak);
    const ml_node *g = get(r, "gemm");
    if (g && g->type != ML_NODE_SEQ)
        return ml_error_at(err, g, ML_SCHEMA, "gemm: expected a list of {m, n, k, tflops}");
    for (size_t i = 0; g && i < g->count; i++) {
        ml_profile_gemm q;
        if ((st = u64(err, g->items[i], "m", "gemm[]", true, &q.m)) ||
            (st = u64(err, g->items[i], "n", "gemm[]", true, &q.n)) ||
            (st = u64(err, g->items[i], "k", "gemm[]", true, &q.k)) ||
            (st = tflops(err, g->items[i], "tflops", "gemm[]", true, &q.tflops)))
            return st;
        if (ml_profile_add_gemm(p, &q))
            return ml_error_at(err, g, ML_NOMEM, "out of memory");
    }
    const ml_node *ls = get(r, "layers");
    if (!ls || ls->type != ML_NODE_MAP)
        return ml_error_at(err, ls ? ls : r, ML_SCHEMA, "layers: missing; a profile maps layer kinds (%s) "
                                                "to their measured points",
                   ML_PROFILE_KINDS);
    if (!ls->count)
        return ml_error_at(err, ls, ML_SCHEMA,
                           "layers: no layer kind; a profile maps layer kinds (%s) to their "
                           "measured points",
                           ML_PROFILE_KINDS);
    const ml_node *seen[sizeof kinds_known / sizeof kinds_known[0]] = {NULL};
    for (size_t i = 0; i < ls->count; i++) {
        const char *kind = ls->keys[i]->text;
        size_t ki = 0;
        while (ki < sizeof kinds_known / sizeof kinds_known[0] && strcmp(kinds_known[ki], kind))
            ki++;
        if (ki == sizeof kinds_known / sizeof kinds_known[0])
            return ml_error_at(err, ls->keys[i], ML_SCHEMA,
                               "layers.%s: unknown layer kind; expected one of: %s", kind,
                               ML_PROFILE_KINDS);
        /* both lists were merged into one fit (a second transformer_block
         * 1000 times larger flipped gpt2-small's verdict unnoticed) */
        if (seen[ki])
            return ml_error_at(err, ls->keys[i], ML_SCHEMA,
                               "layers.%s: given twice (first at line %u, column %u); merge the "
                               "two lists of points under one key",
                               kind, seen[ki]->line, seen[ki]->col);
        seen[ki] = ls->keys[i];
        const ml_node *k = ls->items[i];
        const ml_node *pts = get(k, "points");
        if (!pts || pts->type != ML_NODE_SEQ)
            return ml_error_at(err, k ? k : ls->keys[i], ML_SCHEMA, "layers.%s.points: missing", kind);
        for (size_t j = 0; j < pts->count; j++) {
            const ml_node *q = pts->items[j];
            ml_profile_point pt;
            memset(&pt, 0, sizeof pt);
            char where[64];
            snprintf(where, sizeof where, "layers.%s.points[%zu]", kind, j);
            if (!q || q->type != ML_NODE_MAP)
                return ml_error_at(err, q, ML_SCHEMA, "%s: expected a mapping", where);
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
                return ml_error_at(err, q, ML_RANGE, "%s: B, T and D must be at least 1 and within "
                                             "memledger's limits",
                           where);
            st = ml_profile_add_point(p, kind, &pt);
            if (st == ML_USAGE)
                return ml_error_at(err, ls->keys[i], ML_SCHEMA, "layers.%s: unknown layer kind; "
                                                        "expected one of: %s",
                           kind, ML_PROFILE_KINDS);
            if (st)
                return ml_error_at(err, q, ML_NOMEM, "out of memory");
        }
        /* the fit needs B*T*D to vary: with one size every model's first
         * column is constant (and a B*T*D past 2^53 rounded apart made a
         * fit of noise) */
        const kindrec *kr = kind_of(p, kind, false);
        size_t np = kr ? kr->n : 0, j = 1;
        while (j < np && same_size(&kr->pts[0], &kr->pts[j]))
            j++;
        if (j >= np) {
            char sz[96] = "";
            if (np > 1)
                snprintf(sz, sizeof sz, ", all of one size B*T*D = %llu*%llu*%llu",
                         (unsigned long long)kr->pts[0].B, (unsigned long long)kr->pts[0].T,
                         (unsigned long long)kr->pts[0].D);
            return ml_error_at(err, ls->keys[i], ML_RANGE,
                               "layers.%s: %zu point%s%s; the fit needs at least 2 points of "
                               "different sizes B*T*D: measure at another micro-batch or "
                               "sequence length",
                               kind, np, np == 1 ? "" : "s", sz);
        }
    }
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
    ml_status st = ml_tree_parse(text, len, &root, err);
    if (st)
        return st;
    ml_profile *p = ml_profile_new();
    if (!p) {
        ml_tree_free(root);
        return ml_error_at(err, NULL, ML_NOMEM, "out of memory");
    }
    /* a key given twice anywhere is refused, not read either way (a layer
     * kind twice gets its own message from read_profile) */
    st = read_profile(root, p, err);
    if (st == ML_OK)
        st = ml_tree_check_unique(err, root);
    ml_tree_free(root);
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
    char *buf = ml_read_file(path, &len, err);
    if (!buf)
        return err->code;
    ml_status st = ml_profile_load_string(buf, len, path, out, err);
    free(buf);
    return st;
}
