/* The component kit: norms, linears, attention, MLPs, dropouts and
 * residual adds that emit their ops into a block's graph (graph.h), each
 * with what PyTorch's eager autograd saves and runs for it
 * (tools/autograd/derivatives.yaml; docs/inventory.md names the reference
 * implementation of each). A family is a composition of these
 * (families.c); docs/adding-a-family.md walks through one. */
#ifndef ML_GRAPH_KIT_H
#define ML_GRAPH_KIT_H

#include "graph/graph.h"

typedef enum { MLG_LAYERNORM } mlg_norm_kind;
typedef enum { MLG_GELU, MLG_RELU } mlg_act;

typedef struct {
    uint8_t kind; /* mlg_norm_kind */
    bool bias;
} mlg_norm;

/* Self-attention. nanoGPT's CausalSelfAttention: one c_attn projection
 * sliced into q, k and v; masked_fill with a causal (T, T) bool mask; the
 * softmax in the stream's dtype (fp32 under autocast, which casts the
 * probabilities back for the PV matmul). */
typedef struct {
    bool qkv_bias, out_bias;
    bool fused_kernel; /* sdpa or flash as dispatched: no T x T tensor */
    bool dropout;      /* on the probabilities and the output */
} mlg_attention;

typedef struct {
    uint8_t act; /* mlg_act */
    bool bias;
    bool dropout; /* on the output */
} mlg_mlp;

/* A layer: its components and how they are wired. */
typedef struct {
    mlg_norm norm;
    mlg_attention attn;
    mlg_mlp mlp;
    bool autocast; /* torch.autocast: linears read low-precision cast copies */
} mlg_layer;

/* A Linear on x (in -> out wide: named dimensions) making y; returns its
 * op. autocast with an fp32 x saves a cast copy of x and of the weight. */
typedef struct {
    const char *name, *node;
    uint8_t in, out; /* mlg_dim */
    bool bias;
} mlg_linear;
mlg_op *ml__kit_linear(ml_graph *g, const mlg_layer *L, const mlg_linear *lin, uint16_t x,
                       uint16_t y);

/* A norm of the residual stream x (whose gradient buffer the skip already
 * holds: xbuf); returns its output. */
uint16_t ml__kit_norm(ml_graph *g, const mlg_norm *n, uint16_t x, bool xbuf);
/* nn.Dropout on x when p > 0: returns its output (x when there is none);
 * held: the output's gradient is a buffer another op holds. */
uint16_t ml__kit_dropout(ml_graph *g, bool on, uint16_t x, const char *node, bool core,
                         bool held);
/* x + y into the residual stream; frees y. */
uint16_t ml__kit_residual(ml_graph *g, uint16_t x, uint16_t y);
/* Self-attention on h; returns its branch output (before the residual). */
uint16_t ml__kit_attention(ml_graph *g, const mlg_layer *L, uint16_t h);
/* The MLP on h; returns its branch output. */
uint16_t ml__kit_mlp(ml_graph *g, const mlg_layer *L, uint16_t h);

/* A pre-norm layer: x + attn(norm(x)), then + mlp(norm(.)). */
void ml__kit_prenorm_layer(ml_graph *g, const mlg_layer *L);

#endif
