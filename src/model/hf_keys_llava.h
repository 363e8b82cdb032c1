/* Rows of the Hugging Face import's key table (hf_keys.c includes this
 * inside its table, where H, I, R, LLV and CLV are defined): LlavaConfig's
 * own keys (configuration_llava.py) and the CLIP vision tower's
 * (CLIPVisionConfig, configuration_clip.py) that no other family shares.
 * The nested text_config is a decoder family's config, checked against
 * that family's rows (hf_llava.c). */
    {"vision_config", LLV, H, NULL,
     "the vision tower: a clip_vision_model config (CLIPVisionConfig's defaults for absent "
     "keys); other towers are refused"},
    {"text_config", LLV, H, NULL,
     "the language model: a decoder family's config (llama: LlamaConfig's defaults for absent "
     "keys; the others need their layers, hidden_size, num_attention_heads and vocab_size, "
     "and take their class's defaults for the other sizes; without model_type, llama's); "
     "absent: LlamaConfig's; its own attn_implementation wins over the top level's"},
    {"vision_feature_layer", LLV, H, NULL,
     "the hidden state the projector reads (default -2: the last layer's input); the layers "
     "after it run with their output unused; a list of layers is refused"},
    {"vision_feature_select_strategy", LLV, H, NULL,
     "default: the class token dropped, (image_size / patch_size)² image tokens; full: kept, "
     "one more"},
    {"projector_hidden_act", LLV, R, "\"gelu\"|null", "the projector's activation (gelu)"},
    {"multimodal_projector_bias", LLV, H, NULL, "the projector's biases (default true)"},
    {"image_seq_length", LLV, H, NULL,
     "the image tokens per image: must equal the tower's count (above)"},
    {"image_token_index", LLV, I, NULL, TOKEN_NOTE},
    {"image_token_id", LLV, I, NULL, TOKEN_NOTE},
    {"ignore_index", LLV, I, NULL, "the labels' ignored value: a value, not a size"},
    {"pad_token_id", LLV, I, NULL, TOKEN_NOTE},
    {"vocab_size", LLV, H, NULL,
     "older configs' copy of text_config's vocab_size: another value is refused"},
    {"tie_word_embeddings", LLV, H, NULL,
     "true ties the LM head to the token embeddings whatever text_config says; false leaves "
     "text_config's value (transformers ties by the text config's)"},
    {"hidden_act", CLV, H, NULL, "quick_gelu (CLIP's default) or gelu; others refused"},
    {"attention_dropout", CLV, R, "0|0.0|null", "dropout on the tower's attention probabilities"},
    {"dropout", CLV, I, NULL, "CLIPVisionConfig keeps it; the tower's layers do not read it"},
    {"projection_dim", CLV, I, NULL,
     "CLIPVisionModelWithProjection's projection; the tower (CLIPVisionModel) has none"},
    {"vocab_size", CLV, I, NULL, "a leftover of the CLIP text config in llava's vision_config"},
