/* Private to the Hugging Face import (hf.c, hf_read.c, hf_gated.c): reading a
 * config.json's values with their positions, and checking its keys against
 * the key table (hf_keys.c). Each reader sets err at the offending node. */
#ifndef ML_HF_READ_H
#define ML_HF_READ_H

#include <stdbool.h>
#include <stdint.h>

#include "memledger/model.h"
#include "model/model_internal.h"
#include "model/tree.h"

/* A NULL-terminated list of a key and its aliases, for ml__hf_uint. */
#define KEYS(...) ((const char *const[]){__VA_ARGS__, NULL})

/* Absent, or JSON's null. */
bool ml__hf_is_null(const ml_node *n);
/* The key of keys (NULL-terminated: a name and its aliases) that is present,
 * as a whole number in [lo, hi]; required: an error when none is. Two
 * aliases at once are refused. ML_OK, ML_SCHEMA or ML_RANGE. */
ml_status ml__hf_uint(ml_error *err, const ml_node *root, const char *const *keys_, bool required,
                      uint64_t lo, uint64_t hi, uint64_t *out);
/* true or false; absent or null leaves *out. ML_OK or ML_SCHEMA. */
ml_status ml__hf_bool(ml_error *err, const ml_node *root, const char *key, bool *out);
/* A probability in [0, 1]; absent or null leaves *out. ML_OK or ML_SCHEMA. */
ml_status ml__hf_prob(ml_error *err, const ml_node *root, const char *key, double *out);
/* A string (borrowed from the tree); absent or null: NULL. ML_OK or ML_SCHEMA. */
ml_status ml__hf_str(ml_error *err, const ml_node *root, const char *key, const char **out);
/* layer_types: num_hidden_layers names, full_attention or
 * sliding_attention; absent or null leaves *windowed, else sets it to
 * whether a layer slides. ML_OK or ML_SCHEMA. */
ml_status ml__hf_layer_types(ml_error *err, const ml_node *r, uint64_t layers, bool *windowed);
/* A positive number up to 1e12; absent leaves *out, null sets 0. ML_OK or
 * ML_SCHEMA. */
ml_status ml__hf_positive(ml_error *err, const ml_node *root, const char *key, double *out);
/* Every key of the config is in family fam's table, and a key the table
 * refuses unless its value is one of its own has such a value; type is the
 * model_type for messages. ML_OK or ML_SCHEMA. */
ml_status ml__hf_check_keys(const ml_node *r, unsigned fam, const char *type, ml_error *err);

/* The Llama-layout families with a layer of their own (hf_gated.c): the
 * norm, MLP, positions, biases and head of model_type gemma and phi3, after
 * hf.c has read the sizes. ML_OK or ML_SCHEMA (err at the key). */
ml_status ml__hf_map_gemma(const ml_node *r, ml_model *m, ml_error *err);
ml_status ml__hf_map_phi3(const ml_node *r, ml_model *m, ml_error *err);
/* MixtralForCausalLM's experts (hf_falcon.c): num_local_experts,
 * num_experts_per_tok. */
ml_status ml__hf_map_mixtral_experts(const ml_node *r, ml_model *m, ml_error *err);
/* Qwen2MoeForCausalLM's experts (hf_falcon.c): num_experts,
 * num_experts_per_tok, moe_intermediate_size, the shared expert,
 * norm_topk_prob. */
ml_status ml__hf_map_qwen2_moe_experts(const ml_node *r, ml_model *m, ml_error *err);
/* The MLP's activation from `key` (hidden_act, GPT-2's activation_function,
 * Falcon's activation): gelu, gelu_pytorch_tanh and gelu_new as the
 * single-op GELU, relu; another value refused (`type` names the family). */
ml_status ml__hf_activation(const ml_node *r, const char *key, const char *type, ml_model *m,
                            ml_error *err);
/* FalconForCausalLM (hf_falcon.c). */
/* attn_implementation into m->attn.kernel, with transformers' default for
 * the family fam when it is absent (m->attention_assumed says why;
 * hf_families.c). ML_SCHEMA, with the value's position, for a value not
 * modelled. */
ml_status ml__hf_attention(const ml_node *r, unsigned fam, ml_model *m, ml_error *err);
ml_status ml__hf_map_falcon(const ml_node *r, ml_model *m, ml_error *err);
/* model_type gemma2: Gemma's layer with the post norms, the score scale,
 * the soft-caps and the alternating sliding window (hf_gated.c). */
ml_status ml__hf_map_gemma2(const ml_node *r, ml_model *m, ml_error *err);
/* T5ForConditionalGeneration and (mt5) MT5ForConditionalGeneration, with
 * MT5Config's defaults (hf_t5.c): the sizes and T5's layer, after
 * hf.c has checked the keys and read attn_implementation; sets the training
 * defaults. */
ml_status ml__hf_map_t5(const ml_node *r, ml_model *m, bool mt5, ml_error *err);
/* DeepseekV3ForCausalLM and DeepseekV2ForCausalLM (hf_deepseek.c). */
ml_status ml__hf_map_deepseek_v3(const ml_node *r, ml_model *m, ml_error *err);
ml_status ml__hf_map_deepseek_v2(const ml_node *r, ml_model *m, ml_error *err);

/* The transformer's sizes of every family but T5's, mT5's and a llava's
 * top level (its text_config comes here; hf_families.c): layers, hidden,
 * heads and key/value heads, the MLP's width, the vocabulary, the
 * positions, the head size. An absent intermediate_size,
 * num_key_value_heads or head_dim takes fi's config class's default, as an
 * unconfigured run does; null, or a default of None, the classes' rule for
 * None (4 · hidden_size, num_attention_heads, hidden_size /
 * num_attention_heads). own_head_dim: the family's attention reads
 * head_dim (another's must be hidden / heads); vit: no vocabulary; !req: a
 * llava's llama text_config, whose absent sizes keep LlamaConfig's
 * (ml__hf_nesting set them). A default a check refuses is said as the
 * class's, at the object that lacks the key. ML_OK, ML_SCHEMA or ML_RANGE. */
ml_status ml__hf_sizes(const ml_node *r, const ml_hf_family_info *fi, bool own_head_dim, bool vit,
                       bool req, ml_model *m, ml_error *err);
/* A llava's text_config (hf.c): a decoder family's config, a llama's with
 * LlamaConfig's defaults for absent sizes. */
ml_status ml__hf_map_text(const ml_node *r, ml_model *m, ml_error *err);
/* Where a family may stand (hf_llava.c): clip_vision_model only nested in
 * a llava, llava only at the top; a nested llama takes LlamaConfig's
 * defaults for absent sizes. ML_OK or ML_SCHEMA (at model_type). */
ml_status ml__hf_nesting(const ml_node *mt, const char *t, unsigned fam, bool nested, ml_model *m,
                         ml_error *err);
/* LlavaForConditionalGeneration (hf_llava.c): the text_config through
 * ml__hf_map_text, the vision_config's tower, the projector. */
ml_status ml__hf_map_llava(const ml_node *r, ml_model *m, ml_error *err);

#endif
