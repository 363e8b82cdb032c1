/* CPU backend: OpenBLAS (CBLAS) GEMMs, plain C elementwise kernels. */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"

static void *cpu_alloc(ml_backend *be, size_t bytes)
{
    (void)be;
    return malloc(bytes ? bytes : 1);
}

static void cpu_free(ml_backend *be, void *p)
{
    (void)be;
    free(p);
}

static void cpu_copy(ml_backend *be, void *dst, const void *src, size_t bytes)
{
    (void)be;
    memcpy(dst, src, bytes);
}

static void cpu_zero(ml_backend *be, void *p, size_t bytes)
{
    (void)be;
    memset(p, 0, bytes);
}

static void cpu_gemm(ml_backend *be, bool ta, bool tb, int M, int N, int K, float alpha,
                     const float *A, const float *B, float beta, float *C)
{
    (void)be;
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M,
                N, K, alpha, A, ta ? M : K, B, tb ? K : N, beta, C, N);
}

static void cpu_gemm_batched(ml_backend *be, bool ta, bool tb, int M, int N, int K, float alpha,
                             const float *A, long sA, const float *B, long sB, float beta,
                             float *C, long sC, int batch)
{
    for (int i = 0; i < batch; i++)
        cpu_gemm(be, ta, tb, M, N, K, alpha, A + i * sA, B + i * sB, beta, C + i * sC);
}

static void cpu_cast(ml_backend *be, const void *src, void *dst, size_t n, bool to_bf16)
{
    (void)be;
    if (to_bf16)
        for (size_t i = 0; i < n; i++)
            ((uint16_t *)dst)[i] = ml_bf16_of(((const float *)src)[i]);
    else
        for (size_t i = 0; i < n; i++)
            ((float *)dst)[i] = ml_f32_of(((const uint16_t *)src)[i]);
}

/* An operand's values as fp32 after rounding to bf16 (n values from p). */
static float *bf16_values(const void *p, bool is_bf16, size_t n)
{
    float *f = malloc((n ? n : 1) * sizeof *f);
    if (!f)
        return NULL;
    for (size_t i = 0; i < n; i++)
        f[i] = is_bf16 ? ml_f32_of(((const uint16_t *)p)[i])
                       : ml_f32_of(ml_bf16_of(((const float *)p)[i]));
    return f;
}

/* bf16 products, fp32 accumulation: the operands are rounded to bf16 and
 * widened back (exact), then multiplied by sgemm. */
static void cpu_gemm_mixed(ml_backend *be, bool ta, bool tb, int M, int N, int K, float alpha,
                           const void *A, bool a_bf16, long sA, const void *B, bool b_bf16,
                           long sB, float beta, float *C, long sC, int batch)
{
    size_t na = (size_t)(batch - 1) * (size_t)sA + (size_t)M * (size_t)K;
    size_t nb = (size_t)(batch - 1) * (size_t)sB + (size_t)K * (size_t)N;
    float *fa = bf16_values(A, a_bf16, na), *fb = bf16_values(B, b_bf16, nb);
    if (fa && fb)
        cpu_gemm_batched(be, ta, tb, M, N, K, alpha, fa, sA, fb, sB, beta, C, sC, batch);
    else
        be->failed = true;
    free(fa);
    free(fb);
}

static void cpu_add(ml_backend *be, const float *a, const float *b, float *y, size_t n)
{
    (void)be;
    for (size_t i = 0; i < n; i++)
        y[i] = a[i] + b[i];
}

static void cpu_bias_add(ml_backend *be, float *y, const float *bias, size_t rows, size_t cols)
{
    (void)be;
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++)
            y[r * cols + c] += bias[c];
}

static void cpu_bias_grad(ml_backend *be, const float *dy, float *db, size_t rows, size_t cols)
{
    (void)be;
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++)
            db[c] += dy[r * cols + c];
}

/* GELU, tanh approximation (F.gelu(approximate='tanh')) */
static void cpu_gelu_fwd(ml_backend *be, const float *x, float *y, size_t n)
{
    (void)be;
    const float k = 0.7978845608f;
    for (size_t i = 0; i < n; i++) {
        float v = x[i];
        y[i] = 0.5f * v * (1.0f + tanhf(k * (v + 0.044715f * v * v * v)));
    }
}

static void cpu_gelu_bwd(ml_backend *be, const float *x, const float *dy, float *dx, size_t n)
{
    (void)be;
    const float k = 0.7978845608f;
    for (size_t i = 0; i < n; i++) {
        float v = x[i], u = k * (v + 0.044715f * v * v * v), t = tanhf(u);
        float du = k * (1.0f + 3.0f * 0.044715f * v * v);
        dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
    }
}

static void cpu_ln_fwd(ml_backend *be, const float *x, const float *g, const float *b, float *y,
                       float *mean, float *rstd, size_t rows, size_t cols)
{
    (void)be;
    for (size_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        double m = 0, v = 0;
        for (size_t c = 0; c < cols; c++)
            m += xr[c];
        m /= (double)cols;
        for (size_t c = 0; c < cols; c++)
            v += (xr[c] - m) * (xr[c] - m);
        v /= (double)cols;
        float rs = (float)(1.0 / sqrt(v + 1e-5));
        mean[r] = (float)m;
        rstd[r] = rs;
        for (size_t c = 0; c < cols; c++)
            y[r * cols + c] = ((xr[c] - (float)m) * rs) * g[c] + b[c];
    }
}

static void cpu_ln_bwd(ml_backend *be, const float *x, const float *g, const float *mean,
                       const float *rstd, const float *dy, float *dx, float *dg, float *db,
                       size_t rows, size_t cols)
{
    (void)be;
    for (size_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols, *dyr = dy + r * cols;
        double s1 = 0, s2 = 0;
        for (size_t c = 0; c < cols; c++) {
            float xh = (xr[c] - mean[r]) * rstd[r];
            float dxh = dyr[c] * g[c];
            s1 += dxh;
            s2 += dxh * xh;
            dg[c] += dyr[c] * xh;
            db[c] += dyr[c];
        }
        for (size_t c = 0; c < cols; c++) {
            float xh = (xr[c] - mean[r]) * rstd[r];
            float dxh = dyr[c] * g[c];
            dx[r * cols + c] =
                rstd[r] * (dxh - (float)(s1 / (double)cols) - xh * (float)(s2 / (double)cols));
        }
    }
}

static void cpu_softmax_fwd(ml_backend *be, const float *S, float *P, size_t bh, size_t T,
                            float scale)
{
    (void)be;
    for (size_t i = 0; i < bh * T; i++) {
        size_t row = i % T;
        const float *s = S + i * T;
        float *p = P + i * T;
        float mx = -INFINITY;
        for (size_t c = 0; c <= row; c++)
            mx = fmaxf(mx, s[c] * scale);
        double sum = 0;
        for (size_t c = 0; c < T; c++) {
            p[c] = c <= row ? expf(s[c] * scale - mx) : 0.0f;
            sum += p[c];
        }
        for (size_t c = 0; c < T; c++)
            p[c] = (float)(p[c] / sum);
    }
}

static void cpu_softmax_bwd(ml_backend *be, const float *P, const float *dP, float *dS, size_t bh,
                            size_t T, float scale)
{
    (void)be;
    for (size_t i = 0; i < bh * T; i++) {
        const float *p = P + i * T, *dp = dP + i * T;
        double dot = 0;
        for (size_t c = 0; c < T; c++)
            dot += (double)p[c] * dp[c];
        for (size_t c = 0; c < T; c++)
            dS[i * T + c] = scale * p[c] * (dp[c] - (float)dot);
    }
}

static void cpu_dropout_fwd(ml_backend *be, const float *x, uint8_t *mask, float *y, size_t n,
                            float p, uint64_t seed)
{
    (void)be;
    uint32_t thr = (uint32_t)(p * 4294967296.0);
    float s = 1.0f / (1.0f - p);
    for (size_t i = 0; i < n; i++) {
        mask[i] = ml_dropout_hash(seed, i) >= thr;
        y[i] = mask[i] ? x[i] * s : 0.0f;
    }
}

static void cpu_dropout_bwd(ml_backend *be, const uint8_t *mask, const float *dy, float *dx,
                            size_t n, float p)
{
    (void)be;
    float s = 1.0f / (1.0f - p);
    for (size_t i = 0; i < n; i++)
        dx[i] = mask[i] ? dy[i] * s : 0.0f;
}

static void cpu_permute(ml_backend *be, const float *src, float *dst, size_t B, size_t T, size_t H,
                        size_t dh, size_t stride, size_t off, bool to_heads)
{
    (void)be;
    for (size_t b = 0; b < B; b++)
        for (size_t t = 0; t < T; t++)
            for (size_t h = 0; h < H; h++)
                for (size_t e = 0; e < dh; e++) {
                    size_t r = (b * T + t) * stride + off + h * dh + e;
                    size_t q = ((b * H + h) * T + t) * dh + e;
                    if (to_heads)
                        dst[q] = src[r];
                    else
                        dst[r] = src[q];
                }
}

static void cpu_emb_fwd(ml_backend *be, const int64_t *ids, const float *W, float *y, size_t n,
                        size_t D)
{
    (void)be;
    for (size_t i = 0; i < n; i++)
        memcpy(y + i * D, W + (size_t)ids[i] * D, D * sizeof *y);
}

static void cpu_emb_bwd(ml_backend *be, const int64_t *ids, const float *dy, float *dW, size_t n,
                        size_t D)
{
    (void)be;
    for (size_t i = 0; i < n; i++)
        for (size_t d = 0; d < D; d++)
            dW[(size_t)ids[i] * D + d] += dy[i * D + d];
}

static void cpu_xent_fwd(ml_backend *be, const float *logits, const int64_t *tgt, float *logp,
                         float *loss, size_t rows, size_t V)
{
    (void)be;
    double total = 0;
    for (size_t r = 0; r < rows; r++) {
        const float *l = logits + r * V;
        float mx = -INFINITY;
        for (size_t v = 0; v < V; v++)
            mx = fmaxf(mx, l[v]);
        double s = 0;
        for (size_t v = 0; v < V; v++)
            s += exp((double)(l[v] - mx));
        float lse = mx + (float)log(s);
        for (size_t v = 0; v < V; v++)
            logp[r * V + v] = l[v] - lse;
        total -= logp[r * V + (size_t)tgt[r]];
    }
    *loss = (float)(total / (double)rows);
}

static void cpu_xent_bwd(ml_backend *be, const float *logp, const int64_t *tgt, float *dl,
                         size_t rows, size_t V)
{
    (void)be;
    for (size_t r = 0; r < rows; r++)
        for (size_t v = 0; v < V; v++)
            dl[r * V + v] = (expf(logp[r * V + v]) - (v == (size_t)tgt[r])) / (float)rows;
}

static void cpu_adam(ml_backend *be, float *p, const float *g, float *m, float *v, size_t n,
                     float lr, float b1, float b2, float eps, int step)
{
    (void)be;
    float bc1 = 1.0f - powf(b1, (float)step), bc2 = 1.0f - powf(b2, (float)step);
    for (size_t i = 0; i < n; i++) {
        m[i] = b1 * m[i] + (1 - b1) * g[i];
        v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
        p[i] -= lr * (m[i] / bc1) / (sqrtf(v[i] / bc2) + eps);
    }
}

static void cpu_rms_fwd(ml_backend *be, const float *x, const float *w, float *rsqrt, float *h,
                        float *y, size_t rows, size_t cols)
{
    (void)be;
    for (size_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        double ss = 0;
        for (size_t c = 0; c < cols; c++)
            ss += (double)xr[c] * xr[c];
        float rs = (float)(1.0 / sqrt(ss / (double)cols + 1e-6));
        rsqrt[r] = rs;
        for (size_t c = 0; c < cols; c++) {
            h[r * cols + c] = xr[c] * rs;
            y[r * cols + c] = w[c] * h[r * cols + c];
        }
    }
}

static void cpu_rms_bwd(ml_backend *be, const float *h, const float *rsqrt, const float *w,
                        const float *dy, float *dx, float *dw, size_t rows, size_t cols)
{
    (void)be;
    for (size_t r = 0; r < rows; r++) {
        const float *hr = h + r * cols, *dyr = dy + r * cols;
        double dot = 0;
        for (size_t c = 0; c < cols; c++) {
            dw[c] += dyr[c] * hr[c];
            dot += (double)dyr[c] * w[c] * hr[c];
        }
        float m = (float)(dot / (double)cols);
        for (size_t c = 0; c < cols; c++)
            dx[r * cols + c] = rsqrt[r] * (dyr[c] * w[c] - hr[c] * m);
    }
}

static void cpu_silu_fwd(ml_backend *be, const float *x, float *y, size_t n)
{
    (void)be;
    for (size_t i = 0; i < n; i++)
        y[i] = x[i] / (1.0f + expf(-x[i]));
}

static void cpu_silu_bwd(ml_backend *be, const float *x, const float *dy, float *dx, size_t n)
{
    (void)be;
    for (size_t i = 0; i < n; i++) {
        float sg = 1.0f / (1.0f + expf(-x[i]));
        dx[i] = dy[i] * sg * (1.0f + x[i] * (1.0f - sg));
    }
}

static void cpu_mul(ml_backend *be, const float *a, const float *b, float *y, size_t n)
{
    (void)be;
    for (size_t i = 0; i < n; i++)
        y[i] = a[i] * b[i];
}

static void cpu_repeat(ml_backend *be, const float *src, float *dst, size_t B, size_t KV,
                       size_t rep, size_t T, size_t dh, bool backward)
{
    (void)be;
    size_t blk = T * dh;
    if (backward)
        memset(dst, 0, B * KV * blk * sizeof *dst);
    for (size_t b = 0; b < B; b++)
        for (size_t k = 0; k < KV; k++)
            for (size_t r = 0; r < rep; r++) {
                const size_t hsrc = (b * KV + k) * blk, hrep = ((b * KV + k) * rep + r) * blk;
                for (size_t e = 0; e < blk; e++) {
                    if (backward)
                        dst[hsrc + e] += src[hrep + e];
                    else
                        dst[hrep + e] = src[hsrc + e];
                }
            }
}

static void cpu_sync(ml_backend *be)
{
    (void)be;
}

static uint64_t cpu_used(ml_backend *be)
{
    (void)be;
    return 0;
}

static void cpu_destroy(ml_backend *be)
{
    free(be);
}

ml_backend *ml_backend_cpu(const char **why)
{
    ml_backend *be = calloc(1, sizeof *be);
    if (!be) {
        *why = "out of memory";
        return NULL;
    }
    be->name = "cpu";
    char *cfg = openblas_get_config();
    snprintf(be->library, sizeof be->library, "%s", cfg ? cfg : "CBLAS");
    snprintf(be->device, sizeof be->device, "cpu (%d OpenBLAS threads)",
             openblas_get_num_threads());
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f))
            if (!strncmp(line, "model name", 10)) {
                char *c = strchr(line, ':');
                if (c) {
                    c += 2;
                    c[strcspn(c, "\n")] = '\0';
                    snprintf(be->device, sizeof be->device, "%s (%d threads)", c,
                             openblas_get_num_threads());
                }
                break;
            }
        fclose(f);
    }
    snprintf(be->driver, sizeof be->driver, "-");
    be->alloc = cpu_alloc;
    be->free = cpu_free;
    be->upload = cpu_copy;
    be->download = cpu_copy;
    be->zero = cpu_zero;
    be->gemm = cpu_gemm;
    be->gemm_batched = cpu_gemm_batched;
    be->gemm_bf16_tflops = NULL;
    be->cast = cpu_cast;
    be->gemm_mixed = cpu_gemm_mixed;
    be->add = cpu_add;
    be->bias_add = cpu_bias_add;
    be->bias_grad = cpu_bias_grad;
    be->gelu_fwd = cpu_gelu_fwd;
    be->gelu_bwd = cpu_gelu_bwd;
    be->layernorm_fwd = cpu_ln_fwd;
    be->layernorm_bwd = cpu_ln_bwd;
    be->softmax_fwd = cpu_softmax_fwd;
    be->softmax_bwd = cpu_softmax_bwd;
    be->dropout_fwd = cpu_dropout_fwd;
    be->dropout_bwd = cpu_dropout_bwd;
    be->permute = cpu_permute;
    be->embedding_fwd = cpu_emb_fwd;
    be->embedding_bwd = cpu_emb_bwd;
    be->xent_fwd = cpu_xent_fwd;
    be->xent_bwd = cpu_xent_bwd;
    be->rmsnorm_fwd = cpu_rms_fwd;
    be->rmsnorm_bwd = cpu_rms_bwd;
    be->silu_fwd = cpu_silu_fwd;
    be->silu_bwd = cpu_silu_bwd;
    be->mul = cpu_mul;
    be->repeat_heads = cpu_repeat;
    be->adam = cpu_adam;
    be->sync = cpu_sync;
    be->device_used = cpu_used;
    be->destroy = cpu_destroy;
    return be;
}
