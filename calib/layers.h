/* Layers of the calibration runner, written once above the backend:
 * forward/backward/Adam for linear, MLP, a GPT-2 style transformer block,
 * an embedding + LM head + cross-entropy and a Llama-style block (RMSNorm,
 * GQA attention, SwiGLU; no biases), every tensor through the tracking
 * allocator (tracker.h). Each saves exactly the tensors PyTorch's eager
 * autograd saves for the same layer (docs/inventory.md; by name per kind in
 * layer_kept.h), so its measured saved bytes are the ledger's inventory
 * (tests/unit/test_calib.c checks it). One file per kind (layer_*.c), each
 * an entry of the kind table in layers.c. */
#ifndef ML_CALIB_LAYERS_H
#define ML_CALIB_LAYERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memledger/calib.h"

#include "backend.h"
#include "layer_kept.h"
#include "tracker.h"

/* The kinds are the profile's (memledger/calib.h, ml_profile_kind_id):
 * one list for what is measured and what is read back. */
typedef enum {
    LAYER_LINEAR = ML_PK_LINEAR,
    LAYER_MLP = ML_PK_MLP,
    LAYER_BLOCK = ML_PK_TRANSFORMER_BLOCK, /* GPT-2 style transformer block */
    LAYER_LM_HEAD = ML_PK_LM_HEAD,         /* embedding + LM head + cross-entropy */
    LAYER_LLAMA = ML_PK_LLAMA_BLOCK,       /* Llama-style block */
    LAYER_KIND_COUNT = ML_PK_COUNT
} layer_kind;

/* The kind's name in profiles and on the command line
 * (ml_profile_kind_name); NULL for no kind. */
const char *layer_kind_name(layer_kind kind);

typedef struct {
    size_t B, T, D, H;
    size_t F; /* the MLP's width */
    size_t V;
    float dropout;
    size_t KV; /* kv heads of the Llama-style block (GQA); 0: H */
    bool amp;  /* torch.autocast(dtype=bfloat16) rules: fp32 parameters, matmuls on
                  bf16 copies, fp32 norms and softmax (docs/calibration.md) */
} layer_dims;

#define MAX_PARAMS 16
#define MAX_SAVED 32

typedef struct {
    layer_kind kind;
    layer_dims d;
    /* parameters, their gradients and Adam's two moments; wn[i] values each */
    tensor w[MAX_PARAMS], g[MAX_PARAMS], m[MAX_PARAMS], v[MAX_PARAMS];
    size_t wn[MAX_PARAMS];
    int nparams;
    tensor saved[MAX_SAVED]; /* what the forward kept: owned here, named in kept */
    int nsaved;
    layer_kept kept;
    tensor weight_copy[MAX_PARAMS]; /* autocast's weight copies (T_CAST), made on first use */
    tensor extra_casts[4]; /* further autocast copies autograd keeps that backward does
                              not read again (each projection's own cast of one input) */
    int nextra;
    int step;
    uint64_t seed;
} layer;

/* Allocates parameters (random) and Adam states. Returns 0, or -1 when out of memory. */
int layer_init(layer *l, layer_kind kind, const layer_dims *d, tracker *tr, uint64_t seed);
/* Forward on x (the layer saves what autograd saves; x is passed in as
 * T_SAVED, and under amp a layer that keeps only a bf16 cast of it (linear,
 * mlp) frees it). Returns the output (T_WORK). For LAYER_LM_HEAD,
 * x holds int64 token ids and the output is the 1-element loss. */
tensor layer_forward(layer *l, tracker *tr, tensor *x);
/* Backward from dy; frees the saved tensors (x included); returns dx (T_WORK,
 * empty for LAYER_LM_HEAD) and leaves the gradients in l->g. */
tensor layer_backward(layer *l, tracker *tr, tensor *dy);
/* One Adam step; frees the gradients. */
void layer_step(layer *l, tracker *tr);
void layer_destroy(layer *l, tracker *tr);
/* Frees what a forward saved (its input included) without a backward. */
void layer_forget(layer *l, tracker *tr);
/* The input's bytes and its category for a layer (ids for LAYER_LM_HEAD). */
size_t layer_input_bytes(const layer *l);
/* GEMM FLOPs of one forward pass. */
double layer_flops(const layer *l);

#endif
