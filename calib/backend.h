/* The calibration runner's backend interface: memory, GEMMs and the
 * elementwise kernels the layers need. One CPU implementation (CBLAS + C)
 * and one CUDA implementation (cuBLAS + kernels); the layer code above is
 * written once. Row-major; tensors are fp32 except the bf16 copies autocast
 * keeps (layers.c), which only `cast` and `gemm_mixed` read or write. */
#ifndef ML_CALIB_BACKEND_H
#define ML_CALIB_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct ml_backend ml_backend;
struct ml_backend {
    const char *name; /* "cpu" or "cuda" */
    char device[128];  /* human name of the device */
    char library[128]; /* BLAS library and version */
    char driver[64];
    void *impl;

    void *(*alloc)(ml_backend *be, size_t bytes);
    void (*free)(ml_backend *be, void *p);
    void (*upload)(ml_backend *be, void *dst, const void *src, size_t bytes);
    void (*download)(ml_backend *be, void *dst, const void *src, size_t bytes);
    void (*zero)(ml_backend *be, void *p, size_t bytes);
    /* C[M,N] = alpha op(A) op(B) + beta C; op(A) is M x K, op(B) K x N. */
    void (*gemm)(ml_backend *be, bool ta, bool tb, int M, int N, int K, float alpha,
                 const float *A, const float *B, float beta, float *C);
    void (*gemm_batched)(ml_backend *be, bool ta, bool tb, int M, int N, int K, float alpha,
                         const float *A, long sA, const float *B, long sB, float beta, float *C,
                         long sC, int batch);
    /* bf16 GEMM throughput (inputs are uninitialised scratch); NULL when not supported */
    double (*gemm_bf16_tflops)(ml_backend *be, int M, int N, int K, int reps);
    /* n values between fp32 and bf16 (to_bf16: fp32 -> bf16, rounded to
     * nearest even like torch's .to(torch.bfloat16); else bf16 -> fp32) */
    void (*cast)(ml_backend *be, const void *src, void *dst, size_t n, bool to_bf16);
    /* autocast's matmul, strided-batched like gemm_batched: either operand
     * may be bf16 (a_bf16, b_bf16). The product is taken on bf16 values
     * with fp32 accumulation (an fp32 operand is rounded to bf16 first);
     * C is fp32. Sets `failed` when its scratch cannot be allocated. */
    void (*gemm_mixed)(ml_backend *be, bool ta, bool tb, int M, int N, int K, float alpha,
                       const void *A, bool a_bf16, long sA, const void *B, bool b_bf16, long sB,
                       float beta, float *C, long sC, int batch);
    bool failed; /* a kernel could not run: the measurement is void */

    void (*add)(ml_backend *be, const float *a, const float *b, float *y, size_t n);
    void (*bias_add)(ml_backend *be, float *y, const float *bias, size_t rows, size_t cols);
    void (*bias_grad)(ml_backend *be, const float *dy, float *db, size_t rows, size_t cols);
    void (*gelu_fwd)(ml_backend *be, const float *x, float *y, size_t n);
    void (*gelu_bwd)(ml_backend *be, const float *x, const float *dy, float *dx, size_t n);
    void (*layernorm_fwd)(ml_backend *be, const float *x, const float *g, const float *b,
                          float *y, float *mean, float *rstd, size_t rows, size_t cols);
    /* dx = LN'(dy); dg, db accumulate */
    void (*layernorm_bwd)(ml_backend *be, const float *x, const float *g, const float *mean,
                          const float *rstd, const float *dy, float *dx, float *dg, float *db,
                          size_t rows, size_t cols);
    /* P = softmax(scale * S) over each row of T, causal (col > row masked) */
    void (*softmax_fwd)(ml_backend *be, const float *S, float *P, size_t bh, size_t T, float scale);
    /* dS = scale * P * (dP - sum(dP * P)) */
    void (*softmax_bwd)(ml_backend *be, const float *P, const float *dP, float *dS, size_t bh,
                        size_t T, float scale);
    void (*dropout_fwd)(ml_backend *be, const float *x, uint8_t *mask, float *y, size_t n,
                        float p, uint64_t seed);
    void (*dropout_bwd)(ml_backend *be, const uint8_t *mask, const float *dy, float *dx,
                        size_t n, float p);
    /* rows (B, T, stride, offset) <-> heads (B, H, T, dh); to_heads copies
     * rows into heads, otherwise heads into rows */
    void (*permute)(ml_backend *be, const float *src, float *dst, size_t B, size_t T, size_t H,
                    size_t dh, size_t stride, size_t off, bool to_heads);
    void (*embedding_fwd)(ml_backend *be, const int64_t *ids, const float *W, float *y, size_t n,
                          size_t D);
    void (*embedding_bwd)(ml_backend *be, const int64_t *ids, const float *dy, float *dW,
                          size_t n, size_t D);
    /* logp = log_softmax(logits); loss = mean nll */
    void (*xent_fwd)(ml_backend *be, const float *logits, const int64_t *tgt, float *logp,
                     float *loss, size_t rows, size_t V);
    void (*xent_bwd)(ml_backend *be, const float *logp, const int64_t *tgt, float *dlogits,
                     size_t rows, size_t V);
    /* Llama-style pieces: RMSNorm (rsqrt per row, h = x * rsqrt, y = w * h),
     * SiLU, an elementwise product, and repeating kv heads for GQA */
    void (*rmsnorm_fwd)(ml_backend *be, const float *x, const float *w, float *rsqrt, float *h,
                        float *y, size_t rows, size_t cols);
    /* dx = d/dx, dw accumulates */
    void (*rmsnorm_bwd)(ml_backend *be, const float *h, const float *rsqrt, const float *w,
                        const float *dy, float *dx, float *dw, size_t rows, size_t cols);
    void (*silu_fwd)(ml_backend *be, const float *x, float *y, size_t n);
    void (*silu_bwd)(ml_backend *be, const float *x, const float *dy, float *dx, size_t n);
    void (*mul)(ml_backend *be, const float *a, const float *b, float *y, size_t n);
    /* (B, KV, T, dh) -> (B, KV*rep, T, dh); backward sums the copies back */
    void (*repeat_heads)(ml_backend *be, const float *src, float *dst, size_t B, size_t KV,
                         size_t rep, size_t T, size_t dh, bool backward);
    void (*adam)(ml_backend *be, float *p, const float *g, float *m, float *v, size_t n, float lr,
                 float b1, float b2, float eps, int step);
    void (*sync)(ml_backend *be);
    /* the device's own view of used memory (cudaMemGetInfo), 0 on the CPU */
    uint64_t (*device_used)(ml_backend *be);
    void (*destroy)(ml_backend *be);
};

/* NULL when the backend is not built or no device is present; *why says why. */
ml_backend *ml_backend_cpu(const char **why);
ml_backend *ml_backend_cuda(const char **why);

/* bf16 is the top half of an fp32: round to nearest even (NaN stays NaN). */
static inline uint16_t ml_bf16_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float ml_f32_of(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Counter-based dropout: keep element i when hash(seed, i) >= p * 2^32. */
static inline uint32_t ml_dropout_hash(uint64_t seed, uint64_t i)
{
    uint64_t z = seed + i * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (uint32_t)((z ^ (z >> 31)) >> 32);
}

#endif
