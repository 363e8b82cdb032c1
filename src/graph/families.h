/* The families as compositions of the component kit (kit.h): each maps a
 * model's settings onto the components of its layer and says whether the
 * kit expresses that layout. docs/adding-a-family.md. */
#ifndef ML_GRAPH_FAMILIES_H
#define ML_GRAPH_FAMILIES_H

#include "graph/kit.h"
#include "model/model_internal.h"

/* What of a configuration changes a layer's ops (the sizes do not). */
typedef struct {
    unsigned compute_bytes, stream_bytes; /* the precision policy's */
    bool fp16;          /* the 2-byte dtype is float16 (else bfloat16) */
    bool autocast;      /* torch.autocast runs the model */
    bool fused_kernel;  /* its attention dispatches to a fused kernel */
    bool eval;          /* the evaluation pass (model.eval(), no_grad) */
    bool ring;          /* context parallelism: the fused attention runs as ring
                           attention (docs/parallel.md) */
    bool ep;            /* a mixture of experts' dispatch (expert, expert-tensor
                           or tensor parallelism; docs/parallel.md) */
    bool ep_one;        /* with ep: one expert-parallel rank */
    bool etp;           /* with ep: more than one expert-tensor rank */
    bool one_local;     /* with ep: one expert on the rank */
    bool one_row;       /* a batch of one (micro-batch or evaluation batch 1):
                           matmul folds a (1, H, ...) head view into bmm's
                           batch as a view (mlg_attention.fold_views) */
} mlg_config;

/* nanoGPT's and Hugging Face GPT-2's layer (pre-LayerNorm, one c_attn
 * projection, masked_fill causal mask, a GELU or ReLU MLP) into L; false
 * when m's layer is another layout. */
bool ml__family_gpt2_layer(const ml_model *m, const mlg_config *c, mlg_layer *L);
/* Hugging Face's Llama layout (LlamaDecoderLayer, and Mistral's, Qwen2's:
 * RMSNorm, q/k/v projections, rotary, grouped heads, a gated MLP). */
bool ml__family_llama_layer(const ml_model *m, const mlg_config *c, mlg_layer *L);
/* Hugging Face's Gemma layout (GemmaDecoderLayer): Llama's with
 * GemmaRMSNorm, (h * (1 + weight)) in fp32 then cast (GeGLU, head_dim,
 * the embeddings' scale are settings Llama's layer already reads); Gemma
 * 2's (Gemma2DecoderLayer) with a norm on each branch's output and the
 * scores' soft cap. */
bool ml__family_gemma_layer(const ml_model *m, const mlg_config *c, mlg_layer *L);
/* Hugging Face's OLMo layout (OlmoDecoderLayer): Llama's with
 * OlmoLayerNorm, a LayerNorm without weight or bias computed in fp32. */
bool ml__family_olmo_layer(const ml_model *m, const mlg_config *c, mlg_layer *L);
/* Hugging Face's ViT layout (ViTLayer): pre-LayerNorm, ViTSelfAttention's
 * query, key and value (softmax in fp32, no mask), a GELU MLP; its
 * patch embedding and classifier are not layers. */
bool ml__family_vit_layer(const ml_model *m, const mlg_config *c, mlg_layer *L);
/* Hugging Face's GPT-NeoX layout (GPTNeoXLayer, use_parallel_residual):
 * two LayerNorms of the input, query_key_value sliced, rotary with its
 * pass, a GELU MLP, both branches added to the input. */
bool ml__family_neox_layer(const ml_model *m, const mlg_config *c, mlg_layer *L);
/* Hugging Face's Falcon layout (FalconDecoderLayer, parallel_attn, the old
 * decoder architecture): one LayerNorm feeding the attention and the MLP,
 * query_key_value cut by _split_heads (one key/value head picked by index
 * lists, or H), rotary, the softmax in the stream's dtype, a GELU MLP;
 * mlp(h) + attn(h) added to the input. */
bool ml__family_falcon_layer(const ml_model *m, const mlg_config *c, mlg_layer *L);
/* DeepSeek-V2's and V3's layout (DeepseekV3DecoderLayer,
 * DeepseekV2DecoderLayer): Llama's layer with
 * multi-head latent attention (q, or its compression, q_a_proj, RMSNorm
 * and q_b_proj; kv_a_proj_with_mqa, an RMSNorm of its compressed part,
 * kv_b_proj; the rotary on a part of each head) and, with experts, their
 * MoE MLP (L->moe; the first dense_layers layers keep a dense MLP). */
bool ml__family_deepseek_layer(const ml_model *m, const mlg_config *c, mlg_layer *L);
/* Hugging Face's Mixtral and Qwen2-MoE layouts (MixtralDecoderLayer,
 * Qwen2MoeDecoderLayer): Llama's layer with a sparse MoE block in place of
 * the MLP (kit_mixtral.c): a softmax router, top-k (renormalised with
 * expert_renorm), each expert with rows on its rows, Qwen2-MoE's shared
 * expert gated by a sigmoid. */
bool ml__family_mixtral_layer(const ml_model *m, const mlg_config *c, mlg_layer *L);
/* Hugging Face's BERT layout (BertLayer): post-LayerNorm, query, key and
 * value, softmax in the stream's dtype, a GELU MLP. */
bool ml__family_bert_layer(const ml_model *m, const mlg_config *c, mlg_layer *L);
/* LLaVA's CLIP vision tower layer (HF CLIPEncoderLayer, kit_clip.c): ViT's
 * layout with CLIPMLP's QuickGELU (or GELU), every setting read from m's
 * vision tower (m->vision), none from its decoder; false: m has no tower. */
bool ml__family_clip_layer(const ml_model *m, const mlg_config *c, mlg_layer *L);
/* The tower's last layer also runs post_layernorm on its class tokens:
 * keeping its input and statistics (KEPT) or with them counted elsewhere
 * (POOLED). */
typedef enum { MLG_CLIP_LAYER, MLG_CLIP_POOLED, MLG_CLIP_POOLED_KEPT } mlg_clip_pool;
/* The graph of a CLIP layer L into g. */
void ml__family_clip_graph(ml_graph *g, const mlg_layer *L, mlg_clip_pool pool);
/* LLaVA's CLIPVisionEmbeddings with pre_layrnorm, over (B, T, D) the
 * tower's (kit_clip.c): the sizes are literals, as the chain builders
 * multiplied them: the image's C*H*W, a patch's C*P*P, the patches
 * (T - 1). */
typedef struct {
    bool autocast;
    uint64_t image, kin, npatches;
} mlg_clip_embed;
void ml__kit_clip_embedding(ml_graph *g, const mlg_clip_embed *E);
/* LLaVA's projector (LlavaMultiModalProjector) and the merge of its
 * output into the token embeddings, over (B, T, D) the decoder's: the
 * tower's tokens, the image tokens, the tower's width and that width plus
 * D (the two products' FLOPs as one, as the builders summed them) as
 * literals;
 * keeps_hidden: linear_1 keeps the feature layer's whole hidden state, its
 * input a view of it (ml__ck_llava_keeps_hidden);
 * cast: the features cast to the embeddings' dtype (compute dtype other
 * than the stream's). */
typedef struct {
    bool autocast, keeps_hidden, cast, bias;
    uint64_t tokens, images, width, summed;
} mlg_llava_projector;
void ml__kit_llava_projector(ml_graph *g, const mlg_llava_projector *P);
/* The family whose layout m's layers have; false: none of the kit's. */
bool ml__family_layer(const ml_model *m, const mlg_config *c, mlg_layer *L);

/* The graph of a layer L into g (a pre-norm layer of its components). */
void ml__family_layer_graph(ml_graph *g, const mlg_layer *L);

/* A decoder's LM head whose final norm the kit expresses: the norm of m's
 * layer family (ml__family_layer), an LM head (no classes, no soft-capped
 * logits). */
bool ml__family_head(const ml_model *m, const mlg_config *c, mlg_layer *L);
/* The graph of that head into g (fused: its norm alone; softcap: Gemma
 * 2's soft-capped logits). */
void ml__family_head_graph(ml_graph *g, const mlg_layer *L, bool tied, bool fused, bool softcap);

/* The bytes an element of the keys and values Hugging Face's DynamicCache
 * copies in training that no op of L saves, held by the model's output
 * (docs/ledger.md); 0: none, or not modelled for L's layout. */
uint8_t ml__family_out_cache_bpe(const ml_model *m, const mlg_config *c, const mlg_layer *L);

#endif
