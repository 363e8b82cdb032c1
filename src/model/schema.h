/* What the model file schema's two files share (schema.c: the file, a
 * transformer, training: and device:; schema_layers.c: a sequential model's
 * layers). Internal to src/model/. */
#ifndef ML_SCHEMA_H
#define ML_SCHEMA_H

#include "model/model_internal.h"
#include "model/tree.h"

/* model: of type sequential: input, loss and the layers, each layer's
 * shape checked against its input (shape.c). */
ml_status ml__schema_sequential(ml_error *err, const ml_node *mm, ml_model *m);

/* model:'s post_norms, attn_scalar, attn_softcap and final_softcap
 * (schema_gemma2.c), after the other transformer keys. */
ml_status ml__schema_gemma2(ml_error *err, const ml_node *mm, ml_model *m);
/* shared_norm, norm_bias (schema_variants.c). */
ml_status ml__schema_falcon(ml_error *err, const ml_node *mm, ml_model *m);
/* experts, experts_per_tok (schema_variants.c). */
ml_status ml__schema_experts(ml_error *err, const ml_node *mm, ml_model *m);
/* kv_lora_rank, q_lora_rank, rope_head_dim, v_head_dim: multi-head latent
 * attention (schema_variants.c), after the experts' keys. */
ml_status ml__schema_mla(ml_error *err, const ml_node *mm, ml_model *m);
/* norm: olmo_layernorm (HF OlmoLayerNorm) is planned in the layouts the op
 * graph expresses with it (docs/graph.md): a plain pre-norm decoder. */
ml_status ml__schema_olmo(ml_error *err, const ml_node *mm, ml_model *m);
/* A size, or "0" for none (device.blas_workspace), into *out; the message
 * names key (config_set.c). */
ml_status ml__size_or_none(const char *key, const char *v, uint64_t *out, ml_error *err);
/* The per-model default of training.seq_len (schema_t5.c). */
void ml__schema_seq_default(ml_model *m);
/* model: of type encoder-decoder (T5; schema_t5.c). */
ml_status ml__schema_encdec(ml_error *err, const ml_node *mm, ml_model *m);
/* model: of a decoder or encoder, the keys of ml__schema_transformer_keys
 * (schema.c). */
ml_status ml__schema_transformer(ml_error *err, const ml_node *mm, ml_model *m);
/* model: of type multimodal (Llava; schema_llava.c): a decoder model with
 * a vision tower. */
ml_status ml__schema_multimodal(ml_error *err, const ml_node *mm, ml_model *m);
/* sec.key: absent, or its only modelled value `want`; else refused with
 * `why` and the fix (schema_t5.c). */
ml_status ml__schema_only(ml_error *err, const ml_node *map, const char *sec, const char *key,
                          const char *want, const char *why);
/* training.vision_tower, and for a multimodal model seq_len and
 * eval_seq_len against its image tokens (schema_llava.c). */
ml_status ml__schema_vision_tower(ml_error *err, const ml_node *t, ml_model *m);
/* The top-level parallel: section, a mapping or the compact form
 * (parallel.c). */
ml_status ml__schema_parallel(ml_error *err, const ml_node *p, ml_model *m);
/* training.engine (parallel.c): megatron also keeps the gradients
 * (zero_grad: zero) unless the section says otherwise. */
ml_status ml__schema_engine(ml_error *err, const ml_node *t, ml_training *tr);
/* ml_config_set's parallel.KEY (parallel.c). */
ml_status ml__parallel_set(const char *key, const char *v, ml_training *t, ml_error *err);
/* The keys a transformer's model: accepts (schema_variants.c). */
const char *const *ml__schema_transformer_keys(size_t *count);

#endif
