/* The Hugging Face import's families (hf.c): each model_type with the one
 * transformers class the planner builds for it (chain_transformer.c,
 * chain_t5.c), that class's head and loss, and a second class where there
 * is one, its configuration class's defaults for the sizes config.json may
 * leave out, and the attention transformers runs for each when config.json
 * names none; the sizes the families share (ml__hf_sizes). docs/hf.md's
 * family table lists them. */
#include <string.h>

#include "model/hf_read.h"
#include "model/model_internal.h"
#include "model/tree.h"

/* The decoders' second class: transformers' GenericForSequenceClassification
 * (chain_head.c, seq_cls_head). */
#define SEQ_CLS_HEAD                                                                           \
    "the final norm, the score Linear (no bias) at every token, the logits of each "           \
    "sequence's last non-pad token (pad_token_id), cross-entropy over num_labels"

/* The families, each with the one transformers class the planner builds
 * (chain_transformer.c; T5: chain_t5.c): the head and the loss it models;
 * then its configuration class with that class's defaults for
 * intermediate_size, num_key_value_heads and head_dim (configuration_*.py;
 * 0: None, or no such key; ml__hf_sizes). T5, mT5, llava and the CLIP tower
 * read their sizes with their own defaults (hf_t5.c, hf_llava.c): 0s here. */
static const ml_hf_family_info families[ML_HF_FAMILY_COUNT] = {
    {"llama", ML_HF_LLAMA, "LlamaForCausalLM", "a causal LM head over vocab_size, cross-entropy",
     "LlamaForSequenceClassification", SEQ_CLS_HEAD,
     "LlamaConfig", 11008, 0, 0},
    {"mistral", ML_HF_MISTRAL, "MistralForCausalLM",
     "a causal LM head over vocab_size, cross-entropy", "MistralForSequenceClassification",
     SEQ_CLS_HEAD,
     "MistralConfig", 14336, 8, 0},
    {"mixtral", ML_HF_MIXTRAL, "MixtralForCausalLM",
     "a causal LM head over vocab_size, cross-entropy (no auxiliary loss: output_router_logits "
     "false)",
     "MixtralForSequenceClassification", SEQ_CLS_HEAD,
     "MixtralConfig", 14336, 8, 0},
    {"qwen2", ML_HF_QWEN2, "Qwen2ForCausalLM", "a causal LM head over vocab_size, cross-entropy",
     "Qwen2ForSequenceClassification", SEQ_CLS_HEAD,
     "Qwen2Config", 22016, 32, 0},
    {"qwen2_moe", ML_HF_QWEN2MOE, "Qwen2MoeForCausalLM",
     "a causal LM head over vocab_size, cross-entropy (no auxiliary loss: output_router_logits "
     "false)",
     "Qwen2MoeForSequenceClassification", SEQ_CLS_HEAD,
     "Qwen2MoeConfig", 5632, 16, 0},
    {"gpt2", ML_HF_GPT2, "GPT2LMHeadModel", "a causal LM head over vocab_size, cross-entropy",
     "GPT2ForSequenceClassification", SEQ_CLS_HEAD,
     "GPT2Config", 0, 0, 0},
    {"gpt_neox", ML_HF_NEOX, "GPTNeoXForCausalLM",
     "a causal LM head over vocab_size, cross-entropy", "GPTNeoXForSequenceClassification",
     SEQ_CLS_HEAD,
     "GPTNeoXConfig", 24576, 0, 0},
    {"bert", ML_HF_BERT, "BertForSequenceClassification",
     "the pooler, dropout and a num_labels classifier on the first token, cross-entropy",
     "BertForMaskedLM",
     "no pooler; the MLM head (dense, activation, LayerNorm, the decoder tied to the word "
     "embeddings and its bias) over vocab_size at every token, cross-entropy",
     "BertConfig", 3072, 0, 0},
    {"vit", ML_HF_VIT, "ViTForImageClassification",
     "a num_labels classifier on the class token, cross-entropy", NULL, NULL,
     "ViTConfig", 3072, 0, 0},
    {"gemma", ML_HF_GEMMA, "GemmaForCausalLM",
     "a causal LM head over vocab_size (tied by default), cross-entropy",
     "GemmaForSequenceClassification", SEQ_CLS_HEAD,
     "GemmaConfig", 24576, 16, 256},
    {"phi3", ML_HF_PHI3, "Phi3ForCausalLM", "a causal LM head over vocab_size, cross-entropy",
     "Phi3ForSequenceClassification", SEQ_CLS_HEAD,
     "Phi3Config", 8192, 0, 0},
    {"gemma2", ML_HF_GEMMA2, "Gemma2ForCausalLM",
     "a causal LM head over vocab_size (tied by default), the logits soft-capped, cross-entropy",
     "Gemma2ForSequenceClassification", SEQ_CLS_HEAD,
     "Gemma2Config", 9216, 4, 256},
    {"falcon", ML_HF_FALCON, "FalconForCausalLM",
     "a causal LM head over vocab_size (tied by default), cross-entropy",
     "FalconForSequenceClassification", SEQ_CLS_HEAD,
     "FalconConfig", 0, 0, 0},
    {"deepseek_v2", ML_HF_DEEPSEEK2, "DeepseekV2ForCausalLM",
     "a causal LM head over vocab_size, cross-entropy (no auxiliary loss)",
     "DeepseekV2ForSequenceClassification", SEQ_CLS_HEAD,
     "DeepseekV2Config", 11008, 0, 0},
    {"deepseek_v3", ML_HF_DEEPSEEK3, "DeepseekV3ForCausalLM",
     "a causal LM head over vocab_size, cross-entropy (no auxiliary loss; no multi-token "
     "prediction module: transformers does not load it)",
     NULL, NULL,
     "DeepseekV3Config", 18432, 128, 0},
    {"t5", ML_HF_T5, "T5ForConditionalGeneration",
     "the decoder's final norm, the LM head over vocab_size (tied by default: the decoder's "
     "output rescaled by d_model^-0.5 first), cross-entropy over the labels",
     NULL, NULL,
     "T5Config", 0, 0, 0},
    {"mt5", ML_HF_MT5, "MT5ForConditionalGeneration",
     "T5's (modeling_mt5.py is modeling_t5.py's layers); MT5Config's defaults: the gated "
     "feed-forward, an untied LM head over 250,112 tokens",
     NULL, NULL,
     "MT5Config", 0, 0, 0},
    {"llava", ML_HF_LLAVA, "LlavaForConditionalGeneration",
     "text_config's (a Llama's) causal LM head over its vocab_size, cross-entropy; one image "
     "per sample through vision_config's tower and the projector",
     NULL, NULL,
     "LlavaConfig", 0, 0, 0},
    {"clip_vision_model", ML_HF_CLIPV, "CLIPVisionModel",
     "none: planned as a llava's vision_config (the tower, its post_layernorm unused)", NULL,
     NULL,
     "CLIPVisionConfig", 0, 0, 0},
    {"olmo", ML_HF_OLMO, "OlmoForCausalLM",
     "a causal LM head over vocab_size (tied as OLMo-1B's, tie_word_embeddings), cross-entropy",
     NULL, NULL,
     "OlmoConfig", 11008, 0, 0},
};

/* Families transformers trains that the planner refuses, each with the
 * layer feature the op graph's kit (docs/graph.md) does not express: planning them with a near layout would be another model's
 * figures. docs/hf.md, "Families refused". */
static const struct {
    const char *type, *why;
} refused[] = {
    {"olmo2", "Olmo2DecoderLayer has no input norm: an RMSNorm on each branch's output "
              "before the add, and q_norm and k_norm, RMSNorms over the whole query and key "
              "projections; the kit has neither that layer nor the q/k norms"},
    {"phi", "PhiDecoderLayer (Phi-2) is a parallel layer with one LayerNorm, but rotates "
            "only partial_rotary_factor of each head (cos and sin would be counted full "
            "width) and adds an lm_head bias: not expressed exactly"},
    {"starcoder2", "Starcoder2DecoderLayer is Llama's layout (q/k/v/o projections, rotary, "
                   "repeat_kv, fp32 softmax) with nn.LayerNorm and a plain c_fc/c_proj MLP "
                   "with biases and residual dropouts; the kit's Llama layer takes only "
                   "RMSNorm-class norms, and GPT-2's layer is another layout"},
    {"gpt_bigcode", "GPTBigCodeAttention's multi-query path (one key/value head sliced "
                    "from c_attn, the query reshaped to (B, T x H, dh) for a baddbmm, the "
                    "fp32 upcast masked softmax scripted with torch.jit; sdpa on the key "
                    "and value expanded to every head) is not in the kit's GPT-2 layer, "
                    "which has as many key/value heads as query heads"},
    {"stablelm", "StableLmAttention rotates only partial_rotary_factor of each head (cos "
                 "and sin would be counted full width) in Llama's layout with nn.LayerNorm "
                 "norms, which the kit's Llama layer does not take; qk_layernorm adds "
                 "per-head LayerNorms"},
    {"granite", "GraniteDecoderLayer scales each branch by residual_multiplier before the "
                "add, and GraniteForCausalLM divides the logits by logits_scaling: each "
                "product is a tensor of its own in the forward (B x T x D, B x T x V) and a "
                "gradient of that size in the backward, ops the kit's Llama layer and head "
                "do not have"},
    {"cohere", "CohereLayerNorm is a composite of elementwise ops in fp32 (mean, variance, "
               "rsqrt, a weight and no bias) the kit has no component for, in a parallel "
               "layer with one norm, with interleaved rotary and the logits multiplied by "
               "logit_scale"},
};

const char *ml__hf_refused_family(const char *model_type)
{
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++)
        if (!strcmp(refused[i].type, model_type))
            return refused[i].why;
    return NULL;
}

unsigned ml__hf_family(const char *model_type)
{
    for (size_t i = 0; i < ML_HF_FAMILY_COUNT; i++)
        if (!strcmp(families[i].type, model_type))
            return families[i].bit;
    return 0;
}

const char *ml__hf_family_name(unsigned bit)
{
    for (size_t i = 0; i < ML_HF_FAMILY_COUNT; i++)
        if (families[i].bit == bit)
            return families[i].type;
    return "?";
}

const ml_hf_family_info *ml__hf_families(void)
{
    return families;
}

/* attn_implementation, the key PretrainedConfig's constructor takes
 * (transformers' configuration_utils.py): "eager" keeps the T x T scores;
 * "sdpa" is torch's scaled_dot_product_attention as dispatched (the ledger's
 * sdpa); the flash kernels save q, k, v, the output and a logsumexp (the
 * ledger's flash inventory). Absent or null: what transformers then runs
 * (modeling_utils.py, _check_and_enable_sdpa): sdpa for a class with
 * _supports_sdpa where the installed torch has it (2.1.1 on), which every
 * family here has but T5's (eager). DeepSeek's classes have it, but sdpa
 * with latent attention is not modelled (chain.c): eager, an upper bound,
 * and the report says so (docs/hf.md, "attn_implementation"). */
ml_status ml__hf_attention(const ml_node *r, unsigned fam, ml_model *m, ml_error *err)
{
    static const struct {
        const char *name;
        ml_attention attention;
    } kinds[] = {{"eager", ML_ATTN_EAGER},
                 {"sdpa", ML_ATTN_SDPA},
                 {"flash_attention_2", ML_ATTN_FLASH},
                 {"flash_attention_3", ML_ATTN_FLASH}};
    m->attn.kernel = ML_ATTN_EAGER;
    m->attn.kernel_assumed = NULL;
    const ml_node *n = ml__tree_get(r, "attn_implementation");
    if (!n || ml__hf_is_null(n)) {
        if (fam & (ML_HF_T5 | ML_HF_MT5)) {
            m->attn.kernel_assumed = "config.json names no attn_implementation, and "
                                     "transformers runs T5's attention eagerly (its classes "
                                     "have no sdpa)";
        } else if (fam & (ML_HF_DEEPSEEK3 | ML_HF_DEEPSEEK2)) {
            m->attn.kernel_assumed = "config.json names no attn_implementation; transformers "
                                     "would then run sdpa, which is not modelled with "
                                     "multi-head latent attention: eager is planned, an upper "
                                     "bound";
        } else {
            m->attn.kernel = ML_ATTN_SDPA;
            m->attn.kernel_assumed = "config.json names no attn_implementation, and transformers "
                                     "then runs sdpa (where the installed torch has it: 2.1.1 "
                                     "on); --attention eager plans eager attention";
        }
        return ML_OK;
    }
    for (size_t i = 0; n->type == ML_NODE_SCALAR && i < sizeof kinds / sizeof *kinds; i++)
        if (!strcmp(n->text, kinds[i].name)) {
            m->attn.kernel = kinds[i].attention;
            return ML_OK;
        }
    return ml__error_at(err, n, ML_SCHEMA,
                        "attn_implementation: '%s' is not modelled (eager, sdpa, "
                        "flash_attention_2 or flash_attention_3)",
                        n->type == ML_NODE_SCALAR ? n->text : "(not a string)");
}

/* Whether config.json lacks the key (a null value is not absent). */
static bool absent(const ml_node *r, const char *key)
{
    return !ml__tree_get(r, key);
}

ml_status ml__hf_sizes(const ml_node *r, const ml_hf_family_info *fi, bool own_head_dim, bool vit,
                       bool req, ml_model *m, ml_error *err)
{
    ml_status st;
    if ((st = ml__hf_uint(err, r, KEYS("num_hidden_layers", "n_layer"), req, 1, 100000,
                          &m->layers)) ||
        (st = ml__hf_uint(err, r, KEYS("hidden_size", "n_embd"), req, 1, 1u << 20, &m->hidden)) ||
        (st = ml__hf_uint(err, r, KEYS("num_attention_heads", "n_head"), req, 1, 1u << 20,
                          &m->attn.heads)))
        return st;
    /* absent: the class's default; null (which ml__hf_uint passes over),
     * or a default of None: the rule the classes apply to None (MistralConfig
     * and the others: num_key_value_heads = num_attention_heads; head_dim =
     * hidden_size // num_attention_heads; GPT2Config's n_inner: 4 * n_embd),
     * or a llava's llama text_config's LlamaConfig value (!req:
     * ml__hf_nesting set it) */
    const bool deepseek = fi->bit & (ML_HF_DEEPSEEK3 | ML_HF_DEEPSEEK2),
               kv_dflt = fi->kv_heads && absent(r, "num_key_value_heads"),
               ffn_dflt = fi->ffn && absent(r, "intermediate_size"),
               hd_dflt = fi->head_dim && absent(r, "head_dim");
    m->attn.kv_heads = kv_dflt ? fi->kv_heads : m->attn.heads;
    m->mlp.ffn = ffn_dflt ? fi->ffn : req ? 4 * m->hidden : m->mlp.ffn;
    m->attn.head_dim = hd_dflt ? fi->head_dim : 0;
    if ((st = ml__hf_uint(err, r, KEYS("num_key_value_heads"), false, 1, 1u << 20,
                          &m->attn.kv_heads)) ||
        (st = ml__hf_uint(err, r, KEYS("intermediate_size", "n_inner"), false, 1, 1u << 24,
                          &m->mlp.ffn)))
        return st;
    if (!vit && (st = ml__hf_uint(err, r, KEYS("vocab_size"), req, 1, 1u << 28, &m->embed.vocab)))
        return st;
    if ((st = ml__hf_uint(err, r, KEYS("max_position_embeddings", "n_positions"), false, 1,
                          1u << 28, &m->embed.max_positions)))
        return st;
    /* head_dim: the attentions of the families the key table honours it for
     * read it (hf_keys.c); the other families' head size is hidden / heads:
     * another value is refused */
    const ml_node *hd = ml__tree_get(r, "head_dim");
    if ((st = ml__hf_uint(err, r, KEYS("head_dim"), false, 1, 1u << 20, &m->attn.head_dim)))
        return st;
    if (m->attn.head_dim && m->attn.heads * m->attn.head_dim > (1u << 20))
        return hd_dflt ? ml__error_at(err, r, ML_RANGE,
                                      "head_dim: %llu is %s's default, taken because the key is "
                                      "absent, and num_attention_heads x head_dim = %llu is "
                                      "above %u; give head_dim",
                                      (unsigned long long)m->attn.head_dim, fi->config,
                                      (unsigned long long)(m->attn.heads * m->attn.head_dim),
                                      1u << 20)
                       : ml__error_at(err, hd, ML_RANGE,
                                      "head_dim: num_attention_heads x head_dim = %llu is above %u",
                                      (unsigned long long)(m->attn.heads * m->attn.head_dim),
                                      1u << 20);
    if (m->attn.head_dim && !own_head_dim && m->attn.head_dim * m->attn.heads != m->hidden)
        return ml__error_at(err, hd, ML_SCHEMA,
                            "head_dim: %llu is not modelled for %s, whose head size is "
                            "hidden_size / num_attention_heads (%llu / %llu)",
                            (unsigned long long)m->attn.head_dim, fi->type,
                            (unsigned long long)m->hidden, (unsigned long long)m->attn.heads);
    if (!m->attn.head_dim && m->hidden % m->attn.heads && !deepseek)
        return ml__error_at(err, ml__tree_get(r, "num_attention_heads"), ML_SCHEMA,
                            "num_attention_heads: %llu does not divide hidden_size (%llu)",
                            (unsigned long long)m->attn.heads, (unsigned long long)m->hidden);
    if (!m->attn.head_dim)
        m->attn.head_dim = m->hidden / m->attn.heads;
    /* DeepSeek's latent attention needs as many key/value heads as heads:
     * its mapper refuses another count, saying so */
    const bool kv_bad = m->attn.kv_heads > m->attn.heads || m->attn.heads % m->attn.kv_heads;
    if (kv_bad && kv_dflt && !deepseek)
        return ml__error_at(err, r, ML_SCHEMA,
                            "num_key_value_heads: %llu is %s's default, taken because the key "
                            "is absent, and does not divide num_attention_heads (%llu); give "
                            "num_key_value_heads (the model's key/value heads, a divisor of %llu)",
                            (unsigned long long)m->attn.kv_heads, fi->config,
                            (unsigned long long)m->attn.heads, (unsigned long long)m->attn.heads);
    if (kv_bad && !kv_dflt)
        return ml__error_at(err, ml__tree_get(r, "num_key_value_heads"), ML_SCHEMA,
                            "num_key_value_heads: %llu does not divide num_attention_heads (%llu)",
                            (unsigned long long)m->attn.kv_heads,
                            (unsigned long long)m->attn.heads);
    return ML_OK;
}
