/* Internal view of a loaded model, shared by the loader and the ledger. */
#ifndef ML_MODEL_INTERNAL_H
#define ML_MODEL_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "memledger/model.h"

typedef enum { ML_MODEL_DECODER, ML_MODEL_ENCODER, ML_MODEL_SEQUENTIAL } ml_model_type;
typedef enum { ML_ACT_GELU, ML_ACT_RELU, ML_ACT_SWIGLU } ml_activation;
typedef enum { ML_NORM_LAYERNORM, ML_NORM_RMSNORM } ml_norm;
typedef enum { ML_POS_LEARNED, ML_POS_ROPE, ML_POS_NONE } ml_position;
/* eager: the matmul/softmax layout; flash: a fused kernel's inventory;
 * sdpa: scaled_dot_product_attention as PyTorch dispatches it (a fused
 * kernel, or the math kernel where none accepts the inputs) */
typedef enum { ML_ATTN_EAGER, ML_ATTN_FLASH, ML_ATTN_SDPA } ml_attention;
typedef enum { ML_LOSS_CROSS_ENTROPY, ML_LOSS_MSE } ml_loss;

typedef enum {
    ML_L_LINEAR,
    ML_L_CONV2D,
    ML_L_BATCHNORM,
    ML_L_LAYERNORM,
    ML_L_RELU,
    ML_L_GELU,
    ML_L_SILU,
    ML_L_DROPOUT,
    ML_L_MAXPOOL,
    ML_L_AVGPOOL,
    ML_L_FLATTEN,
    ML_L_RESIDUAL,
    ML_L_EMBEDDING,
    ML_L_ATTENTION,
    ML_L_KIND_COUNT
} ml_layer_kind;

typedef struct ml_layer ml_layer;
struct ml_layer {
    ml_layer_kind kind;
    unsigned line, col;      /* position in the file, for messages */
    uint64_t out;            /* linear/conv2d: output features/channels */
    uint64_t kernel, stride, padding;
    uint64_t vocab, dim;     /* embedding */
    uint64_t heads;          /* attention */
    bool bias;
    bool global;             /* avgpool */
    bool causal;             /* attention */
    double p;                /* dropout */
    ml_layer *body;          /* residual */
    size_t nbody;
    ml_layer *shortcut;      /* residual: NULL/0 = identity */
    size_t nshortcut;
};

struct ml_model {
    char name[128];
    ml_model_type type;
    /* transformer shorthand */
    uint64_t layers, hidden, heads, kv_heads, ffn, vocab, max_positions;
    uint64_t classes, token_types;             /* encoder classifier */
    uint64_t image_size, patch_size, channels; /* vision encoder (ViT) */
    ml_activation activation;
    ml_norm norm;
    bool prenorm;
    ml_position position;
    bool tied_embeddings, bias, pooler;
    bool qkv_bias;          /* biases on the q/k/v projections (default: bias) */
    bool parallel_residual; /* x + attn(ln1(x)) + mlp(ln2(x)) (GPT-NeoX, GPT-J) */
    bool kv_cache;          /* the forward returns every layer's keys and values
                               (HF use_cache, on by default for decoders) */
    ml_attention attention;
    double dropout;
    /* sequential */
    ml_layer *seq;
    size_t nseq;
    uint64_t input[4];
    size_t ninput;
    ml_loss loss;
    /* settings */
    ml_config config;
};

void ml_layers_free(ml_layer *layers, size_t n);
/* "linear", "conv2d", ...: the YAML name of a layer kind (schema_layers.c). */
const char *ml_layer_kind_name(ml_layer_kind k);

/* Limits of the model file that keep every product representable
 * (docs/ledger.md, "robustness"). */
#define ML_MAX_LAYERS 100000ull
#define ML_MAX_HIDDEN (1ull << 20)
#define ML_MAX_FFN (1ull << 24)
#define ML_MAX_VOCAB (1ull << 28)
#define ML_MAX_TOKENS (1ull << 28)
#define ML_MAX_BATCH (1ull << 24)

/* Reads a YAML document holding only training: and device: sections (and an
 * optional name:) into m->config (schema.c). */
ml_status ml_schema_settings(const char *text, size_t len, const char *path, ml_model *m,
                             ml_error *err);

#endif
