/* What each layer kind's forward keeps for its backward, by name: the
 * forward sets these fields and the backward reads the same fields. Each
 * points into layer.saved[], which owns the tensors (and frees them after
 * the backward); fields are listed in the order the forward keeps them,
 * which is PyTorch eager autograd's set for the same layer
 * (docs/inventory.md). A field that is NULL was not kept at this shape
 * (dropout 0, or fp32 where only amp keeps a cast). Under amp a field may
 * hold a bf16 tensor (tensor.low). */
#ifndef ML_CALIB_LAYER_KEPT_H
#define ML_CALIB_LAYER_KEPT_H

#include "tracker.h"

/* nn.Linear: addmm's input x (under amp its bf16 cast instead) */
struct linear_kept {
    tensor *x;
};

/* Linear, GELU, linear */
struct mlp_kept {
    tensor *x; /* the first linear's input (its bf16 cast under amp) */
    tensor *h; /* GELU's input */
    tensor *a; /* the second linear's input, GELU's output */
};

/* Eager attention after the head-major q, k, v (layer__attention_fwd) */
struct attn_kept {
    tensor *P;    /* softmax output, fp32 (autocast's fp32 list) */
    tensor *mask; /* attention dropout mask, NULL without dropout */
    tensor *pv;   /* PV's left operand: the dropout output, under amp
                     P's bf16 cast, else P itself */
    tensor *om;   /* the output projection's input, (B, T, D) rows */
    bool kv_one;  /* k and v are one head that every query head reads (a
                     batch stride of 0): one key/value head at micro-batch
                     1, where bmm saves that head (docs/ledger.md) */
};

/* GPT-2 style block: LayerNorm, qkv, attention, projection, residual
 * dropout, LayerNorm, MLP, residual dropout */
struct block_kept {
    tensor *x;            /* ln_1 input (the block's input) */
    tensor *mean1, *rstd1;
    tensor *ln1;          /* the qkv projection's input */
    tensor *q, *k, *v;    /* head-major (B*H, T, dh) */
    tensor *causal_mask;  /* masked_fill's bool T x T (not read: the softmax
                             kernel masks by index) */
    struct attn_kept attn;
    tensor *resid_mask;   /* dropout after the attention projection */
    tensor *x2;           /* ln_2 input, the residual sum */
    tensor *mean2, *rstd2;
    tensor *ln2;          /* c_fc input */
    tensor *h;            /* GELU input */
    tensor *g;            /* c_proj input, GELU output */
    tensor *mlp_mask;     /* dropout after the MLP */
};

/* Embedding + positions, (dropout), final LayerNorm, LM head, cross-entropy */
struct lm_head_kept {
    tensor *ids;          /* token ids: the layer's input */
    tensor *pos;          /* position ids (not read: row i is position i % T) */
    tensor *tgt;          /* targets */
    tensor *emb_mask;     /* embedding dropout mask */
    tensor *xf;           /* ln_f input */
    tensor *mf, *rf;      /* ln_f mean and rstd */
    tensor *lnf;          /* lm_head input */
    tensor *logp;         /* log-softmax output, fp32 */
    tensor *total_weight; /* nll_loss's total_weight (not read) */
};

/* Llama-style block: RMSNorm, q/k/v (GQA), attention, o_proj, residual,
 * RMSNorm, SwiGLU (gate, up, down); no biases, no dropout */
struct llama_kept {
    tensor *x;            /* the first RMSNorm's input */
    tensor *rs1, *h1;     /* its rsqrt and normalised rows */
    tensor *y1;           /* q/k/v projections' input */
    tensor *qh, *kh, *vh; /* head-major; k and v repeated to H heads
                             (one head with attn.kv_one) */
    struct attn_kept attn;
    tensor *x2;           /* the residual sum, the second RMSNorm's input
                             (not read: rs2 and h2 suffice) */
    tensor *rs2, *h2;
    tensor *y2;           /* gate/up projections' input */
    tensor *g;            /* SiLU input (gate output) */
    tensor *sg;           /* SiLU output */
    tensor *u;            /* up output */
    tensor *pr;           /* down projection's input, sg * u */
};

typedef union {
    struct linear_kept linear;
    struct mlp_kept mlp;
    struct block_kept block;
    struct lm_head_kept lm_head;
    struct llama_kept llama;
} layer_kept;

#endif
