/* Calibration profiles: built by the runner, fitted, saved as YAML (read back
 * by profile_read.c). The fitted values are always recomputed from the raw
 * points. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memledger/calib.h"
#include "memledger/model.h"
#include "profile/profile_internal.h"
#include "util/error.h"
#include "util/grow.h"

#define NKEYS ML_PROFILE_NMETA
const char *const ml__profile_meta_keys[NKEYS] = {"name",    "backend", "device", "dtype",
                                                 "driver",  "library", "created", "notes",
                                                 "precision"};

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
    ml_profile_host host;
    bool has_host;
    double memory_gbps;
};

static const char *const kind_names[ML_PK_COUNT] = {
    [ML_PK_LINEAR] = "linear",           [ML_PK_MLP] = "mlp",
    [ML_PK_TRANSFORMER_BLOCK] = "transformer_block", [ML_PK_LM_HEAD] = "lm_head",
    [ML_PK_LLAMA_BLOCK] = "llama_block"};

const char *ml_profile_kind_name(ml_profile_kind_id k)
{
    return (unsigned)k < ML_PK_COUNT ? kind_names[k] : NULL;
}

bool ml_profile_kind_parse(const char *name, ml_profile_kind_id *out)
{
    for (unsigned i = 0; i < ML_PK_COUNT; i++)
        if (!strcmp(name, kind_names[i])) {
            *out = (ml_profile_kind_id)i;
            return true;
        }
    return false;
}

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
        if (!strcmp(ml__profile_meta_keys[i], key))
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
    ml_profile_kind_id id;
    bool known = ml_profile_kind_parse(kind, &id);
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

void ml_profile_set_host(ml_profile *p, const ml_profile_host *h)
{
    p->host = *h;
    p->has_host = true;
}

const ml_profile_host *ml_profile_host_costs(const ml_profile *p)
{
    return p->has_host ? &p->host : NULL;
}

void ml_profile_set_memory_gbps(ml_profile *p, double gbps)
{
    p->memory_gbps = gbps > 0 && isfinite(gbps) ? gbps : 0;
}

double ml_profile_memory_gbps(const ml_profile *p)
{
    return p->memory_gbps;
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
    return !strcmp(kind, ml_profile_kind_name(ML_PK_TRANSFORMER_BLOCK)) ||
           !strcmp(kind, ml_profile_kind_name(ML_PK_LLAMA_BLOCK));
}

#define FITK_MAX 4

/* The columns' means and spreads (mean[j], scale[j]) and y's mean, *my.
 * False when a column does not vary over the points. */
static bool centre(double *const *x, size_t k, const double *y, size_t n, double *mean,
                   double *scale, double *my)
{
    *my = 0;
    for (size_t i = 0; i < n; i++) {
        *my += y[i];
        for (size_t j = 0; j < k; j++)
            mean[j] += x[j][i];
    }
    *my /= (double)n;
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
    return true;
}

/* Gauss-Jordan elimination of A (k x k) | rhs with partial pivoting, in
 * place: A[j][k] / A[j][j] is then unknown j. False when A is singular. */
static bool eliminate(double A[FITK_MAX][FITK_MAX + 1], size_t k)
{
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
    return true;
}

/* f's r2 (syy: y's sum of squares about its mean), largest relative
 * residual and count, from the fitted f->fixed and coef. */
static void residuals(double *const *x, size_t k, const double *y, size_t n, const double *coef,
                      double syy, ml_linfit *f)
{
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
}

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
    if (!centre(x, k, y, n, mean, scale, &my))
        return false;
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
    if (!eliminate(A, k))
        return false;
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
    residuals(x, k, y, n, coef, syy, f);
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
        return ml__errorf_at(err, ML_RANGE, 0, 0,
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
        bool heads = has_attention(k->kind), lm = !strcmp(k->kind, ml_profile_kind_name(ML_PK_LM_HEAD));
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
        fprintf(f, "%s: ", ml__profile_meta_keys[i]);
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
    if (p->memory_gbps > 0)
        fprintf(f, "memory_gbps: %.17g\n", p->memory_gbps);
    if (p->has_host)
        fprintf(f,
                "host:\n  forward_op_us: %.10g\n  backward_op_us: %.10g\n  forward_block_us: "
                "%.10g\n  backward_block_us: %.10g\n  recompute_block_us: %.10g\n  "
                "step_call_us: %.10g\n  step_tensor_us: %.10g\n",
                p->host.forward_op_s * 1e6, p->host.backward_op_s * 1e6,
                p->host.forward_block_s * 1e6, p->host.backward_block_s * 1e6,
                p->host.recompute_block_s * 1e6, p->host.step_call_s * 1e6,
                p->host.step_tensor_s * 1e6);
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

/* docs/devices.md, "Step time": with no device at all, the profile's device
 * is the plan's; a named device must be the profile's by driver name. */
static bool same_nocase(const char *a, const char *b)
{
    while (*a && tolower((unsigned char)*a) == tolower((unsigned char)*b))
        a++, b++;
    return tolower((unsigned char)*a) == tolower((unsigned char)*b);
}

const char *ml_profile_time_mismatch(const ml_profile *p, const ml_config *cfg)
{
    const ml_device *dv = &cfg->device;
    const char *pdev = ml_profile_get(p, "device");
    const char *pdt = ml_profile_get(p, "dtype");
    if (dv->present && !dv->preset)
        return "the device is given by its size only; name it (--device h200) to use a profile "
               "measured on it";
    if (dv->present && (!pdev || !same_nocase(pdev, dv->preset->product)))
        return "the profile was measured on another device";
    ml_compute_dtype c = ml_precision_compute_dtype(cfg->training.precision);
    if (pdt && *pdt && strcmp(pdt, ml_compute_dtype_name(c)))
        return "the profile's GEMMs ran at another dtype than the plan's";
    return NULL;
}
