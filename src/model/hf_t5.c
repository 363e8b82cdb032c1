/* The Hugging Face import's T5 (hf.c calls it once the keys are checked):
 * T5ForConditionalGeneration as modeling_t5.py builds it from a T5Config.
 * Every key it reads is in the key table (hf_keys.c); the chain it maps to
 * is docs/inventory.md's "T5". */
#include <string.h>

#include "model/hf_read.h"
#include "model/model_internal.h"
#include "model/tree.h"

/* The sizes, with T5Config's defaults (configuration_t5.py: vocab_size
 * 32128, d_model 512, d_kv 64, d_ff 2048, num_layers 6, num_heads 8,
 * num_decoder_layers = num_layers, 32 buckets reaching 128 positions) or
 * MT5Config's (configuration_mt5.py: vocab_size 250112, d_ff 1024,
 * num_layers 8, num_heads 6), and the attribute_map's aliases
 * (hidden_size, num_attention_heads, num_hidden_layers). */
static ml_status t5_sizes(const ml_node *r, ml_model *m, bool mt5, ml_error *err)
{
    m->embed.vocab = mt5 ? 250112 : 32128;
    m->hidden = 512;
    m->attn.head_dim = 64;
    m->mlp.ffn = mt5 ? 1024 : 2048;
    m->layers = mt5 ? 8 : 6;
    m->attn.heads = mt5 ? 6 : 8;
    m->t5.rel_buckets = 32;
    m->t5.rel_max_distance = 128;
    ml_status st;
    if ((st = ml__hf_uint(err, r, KEYS("vocab_size"), false, 1, ML_MAX_VOCAB, &m->embed.vocab)) ||
        (st = ml__hf_uint(err, r, KEYS("d_model", "hidden_size"), false, 1, ML_MAX_HIDDEN,
                          &m->hidden)) ||
        (st = ml__hf_uint(err, r, KEYS("d_kv"), false, 1, ML_MAX_HIDDEN, &m->attn.head_dim)) ||
        (st = ml__hf_uint(err, r, KEYS("d_ff"), false, 1, ML_MAX_FFN, &m->mlp.ffn)) ||
        (st = ml__hf_uint(err, r, KEYS("num_layers", "num_hidden_layers"), false, 1, ML_MAX_LAYERS,
                          &m->layers)) ||
        (st = ml__hf_uint(err, r, KEYS("num_heads", "num_attention_heads"), false, 1,
                          ML_MAX_HIDDEN, &m->attn.heads)) ||
        (st = ml__hf_uint(err, r, KEYS("relative_attention_num_buckets"), false, 2, 1u << 16,
                          &m->t5.rel_buckets)) ||
        (st = ml__hf_uint(err, r, KEYS("relative_attention_max_distance"), false, 1, ML_MAX_TOKENS,
                          &m->t5.rel_max_distance)))
        return st;
    m->t5.dec_layers = m->layers;
    if ((st = ml__hf_uint(err, r, KEYS("num_decoder_layers"), false, 1, ML_MAX_LAYERS,
                          &m->t5.dec_layers)))
        return st;
    if (m->attn.heads * m->attn.head_dim > ML_MAX_HIDDEN)
        return ml__error_at(err, ml__tree_get(r, "d_kv"), ML_RANGE,
                            "d_kv: num_heads x d_kv = %llu is above %llu",
                            (unsigned long long)(m->attn.heads * m->attn.head_dim),
                            (unsigned long long)ML_MAX_HIDDEN);
    m->attn.kv_heads = m->attn.heads;
    return ML_OK;
}

/* The feed-forward: T5Config derives is_gated_act and dense_act_fn from
 * feed_forward_proj ("relu" or "gated-gelu" here: the key table refuses
 * the others; gated-gelu's activation is gelu_new), and a config.json's
 * own values of the two override them (PretrainedConfig sets every kwarg).
 * relu without the gate and gelu_new with it are planned. */
static ml_status t5_activation(const ml_node *r, ml_model *m, bool mt5, ml_error *err)
{
    const char *proj = NULL, *fn = NULL;
    ml_status st;
    if ((st = ml__hf_str(err, r, "feed_forward_proj", &proj)) ||
        (st = ml__hf_str(err, r, "dense_act_fn", &fn)))
        return st;
    if (!proj) /* the default: T5Config's relu, MT5Config's gated-gelu */
        proj = mt5 ? "gated-gelu" : "relu";
    bool gated = proj && !strcmp(proj, "gated-gelu");
    if (!fn)
        fn = gated ? "gelu_new" : "relu";
    if ((st = ml__hf_bool(err, r, "is_gated_act", &gated)))
        return st;
    if (strcmp(fn, gated ? "gelu_new" : "relu") != 0) {
        const ml_node *n = ml__tree_get(r, "dense_act_fn");
        return ml__error_at(err, n ? n : ml__tree_get(r, "is_gated_act"), ML_SCHEMA,
                            "dense_act_fn: '%s' %s the gate is not modelled: T5's feed-forward "
                            "is planned as relu without the gate (feed_forward_proj relu) or "
                            "gelu_new with it (gated-gelu)",
                            fn, gated ? "with" : "without");
    }
    m->mlp.activation = gated ? ML_ACT_GEGLU : ML_ACT_RELU;
    return ML_OK;
}

ml_status ml__hf_map_t5(const ml_node *r, ml_model *m, bool mt5, ml_error *err)
{
    /* feed_forward_proj other than relu and gated-gelu, is_decoder true and
     * is_encoder_decoder false are refused by the key table before this
     * runs */
    ml_status st = t5_sizes(r, m, mt5, err);
    if (st || (st = t5_activation(r, m, mt5, err)))
        return st;
    m->type = ML_MODEL_ENCDEC;
    m->norms.kind = ML_NORM_RMSNORM;
    m->residual.prenorm = true;
    m->embed.position = ML_POS_NONE;
    m->bias = m->attn.qkv_bias = m->mlp.bias = false;
    m->embed.tied = !mt5;      /* T5Config: true; MT5Config: false */
    m->dropout = 0.1;          /* dropout_rate */
    m->attn.kv_cache = true;   /* PretrainedConfig's use_cache */
    if ((st = ml__hf_prob(err, r, "dropout_rate", &m->dropout)) ||
        (st = ml__hf_bool(err, r, "tie_word_embeddings", &m->embed.tied)) ||
        (st = ml__hf_bool(err, r, "use_cache", &m->attn.kv_cache)))
        return st;
    if (m->attn.kernel != ML_ATTN_EAGER)
        return ml__error_at(err, ml__tree_get(r, "attn_implementation"), ML_SCHEMA,
                            "attn_implementation: T5's attention is eager (its position bias "
                            "is added to the scores); use eager or remove the key");
    /* the training settings' defaults, as the YAML loader's: T5 was
     * trained on inputs of 512 tokens (n_positions) */
    m->config = ml_config_defaults();
    m->config.training.seq_len = 512;
    return ML_OK;
}
