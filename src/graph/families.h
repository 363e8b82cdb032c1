/* The families as compositions of the component kit (kit.h): each maps a
 * model's settings onto the components of its layer and says whether the
 * kit expresses that layout. docs/adding-a-family.md. */
#ifndef ML_GRAPH_FAMILIES_H
#define ML_GRAPH_FAMILIES_H

#include "graph/kit.h"
#include "model/model_internal.h"

/* nanoGPT's and Hugging Face GPT-2's layer (pre-LayerNorm, one c_attn
 * projection, masked_fill causal mask, a GELU or ReLU MLP) into L; false
 * when m's layer is another layout. autocast: torch.autocast runs it;
 * fused_kernel: its attention dispatches to a fused kernel. */
bool ml__family_gpt2_layer(const ml_model *m, bool autocast, bool fused_kernel, mlg_layer *L);

/* The graph of a layer L into g (a pre-norm layer of its components). */
void ml__family_layer_graph(ml_graph *g, const mlg_layer *L);

#endif
