// CUDA kernels of the calibration runner, with the C launchers kernels.h
// declares (most are backend entry points as they stand). Row-major fp32;
// grid-stride loops; one thread per row for the row-wise ops (correctness and
// measurement, not peak speed).
#include <stdint.h>

#include "kernels.h"

#define GRID(n) (unsigned)(((n) + 255) / 256 > 4096 ? 4096 : ((n) + 255) / 256), 256
#define LOOP(i, n) for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); \
                        i += (size_t)blockDim.x * gridDim.x)

__device__ static uint32_t hash32(uint64_t seed, uint64_t i)
{
    uint64_t z = seed + i * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (uint32_t)((z ^ (z >> 31)) >> 32);
}

// fp32 <-> bf16 with the same rounding as ml_bf16_of (backend.h): nearest
// even on the top 16 bits, NaN kept quiet
__global__ void k_to_bf16(const float *x, uint16_t *y, size_t n)
{
    LOOP(i, n)
    {
        uint32_t u = __float_as_uint(x[i]);
        if ((u & 0x7fffffffu) > 0x7f800000u)
            y[i] = (uint16_t)((u >> 16) | 0x40u);
        else
            y[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
}
__global__ void k_from_bf16(const uint16_t *x, float *y, size_t n)
{
    LOOP(i, n) y[i] = __uint_as_float((uint32_t)x[i] << 16);
}
__global__ void k_add(const float *a, const float *b, float *y, size_t n)
{
    LOOP(i, n) y[i] = a[i] + b[i];
}
__global__ void k_bias_add(float *y, const float *bias, size_t rows, size_t cols)
{
    LOOP(i, rows * cols) y[i] += bias[i % cols];
}
__global__ void k_bias_grad(const float *dy, float *db, size_t rows, size_t cols)
{
    LOOP(c, cols)
    {
        float s = 0;
        for (size_t r = 0; r < rows; r++)
            s += dy[r * cols + c];
        db[c] += s;
    }
}
__global__ void k_gelu_fwd(const float *x, float *y, size_t n)
{
    LOOP(i, n)
    {
        float v = x[i];
        y[i] = 0.5f * v * (1.0f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v)));
    }
}
__global__ void k_gelu_bwd(const float *x, const float *dy, float *dx, size_t n)
{
    LOOP(i, n)
    {
        float v = x[i], u = 0.7978845608f * (v + 0.044715f * v * v * v), t = tanhf(u);
        float du = 0.7978845608f * (1.0f + 3.0f * 0.044715f * v * v);
        dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
    }
}
__global__ void k_ln_fwd(const float *x, const float *g, const float *b, float *y, float *mean,
                         float *rstd, size_t rows, size_t cols)
{
    LOOP(r, rows)
    {
        const float *xr = x + r * cols;
        double m = 0, v = 0;
        for (size_t c = 0; c < cols; c++)
            m += xr[c];
        m /= (double)cols;
        for (size_t c = 0; c < cols; c++)
            v += (xr[c] - m) * (xr[c] - m);
        v /= (double)cols;
        float rs = (float)rsqrt(v + 1e-5);
        mean[r] = (float)m;
        rstd[r] = rs;
        for (size_t c = 0; c < cols; c++)
            y[r * cols + c] = ((xr[c] - (float)m) * rs) * g[c] + b[c];
    }
}
__global__ void k_ln_bwd_rows(const float *x, const float *g, const float *mean, const float *rstd,
                              const float *dy, float *dx, size_t rows, size_t cols)
{
    LOOP(r, rows)
    {
        const float *xr = x + r * cols, *dyr = dy + r * cols;
        double s1 = 0, s2 = 0;
        for (size_t c = 0; c < cols; c++) {
            float xh = (xr[c] - mean[r]) * rstd[r], dxh = dyr[c] * g[c];
            s1 += dxh;
            s2 += dxh * xh;
        }
        for (size_t c = 0; c < cols; c++) {
            float xh = (xr[c] - mean[r]) * rstd[r], dxh = dyr[c] * g[c];
            dx[r * cols + c] = rstd[r] * (dxh - (float)(s1 / cols) - xh * (float)(s2 / cols));
        }
    }
}
__global__ void k_ln_bwd_cols(const float *x, const float *mean, const float *rstd,
                              const float *dy, float *dg, float *db, size_t rows, size_t cols)
{
    LOOP(c, cols)
    {
        float sg = 0, sb = 0;
        for (size_t r = 0; r < rows; r++) {
            float xh = (x[r * cols + c] - mean[r]) * rstd[r];
            sg += dy[r * cols + c] * xh;
            sb += dy[r * cols + c];
        }
        dg[c] += sg;
        db[c] += sb;
    }
}
__global__ void k_softmax_fwd(const float *S, float *P, size_t rows, size_t T, float scale)
{
    LOOP(i, rows)
    {
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
__global__ void k_softmax_bwd(const float *P, const float *dP, float *dS, size_t rows, size_t T,
                              float scale)
{
    LOOP(i, rows)
    {
        const float *p = P + i * T, *dp = dP + i * T;
        double dot = 0;
        for (size_t c = 0; c < T; c++)
            dot += (double)p[c] * dp[c];
        for (size_t c = 0; c < T; c++)
            dS[i * T + c] = scale * p[c] * (dp[c] - (float)dot);
    }
}
__global__ void k_dropout_fwd(const float *x, uint8_t *mask, float *y, size_t n, uint32_t thr,
                              float s, uint64_t seed)
{
    LOOP(i, n)
    {
        uint8_t k = hash32(seed, i) >= thr;
        mask[i] = k;
        y[i] = k ? x[i] * s : 0.0f;
    }
}
__global__ void k_dropout_bwd(const uint8_t *mask, const float *dy, float *dx, size_t n, float s)
{
    LOOP(i, n) dx[i] = mask[i] ? dy[i] * s : 0.0f;
}
__global__ void k_permute(const float *src, float *dst, size_t B, size_t T, size_t H, size_t dh,
                          size_t stride, size_t off, int to_heads)
{
    LOOP(q, B * H * T * dh)
    {
        size_t e = q % dh, t = (q / dh) % T, h = (q / (dh * T)) % H, b = q / (dh * T * H);
        size_t r = (b * T + t) * stride + off + h * dh + e;
        if (to_heads)
            dst[q] = src[r];
        else
            dst[r] = src[q];
    }
}
__global__ void k_emb_fwd(const int64_t *ids, const float *W, float *y, size_t n, size_t D)
{
    LOOP(i, n * D) y[i] = W[(size_t)ids[i / D] * D + i % D];
}
__global__ void k_emb_bwd(const int64_t *ids, const float *dy, float *dW, size_t n, size_t D)
{
    LOOP(i, n * D) atomicAdd(&dW[(size_t)ids[i / D] * D + i % D], dy[i]);
}
__global__ void k_xent_fwd(const float *l, const int64_t *tgt, float *logp, float *nll,
                           size_t rows, size_t V)
{
    LOOP(r, rows)
    {
        float mx = -INFINITY;
        for (size_t v = 0; v < V; v++)
            mx = fmaxf(mx, l[r * V + v]);
        double s = 0;
        for (size_t v = 0; v < V; v++)
            s += exp((double)(l[r * V + v] - mx));
        float lse = mx + (float)log(s);
        for (size_t v = 0; v < V; v++)
            logp[r * V + v] = l[r * V + v] - lse;
        nll[r] = -logp[r * V + (size_t)tgt[r]];
    }
}
__global__ void k_xent_bwd(const float *logp, const int64_t *tgt, float *dl, size_t rows, size_t V)
{
    LOOP(i, rows * V)
    {
        size_t r = i / V, v = i % V;
        dl[i] = (expf(logp[i]) - (v == (size_t)tgt[r])) / (float)rows;
    }
}
__global__ void k_adam(float *p, const float *g, float *m, float *v, size_t n, float lr, float b1,
                       float b2, float eps, float bc1, float bc2)
{
    LOOP(i, n)
    {
        m[i] = b1 * m[i] + (1 - b1) * g[i];
        v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
        p[i] -= lr * (m[i] / bc1) / (sqrtf(v[i] / bc2) + eps);
    }
}

__global__ void k_rms_fwd(const float *x, const float *w, float *rs_out, float *h, float *y,
                          size_t rows, size_t cols)
{
    LOOP(r, rows)
    {
        double ss = 0;
        for (size_t c = 0; c < cols; c++)
            ss += (double)x[r * cols + c] * x[r * cols + c];
        float rs = (float)rsqrt(ss / cols + 1e-6);
        rs_out[r] = rs;
        for (size_t c = 0; c < cols; c++) {
            h[r * cols + c] = x[r * cols + c] * rs;
            y[r * cols + c] = w[c] * h[r * cols + c];
        }
    }
}
__global__ void k_rms_bwd_rows(const float *h, const float *rsqrt, const float *w, const float *dy,
                               float *dx, size_t rows, size_t cols)
{
    LOOP(r, rows)
    {
        double dot = 0;
        for (size_t c = 0; c < cols; c++)
            dot += (double)dy[r * cols + c] * w[c] * h[r * cols + c];
        float m = (float)(dot / cols);
        for (size_t c = 0; c < cols; c++)
            dx[r * cols + c] = rsqrt[r] * (dy[r * cols + c] * w[c] - h[r * cols + c] * m);
    }
}
__global__ void k_rms_bwd_cols(const float *h, const float *dy, float *dw, size_t rows, size_t cols)
{
    LOOP(c, cols)
    {
        float s = 0;
        for (size_t r = 0; r < rows; r++)
            s += dy[r * cols + c] * h[r * cols + c];
        dw[c] += s;
    }
}
__global__ void k_silu_fwd(const float *x, float *y, size_t n)
{
    LOOP(i, n) y[i] = x[i] / (1.0f + expf(-x[i]));
}
__global__ void k_silu_bwd(const float *x, const float *dy, float *dx, size_t n)
{
    LOOP(i, n)
    {
        float sg = 1.0f / (1.0f + expf(-x[i]));
        dx[i] = dy[i] * sg * (1.0f + x[i] * (1.0f - sg));
    }
}
__global__ void k_mul(const float *a, const float *b, float *y, size_t n)
{
    LOOP(i, n) y[i] = a[i] * b[i];
}
__global__ void k_repeat_fwd(const float *src, float *dst, size_t B, size_t KV, size_t rep,
                             size_t blk)
{
    LOOP(i, B * KV * rep * blk)
    {
        size_t e = i % blk, hr = i / blk; /* (b*KV + k)*rep + r */
        dst[i] = src[(hr / rep) * blk + e];
    }
}
__global__ void k_repeat_bwd(const float *src, float *dst, size_t B, size_t KV, size_t rep,
                             size_t blk)
{
    LOOP(i, B * KV * blk)
    {
        size_t e = i % blk, hk = i / blk;
        float s = 0;
        for (size_t r = 0; r < rep; r++)
            s += src[(hk * rep + r) * blk + e];
        dst[i] = s;
    }
}

// The backend entry points: `be` is unused on CUDA (one device, the
// default stream).
void ml_cu_rms_fwd(ml_backend *, const float *x, const float *w, float *rsqrt, float *h,
                   float *y, size_t rows, size_t cols)
{
    k_rms_fwd<<<GRID(rows)>>>(x, w, rsqrt, h, y, rows, cols);
}
void ml_cu_rms_bwd(ml_backend *, const float *h, const float *rsqrt, const float *w,
                   const float *dy, float *dx, float *dw, size_t rows, size_t cols)
{
    k_rms_bwd_rows<<<GRID(rows)>>>(h, rsqrt, w, dy, dx, rows, cols);
    k_rms_bwd_cols<<<GRID(cols)>>>(h, dy, dw, rows, cols);
}
void ml_cu_silu_fwd(ml_backend *, const float *x, float *y, size_t n)
{
    k_silu_fwd<<<GRID(n)>>>(x, y, n);
}
void ml_cu_silu_bwd(ml_backend *, const float *x, const float *dy, float *dx, size_t n)
{
    k_silu_bwd<<<GRID(n)>>>(x, dy, dx, n);
}
void ml_cu_mul(ml_backend *, const float *a, const float *b, float *y, size_t n)
{
    k_mul<<<GRID(n)>>>(a, b, y, n);
}
void ml_cu_cast(ml_backend *, const void *src, void *dst, size_t n, bool to_bf16)
{
    if (to_bf16)
        k_to_bf16<<<GRID(n)>>>((const float *)src, (uint16_t *)dst, n);
    else
        k_from_bf16<<<GRID(n)>>>((const uint16_t *)src, (float *)dst, n);
}
void ml_cu_repeat(ml_backend *, const float *src, float *dst, size_t B, size_t KV, size_t rep,
                  size_t T, size_t dh, bool backward)
{
    if (backward)
        k_repeat_bwd<<<GRID(B * KV * T * dh)>>>(src, dst, B, KV, rep, T * dh);
    else
        k_repeat_fwd<<<GRID(B * KV * rep * T * dh)>>>(src, dst, B, KV, rep, T * dh);
}
void ml_cu_add(ml_backend *, const float *a, const float *b, float *y, size_t n)
{
    k_add<<<GRID(n)>>>(a, b, y, n);
}
void ml_cu_bias_add(ml_backend *, float *y, const float *bias, size_t rows, size_t cols)
{
    k_bias_add<<<GRID(rows * cols)>>>(y, bias, rows, cols);
}
void ml_cu_bias_grad(ml_backend *, const float *dy, float *db, size_t rows, size_t cols)
{
    k_bias_grad<<<GRID(cols)>>>(dy, db, rows, cols);
}
void ml_cu_gelu_fwd(ml_backend *, const float *x, float *y, size_t n)
{
    k_gelu_fwd<<<GRID(n)>>>(x, y, n);
}
void ml_cu_gelu_bwd(ml_backend *, const float *x, const float *dy, float *dx, size_t n)
{
    k_gelu_bwd<<<GRID(n)>>>(x, dy, dx, n);
}
void ml_cu_ln_fwd(ml_backend *, const float *x, const float *g, const float *b, float *y,
                  float *mean, float *rstd, size_t rows, size_t cols)
{
    k_ln_fwd<<<GRID(rows)>>>(x, g, b, y, mean, rstd, rows, cols);
}
void ml_cu_ln_bwd(ml_backend *, const float *x, const float *g, const float *mean,
                  const float *rstd, const float *dy, float *dx, float *dg, float *db, size_t rows,
                  size_t cols)
{
    k_ln_bwd_rows<<<GRID(rows)>>>(x, g, mean, rstd, dy, dx, rows, cols);
    k_ln_bwd_cols<<<GRID(cols)>>>(x, mean, rstd, dy, dg, db, rows, cols);
}
void ml_cu_softmax_fwd(ml_backend *, const float *S, float *P, size_t bh, size_t T, float scale)
{
    k_softmax_fwd<<<GRID(bh * T)>>>(S, P, bh * T, T, scale);
}
void ml_cu_softmax_bwd(ml_backend *, const float *P, const float *dP, float *dS, size_t bh,
                       size_t T, float scale)
{
    k_softmax_bwd<<<GRID(bh * T)>>>(P, dP, dS, bh * T, T, scale);
}
void ml_cu_dropout_fwd(ml_backend *, const float *x, uint8_t *mask, float *y, size_t n, float p,
                       uint64_t seed)
{
    k_dropout_fwd<<<GRID(n)>>>(x, mask, y, n, (uint32_t)(p * 4294967296.0), 1.0f / (1.0f - p),
                               seed);
}
void ml_cu_dropout_bwd(ml_backend *, const uint8_t *mask, const float *dy, float *dx, size_t n,
                       float p)
{
    k_dropout_bwd<<<GRID(n)>>>(mask, dy, dx, n, 1.0f / (1.0f - p));
}
void ml_cu_permute(ml_backend *, const float *src, float *dst, size_t B, size_t T, size_t H,
                   size_t dh, size_t stride, size_t off, bool to_heads)
{
    k_permute<<<GRID(B * H * T * dh)>>>(src, dst, B, T, H, dh, stride, off, to_heads);
}
void ml_cu_emb_fwd(ml_backend *, const int64_t *ids, const float *W, float *y, size_t n, size_t D)
{
    k_emb_fwd<<<GRID(n * D)>>>(ids, W, y, n, D);
}
void ml_cu_emb_bwd(ml_backend *, const int64_t *ids, const float *dy, float *dW, size_t n,
                   size_t D)
{
    k_emb_bwd<<<GRID(n * D)>>>(ids, dy, dW, n, D);
}
void ml_cu_xent_bwd(ml_backend *, const float *logp, const int64_t *tgt, float *dl, size_t rows,
                    size_t V)
{
    k_xent_bwd<<<GRID(rows * V)>>>(logp, tgt, dl, rows, V);
}

// Helpers backend_cuda.c wraps.
void ml_cu_xent_fwd(const float *l, const int64_t *tgt, float *logp, float *nll, size_t rows,
                    size_t V)
{
    k_xent_fwd<<<GRID(rows)>>>(l, tgt, logp, nll, rows, V);
}
void ml_cu_adam(float *p, const float *g, float *m, float *v, size_t n, float lr, float b1,
                float b2, float eps, float bc1, float bc2)
{
    k_adam<<<GRID(n)>>>(p, g, m, v, n, lr, b1, b2, eps, bc1, bc2);
}
