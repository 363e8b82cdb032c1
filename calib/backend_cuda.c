/* CUDA backend: cuBLAS GEMMs (fp32; autocast's bf16 products and a bf16
 * throughput probe through cublasGemm(StridedBatched)Ex), the kernels of
 * kernels.cu (most assigned as they stand), cudaMemGetInfo for the device's
 * own view of used memory. Host code in plain C. Compiled only when meson
 * finds CUDA and cuBLAS (calib/meson.build). */
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels.h"

typedef struct {
    cublasHandle_t h;
    void *workspace; /* cuBLAS workspace we own, so its size is known */
} cuda_impl;

/* cuBLAS's own recommendation for Hopper is 32 MiB (cuBLAS docs,
 * cublasSetWorkspace); it is allocated before the measurements, so the
 * device view includes it and the profile records it. */
#define ML_CUBLAS_WORKSPACE (32u << 20)

static cublasHandle_t H(ml_backend *be)
{
    return ((cuda_impl *)be->impl)->h;
}

static void *cu_alloc(ml_backend *be, size_t bytes)
{
    (void)be;
    void *p = NULL;
    return cudaMalloc(&p, bytes ? bytes : 1) == cudaSuccess ? p : NULL;
}

static void cu_free(ml_backend *be, void *p)
{
    (void)be;
    if (p)
        cudaFree(p);
}

static void cu_up(ml_backend *be, void *dst, const void *src, size_t bytes)
{
    (void)be;
    cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice);
}

static void cu_down(ml_backend *be, void *dst, const void *src, size_t bytes)
{
    (void)be;
    cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost);
}

static void cu_zero(ml_backend *be, void *p, size_t bytes)
{
    (void)be;
    cudaMemset(p, 0, bytes);
}

/* Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T. */
static void cu_gemm(ml_backend *be, bool ta, bool tb, int M, int N, int K, float alpha,
                    const float *A, const float *B, float beta, float *C)
{
    cublasSgemm(H(be), tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K,
                &alpha, B, tb ? K : N, A, ta ? M : K, &beta, C, N);
}

static void cu_gemm_batched(ml_backend *be, bool ta, bool tb, int M, int N, int K, float alpha,
                            const float *A, long sA, const float *B, long sB, float beta, float *C,
                            long sC, int batch)
{
    cublasSgemmStridedBatched(H(be), tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                              N, M, K, &alpha, B, tb ? K : N, sB, A, ta ? M : K, sA, &beta, C, N,
                              sC, batch);
}

static double cu_gemm_bf16(ml_backend *be, int M, int N, int K, int reps)
{
    void *A = NULL, *B = NULL, *C = NULL;
    size_t a = (size_t)M * K * 2, b = (size_t)K * N * 2, c = (size_t)M * N * 2;
    if (cudaMalloc(&A, a) || cudaMalloc(&B, b) || cudaMalloc(&C, c)) {
        cudaFree(A);
        cudaFree(B);
        cudaFree(C);
        return 0;
    }
    cudaMemset(A, 0, a);
    cudaMemset(B, 0, b);
    float one = 1, zero = 0;
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    struct timespec t0, t1;
    for (int i = -1; i < reps && st == CUBLAS_STATUS_SUCCESS; i++) {
        if (i == 0) {
            cudaDeviceSynchronize();
            clock_gettime(CLOCK_MONOTONIC, &t0);
        }
        st = cublasGemmEx(H(be), CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, &one, B, CUDA_R_16BF, N, A,
                          CUDA_R_16BF, K, &zero, C, CUDA_R_16BF, N, CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT);
    }
    cudaDeviceSynchronize();
    clock_gettime(CLOCK_MONOTONIC, &t1);
    cudaFree(A);
    cudaFree(B);
    cudaFree(C);
    double t = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    return st == CUBLAS_STATUS_SUCCESS && t > 0 ? 2.0 * M * (double)N * K * reps / t / 1e12 : 0;
}

/* An fp32 operand of a mixed GEMM rounded into a bf16 scratch buffer
 * (cudaMalloc'd here; the device view sees it). */
static const void *as_bf16(const void *p, bool is_bf16, size_t n, void **scratch)
{
    *scratch = NULL;
    if (is_bf16)
        return p;
    if (cudaMalloc(scratch, (n ? n : 1) * 2) != cudaSuccess) {
        *scratch = NULL;
        return NULL;
    }
    ml_cu_cast(NULL, p, *scratch, n, true);
    return *scratch;
}

/* cublasGemmStridedBatchedEx on bf16 A and B, fp32 C, fp32 compute; the
 * row-major to column-major swap as in cu_gemm. */
static void cu_gemm_mixed(ml_backend *be, bool ta, bool tb, int M, int N, int K, float alpha,
                          const void *A, bool a_bf16, long sA, const void *B, bool b_bf16, long sB,
                          float beta, float *C, long sC, int batch)
{
    size_t na = (size_t)(batch - 1) * (size_t)sA + (size_t)M * (size_t)K;
    size_t nb = (size_t)(batch - 1) * (size_t)sB + (size_t)K * (size_t)N;
    void *sa, *sb;
    const void *a = as_bf16(A, a_bf16, na, &sa), *b = as_bf16(B, b_bf16, nb, &sb);
    if (!a || !b ||
        cublasGemmStridedBatchedEx(H(be), tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                   ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, b, CUDA_R_16BF,
                                   tb ? K : N, sB, a, CUDA_R_16BF, ta ? M : K, sA, &beta, C,
                                   CUDA_R_32F, N, sC, batch, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
        be->failed = true;
    cudaFree(sa);
    cudaFree(sb);
}

static void cu_xent_fwd(ml_backend *be, const float *l, const int64_t *tgt, float *logp,
                        float *loss, size_t rows, size_t V)
{
    float *nll = NULL;
    *loss = 0;
    if (cudaMalloc((void **)&nll, rows * sizeof *nll) != cudaSuccess) {
        be->failed = true; /* no loss: the measurement is void */
        return;
    }
    ml_cu_xent_fwd(l, tgt, logp, nll, rows, V);
    float *h = malloc(rows * sizeof *h);
    if (h) {
        cu_down(be, h, nll, rows * sizeof *h);
        double s = 0;
        for (size_t r = 0; r < rows; r++)
            s += h[r];
        *loss = (float)(s / (double)rows);
        free(h);
    } else {
        be->failed = true;
    }
    cudaFree(nll);
}
static void cu_adam(ml_backend *be, float *p, const float *g, float *m, float *v, size_t n,
                    float lr, float b1, float b2, float eps, int step)
{
    (void)be;
    ml_cu_adam(p, g, m, v, n, lr, b1, b2, eps, 1.0f - powf(b1, (float)step),
               1.0f - powf(b2, (float)step));
}
static void cu_sync(ml_backend *be)
{
    (void)be;
    cudaDeviceSynchronize();
}
static uint64_t cu_used(ml_backend *be)
{
    (void)be;
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess)
        return 0;
    return (uint64_t)(tot - fr);
}
static void cu_destroy(ml_backend *be)
{
    cublasDestroy(H(be));
    cudaFree(((cuda_impl *)be->impl)->workspace);
    free(be->impl);
    free(be);
}

ml_backend *ml_backend_cuda(const char **why)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        *why = "no CUDA device is visible";
        return NULL;
    }
    ml_backend *be = calloc(1, sizeof *be);
    cuda_impl *im = calloc(1, sizeof *im);
    if (!be || !im || cublasCreate(&im->h) != CUBLAS_STATUS_SUCCESS) {
        free(be);
        free(im);
        *why = "cuBLAS could not be initialised";
        return NULL;
    }
    be->impl = im;
    be->name = "cuda";
    if (cudaMalloc(&im->workspace, ML_CUBLAS_WORKSPACE) == cudaSuccess)
        cublasSetWorkspace(im->h, im->workspace, ML_CUBLAS_WORKSPACE);
    else
        im->workspace = NULL;
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
        snprintf(be->device, sizeof be->device, "%s", prop.name);
    int drv = 0, rt = 0, cbv = 0;
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    cublasGetVersion(im->h, &cbv);
    snprintf(be->driver, sizeof be->driver, "CUDA driver %d.%d", drv / 1000, (drv % 1000) / 10);
    snprintf(be->library, sizeof be->library, "CUDA runtime %d.%d, cuBLAS %d, cuBLAS workspace %u MiB",
             rt / 1000, (rt % 1000) / 10, cbv, im->workspace ? ML_CUBLAS_WORKSPACE >> 20 : 0u);
    be->alloc = cu_alloc;
    be->free = cu_free;
    be->upload = cu_up;
    be->download = cu_down;
    be->zero = cu_zero;
    be->gemm = cu_gemm;
    be->gemm_batched = cu_gemm_batched;
    be->gemm_bf16_tflops = cu_gemm_bf16;
    be->cast = ml_cu_cast;
    be->gemm_mixed = cu_gemm_mixed;
    be->add = ml_cu_add;
    be->bias_add = ml_cu_bias_add;
    be->bias_grad = ml_cu_bias_grad;
    be->gelu_fwd = ml_cu_gelu_fwd;
    be->gelu_bwd = ml_cu_gelu_bwd;
    be->layernorm_fwd = ml_cu_ln_fwd;
    be->layernorm_bwd = ml_cu_ln_bwd;
    be->softmax_fwd = ml_cu_softmax_fwd;
    be->softmax_bwd = ml_cu_softmax_bwd;
    be->dropout_fwd = ml_cu_dropout_fwd;
    be->dropout_bwd = ml_cu_dropout_bwd;
    be->permute = ml_cu_permute;
    be->embedding_fwd = ml_cu_emb_fwd;
    be->embedding_bwd = ml_cu_emb_bwd;
    be->xent_fwd = cu_xent_fwd;
    be->xent_bwd = ml_cu_xent_bwd;
    be->rmsnorm_fwd = ml_cu_rms_fwd;
    be->rmsnorm_bwd = ml_cu_rms_bwd;
    be->silu_fwd = ml_cu_silu_fwd;
    be->silu_bwd = ml_cu_silu_bwd;
    be->mul = ml_cu_mul;
    be->repeat_heads = ml_cu_repeat;
    be->adam = cu_adam;
    be->sync = cu_sync;
    be->device_used = cu_used;
    be->destroy = cu_destroy;
    return be;
}
