/* Hugging Face config.json → ml_model. The JSON is read with the YAML tree
 * parser (JSON's flow syntax is YAML). Field mapping: docs/hf.md. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"
#include "model/tree.h"

static const char *const supported = "llama, mistral, qwen2, gpt2, gpt_neox, bert, vit";


static const ml_node *get(const ml_node *map, const char *key)
{
    for (size_t i = 0; map && i < map->count; i++)
        if (strcmp(map->keys[i]->text, key) == 0)
            return map->items[i];
    return NULL;
}

static bool is_null(const ml_node *n)
{
    return !n || (n->type == ML_NODE_SCALAR && n->plain && !strcmp(n->text, "null"));
}

/* The first present key among keys (NULL-terminated list). Returns false
 * when none is present (and def is kept). */
static ml_status uint_of(ml_error *err, const ml_node *root, const char *const *keys, bool required,
                         uint64_t lo, uint64_t hi, uint64_t *out)
{
    for (const char *const *k = keys; *k; k++) {
        const ml_node *n = get(root, *k);
        if (is_null(n))
            continue;
        char *end = NULL;
        errno = 0;
        unsigned long long v = n->type == ML_NODE_SCALAR ? strtoull(n->text, &end, 10) : 0;
        if (n->type != ML_NODE_SCALAR || !end || *end || errno || n->text[0] == '-')
            return ml_error_at(err, n, ML_SCHEMA, "%s: expected a whole number", *k);
        if (v < lo || v > hi)
            return ml_error_at(err, n, ML_RANGE, "%s: %llu is out of range (%llu to %llu)", *k, v,
                        (unsigned long long)lo, (unsigned long long)hi);
        *out = v;
        return ML_OK;
    }
    if (required)
        return ml_error_at(err, root, ML_SCHEMA, "%s: missing from the config", keys[0]);
    return ML_OK;
}

static void bool_of(const ml_node *root, const char *key, bool *out)
{
    const ml_node *n = get(root, key);
    if (n && n->type == ML_NODE_SCALAR && n->plain) {
        if (!strcmp(n->text, "true"))
            *out = true;
        else if (!strcmp(n->text, "false"))
            *out = false;
    }
}

static double num_of(const ml_node *root, const char *key, double def)
{
    const ml_node *n = get(root, key);
    if (!n || n->type != ML_NODE_SCALAR || is_null(n))
        return def;
    char *end = NULL;
    double v = strtod(n->text, &end);
    return end && !*end && v >= 0 && v < 1 ? v : def;
}

static const char *str_of(const ml_node *root, const char *key)
{
    const ml_node *n = get(root, key);
    return n && n->type == ML_NODE_SCALAR && !is_null(n) ? n->text : NULL;
}

/* attn_implementation, the key PretrainedConfig's constructor takes
 * (transformers' configuration_utils.py): "eager" keeps the T x T scores;
 * "sdpa" is torch's scaled_dot_product_attention as dispatched (the ledger's
 * sdpa); the flash kernels save q, k, v, the output and a logsumexp (the
 * ledger's flash inventory). Absent: eager, the reference layout. */
static ml_status attention_of(const ml_node *r, ml_model *m, ml_error *err)
{
    static const struct {
        const char *name;
        ml_attention attention;
    } kinds[] = {{"eager", ML_ATTN_EAGER},
                 {"sdpa", ML_ATTN_SDPA},
                 {"flash_attention_2", ML_ATTN_FLASH},
                 {"flash_attention_3", ML_ATTN_FLASH}};
    m->attention = ML_ATTN_EAGER;
    const ml_node *n = get(r, "attn_implementation");
    if (!n || is_null(n))
        return ML_OK;
    for (size_t i = 0; n->type == ML_NODE_SCALAR && i < sizeof kinds / sizeof *kinds; i++)
        if (!strcmp(n->text, kinds[i].name)) {
            m->attention = kinds[i].attention;
            return ML_OK;
        }
    return ml_error_at(err, n, ML_SCHEMA,
                       "attn_implementation: '%s' is not modelled (eager, sdpa, "
                       "flash_attention_2 or flash_attention_3)",
                       n->type == ML_NODE_SCALAR ? n->text : "(not a string)");
}

#define KEYS(...) ((const char *const[]){__VA_ARGS__, NULL})

static ml_status map_config(const ml_node *r, ml_model *m, ml_error *err)
{
    const ml_node *mt = get(r, "model_type");
    if (!mt || mt->type != ML_NODE_SCALAR)
        return ml_error_at(err, r, ML_SCHEMA,
                    "model_type: missing; a Hugging Face config.json names its model_type "
                    "(supported: %s)",
                    supported);
    const char *t = mt->text;
    bool llama = !strcmp(t, "llama") || !strcmp(t, "mistral") || !strcmp(t, "qwen2");
    bool gpt2 = !strcmp(t, "gpt2"), neox = !strcmp(t, "gpt_neox"), bert = !strcmp(t, "bert"),
         vit = !strcmp(t, "vit");
    if (!llama && !gpt2 && !neox && !bert && !vit)
        return ml_error_at(err, mt, ML_SCHEMA, "model_type '%s' is not supported; supported: %s", t,
                    supported);
    ml_status st;
    m->type = (bert || vit) ? ML_MODEL_ENCODER : ML_MODEL_DECODER;
    /* PretrainedConfig: use_cache defaults to true; the decoders return
     * past_key_values unless training with gradient checkpointing */
    m->kv_cache = m->type == ML_MODEL_DECODER;
    bool_of(r, "use_cache", &m->kv_cache);
    if ((st = attention_of(r, m, err)))
        return st;
    if ((st = uint_of(err, r, KEYS("num_hidden_layers", "n_layer"), true, 1, 100000, &m->layers)) ||
        (st = uint_of(err, r, KEYS("hidden_size", "n_embd"), true, 1, 1u << 20, &m->hidden)) ||
        (st = uint_of(err, r, KEYS("num_attention_heads", "n_head"), true, 1, 1u << 20, &m->heads)))
        return st;
    m->kv_heads = m->heads;
    m->ffn = 4 * m->hidden;
    if ((st = uint_of(err, r, KEYS("num_key_value_heads"), false, 1, 1u << 20, &m->kv_heads)) ||
        (st = uint_of(err, r, KEYS("intermediate_size", "n_inner"), false, 1, 1u << 24, &m->ffn)))
        return st;
    if (!vit && (st = uint_of(err, r, KEYS("vocab_size"), true, 1, 1u << 28, &m->vocab)))
        return st;
    if ((st = uint_of(err, r, KEYS("max_position_embeddings", "n_positions"), false, 1, 1u << 28,
                      &m->max_positions)))
        return st;
    if (m->hidden % m->heads)
        return ml_error_at(err, get(r, "num_attention_heads"), ML_SCHEMA,
                    "num_attention_heads: %llu does not divide hidden_size (%llu)",
                    (unsigned long long)m->heads, (unsigned long long)m->hidden);
    if (m->kv_heads > m->heads || m->heads % m->kv_heads)
        return ml_error_at(err, get(r, "num_key_value_heads"), ML_SCHEMA,
                    "num_key_value_heads: %llu does not divide num_attention_heads (%llu)",
                    (unsigned long long)m->kv_heads, (unsigned long long)m->heads);
    if (llama) {
        /* modeling_llama / mistral / qwen2: RMSNorm, SwiGLU, rotary, no
         * biases (Qwen2: biases on q, k, v) */
        const char *act = str_of(r, "hidden_act");
        if (act && strcmp(act, "silu"))
            return ml_error_at(err, get(r, "hidden_act"), ML_SCHEMA,
                        "hidden_act: '%s' is not modelled for %s (silu: SwiGLU)", act, t);
        m->activation = ML_ACT_SWIGLU;
        m->norm = ML_NORM_RMSNORM;
        m->prenorm = true;
        m->position = ML_POS_ROPE;
        m->bias = false;
        m->qkv_bias = !strcmp(t, "qwen2");
        bool_of(r, "attention_bias", &m->qkv_bias);
        m->tied_embeddings = false;
        bool_of(r, "tie_word_embeddings", &m->tied_embeddings);
        m->dropout = num_of(r, "attention_dropout", 0);
    } else if (gpt2) {
        m->activation = ML_ACT_GELU;
        m->norm = ML_NORM_LAYERNORM;
        m->prenorm = true;
        m->position = ML_POS_LEARNED;
        m->bias = m->qkv_bias = true;
        m->tied_embeddings = true;
        bool_of(r, "tie_word_embeddings", &m->tied_embeddings);
        m->dropout = num_of(r, "resid_pdrop", 0.1);
    } else if (neox) {
        /* GPTNeoX: fused qkv with biases, parallel residual, rotary, untied */
        m->activation = ML_ACT_GELU;
        m->norm = ML_NORM_LAYERNORM;
        m->prenorm = true;
        m->position = ML_POS_ROPE;
        m->bias = m->qkv_bias = true;
        m->tied_embeddings = false;
        bool_of(r, "tie_word_embeddings", &m->tied_embeddings);
        m->parallel_residual = true;
        bool_of(r, "use_parallel_residual", &m->parallel_residual);
        m->dropout = num_of(r, "hidden_dropout", 0);
    } else {
        /* BERT and ViT classifiers */
        m->activation = ML_ACT_GELU;
        m->norm = ML_NORM_LAYERNORM;
        m->prenorm = vit;
        m->bias = m->qkv_bias = true;
        if (vit)
            bool_of(r, "qkv_bias", &m->qkv_bias);
        m->dropout = num_of(r, "hidden_dropout_prob", bert ? 0.1 : 0);
        m->classes = 2; /* PretrainedConfig's num_labels default */
        const ml_node *labels = get(r, "id2label");
        if (labels && labels->type == ML_NODE_MAP && labels->count)
            m->classes = labels->count;
        if ((st = uint_of(err, r, KEYS("num_labels"), false, 1, 1u << 24, &m->classes)))
            return st;
        if (bert) {
            m->position = ML_POS_LEARNED;
            m->pooler = true;
            m->token_types = 2;
            if ((st = uint_of(err, r, KEYS("type_vocab_size"), false, 1, 1u << 16,
                              &m->token_types)))
                return st;
        } else {
            m->position = ML_POS_LEARNED;
            m->pooler = false;
            m->channels = 3;
            if ((st = uint_of(err, r, KEYS("image_size"), true, 1, 1u << 16, &m->image_size)) ||
                (st = uint_of(err, r, KEYS("patch_size"), true, 1, 1u << 16, &m->patch_size)) ||
                (st = uint_of(err, r, KEYS("num_channels"), false, 1, 1u << 16, &m->channels)))
                return st;
            if (m->image_size % m->patch_size)
                return ml_error_at(err, get(r, "patch_size"), ML_SCHEMA,
                            "patch_size: %llu does not divide image_size (%llu)",
                            (unsigned long long)m->patch_size, (unsigned long long)m->image_size);
        }
    }
    if (m->position == ML_POS_ROPE && (m->hidden / m->heads) % 2)
        return ml_error_at(err, mt, ML_SCHEMA, "rotary embeddings need an even head size");
    if (m->position == ML_POS_LEARNED && !m->max_positions && !m->image_size)
        return ml_error_at(err, r, ML_SCHEMA, "max_position_embeddings: missing for learned positions");
    /* defaults for the training settings, as the YAML loader does */
    m->config = ml_config_defaults();
    if (m->image_size) {
        uint64_t g = m->image_size / m->patch_size;
        m->config.training.seq_len = g * g + 1;
    } else {
        uint64_t mp = m->max_positions ? m->max_positions : 2048;
        m->config.training.seq_len = mp < 2048 ? mp : 2048;
    }
    return ML_OK;
}

static ml_status load_hf(const char *text, size_t len, const char *config_path,
                         const char *training_path, ml_model **out, ml_error *err);

ml_status ml_model_load_hf_string(const char *text, size_t len, const char *name, ml_model **out,
                                  ml_error *err)
{
    ml_error local;
    if (!err)
        err = &local;
    memset(err, 0, sizeof *err);
    snprintf(err->path, sizeof err->path, "%s", name ? name : "config.json");
    return load_hf(text, len, name ? name : "config.json", NULL, out, err);
}

ml_status ml_model_load_hf(const char *config_path, const char *training_path, ml_model **out,
                           ml_error *err)
{
    ml_error local;
    if (!err)
        err = &local;
    size_t len = 0;
    char *text = ml_read_file(config_path, &len, err);
    if (!text)
        return err->code;
    ml_status st = load_hf(text, len, config_path, training_path, out, err);
    free(text);
    return st;
}

static ml_status load_hf(const char *text, size_t len, const char *config_path,
                         const char *training_path, ml_model **out, ml_error *err)
{
    ml_node *root = NULL;
    ml_status st = ml_tree_parse(text, len, &root, err);
    if (st)
        return st;
    ml_model *m = calloc(1, sizeof *m);
    if (!m) {
        ml_tree_free(root);
        return ml_error_at(err, NULL, ML_NOMEM, "out of memory");
    }
    if (!root || root->type != ML_NODE_MAP)
        st = ml_error_at(err, root, ML_SCHEMA, "expected a JSON object (a Hugging Face config.json)");
    else
        st = map_config(root, m, err);
    if (!st) {
        /* name: _name_or_path, else the config's directory */
        const char *n = str_of(root, "_name_or_path");
        if (n && *n) {
            const char *slash = strrchr(n, '/');
            snprintf(m->name, sizeof m->name, "%s", slash ? slash + 1 : n);
        } else {
            /* models/hf/gpt2/config.json -> gpt2 */
            char dir[512];
            snprintf(dir, sizeof dir, "%s", config_path);
            char *slash = strrchr(dir, '/');
            const char *name = "hf-model";
            if (slash) {
                *slash = '\0';
                slash = strrchr(dir, '/');
                name = slash ? slash + 1 : dir;
            }
            snprintf(m->name, sizeof m->name, "%s", *name ? name : "hf-model");
        }
    }
    ml_tree_free(root);
    if (!st && training_path) {
        size_t tlen = 0;
        char *t = ml_read_file(training_path, &tlen, err);
        if (!t)
            st = err->code;
        else {
            st = ml_schema_settings(t, tlen, training_path, m, err);
            free(t);
        }
    }
    if (st) {
        ml_model_destroy(m);
        return st;
    }
    *out = m;
    return ML_OK;
}
