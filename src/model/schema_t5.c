/* The model file's encoder-decoder (T5, HF T5ForConditionalGeneration:
 * docs/cli.md, "The model file"; what it keeps: docs/inventory.md, "T5"),
 * and the per-model default sequence length. */
#include <string.h>

#include "model/schema.h"

void ml__schema_seq_default(ml_model *m)
{
    ml_training *t = &m->config.training;
    if (m->type == ML_MODEL_SEQUENTIAL)
        return;
    if (m->type == ML_MODEL_ENCDEC) {
        t->seq_len = 512; /* T5Config's n_positions: the length it was trained at */
    } else if (m->embed.image_size) {
        uint64_t g = m->embed.image_size / m->embed.patch_size;
        t->seq_len = g * g + 1;
    } else if (m->embed.max_positions) {
        t->seq_len = m->embed.max_positions;
    } else {
        t->seq_len = 2048;
    }
}

static const char *const encdec_keys[] = {
    "type",      "layers",           "decoder_layers",        "hidden",          "heads",
    "head_dim",  "ffn",              "activation",            "norm",            "position",
    "vocab",     "relative_buckets", "relative_max_distance", "tied_embeddings", "dropout",
    "attention", "buffers"};

/* The sizes: layers, hidden, heads and vocab are needed; the others have
 * T5Config's defaults (decoder_layers = layers, head_dim = hidden / heads,
 * 32 buckets reaching 128 positions) or the file's usual ones (ffn 4 x hidden). */
static ml_status encdec_sizes(ml_error *err, const ml_node *mm, ml_model *m)
{
    const char *req[] = {"layers", "hidden", "heads", "vocab"};
    for (size_t i = 0; i < ML_COUNT(req); i++)
        if (!ml__tree_get(mm, req[i]))
            return ml__error_at(err, mm, ML_SCHEMA,
                                "model.%s: missing; an encoder-decoder needs layers, hidden, "
                                "heads and vocab",
                                req[i]);
    ml_status st;
    if ((st = ml__tree_uint(err, mm, "layers", "model", 1, ML_MAX_LAYERS, &m->layers)) ||
        (st = ml__tree_uint(err, mm, "hidden", "model", 1, ML_MAX_HIDDEN, &m->hidden)) ||
        (st = ml__tree_uint(err, mm, "heads", "model", 1, ML_MAX_HIDDEN, &m->attn.heads)) ||
        (st = ml__tree_uint(err, mm, "vocab", "model", 1, ML_MAX_VOCAB, &m->embed.vocab)))
        return st;
    m->t5.dec_layers = m->layers;
    m->attn.head_dim = 0;
    m->mlp.ffn = 4 * m->hidden;
    m->t5.rel_buckets = 32;
    m->t5.rel_max_distance = 128;
    if ((st = ml__tree_uint(err, mm, "decoder_layers", "model", 1, ML_MAX_LAYERS,
                            &m->t5.dec_layers)) ||
        (st = ml__tree_uint(err, mm, "head_dim", "model", 1, ML_MAX_HIDDEN, &m->attn.head_dim)) ||
        (st = ml__tree_uint(err, mm, "ffn", "model", 1, ML_MAX_FFN, &m->mlp.ffn)) ||
        (st = ml__tree_uint(err, mm, "relative_buckets", "model", 2, 1u << 16,
                            &m->t5.rel_buckets)) ||
        (st = ml__tree_uint(err, mm, "relative_max_distance", "model", 1, ML_MAX_TOKENS,
                            &m->t5.rel_max_distance)))
        return st;
    if (!m->attn.head_dim && m->hidden % m->attn.heads)
        return ml__error_at(err, ml__tree_get(mm, "heads"), ML_SCHEMA,
                            "model.heads: %llu does not divide hidden (%llu); give head_dim "
                            "(T5's d_kv)",
                            (unsigned long long)m->attn.heads, (unsigned long long)m->hidden);
    if (!m->attn.head_dim)
        m->attn.head_dim = m->hidden / m->attn.heads;
    if (m->attn.heads * m->attn.head_dim > ML_MAX_HIDDEN)
        return ml__error_at(err, ml__tree_get(mm, "head_dim"), ML_RANGE,
                            "model.head_dim: heads x head_dim = %llu is above %llu",
                            (unsigned long long)(m->attn.heads * m->attn.head_dim),
                            (unsigned long long)ML_MAX_HIDDEN);
    m->attn.kv_heads = m->attn.heads;
    return ML_OK;
}

ml_status ml__schema_only(ml_error *err, const ml_node *map, const char *sec, const char *key,
                          const char *want, const char *why)
{
    const ml_node *n = ml__tree_get(map, key);
    if (!n)
        return ML_OK;
    ml_status st = ml__tree_need_scalar(err, n, key, "a name");
    if (st)
        return st;
    if (strcmp(n->text, want) != 0)
        return ml__error_at(err, n, ML_SCHEMA, "%s.%s: '%s' %s; use %s: %s", sec, key, n->text,
                            why, key, want);
    return ML_OK;
}

/* The kinds: T5's layer (T5LayerNorm, a ReLU feed-forward, relative
 * position biases, eager attention) is the one modelled. */
static ml_status encdec_kinds(ml_error *err, const ml_node *mm, ml_model *m)
{
    ml_status st;
    /* relu: T5DenseActDense; geglu: T5DenseGatedActDense with gelu_new */
    static const char *const acts[] = {"relu", "geglu"};
    unsigned act = 0;
    if ((st = ml__tree_enum(err, mm, "activation", "model", acts, 2, &act)))
        return st;
    if ((st = ml__schema_only(err, mm, "model", "norm", "rmsnorm",
                         "is not T5's layer norm (T5LayerNorm: a scale without mean or bias, "
                         "as rmsnorm)")) ||
        (st = ml__schema_only(err, mm, "model", "position", "relative",
                         "is not T5's positions (a learned bias per head over relative-"
                         "position buckets)")) ||
        (st = ml__schema_only(err, mm, "model", "attention", "eager",
                         "is not modelled for T5: its position bias is added to the scores, "
                         "and transformers runs T5's attention eagerly")))
        return st;
    m->mlp.activation = act ? ML_ACT_GEGLU : ML_ACT_RELU;
    m->norms.kind = ML_NORM_RMSNORM;
    m->residual.prenorm = true;
    m->embed.position = ML_POS_NONE;
    m->attn.kernel = ML_ATTN_EAGER;
    m->bias = m->attn.qkv_bias = m->mlp.bias = false;
    m->embed.tied = true; /* T5Config's tie_word_embeddings */
    if ((st = ml__tree_bool(err, mm, "tied_embeddings", "model", &m->embed.tied)) ||
        (st = ml__tree_double(err, mm, "dropout", "model", 0, 1, true, &m->dropout)) ||
        (st = ml__tree_size_or_zero(err, mm, "buffers", "model", &m->buffers)))
        return st;
    return ML_OK;
}

ml_status ml__schema_encdec(ml_error *err, const ml_node *mm, ml_model *m)
{
    ml_status st;
    if ((st = ml__tree_check_keys(err, mm, "model", encdec_keys, ML_COUNT(encdec_keys))) ||
        (st = encdec_sizes(err, mm, m)) || (st = encdec_kinds(err, mm, m)))
        return st;
    return ML_OK;
}
