/* The CUDA launchers of kernels.cu. Those that take the backend are its
 * entry points as they stand (backend.h signatures, `be` unused); the other
 * two are helpers backend_cuda.c wraps. */
#ifndef ML_CALIB_KERNELS_H
#define ML_CALIB_KERNELS_H

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

void ml_cu_cast(ml_backend *be, const void *src, void *dst, size_t n, bool to_bf16);
void ml_cu_add(ml_backend *be, const float *a, const float *b, float *y, size_t n);
void ml_cu_bias_add(ml_backend *be, float *y, const float *bias, size_t rows, size_t cols);
void ml_cu_bias_grad(ml_backend *be, const float *dy, float *db, size_t rows, size_t cols);
void ml_cu_gelu_fwd(ml_backend *be, const float *x, float *y, size_t n);
void ml_cu_gelu_bwd(ml_backend *be, const float *x, const float *dy, float *dx, size_t n);
void ml_cu_ln_fwd(ml_backend *be, const float *x, const float *g, const float *b, float *y,
                  float *mean, float *rstd, size_t rows, size_t cols);
void ml_cu_ln_bwd(ml_backend *be, const float *x, const float *g, const float *mean,
                  const float *rstd, const float *dy, float *dx, float *dg, float *db, size_t rows,
                  size_t cols);
void ml_cu_softmax_fwd(ml_backend *be, const float *S, float *P, size_t bh, size_t T, float scale);
void ml_cu_softmax_bwd(ml_backend *be, const float *P, const float *dP, float *dS, size_t bh,
                       size_t T, float scale);
void ml_cu_dropout_fwd(ml_backend *be, const float *x, uint8_t *mask, float *y, size_t n, float p,
                       uint64_t seed);
void ml_cu_dropout_bwd(ml_backend *be, const uint8_t *mask, const float *dy, float *dx, size_t n,
                       float p);
void ml_cu_permute(ml_backend *be, const float *src, float *dst, size_t B, size_t T, size_t H,
                   size_t dh, size_t stride, size_t off, bool to_heads);
void ml_cu_emb_fwd(ml_backend *be, const int64_t *ids, const float *W, float *y, size_t n,
                   size_t D);
void ml_cu_emb_bwd(ml_backend *be, const int64_t *ids, const float *dy, float *dW, size_t n,
                   size_t D);
void ml_cu_xent_bwd(ml_backend *be, const float *logp, const int64_t *tgt, float *dl, size_t rows,
                    size_t V);
void ml_cu_rms_fwd(ml_backend *be, const float *x, const float *w, float *rsqrt, float *h,
                   float *y, size_t rows, size_t cols);
void ml_cu_rms_bwd(ml_backend *be, const float *h, const float *rsqrt, const float *w,
                   const float *dy, float *dx, float *dw, size_t rows, size_t cols);
void ml_cu_silu_fwd(ml_backend *be, const float *x, float *y, size_t n);
void ml_cu_silu_bwd(ml_backend *be, const float *x, const float *dy, float *dx, size_t n);
void ml_cu_mul(ml_backend *be, const float *a, const float *b, float *y, size_t n);
void ml_cu_repeat(ml_backend *be, const float *src, float *dst, size_t B, size_t KV, size_t rep,
                  size_t T, size_t dh, bool backward);

/* per-row negative log-likelihoods into nll (device); the caller averages */
void ml_cu_xent_fwd(const float *l, const int64_t *tgt, float *logp, float *nll, size_t rows,
                    size_t V);
/* bc1, bc2: Adam's bias corrections 1 - b^step */
void ml_cu_adam(float *p, const float *g, float *m, float *v, size_t n, float lr, float b1,
                float b2, float eps, float bc1, float bc2);

#ifdef __cplusplus
}
#endif

#endif
