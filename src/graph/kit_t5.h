/* T5's layers (Hugging Face T5ForConditionalGeneration, transformers 4.5x
 * modeling_t5.py) as op graphs: the encoder's (self-attention, then the
 * feed-forward) and the decoder's (self-attention, cross-attention over
 * the encoder's output, the feed-forward), each sublayer T5LayerNorm, its
 * module, dropout and the residual. The stacks' position biases and the
 * encoder's output are side tensors (docs/ledger.md, "Side tensors"): the
 * ops read them, the chain (ledger/chain_t5.c) holds them. docs/graph.md. */
#ifndef ML_GRAPH_KIT_T5_H
#define ML_GRAPH_KIT_T5_H

#include "graph/families.h"

typedef struct {
    bool decoder;      /* the decoder's layer (with cross-attention) */
    bool first;        /* the stack's first layer: its self-attention embeds
                          the relative-position buckets */
    bool gated;        /* T5DenseGatedActDense (gelu_new(wi_0) * wi_1) */
    bool dropout;
    bool autocast;
    bool half_stream;  /* the stream and the parameters in a 2-byte dtype */
    bool fp32_compute; /* the compute dtype is fp32: no type_as cast */
} mlg_t5;

/* T5's layer of a configuration: false when m is not T5's layout. */
bool ml__family_t5_layer(const ml_model *m, const mlg_config *c, bool decoder, bool first,
                         mlg_t5 *L);
/* The graph of that layer into g. */
void ml__kit_t5_layer(ml_graph *g, const mlg_t5 *L);
/* The encoder's final_layer_norm and its dropout into g: the encoder's
 * output (a side tensor the chain holds). */
void ml__kit_t5_final(ml_graph *g, const mlg_t5 *L);
/* The head into g: the decoder's final_layer_norm, its dropout, the rescale
 * by D^-0.5 when tied (the table then another block's), lm_head. */
void ml__kit_t5_head(ml_graph *g, const mlg_t5 *L, bool tied);

/* T5Stack.forward's own tensors before its loop (kit_t5_stack.c), each a
 * side tensor: the attention mask of ones it makes when given none (fp32),
 * the extended (encoder: (B, 1, 1, T)) or causal (decoder: (B, 1, T, T))
 * mask in the stream's dtype, cache_position (int64), with dropout the
 * embedding's output (inputs_embeds, which the stack holds beside its
 * dropout's); the decoder's also the encoder's mask of ones (int64) and its
 * inversion (B, 1, 1, TS). Not a block: the chain (ledger/chain_t5.c)
 * notes it at the stack's embedding. */
void ml__kit_t5_stack(ml_graph *g, const mlg_t5 *L);
/* The stack's arguments to every block into layer graph g, as side
 * tensors (inputs): args[0] the extended or causal mask, args[1]
 * cache_position, args[2] the inverted encoder mask (the decoder's;
 * else MLG_NONE). */
void ml__kit_t5_args(ml_graph *g, const mlg_t5 *L, uint16_t args[3]);

#endif
