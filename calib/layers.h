/* Layers of the calibration runner, written once above the backend: a
 * tracking allocator, and forward/backward/Adam for linear, MLP, a GPT-2
 * style transformer block, an embedding + LM head + cross-entropy and a
 * Llama-style block (RMSNorm, GQA attention, SwiGLU; no biases). Each
 * saves exactly the tensors PyTorch's eager autograd saves for the same layer
 * (docs/inventory.md), so its measured saved bytes are the ledger's
 * inventory (tests/unit/test_calib.c checks it). */
#ifndef ML_CALIB_LAYERS_H
#define ML_CALIB_LAYERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"

/* T_CAST: autocast's cached bf16 weight copies, kept for backward */
enum { T_PARAM, T_GRAD, T_STATE, T_SAVED, T_WORK, T_CAST, T_NCAT };
enum { PH_FORWARD, PH_BACKWARD, PH_STEP, PH_N };

typedef struct {
    ml_backend *be;
    uint64_t live[T_NCAT];
    uint64_t total;
    uint64_t peak[PH_N];
    int phase;
    uint64_t dev_base, dev_peak; /* the device's own view (CUDA) */
    bool oom;
} tracker;

typedef struct {
    void *p;
    size_t bytes;
    int cat;
    bool low; /* bf16 values (2 bytes each); otherwise fp32, int64 or bytes */
} tn;

void tracker_init(tracker *tr, ml_backend *be);
tn talloc(tracker *tr, size_t bytes, int cat);
void tfree(tracker *tr, tn *t);
/* notes the device's used memory (cudaMemGetInfo) as a candidate peak */
void tracker_device_sample(tracker *tr);

typedef enum { K_LINEAR, K_MLP, K_BLOCK, K_LMHEAD, K_LLAMA, K_COUNT } kind_t;
extern const char *const kind_names[K_COUNT];

typedef struct {
    size_t B, T, D, H, F, V;
    float dropout;
    size_t KV; /* kv heads of the Llama-style block (GQA); 0: H */
    bool amp;  /* torch.autocast(dtype=bfloat16) rules: fp32 parameters, matmuls on
                  bf16 copies, fp32 norms and softmax (docs/calibration.md) */
} dims;

#define MAX_PARAMS 16
#define MAX_SAVED 32

typedef struct {
    kind_t kind;
    dims d;
    tn w[MAX_PARAMS], g[MAX_PARAMS], m[MAX_PARAMS], v[MAX_PARAMS];
    size_t wn[MAX_PARAMS];
    int nparams;
    tn saved[MAX_SAVED];
    int nsaved;
    tn wc[MAX_PARAMS]; /* autocast's weight copies (T_CAST), made on first use */
    tn extra[4];       /* further autocast copies autograd keeps that backward does
                          not read again (each projection's own cast of one input) */
    int nextra;
    int step;
    uint64_t seed;
} layer;

/* Allocates parameters (random) and Adam states. Returns 0, or -1 when out of memory. */
int layer_init(layer *l, kind_t kind, const dims *d, tracker *tr, uint64_t seed);
/* Forward on x (the layer saves what autograd saves; x is passed in as
 * T_SAVED, and under amp a layer that keeps only a bf16 cast of it (linear,
 * mlp) frees it). Returns the output (T_WORK). For K_LMHEAD,
 * x holds int64 token ids and the output is the 1-element loss. */
tn layer_forward(layer *l, tracker *tr, tn *x);
/* Backward from dy; frees the saved tensors (x included); returns dx (T_WORK,
 * empty for K_LMHEAD) and leaves the gradients in l->g. */
tn layer_backward(layer *l, tracker *tr, tn *dy);
/* One Adam step; frees the gradients. */
void layer_step(layer *l, tracker *tr);
void layer_destroy(layer *l, tracker *tr);
/* Frees what a forward saved (its input included) without a backward. */
void layer_forget(layer *l, tracker *tr);
/* The input's bytes and its category for a layer (ids for K_LMHEAD). */
size_t layer_input_bytes(const layer *l);
/* GEMM FLOPs of one forward pass. */
double layer_flops(const layer *l);

#endif
