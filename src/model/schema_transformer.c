/* The model file's transformer section (model: of a decoder or encoder):
 * its sizes, its options and their consistency, into the model's
 * components (model_internal.h). Every message names the field, what was
 * expected and, for unknown keys, the closest valid one. */
#include "model/limits.h"
#include "model/schema.h"
#include "model/shape.h"

/* gelu_new: gelu as transformers' NewGELUActivation computes it (a
 * composite; ml_mlp_spec.gelu_new), after the ml_activation names */
static const char *const act_names[] = {"gelu", "relu", "swiglu", "geglu", "gelu_new"};
enum { ACT_GELU_NEW = 4 };
static const char *const norm_names[] = {"layernorm", "rmsnorm", "gemma_rmsnorm",
                                         "olmo_layernorm"};
static const char *const normpos_names[] = {"pre", "post"};
static const char *const pos_names[] = {"learned", "rope", "none"};
static const char *const attn_names[] = {"eager", "flash", "sdpa"};
/* "multimodal" is a decoder with a vision tower (schema_llava.c) */
/* The transformer's sizes: layers, hidden, heads, the head size and the
 * key/value heads. */
static ml_status transformer_sizes(ml_error *err, const ml_node *mm, ml_model *m)
{
    const bool enc = m->type == ML_MODEL_ENCODER;
    ml_status st;
    const char *req[] = {"layers", "hidden", "heads"};
    for (size_t i = 0; i < ML_COUNT(req); i++)
        if (!ml__tree_get(mm, req[i]))
            return ml__error_at(err, mm, ML_SCHEMA,
                                "model.%s: missing; a %s needs layers, hidden and heads", req[i],
                                enc ? "encoder" : "decoder");
    if ((st = ml__tree_uint(err, mm, "layers", "model", 1, ML_MAX_LAYERS, &m->layers)) ||
        (st = ml__tree_uint(err, mm, "hidden", "model", 1, ML_MAX_HIDDEN, &m->hidden)) ||
        (st = ml__tree_uint(err, mm, "heads", "model", 1, ML_MAX_HIDDEN, &m->attn.heads)))
        return st;
    /* head_dim (HF's key): the attention's own width, heads * head_dim;
     * without it each head is hidden / heads wide */
    m->attn.head_dim = 0;
    if ((st = ml__tree_uint(err, mm, "head_dim", "model", 1, ML_MAX_HIDDEN, &m->attn.head_dim)))
        return st;
    if (!m->attn.head_dim && m->hidden % m->attn.heads)
        return ml__error_at(err, ml__tree_get(mm, "heads"), ML_SCHEMA,
                            "model.heads: %llu does not divide hidden (%llu)",
                            (unsigned long long)m->attn.heads, (unsigned long long)m->hidden);
    if (!m->attn.head_dim)
        m->attn.head_dim = m->hidden / m->attn.heads;
    else if (m->attn.heads * m->attn.head_dim > ML_MAX_HIDDEN)
        return ml__error_at(err, ml__tree_get(mm, "head_dim"), ML_RANGE,
                            "model.head_dim: heads x head_dim = %llu is above %llu",
                            (unsigned long long)(m->attn.heads * m->attn.head_dim),
                            (unsigned long long)ML_MAX_HIDDEN);
    m->attn.kv_heads = m->attn.heads;
    if ((st = ml__tree_uint(err, mm, "kv_heads", "model", 1, ML_MAX_HIDDEN, &m->attn.kv_heads)))
        return st;
    if (m->attn.kv_heads > m->attn.heads || m->attn.heads % m->attn.kv_heads)
        return ml__error_at(err, ml__tree_get(mm, "kv_heads"), ML_SCHEMA,
                            "model.kv_heads: %llu does not divide heads (%llu)",
                            (unsigned long long)m->attn.kv_heads,
                            (unsigned long long)m->attn.heads);
    return ML_OK;
}

/* The transformer's kinds and switches (activation, norm, positions,
 * attention, biases, dropout), each with its default, and the other sizes
 * (ffn, vocab, positions, classes, image). */
static ml_status transformer_options(ml_error *err, const ml_node *mm, ml_model *m)
{
    const bool enc = m->type == ML_MODEL_ENCODER;
    ml_status st;
    m->mlp.ffn = 4 * m->hidden;
    unsigned e;
    m->mlp.activation = ML_ACT_GELU;
    m->norms.kind = ML_NORM_LAYERNORM;
    m->embed.position = ML_POS_LEARNED;
    m->attn.kernel = ML_ATTN_EAGER;
    m->bias = true;
    m->embed.tied = !enc;
    m->residual.prenorm = !enc;
    if ((st = ml__tree_uint(err, mm, "ffn", "model", 1, ML_MAX_FFN, &m->mlp.ffn)))
        return st;
    e = m->mlp.activation;
    if ((st = ml__tree_enum(err, mm, "activation", "model", act_names, ML_COUNT(act_names), &e)))
        return st;
    m->mlp.gelu_new = e == ACT_GELU_NEW;
    m->mlp.activation = m->mlp.gelu_new ? ML_ACT_GELU : (ml_activation)e;
    e = m->norms.kind;
    if ((st = ml__tree_enum(err, mm, "norm", "model", norm_names, ML_COUNT(norm_names), &e)))
        return st;
    m->norms.kind = (ml_norm)e;
    e = m->residual.prenorm ? 0 : 1;
    if ((st = ml__tree_enum(err, mm, "norm_position", "model", normpos_names, 2, &e)))
        return st;
    m->residual.prenorm = e == 0;
    e = m->embed.position;
    if ((st = ml__tree_enum(err, mm, "position", "model", pos_names, ML_COUNT(pos_names), &e)))
        return st;
    m->embed.position = (ml_position)e;
    e = m->attn.kernel;
    if ((st = ml__tree_enum(err, mm, "attention", "model", attn_names, ML_COUNT(attn_names), &e)))
        return st;
    m->attn.kernel = (ml_attention)e;
    if ((st = ml__tree_bool(err, mm, "tied_embeddings", "model", &m->embed.tied)) ||
        (st = ml__tree_bool(err, mm, "bias", "model", &m->bias)) ||
        (st = ml__tree_double(err, mm, "dropout", "model", 0, 1, true, &m->dropout)) ||
        (st = ml__tree_uint(err, mm, "vocab", "model", 1, ML_MAX_VOCAB, &m->embed.vocab)) ||
        (st = ml__tree_uint(err, mm, "max_positions", "model", 1, ML_MAX_TOKENS,
                            &m->embed.max_positions)) ||
        (st = ml__tree_uint(err, mm, "classes", "model", 1, ML_MAX_VOCAB, &m->head.classes)) ||
        (st =
             ml__tree_uint(err, mm, "token_types", "model", 1, 1u << 16, &m->embed.token_types)) ||
        (st = ml__tree_uint(err, mm, "image_size", "model", 1, 1u << 16, &m->embed.image_size)) ||
        (st = ml__tree_uint(err, mm, "patch_size", "model", 1, 1u << 16, &m->embed.patch_size)) ||
        (st = ml__tree_uint(err, mm, "channels", "model", 1, 1u << 16, &m->embed.channels)))
        return st;
    if ((st = ml__tree_bool(err, mm, "mlm_head", "model", &m->head.mlm)))
        return st;
    if (m->head.mlm && !ml__tree_get(mm, "tied_embeddings"))
        m->embed.tied = true; /* BertConfig's tie_word_embeddings */
    m->head.pooler = enc && m->embed.image_size == 0 && !m->head.mlm;
    m->attn.qkv_bias = m->bias;
    if ((st = ml__tree_bool(err, mm, "pooler", "model", &m->head.pooler)) ||
        (st = ml__tree_bool(err, mm, "fused_projections", "model", &m->attn.fused_proj)) ||
        (st = ml__tree_bool(err, mm, "qkv_bias", "model", &m->attn.qkv_bias)) ||
        (st = ml__tree_bool(err, mm, "parallel_residual", "model", &m->residual.parallel)) ||
        (st = ml__tree_bool(err, mm, "embedding_scale", "model", &m->embed.scale)) ||
        (st = ml__tree_size_or_zero(err, mm, "buffers", "model", &m->buffers)))
        return st;
    return ML_OK;
}

/* What the keys say together: a parallel residual is pre-norm, an image
 * encoder has patches (and 3 channels unless told) and no vocabulary, an
 * encoder has classes, learned positions have a count, rotary heads are
 * even. */
static ml_status transformer_consistent(ml_error *err, const ml_node *mm, ml_model *m)
{
    const bool enc = m->type == ML_MODEL_ENCODER;
    if (m->residual.parallel &&
        (!m->residual.prenorm || m->norms.kind != ML_NORM_LAYERNORM ||
         m->mlp.activation == ML_ACT_SWIGLU || m->mlp.activation == ML_ACT_GEGLU))
        return ml__error_at(err, ml__tree_get(mm, "parallel_residual"), ML_SCHEMA,
                            "model.parallel_residual: GPT-NeoX's and Falcon's layer: needs "
                            "norm_position: pre, norm: layernorm and activation: gelu or relu");
    if (m->embed.image_size) {
        if (!enc)
            return ml__error_at(err, ml__tree_get(mm, "image_size"), ML_SCHEMA,
                                "model.image_size: image inputs are for encoders (type: encoder)");
        if (!m->embed.patch_size)
            return ml__error_at(err, ml__tree_get(mm, "image_size"), ML_SCHEMA,
                                "model.patch_size: missing; an image encoder needs patch_size");
        if (m->embed.image_size % m->embed.patch_size)
            return ml__error_at(err, ml__tree_get(mm, "patch_size"), ML_SCHEMA,
                                "model.patch_size: %llu does not divide image_size (%llu)",
                                (unsigned long long)m->embed.patch_size,
                                (unsigned long long)m->embed.image_size);
        if (!m->embed.channels)
            m->embed.channels = 3;
        if (m->embed.vocab)
            return ml__error_at(err, ml__tree_get(mm, "vocab"), ML_SCHEMA,
                                "model.vocab: an image encoder has no vocabulary; remove vocab");
    } else if (m->embed.patch_size || m->embed.channels) {
        /* an image's keys without the image: refused, not ignored */
        const char *k = m->embed.patch_size ? "patch_size" : "channels";
        return ml__error_at(err, ml__tree_get(mm, k), ML_SCHEMA,
                            "model.%s: an image encoder's key, without model.image_size: give "
                            "image_size (type: encoder) or remove %s",
                            k, k);
    } else if (!m->embed.vocab) {
        return ml__error_at(err, mm, ML_SCHEMA,
                            "model.vocab: missing; a %s needs its vocabulary size",
                            enc ? "text encoder" : "decoder");
    }
    if (m->attn.fused_proj &&
        (enc || m->norms.kind == ML_NORM_LAYERNORM ||
         (m->mlp.activation != ML_ACT_SWIGLU && m->mlp.activation != ML_ACT_GEGLU)))
        return ml__error_at(err, ml__tree_get(mm, "fused_projections"), ML_SCHEMA,
                            "model.fused_projections: one qkv_proj and one gate_up_proj (Phi-3) "
                            "need a decoder with norm: rmsnorm or gemma_rmsnorm and a gated "
                            "activation (swiglu, geglu)");
    if (m->head.mlm && (!enc || m->embed.image_size || m->head.classes))
        return ml__error_at(err, ml__tree_get(mm, "mlm_head"), ML_SCHEMA,
                            "model.mlm_head: the masked-LM head (BertForMaskedLM) is for a text "
                            "encoder (type: encoder, vocab) and predicts the vocabulary: remove "
                            "classes");
    if (m->head.classes == 1)
        return ml__error_at(err, ml__tree_get(mm, "classes"), ML_SCHEMA,
                            "model.classes: 1 would be a regression (transformers' MSELoss for "
                            "one label), which is not modelled; give 2 or more classes");
    if (enc && !m->head.classes && !m->head.mlm)
        return ml__error_at(err, mm, ML_SCHEMA,
                            "model.classes: missing; an encoder is planned as a "
                            "classifier and needs 'classes: N' (or mlm_head: true)");
    if (!enc && (m->embed.token_types || ml__tree_get(mm, "pooler")))
        return ml__error_at(err,
                            ml__tree_get(mm, "token_types") ? ml__tree_get(mm, "token_types")
                                                          : ml__tree_get(mm, "pooler"),
                           ML_SCHEMA,
                           "model: pooler and token_types are encoder keys (type: encoder); a "
                           "decoder takes classes: N for a sequence-classification head");
    if (m->embed.position == ML_POS_LEARNED && !m->embed.max_positions && !m->embed.image_size)
        return ml__error_at(err, mm, ML_SCHEMA,
                            "model.max_positions: missing; learned positions need "
                            "max_positions (or set position: rope or none)");
    if (m->embed.position == ML_POS_ROPE && m->attn.head_dim % 2 &&
        !ml__tree_get(mm, "kv_lora_rank"))
        return ml__error_at(err,
                            ml__tree_get(mm, "head_dim") ? ml__tree_get(mm, "head_dim")
                                                         : ml__tree_get(mm, "position"),
                            ML_SCHEMA, "model.position: rope needs an even head size, %s = %llu",
                            ml__tree_get(mm, "head_dim") ? "head_dim" : "hidden/heads",
                            (unsigned long long)m->attn.head_dim);
    return ML_OK;
}

ml_status ml__schema_transformer(ml_error *err, const ml_node *mm, ml_model *m)
{
    ml_status st;
    size_t nkeys;
    const char *const *keys = ml__schema_transformer_keys(&nkeys);
    if ((st = ml__tree_check_keys(err, mm, "model", keys, nkeys)) ||
        (st = transformer_sizes(err, mm, m)) || (st = transformer_options(err, mm, m)) ||
        (st = transformer_consistent(err, mm, m)))
        return st;
    if ((st = ml__schema_gemma2(err, mm, m)) || (st = ml__schema_falcon(err, mm, m)))
        return st;
    if ((st = ml__schema_experts(err, mm, m)) || (st = ml__schema_mla(err, mm, m)))
        return st;
    return ml__schema_olmo(err, mm, m);
}

/* training.KEY within the limits table's range (model/limits.h); a key
 * whose 0 means "not given" takes 1 and up when written. */
