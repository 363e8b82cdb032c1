/* A sequential model's block as an op graph (graph.h): one `layers:`
 * entry (linear, conv2d, batchnorm, layernorm, relu, gelu, silu, dropout,
 * pooling, flatten, embedding, attention, a residual with its branches),
 * its sizes from shape inference (model/shape.h) as the graph's literal sizes.
 * docs/graph.md, "Sequential layers"; sources in docs/inventory.md. */
#ifndef ML_GRAPH_KIT_SEQ_H
#define ML_GRAPH_KIT_SEQ_H

#include "graph/graph.h"
#include "model/shape.h"

/* What of a configuration and of the block's input changes the ops. */
typedef struct {
    uint64_t B;             /* micro-batch (a matmul's rows: its FLOPs) */
    unsigned stream_bytes;  /* the precision policy's weights-dtype activations */
    bool autocast;          /* torch.autocast runs the model */
    bool eval;              /* the evaluation pass (model.eval()) */
    unsigned in_bytes;      /* the block input's bytes per element */
    bool in_nograd;         /* the block's input is the model's: no gradient */
} mlg_seq_config;

/* What the block's graph decides beyond its ops. */
typedef struct {
    ml_shape shape;     /* the output's per-sample shape */
    uint64_t out_ps;    /* its per-sample elements */
    unsigned out_bytes; /* its bytes per element */
    bool identity;      /* the output is the input (flatten, dropout p=0) */
    bool inplace;       /* a ReLU in place on the block's input */
    bool nodes_off;     /* an op on the model's input without parameters:
                           nothing needs a gradient, no node */
    bool nodes_off_recorded; /* a residual whose nodes have no rule (one
                           nested in another, a body without nodes or
                           ending in a view, a shortcut ending in a view) */
    bool attention;     /* an attention layer (the kit's nanoGPT layout):
                           its sizes below, no forward programs, no
                           backward FLOPs (docs/graph.md, "Sequential
                           layers") */
    uint64_t T, D, H;   /* its tokens, width and heads (one size for
                           every attention layer of the block) */
    bool attn_op[MLG_MAX_OPS]; /* the attention layers' ops */
    uint16_t attn_last;   /* the last attention layer's first op */
    bool overflow;        /* refused: a size past 64 bits */
    uint64_t bn_channels; /* the batch norms' channels (running statistics) */
    unsigned nbn;         /* the batch norms (num_batches_tracked each) */
} mlg_seq_block;

/* The graph of layer l on input shape in into g; false when the kit does
 * not express it (an embedding not on the block's input, two attention
 * layers of different sizes in one block, a graph that overfills). */
bool ml__seq_block_graph(ml_graph *g, const ml_layer *l, const ml_shape *in,
                         const mlg_seq_config *c, mlg_seq_block *info);

#endif
