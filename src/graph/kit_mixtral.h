/* Mixtral's and Qwen2-MoE's experts (kit_mixtral.c), shared with their
 * dispatch under expert parallelism (kit_mixtral_ep.c). Internal. */
#ifndef ML_GRAPH_KIT_MIXTRAL_H
#define ML_GRAPH_KIT_MIXTRAL_H

#include "graph/kit.h"

/* One expert's tensors (the repeated group), in the inventory's order. */
typedef struct {
    uint16_t where, c1, c3, x, G1, A1, U, P, Y, rw, Z;
} mlg_expert;

/* Sets flag f on tensor t (none: nothing). */
void ml__kit_flag(ml_graph *g, uint16_t t, uint8_t f);
/* One expert's tensors: Hugging Face's loop gathers each expert's rows and
 * weights itself; under the dispatch (dispatched) they are views of the
 * dispatch's sorted rows and weights (MLG_NONE). */
void ml__kit_expert_tensors(ml_graph *g, const mlg_layer *L, uint8_t hd, bool dispatched,
                            mlg_expert *e);
/* A matmul of an expert: x (or its cast c) times the weight W (its
 * autocast copy w), making y; its node makes x's gradient. */
mlg_op *ml__kit_expert_mm(ml_graph *g, const char *name, const char *nname, uint16_t x,
                          uint16_t c, uint16_t w, uint16_t W, uint16_t y);
/* The rank's routed experts' weights (and autocast's copies of them), after
 * one expert's tensors. */
void ml__kit_expert_weights(ml_graph *g, const mlg_layer *L, uint16_t wc[3], uint16_t W[3]);
/* The routed experts on h with the top-k weights wk through Megatron-core's
 * dispatch (kit_mixtral_ep.c); returns the sum. */
uint16_t ml__kit_mixtral_experts_ep(ml_graph *g, const mlg_layer *L, uint16_t h, uint16_t wk);

#endif
