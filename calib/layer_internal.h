/* Private to the layer code (layers.c, layer_*.c): the per-kind table and
 * the pieces the kinds share. Not for the runner or the tests. */
#ifndef ML_CALIB_LAYER_INTERNAL_H
#define ML_CALIB_LAYER_INTERNAL_H

#include "layers.h"

/* A tensor's values as the type a kernel takes */
#define AS_F32(t) ((float *)(t).p)
#define AS_I64(t) ((int64_t *)(t).p)
#define AS_U8(t) ((uint8_t *)(t).p)

#define TENSOR_NONE ((tensor){NULL, 0, T_WORK, false})

/* One layer kind. init adds the parameters (layer__add_param) to a layer
 * whose kind, dims and seed are set; returns nonzero when out of memory.
 * forward fills l->kept.<kind> and returns the output, TENSOR_NONE when out
 * of memory; backward runs after the gradients are allocated and before the
 * kept tensors are freed, and returns dx. */
typedef struct {
    int (*init)(layer *l, tracker *tr);
    tensor (*forward)(layer *l, tracker *tr, tensor *x);
    tensor (*backward)(layer *l, tracker *tr, tensor *dy);
    double (*flops)(const layer *l);
} layer_ops;

extern const layer_ops layer__linear_ops, layer__mlp_ops, layer__block_ops,
    layer__lm_head_ops, layer__llama_ops;

/* Adds a parameter of n values (uniform in +-scale, or all ones) and its
 * Adam states. Returns 0, or -1 when out of memory. */
int layer__add_param(layer *l, tracker *tr, size_t n, float scale, bool ones);
/* A LayerNorm's weight (ones) and bias: 2 parameters */
int layer__add_norm_params(layer *l, tracker *tr);
/* The MLP's c_fc and c_proj (D x F, F, F x D, D): 4 parameters */
int layer__add_mlp_params(layer *l, tracker *tr);
/* The Llama block's kv heads: d->KV, or H when 0 */
size_t layer__kv_heads(const layer_dims *d);

/* Takes t into l->saved; returns where it now lives. */
tensor *layer__keep(layer *l, tensor t);

/* ---- autocast (amp) ------------------------------------------------------
 * Under torch.autocast(dtype=bfloat16) (aten/src/ATen/autocast_mode.cpp)
 * a matmul runs on bf16 casts of its inputs and saves those casts; weights
 * are cast once per forward and cached; layer_norm, softmax and
 * log_softmax run in fp32. The runner stores exactly the tensors autograd
 * keeps in those dtypes; its elementwise kernels are fp32 only, so an op
 * whose result autograd keeps in bf16 writes an fp32 staging buffer (T_WORK)
 * that is then cast (layer__slot, layer__settle). The saved bytes are
 * autocast's; the transient workspace is larger than PyTorch's. */

/* A bf16 cast of n fp32 values, in category cat. */
tensor layer__low_copy(tracker *tr, const float *src, size_t n, int cat);
/* Where an op writes a tensor autograd keeps in the compute dtype: the kept
 * fp32 tensor itself, or under amp an fp32 staging buffer (*stage) whose
 * bf16 cast layer__settle keeps. */
tensor *layer__slot(layer *l, tracker *tr, size_t n, tensor *stage);
/* The kept tensor for what layer__slot returned (t): t itself, or under amp
 * the kept bf16 cast of the staging buffer, which it frees. */
tensor *layer__settle(layer *l, tracker *tr, tensor *t, tensor *stage);
/* layer__slot and layer__settle for n tensors of the same size, in order:
 * t[i] with staging buffer stage[i]. */
void layer__slots(layer *l, tracker *tr, size_t size, int n, tensor **t, tensor *stage);
void layer__settle_each(layer *l, tracker *tr, int n, tensor **t, tensor *stage);
/* A norm over (B*T, D) rows: keeps its two statistics (*first and
 * *second, of first_bytes and second_bytes: LayerNorm's mean and rstd,
 * RMSNorm's rsqrt and normalised rows) and returns where its output goes
 * (layer__slot with *stage); NULL when out of memory. */
tensor *layer__norm_keep(layer *l, tracker *tr, size_t first_bytes, size_t second_bytes,
                         tensor **first, tensor **second, tensor *stage);
/* Another bf16 cast of the same fp32 input, for a second projection of it:
 * casts of non-leaf tensors are not cached, so autograd keeps each one
 * (backward reads the first; the values are equal). */
void layer__extra_copy(layer *l, tracker *tr, const float *src, size_t n);
/* The weight a matmul multiplies by: parameter i, or under amp its bf16
 * copy, cast on first use and kept until backward is done. */
const tensor *layer__matmul_weight(layer *l, tracker *tr, int i);
/* fp32 values of t for an elementwise kernel: t itself, or an fp32 copy of
 * a bf16 tensor in *tmp (tensor_free it after; NULL when out of memory). */
float *layer__fp32_values(tracker *tr, const tensor *t, tensor *tmp);

/* C = alpha op(A) op(B) + beta C over `batch` strided matrices, through
 * the mixed-precision GEMM when an operand is bf16. */
void layer__matmul(ml_backend *be, bool ta, bool tb, int M, int N, int K, float alpha,
                   const tensor *A, long sA, const tensor *B, long sB, float beta, float *C,
                   long sC, int batch);
/* y = x W + b over rows (b may be NULL) */
void layer__linear_fwd(ml_backend *be, const tensor *x, const tensor *W, const tensor *b,
                       float *y, size_t rows, size_t in, size_t out);
/* dx = dy W^T (if dx; beta_dx 1 adds to it), dW += x^T dy, db += sum dy (if db) */
void layer__linear_bwd(ml_backend *be, const tensor *x, const tensor *W, const tensor *dy,
                       float *dx, float beta_dx, float *dW, float *db, size_t rows, size_t in,
                       size_t out);

/* A residual block's forward in two halves: attention returns its
 * branch's output a; mlp adds a to x (freeing a) and runs the rest. Returns
 * mlp's output, TENSOR_NONE when out of memory. Both block kinds. */
typedef struct {
    tensor (*attention)(layer *l, tracker *tr, tensor *x);
    tensor (*mlp)(layer *l, tracker *tr, const tensor *x, tensor *a);
} block_halves;
tensor layer__block_forward(layer *l, tracker *tr, tensor *x, const block_halves *h);

/* Eager attention after the head-major q, k, v (B*H, T, dh), keeping into
 * *kept (layer_kept.h); p the dropout on P (0 for none); then the output
 * projection (weight wo, bias bo or NULL). Returns its output (T_WORK),
 * TENSOR_NONE when out of memory. Both block layouts share it. */
tensor layer__attention_fwd(layer *l, tracker *tr, struct attn_kept *kept, const tensor *q,
                            const tensor *k, const tensor *v, float p, int wo, const tensor *bo);

/* The gradient buffers of layer__attention_bwd: rows a (B, T, D) scratch;
 * dO (B*H, T, dh) and dP (B*H, T, T) workspace; dq, dk, dv head-major
 * (B*H, T, dh) results. */
typedef struct {
    float *rows;
    tensor *dO, *dP;
    float *dq, *dk, *dv;
} attn_grads;

/* Backward of layer__attention_fwd from da, the projection output's
 * gradient: the projection's weight gradient (and bias gradient into dbo
 * when not NULL), and dq, dk, dv into g. */
void layer__attention_bwd(layer *l, tracker *tr, const struct attn_kept *kept, const tensor *q,
                          const tensor *k, const tensor *v, const tensor *da, int wo, float *dbo,
                          const attn_grads *g);

#endif
