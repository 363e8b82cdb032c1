/* The Hugging Face import's key table (hf.c; the families: hf_families.c):
 * every config.json key with what the import does with it — honoured,
 * inert, approximated or refused — and why. docs/hf.md's key table is
 * checked against this one (tests/unit/test_hf.c). */
#include <string.h>

#include "model/model_internal.h"


/* ---- the key table ------------------------------------------------------ */

#define MIX ML_HF_MIXTRAL
#define QWM ML_HF_QWEN2MOE
#define QW (ML_HF_QWEN2 | QWM)
#define LM3 (ML_HF_LLAMA | ML_HF_MISTRAL | QW | MIX)
#define GEM (ML_HF_GEMMA | ML_HF_GEMMA2) /* Gemma and Gemma 2 */
#define GEM2 ML_HF_GEMMA2
#define PHI ML_HF_PHI3
#define FAL ML_HF_FALCON
#define DS3 ML_HF_DEEPSEEK3
#define DS2 ML_HF_DEEPSEEK2
#define DSK (DS2 | DS3)
#define OLM ML_HF_OLMO
#define DEC (LM3 | GEM | PHI | ML_HF_GPT2 | ML_HF_NEOX | FAL | DSK | OLM)
#define ENC (ML_HF_BERT | ML_HF_VIT)
#define T5 (ML_HF_T5 | ML_HF_MT5)
#define LLV ML_HF_LLAVA
#define CLV ML_HF_CLIPV
#define ALL (DEC | ENC | T5 | LLV | CLV)
#define H ML_HF_HONOURED
#define I ML_HF_INERT
#define A ML_HF_APPROXIMATED
#define R ML_HF_REFUSED_UNLESS

#define ACT_NOTE                                                                               \
    "gelu and gelu_pytorch_tanh: the single-op GELU; relu; gelu_new (HF GPT-2's default): "  \
    "transformers' composite of elementwise ops, which saves 3 B·T·F tensors more "          \
    "(docs/inventory.md); any other value is refused"
#define GEMMA_ACT_NOTE                                                                         \
    "gelu or gelu_pytorch_tanh (GeGLU): transformers versions differ in which key they read "  \
    "(hidden_activation, null meaning gelu_pytorch_tanh, where it exists; hidden_act "          \
    "elsewhere), and both values are the one F.gelu op, which saves its input either way, so " \
    "the plan is the same; any other value of either key is refused"
#define DROP_NOTE                                                                              \
    "a dropout probability: the planner has one switch (masks on the attention "              \
    "probabilities, the residual branches and the embeddings, or none), so values that are "  \
    "0 in some places and not in others are refused"
#define EPS_NOTE "the norm's epsilon: a value, not a size"
#define ROPE_NOTE "the rotation's frequencies: values of the same cos and sin tensors"
#define TOKEN_NOTE "a token id: a value, not a size"
#define DTYPE_NOTE                                                                             \
    "the checkpoint's storage dtype; the training precision comes from the training "         \
    "settings (training.precision)"
#define GEN_NOTE "a generation setting: training does not generate"
#define SUMMARY_NOTE "GPT2DoubleHeadsModel's multiple-choice head; GPT2LMHeadModel has none"
#define LEGACY_NOTE "a key of Google's original BERT configs that transformers does not read"
#define VIT_POOLER_NOTE "ViTModel's pooler; ViTForImageClassification has none"
#define RAW_ROTARY_NOTE                                                                        \
    "cos and sin are counted full width (2·T·dh·w, once for all blocks): an over-estimate " \
    "by the fraction 1 − rotary_pct of that; the rotation has no parameters"
#define MOE_NOTE                                                                               \
    "mixture-of-experts layers are not modelled (these families' transformers classes "        \
    "would ignore the key: the config is another family's)"
#define PHI_DROP_NOTE                                                                          \
    "Phi-3's dropouts (on the attention probabilities after their cast, the residual "          \
    "branches, the embeddings) are not modelled in its block"
#define WINDOW_NOTE                                                                            \
    "attention over a sliding window is not modelled: planning more tokens than the window "  \
    "is refused"

static const ml_hf_key keys[] = {
    /* the family, the head, the name */
    {"model_type", ALL, H, NULL, "the family (the table above)"},
    {"architectures", ALL, H, NULL,
     "the head: only the class the planner builds is accepted (the list above); absent or "
     "null: that class"},
    {"_name_or_path", ALL, H, NULL, "the plan's name (its last path component)"},
    {"attn_implementation", ALL, H, NULL,
     "eager, sdpa, flash_attention_2, flash_attention_3 (above); absent or null: "
     "transformers' default, sdpa (T5: eager; DeepSeek: eager, an upper bound), said in the "
     "report; others refused (T5: eager only, its position bias being added to the scores)"},
    /* shapes */
    {"num_hidden_layers", ALL & ~LLV, H, NULL,
     "the layers (GPT-2: the alias of n_layer; T5: of num_layers, T5Config's attribute_map)"},
    {"hidden_size", ALL & ~LLV, H, NULL, "D (GPT-2: the alias of n_embd; T5: of d_model)"},
    {"num_attention_heads", ALL & ~LLV, H, NULL, "H (GPT-2: the alias of n_head; T5: of num_heads)"},
    {"n_layer", ML_HF_GPT2, H, NULL, "the layers"},
    {"n_embd", ML_HF_GPT2, H, NULL, "D"},
    {"n_head", ML_HF_GPT2, H, NULL, "H"},
    {"n_inner", ML_HF_GPT2, H, NULL, "F; absent or null: 4 · n_embd (GPT2Config's None)"},
    {"n_positions", ML_HF_GPT2, H, NULL,
     "learned positions (n_positions × D parameters) and the longest sequence"},
    {"max_position_embeddings", ML_HF_GPT2 | ML_HF_BERT, H, NULL,
     "learned positions (max_position_embeddings × D parameters) and the longest sequence "
     "(GPT-2: the alias of n_positions)"},
    {"max_position_embeddings", LM3 | GEM | PHI | ML_HF_NEOX | FAL | DSK | OLM, H, NULL,
     "the default sequence length, the smaller of it and 2048 (rotary positions have no "
     "parameters)"},
    {"num_key_value_heads", LM3 | GEM | PHI | OLM, H, NULL,
     "Hkv (grouped-query attention); absent, the config class's default: 8 for mistral and "
     "mixtral, 32 for qwen2, 16 for qwen2_moe and gemma, 4 for gemma2, H for llama, phi3 and "
     "olmo (their None); null: H; a default that does not divide H is refused, naming the key "
     "to give"},
    {"num_key_value_heads", DSK, H, NULL,
     "must equal num_attention_heads: latent attention makes H key and value heads, and "
     "repeating them is not modelled; absent, DeepseekV3Config's 128 (so refused unless H is "
     "128) and DeepseekV2Config's None, H; null: H"},
    {"head_dim", LM3 | GEM | PHI, H, NULL,
     "dh: q projects D to H·dh, k and v to Hkv·dh, o_proj H·dh back to D; absent, the config "
     "class's default: 256 for gemma and gemma2 (H need not divide D), D / H for the others "
     "(hidden_size // num_attention_heads); null: D / H"},
    {"head_dim", ML_HF_GPT2 | ML_HF_NEOX | FAL | ENC, R, NULL,
     "these families' head size is hidden_size / num_attention_heads: another value is "
     "refused"},
    {"intermediate_size", (LM3 & ~QWM) | GEM | ML_HF_NEOX | ENC | CLV | OLM, H, NULL,
     "F; absent, the config class's default: 11008 for llama and olmo, 14336 for mistral and "
     "mixtral, 22016 for qwen2, 24576 for gemma and gpt_neox, 9216 for gemma2, 3072 for bert, "
     "vit and clip_vision_model"},
    {"intermediate_size", QWM, I, NULL,
     "the dense MLP's width, for the layers decoder_sparse_step and mlp_only_layers leave "
     "dense (refused): every layer planned is sparse"},
    {"intermediate_size", PHI, H, NULL,
     "F: gate_up_proj projects D to 2·F, down_proj F to D; absent, Phi3Config's 8192"},
    {"vocab_size", DEC | ML_HF_BERT | T5, H, NULL, "V"},
    {"type_vocab_size", ML_HF_BERT, H, NULL, "token-type embeddings (default 2)"},
    {"image_size", ML_HF_VIT | CLV, H, NULL, "the image side; T = (image_size / patch_size)² + 1"},
    {"patch_size", ML_HF_VIT | CLV, H, NULL, "the patch side (must divide image_size)"},
    {"num_channels", ML_HF_VIT | CLV, H, NULL, "the image channels (default 3)"},
    /* the layer's layout */
    {"hidden_act", LM3 | PHI | DSK | OLM, H, NULL, "silu (SwiGLU); any other value is refused"},
    {"hidden_act", ML_HF_NEOX | ENC, H, NULL, ACT_NOTE},
    {"hidden_act", GEM, H, NULL, GEMMA_ACT_NOTE},
    {"hidden_activation", GEM, H, NULL, GEMMA_ACT_NOTE},
    {"activation_function", ML_HF_GPT2, H, NULL, ACT_NOTE},
    {"attention_bias", ML_HF_LLAMA | GEM | OLM, H, NULL,
     "biases on q, k, v and o_proj (default false)"},
    {"attention_bias", ML_HF_MISTRAL | MIX, R, "false|null",
     "MistralAttention and MixtralAttention have no biases (they do not read the key)"},
    {"attention_bias", DSK, R, "false|null",
     "biases on q_a_proj, kv_a_proj_with_mqa and o_proj are not modelled (DeepSeek-V3 has "
     "none)"},
    {"attention_bias", PHI, R, "false|null",
     "Phi3Attention's qkv_proj and o_proj have no biases (it does not read the key)"},
    {"attention_bias", QW, R, "true|null",
     "Qwen2Attention always has q, k and v biases (it does not read the key)"},
    {"attention_bias", ML_HF_NEOX, R, "true|null",
     "false drops the attention's biases but not the MLP's, which is not modelled"},
    {"mlp_bias", ML_HF_LLAMA, H, NULL,
     "biases on gate_proj, up_proj and down_proj (default false)"},
    {"qkv_bias", ML_HF_VIT, H, NULL, "biases on q, k and v (default true)"},
    {"use_parallel_residual", ML_HF_NEOX, R, "true|null",
     "x + attn(ln1(x)) + mlp(ln2(x)) (the default); false, the sequential NeoX layer with its "
     "own attention layout, is not modelled"},
    {"tie_word_embeddings", DEC, H, NULL,
     "the LM head shares the embedding table (default true for gpt2, gemma and falcon, false "
     "for the others)"},
    {"tie_word_embeddings", ML_HF_BERT, H, NULL,
     "BertForMaskedLM: its decoder shares the word embeddings (default true; false adds a "
     "vocab_size × D decoder); the classifier has no output embedding to tie"},
    {"tie_word_embeddings", ML_HF_VIT, I, NULL, "the classifier has no output embedding to tie"},
    {"tie_word_embeddings", T5, H, NULL,
     "the LM head is the shared embedding (default true), the decoder's output rescaled by "
     "d_model^-0.5 before it"},
    {"position_embedding_type", ML_HF_BERT, R, "\"absolute\"|null",
     "relative_key and relative_key_query add distance embeddings and B·H·T²·dh products, "
     "which are not modelled"},
    {"is_llama_config", ML_HF_LLAMA, I, NULL,
     "a flag of nanotron's Llama export (SmolLM): LlamaConfig keeps it as an attribute, the "
     "model never reads it"},
    {"rope_interleaved", ML_HF_LLAMA, I, NULL,
     "nanotron's rotary layout flag (SmolLM): transformers' Llama never reads it (its rotary "
     "is rotate_half whatever the flag says)"},
    {"pretraining_tp", ML_HF_LLAMA, R, "1|null",
     "above 1, older transformers split every projection into slices, which is not modelled"},
    {"reorder_and_upcast_attn", ML_HF_GPT2, R, "false|null",
     "true computes the scores in fp32 with autocast off, which saves other tensors; not "
     "modelled"},
    {"scale_attn_weights", ML_HF_GPT2, I, NULL,
     "divides the scores by a Python scalar, which saves nothing"},
    {"scale_attn_by_inverse_layer_idx", ML_HF_GPT2, I, NULL,
     "divides the scores by a Python scalar, which saves nothing"},
    /* positions */
    {"rope_theta", LM3 | GEM | PHI | ML_HF_NEOX | FAL | DSK | OLM, I, NULL, ROPE_NOTE},
    {"rotary_emb_base", ML_HF_NEOX, I, NULL, ROPE_NOTE},
    {"rope_scaling", LM3 | GEM | PHI | ML_HF_NEOX | FAL | DSK | OLM, I, NULL,
     "linear, dynamic, yarn, llama3 or longrope rescaling of the rotation's frequencies: "
     "values of the same cos and sin tensors"},
    {"rope_parameters", LM3 | GEM | PHI | ML_HF_NEOX | FAL | DSK, I, NULL,
     "rope_theta and rope_scaling in one object (transformers 5): values of the same cos and "
     "sin tensors"},
    {"rotary_pct", ML_HF_NEOX, A, NULL, RAW_ROTARY_NOTE},
    {"partial_rotary_factor", ML_HF_NEOX, A, NULL, RAW_ROTARY_NOTE},
    {"partial_rotary_factor", LM3 | GEM | PHI, R, "1|null", "these attentions rotate the whole head"},
    /* sliding windows */
    {"sliding_window", ML_HF_MISTRAL, H, NULL,
     "the window (default 4096; null: none); " WINDOW_NOTE},
    {"sliding_window", MIX, H, NULL, "the window (default null: none); " WINDOW_NOTE},
    {"sliding_window", QW, H, NULL,
     "the window when use_sliding_window is true and a layer uses it; " WINDOW_NOTE},
    {"sliding_window", PHI, H, NULL,
     "the window (Phi3Config's default null: none; Phi-3-mini-4k: 2047); " WINDOW_NOTE},
    {"original_max_position_embeddings", PHI, I, NULL,
     "the pre-training context that longrope's rescaling reads: values of the same cos and "
     "sin tensors"},
    {"use_sliding_window", QW, H, NULL, "turns sliding_window on (default false)"},
    {"max_window_layers", QW, H, NULL,
     "the layers from this index on use the window (default 28)"},
    {"layer_types", QW, H, NULL,
     "full_attention or sliding_attention per layer (instead of max_window_layers)"},
    /* dropout */
    {"clip_qkv", OLM, R, "null",
     "OlmoAttention clamps q, k and v in place when it is set: not modelled"},
    {"attention_dropout", LM3 | GEM | DSK | OLM, R, "0|null",
     "attention dropout alone is not modelled: the planner's dropout also masks the residual "
     "branches and the embeddings, which these models do not"},
    {"attention_dropout", ML_HF_NEOX, H, NULL, DROP_NOTE},
    {"attention_dropout", PHI, R, "0|null", PHI_DROP_NOTE},
    {"resid_pdrop", PHI, R, "0|null", PHI_DROP_NOTE},
    {"embd_pdrop", PHI, R, "0|null", PHI_DROP_NOTE},
    {"hidden_dropout", ML_HF_NEOX, H, NULL, DROP_NOTE},
    {"resid_pdrop", ML_HF_GPT2, H, NULL, DROP_NOTE},
    {"embd_pdrop", ML_HF_GPT2, H, NULL, DROP_NOTE},
    {"attn_pdrop", ML_HF_GPT2, H, NULL, DROP_NOTE},
    {"hidden_dropout_prob", ENC, H, NULL, DROP_NOTE},
    {"attention_probs_dropout_prob", ENC, H, NULL, DROP_NOTE},
    {"classifier_dropout", ML_HF_BERT, H, NULL,
     "null: hidden_dropout_prob; " DROP_NOTE "; BertForMaskedLM has no classifier and does not "
     "read it"},
    {"classifier_dropout", ML_HF_NEOX, I, NULL,
     "GPTNeoXForTokenClassification's; the causal LM and GPTNeoXForSequenceClassification "
     "have no dropout before their head"},
    /* the head */
    {"num_labels", ENC, H, NULL,
     "the classes; refused when id2label has another count, and 1 (a regression, MSELoss) is "
     "refused; BertForMaskedLM's head has vocab_size outputs and does not read it"},
    {"id2label", ENC, H, NULL,
     "the classes: its count (default 2); BertForMaskedLM's head has vocab_size outputs and "
     "does not read it"},
    {"num_labels", DEC, H, NULL,
     "*ForSequenceClassification: the classes, as for the encoders (1, a regression, refused); "
     "the causal LM head has vocab_size outputs and does not read it"},
    {"id2label", DEC, H, NULL,
     "*ForSequenceClassification: the classes (its count); the causal LM does not read it"},
    {"label2id", ALL, I, NULL, "label names"},
    {"problem_type", ENC, R, "null|\"single_label_classification\"",
     "the regression (MSELoss) and multi-label (BCEWithLogitsLoss) heads are not modelled"},
    {"problem_type", DEC, H, NULL,
     "*ForSequenceClassification: null or single_label_classification, else refused (the "
     "regression and multi-label losses are not modelled); the causal LM does not read it"},
    {"use_cache", DEC, H, NULL,
     "the evaluation output holds every layer's keys and values (default true)"},
    {"use_cache", ENC, I, NULL, "BERT and ViT return no cache (BERT only as a decoder, refused)"},
    {"use_cache", T5, A, NULL,
     "true (default): the evaluation output holds every decoder layer's self- and "
     "cross-attention keys and values (planned); a training forward without gradient "
     "checkpointing keeps them too, which the plan leaves out (docs/inventory.md, \"T5\"): a "
     "loop that sets use_cache=False, or checkpoints, trains what is planned"},
    /* inert per family */
    {"rms_norm_eps", LM3 | GEM | PHI | DSK, I, NULL, EPS_NOTE},
    {"layer_norm_eps", ML_HF_NEOX | ENC | CLV, I, NULL, EPS_NOTE},
    {"layer_norm_epsilon", ML_HF_GPT2 | FAL, I, NULL, EPS_NOTE},
    {"n_ctx", ML_HF_GPT2, I, NULL, "the legacy context length; transformers reads n_positions"},
    {"summary_type", ML_HF_GPT2, I, NULL, SUMMARY_NOTE},
    {"summary_use_proj", ML_HF_GPT2, I, NULL, SUMMARY_NOTE},
    {"summary_activation", ML_HF_GPT2, I, NULL, SUMMARY_NOTE},
    {"summary_proj_to_labels", ML_HF_GPT2, I, NULL, SUMMARY_NOTE},
    {"summary_first_dropout", ML_HF_GPT2, I, NULL, SUMMARY_NOTE},
    {"encoder_stride", ML_HF_VIT, I, NULL, "ViTForMaskedImageModeling's decoder"},
    {"pooler_output_size", ML_HF_VIT, I, NULL, VIT_POOLER_NOTE},
    {"pooler_act", ML_HF_VIT, I, NULL, VIT_POOLER_NOTE},
    {"directionality", ML_HF_BERT, I, NULL, LEGACY_NOTE},
    {"pooler_fc_size", ML_HF_BERT, I, NULL, LEGACY_NOTE},
    {"pooler_num_attention_heads", ML_HF_BERT, I, NULL, LEGACY_NOTE},
    {"pooler_num_fc_layers", ML_HF_BERT, I, NULL, LEGACY_NOTE},
    {"pooler_size_per_head", ML_HF_BERT, I, NULL, LEGACY_NOTE},
    {"pooler_type", ML_HF_BERT, I, NULL, LEGACY_NOTE},
    /* PretrainedConfig's own keys */
    {"is_decoder", DEC, I, NULL, "the causal LMs do not read it"},
    {"is_decoder", ENC, R, "false|null", "BERT as a decoder (causal mask, cache) is not modelled"},
    {"initializer_range", ALL, I, NULL, "initialisation only"},
    {"bos_token_id", ALL, I, NULL, TOKEN_NOTE},
    {"eos_token_id", ALL, I, NULL, TOKEN_NOTE},
    {"pad_token_id", T5, I, NULL,
     TOKEN_NOTE " (the decoder's start token and the labels' padding in _shift_right)"},
    {"pad_token_id", ENC, I, NULL,
     TOKEN_NOTE " (the embedding's padding row gets a zero gradient in the same tensors)"},
    {"pad_token_id", DEC, H, NULL,
     "*ForSequenceClassification finds each sequence's last token by it; absent or null, a "
     "micro-batch above 1 is refused, as transformers refuses it; the causal LM uses it as a "
     "token id only"},
    {"sep_token_id", ALL, I, NULL, TOKEN_NOTE},
    {"decoder_start_token_id", ALL, I, NULL, TOKEN_NOTE},
    {"torch_dtype", ALL, I, NULL, DTYPE_NOTE},
    {"dtype", ALL, I, NULL, DTYPE_NOTE},
    {"use_bfloat16", ALL, I, NULL, "TensorFlow and JAX only"},
    {"tf_legacy_loss", ALL, I, NULL, "TensorFlow and JAX only"},
    {"transformers_version", ALL, I, NULL, "provenance"},
    {"auto_map", ALL, I, NULL,
     "the hub's remote code, read only with trust_remote_code=True; without it transformers "
     "builds its own class for model_type, which is what is planned"},
    {"_commit_hash", ALL, I, NULL, "provenance"},
    {"_attn_implementation_autoset", ALL, I, NULL, "transformers' bookkeeping"},
    {"return_dict", ALL, I, NULL, "the output container's type"},
    {"tokenizer_class", ALL, I, NULL, "a tokenizer setting"},
    {"prefix", ALL, I, NULL, "a tokenizer setting"},
    {"finetuning_task", ALL, I, NULL, "a label"},
    {"task_specific_params", ALL, I, NULL, "pipeline settings"},
    {"max_length", ALL, I, NULL, GEN_NOTE},
    {"min_length", ALL, I, NULL, GEN_NOTE},
    {"do_sample", ALL, I, NULL, GEN_NOTE},
    {"early_stopping", ALL, I, NULL, GEN_NOTE},
    {"num_beams", ALL, I, NULL, GEN_NOTE},
    {"num_beam_groups", ALL, I, NULL, GEN_NOTE},
    {"diversity_penalty", ALL, I, NULL, GEN_NOTE},
    {"temperature", ALL, I, NULL, GEN_NOTE},
    {"top_k", ALL, I, NULL, GEN_NOTE},
    {"top_p", ALL, I, NULL, GEN_NOTE},
    {"typical_p", ALL, I, NULL, GEN_NOTE},
    {"repetition_penalty", ALL, I, NULL, GEN_NOTE},
    {"length_penalty", ALL, I, NULL, GEN_NOTE},
    {"no_repeat_ngram_size", ALL, I, NULL, GEN_NOTE},
    {"encoder_no_repeat_ngram_size", ALL, I, NULL, GEN_NOTE},
    {"bad_words_ids", ALL, I, NULL, GEN_NOTE},
    {"num_return_sequences", ALL, I, NULL, GEN_NOTE},
    {"output_scores", ALL, I, NULL, GEN_NOTE},
    {"return_dict_in_generate", ALL, I, NULL, GEN_NOTE},
    {"forced_bos_token_id", ALL, I, NULL, GEN_NOTE},
    {"forced_eos_token_id", ALL, I, NULL, GEN_NOTE},
    {"remove_invalid_values", ALL, I, NULL, GEN_NOTE},
    {"exponential_decay_length_penalty", ALL, I, NULL, GEN_NOTE},
    {"suppress_tokens", ALL, I, NULL, GEN_NOTE},
    {"begin_suppress_tokens", ALL, I, NULL, GEN_NOTE},
    {"gradient_checkpointing", ALL, R, "false|null",
     "true turned checkpointing on in older transformers: give training.checkpoint instead"},
    {"output_hidden_states", ALL, R, "false|null",
     "the output would hold every layer's hidden states, which is not modelled"},
    {"output_attentions", ALL, R, "false|null",
     "the output would hold every layer's attention probabilities, which is not modelled"},
    {"torchscript", ALL, R, "false|null",
     "true clones tied embeddings into two parameters, which is not modelled"},
    {"pruned_heads", ALL, R, "{}|null", "pruned heads shrink the projections, not modelled"},
    {"chunk_size_feed_forward", ALL, R, "0|null",
     "a chunked feed-forward keeps other tensors, not modelled"},
    {"add_cross_attention", ALL, R, "false|null",
     "cross-attention layers added to a decoder are not modelled (T5's own are)"},
    {"cross_attention_hidden_size", ALL, R, "null", "cross-attention layers are not modelled"},
    {"is_encoder_decoder", ALL & ~T5, R, "false|null",
     "encoder-decoder models are not modelled, except T5"},
    {"is_encoder_decoder", T5, R, "true|null", "T5 is an encoder-decoder (T5Config: true)"},
    {"tie_encoder_decoder", ALL, R, "false|null",
     "the encoder's weights tied to the decoder's are not modelled"},
    {"quantization_config", ALL, R, "null",
     "quantized weights are not modelled; without the key the plan is the dequantized model's "
     "(the precision training.precision names)"},
    /* other families' keys that change parameters, saved tensors or FLOPs */
    {"num_local_experts", ALL & ~MIX, R, "0|1|null", MOE_NOTE},
    {"num_experts", ALL & ~QWM, R, "0|1|null", MOE_NOTE},
    {"num_experts_per_tok", ALL & ~(MIX | QWM | DSK), R, "0|1|null", MOE_NOTE},
    {"n_routed_experts", ALL & ~DSK, R, "0|null", MOE_NOTE},
    {"moe_intermediate_size", ALL & ~(QWM | DSK), R, "0|null", MOE_NOTE},
    {"n_shared_experts", ALL & ~DSK, R, "0|null", MOE_NOTE},
    {"first_k_dense_replace", ALL & ~DSK, R, "0|null", MOE_NOTE},
    {"kv_lora_rank", ALL & ~DSK, R, "null",
     "multi-head latent attention is DeepSeek's: these families do not read it, the config "
     "is DeepSeek's"},
    {"q_lora_rank", ALL & ~DSK, R, "null",
     "multi-head latent attention is DeepSeek's: these families do not read it"},
    {"shared_expert_intermediate_size", ALL & ~QWM, R, "0|null", MOE_NOTE},
    {"use_bidirectional_attention", GEM, R, "false|null",
     "attention without the causal mask (EmbeddingGemma's) is not the causal LM planned"},
    {"hidden_activation", ALL & ~GEM, R, "null",
     "Gemma's activation key: these families do not read it, the config is Gemma's"},
    {"query_pre_attn_scalar", ALL & ~GEM2, R, "null",
     "Gemma 2's score scale: these families do not read it, the config is Gemma 2's"},
    {"attn_logit_softcapping", ALL & ~GEM2, R, "null",
     "soft-capped scores are Gemma 2's: these families do not read it"},
    {"final_logit_softcapping", ALL & ~GEM2, R, "null",
     "soft-capped logits are Gemma 2's: these families do not read it"},
    /* Mixtral */
    {"num_local_experts", MIX, H, NULL,
     "E SwiGLU experts of intermediate_size each (default 8): E·3·D·F parameters; every "
     "token's rows saved once per expert it is routed to (docs/inventory.md)"},
    {"num_experts_per_tok", MIX, H, NULL, "k, the experts each token is routed to (default 2)"},
    {"output_router_logits", MIX | QWM, R, "false|null",
     "true adds the load-balancing loss over every layer's router logits, which is not "
     "modelled"},
    {"router_aux_loss_coef", MIX | QWM, I, NULL,
     "the load-balancing loss's weight, used only with output_router_logits (refused)"},
    {"router_jitter_noise", MIX, R, "0|null",
     "multiplies the router's input by uniform noise in place during training: not "
     "modelled"},
    /* Qwen2-MoE */
    {"num_experts", QWM, H, NULL,
     "E SwiGLU experts of moe_intermediate_size each (default 60): E·3·D·F parameters"},
    {"num_experts_per_tok", QWM, H, NULL, "k, the experts each token is routed to (default 4)"},
    {"moe_intermediate_size", QWM, H, NULL, "each expert's width F (default 1408)"},
    {"shared_expert_intermediate_size", QWM, H, NULL,
     "the shared expert's width, a SwiGLU on every token gated by sigmoid(shared_expert_gate) "
     "(default 5632; the block always builds it, so 0 is out of range)"},
    {"norm_topk_prob", QWM, H, NULL,
     "renormalise the top-k weights in place, which keeps their sum and a copy (default "
     "false)"},
    {"qkv_bias", QWM, H, NULL, "biases on q, k and v (default true)"},
    {"decoder_sparse_step", QWM, R, "1|null",
     "above 1 some layers have a dense MLP instead of the experts: not modelled"},
    {"mlp_only_layers", QWM, R, "[]|null",
     "the layers it names have a dense MLP instead of the experts: not modelled"},
    /* Falcon */
    {"alibi", FAL, R, "false|null",
     "ALiBi adds a bias to the scores and runs another attention path; the rotary Falcons "
     "(alibi: false) are planned"},
    {"new_decoder_architecture", FAL, R, "false|null",
     "the Falcon-40B/180B layer (grouped key/value heads, ln_attn and ln_mlp) is not modelled; "
     "Falcon-7B's is"},
    {"parallel_attn", FAL, R, "true|null",
     "the sequential layer (post_attention_layernorm) is not modelled; true: x + attn(ln(x)) + "
     "mlp(ln(x)), one LayerNorm for both branches"},
    {"num_ln_in_parallel_attn", FAL, R, "1|null",
     "2 belongs to the new decoder architecture (ln_attn and ln_mlp)"},
    {"multi_query", FAL, H, NULL,
     "one key/value head (default true); false: num_attention_heads of them"},
    {"num_kv_heads", FAL, H, NULL,
     "read only with multi_query false, where it must equal num_attention_heads (the old "
     "architecture's reshape)"},
    {"ffn_hidden_size", FAL, H, NULL, "F (default 4 · hidden_size)"},
    {"activation", FAL, H, NULL, ACT_NOTE " (default gelu)"},
    {"bias", FAL, R, "false|null",
     "FalconLinear adds its bias after the matmul, which under autocast promotes the "
     "projections' outputs to fp32: not modelled (Falcon-7B has none; the LayerNorms keep "
     "theirs either way)"},
    {"hidden_dropout", FAL, R, "0|null",
     "Falcon drops out the sum of both branches once (dropout_add), not each branch as the "
     "planner's dropout does"},
    {"attention_dropout", FAL, R, "0|null",
     "the rotary eager and sdpa paths apply none, flash_attention_2 does: not modelled"},
    {"apply_residual_connection_post_layernorm", FAL, I, NULL,
     "FalconConfig keeps it; modeling_falcon.py does not read it"},
    /* DeepSeek-V2 and DeepSeek-V3 */
    {"intermediate_size", DSK, H, NULL,
     "the dense MLP's width F, in the first first_k_dense_replace layers (default 18432 for "
     "V3, 11008 for V2)"},
    {"kv_lora_rank", DSK, H, NULL,
     "the compressed key/value width: kv_a_proj_with_mqa projects D to it plus "
     "qk_rope_head_dim, its RMSNorm, kv_b_proj to H·(qk_nope_head_dim + v_head_dim) "
     "(default 512)"},
    {"q_lora_rank", DSK, H, NULL,
     "the compressed query width: q_a_proj, its RMSNorm, q_b_proj to H·(qk_nope_head_dim + "
     "qk_rope_head_dim) (default 1536); null: one q_proj"},
    {"qk_nope_head_dim", DSK, H, NULL, "each q/k head's part without rotary (default 128)"},
    {"qk_rope_head_dim", DSK, H, NULL,
     "each q/k head's rotated part, the key's shared by the heads (default 64)"},
    {"v_head_dim", DSK, H, NULL, "each value head's width (default 128)"},
    {"head_dim", DSK, I, NULL,
     "the configs set it to qk_rope_head_dim, the rotary's size, which qk_rope_head_dim "
     "gives"},
    {"qk_head_dim", DSK, I, NULL, "qk_nope_head_dim + qk_rope_head_dim, derived"},
    {"rope_interleave", DS3, I, NULL,
     "true rotates interleaved pairs: a view, a transpose and a reshape copy that nothing "
     "saves, then the same products (checked by the PyTorch twin)"},
    {"n_routed_experts", DSK, H, NULL,
     "E SwiGLU experts of moe_intermediate_size each (default 256 for V3, 64 for V2): "
     "E·3·D·F parameters"},
    {"num_experts_per_tok", DSK, H, NULL,
     "k, the experts each token is routed to (V3's default 8; V2 has none: required)"},
    {"moe_intermediate_size", DSK, H, NULL,
     "each expert's width F (default 2048 for V3, 1407 for V2)"},
    {"n_shared_experts", DSK, H, NULL,
     "the shared experts, one SwiGLU of moe_intermediate_size · n_shared_experts on every "
     "token, ungated (default 1 for V3, 2 for V2)"},
    {"first_k_dense_replace", DSK, H, NULL,
     "the first layers with a dense MLP of intermediate_size instead of the experts "
     "(default 3 for V3, 0 for V2)"},
    {"norm_topk_prob", DS3, H, NULL,
     "renormalise the top-k weights by their sum + 1e-20 in place, which keeps the sum and a "
     "copy (default true)"},
    {"norm_topk_prob", DS2, I, NULL, "DeepseekV2MoEGate does not read it (no renormalisation)"},
    {"routed_scaling_factor", DSK, I, NULL, "scales the top-k weights: a value, not a size"},
    {"n_group", DS3, I, NULL,
     "the expert groups the top-k is chosen within, under no_grad: values of transients"},
    {"n_group", DS2, H, NULL,
     "with group_limited_greedy: the groups of experts (must divide n_routed_experts); the "
     "group choice's own nodes die before the forward ends"},
    {"topk_group", DS3, I, NULL, "the groups kept: values of transients"},
    {"topk_group", DS2, H, NULL, "with group_limited_greedy: the groups kept, 1 to n_group"},
    {"scoring_func", DS3, R, "\"sigmoid\"|null",
     "DeepseekV3TopkRouter always scores by sigmoid; softmax is DeepSeek-V2's router"},
    {"scoring_func", DS2, R, "\"softmax\"|null", "DeepseekV2MoEGate always scores by softmax"},
    {"topk_method", DS3, R, "\"noaux_tc\"|null",
     "DeepseekV3TopkRouter always chooses as noaux_tc does; greedy and group_limited_greedy "
     "are DeepSeek-V2's"},
    {"topk_method", DS2, R, "\"greedy\"|\"group_limited_greedy\"|null",
     "greedy: topk over the scores; group_limited_greedy: the scores outside the chosen groups "
     "masked first (masked_fill keeps a B·T·E bool mask); DeepseekV2MoEGate has no other"},
    {"moe_layer_freq", DSK, R, "1|null",
     "transformers' layers have experts in every layer from first_k_dense_replace on, as 1 "
     "says; other values are the hub's remote code"},
    {"ep_size", DSK, R, "1|null", "the remote code's own expert split is not planned: plan Megatron's dispatch with --ep"},
    {"mlp_bias", DS2, R, "false|null",
     "biases on the experts' and shared experts' projections are not modelled (DeepSeek-V2 "
     "has none)"},
    {"aux_loss_alpha", DSK, I, NULL,
     "the remote code's load-balancing loss weight; transformers' classes compute no "
     "auxiliary loss"},
    {"seq_aux", DSK, I, NULL, "the remote code's sequence-level auxiliary loss; the same"},
    {"num_nextn_predict_layers", DS3, I, NULL,
     "the multi-token prediction module's layers: transformers does not load them "
     "(_keys_to_ignore_on_load_unexpected)"},
    {"pretraining_tp", DSK, I, NULL, "the configs keep it; the models do not read it"},
    /* Gemma 2 */
    {"query_pre_attn_scalar", GEM2, H, NULL,
     "the scores are scaled by its -0.5 power (default 256): a value, not a size; null is "
     "refused"},
    {"attn_logit_softcapping", GEM2, H, NULL,
     "eager attention's scores / cap, tanh, * cap: tanh keeps a B·H·T² tensor per layer "
     "(default 50; null: none)"},
    {"final_logit_softcapping", GEM2, H, NULL,
     "the logits / cap, tanh, * cap: tanh keeps a B·T·V tensor (default 30; null: none)"},
    {"sliding_window", GEM2, H, NULL,
     "the window of the layers layer_types names sliding_attention (default 4096, every "
     "other layer from the first; null: none); eager attention's window only changes the "
     "mask's values: " WINDOW_NOTE},
    {"layer_types", GEM2, H, NULL,
     "full_attention or sliding_attention per layer (default: sliding_attention on the "
     "even layers)"},
    {"sliding_window_size", GEM2, I, NULL,
     "an early name of the window that Gemma2Config does not read (sliding_window is the "
     "window)"},
    {"cache_implementation", GEM2, I, NULL,
     "the generation cache's class (hybrid): training does not generate"},
    /* T5 (T5Config, configuration_t5.py; hf_t5.c) */
    {"d_model", T5, H, NULL, "D (default 512)"},
    {"d_kv", T5, H, NULL, "each head's width (default 64): q, k, v project D to num_heads x d_kv"},
    {"d_ff", T5, H, NULL, "F (default 2048)"},
    {"num_layers", T5, H, NULL, "the encoder's blocks (default 6)"},
    {"num_decoder_layers", T5, H, NULL, "the decoder's blocks (default num_layers)"},
    {"num_heads", T5, H, NULL, "H (default 8)"},
    {"relative_attention_num_buckets", T5, H, NULL,
     "the buckets of each stack's relative_attention_bias (buckets x H parameters; default 32)"},
    {"relative_attention_max_distance", T5, I, NULL,
     "the distance the buckets reach (default 128): which bucket a pair falls in, not a size"},
    {"dropout_rate", T5, H, NULL, "the dropout probability (default 0.1)"},
    {"layer_norm_epsilon", T5, I, NULL, EPS_NOTE},
    {"initializer_factor", T5 | CLV, I, NULL, "initialisation only"},
    {"feed_forward_proj", T5, R, "\"relu\"|\"gated-gelu\"|null",
     "relu (default): T5DenseActDense; gated-gelu (T5 v1.1, FLAN-T5): T5DenseGatedActDense "
     "with gelu_new, a composite of elementwise ops (docs/inventory.md, \"T5\"); others "
     "refused"},
    {"dense_act_fn", T5, H, NULL,
     "the activation T5Config derives from feed_forward_proj (a config.json's value overrides "
     "it): relu without the gate, gelu_new with it; other pairs refused"},
    {"is_gated_act", T5, H, NULL,
     "whether the feed-forward is gated (T5Config: from feed_forward_proj; a config.json's "
     "value overrides it)"},
    {"is_decoder", T5, R, "false|null", "T5ForConditionalGeneration's config is not a decoder's"},
    {"n_positions", T5, I, NULL,
     "the length T5 was trained at (the default training.seq_len, 512): relative positions "
     "take any length"},
    {"output_past", T5, I, NULL, "a legacy generation switch transformers does not read"},
    {"classifier_dropout", T5, I, NULL,
     "T5ForSequenceClassification's head; T5ForConditionalGeneration has none"},
#include "model/hf_keys_llava.h"
};

#undef GEM
#undef T5
#undef LLV
#undef CLV
#undef MIX
#undef QWM
#undef QW
#undef FAL
#undef DS3
#undef DS2
#undef DSK
#undef GEM2
#undef PHI
#undef H
#undef I
#undef A
#undef R

const ml_hf_key *ml__hf_keys(size_t *count)
{
    *count = sizeof keys / sizeof *keys;
    return keys;
}

const ml_hf_key *ml__hf_key_find(unsigned family, const char *key)
{
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        if ((keys[i].families & family) && !strcmp(keys[i].key, key))
            return &keys[i];
    return NULL;
}
