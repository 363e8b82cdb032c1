/* LlavaForConditionalGeneration's config.json (configuration_llava.py): the
 * text_config (a decoder family's config: hf.c), the vision_config (a CLIP
 * vision tower, CLIPVisionConfig's defaults, configuration_clip.py) and
 * the projector. The key table's rows: hf_keys_llava.h. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "model/hf_read.h"
#include "model/model_internal.h"

/* A llava and the configs it nests: clip_vision_model only as its
 * vision_config, llava only at the top; a llama text_config (nested) takes
 * LlamaConfig's defaults for absent sizes (configuration_llama.py). */
ml_status ml__hf_nesting(const ml_node *mt, const char *t, unsigned fam, bool nested, ml_model *m,
                         ml_error *err)
{
    if ((fam == ML_HF_CLIPV && !nested) || (fam == ML_HF_LLAVA && nested))
        return ml__error_at(err, mt, ML_SCHEMA, "model_type '%s' is planned %s", t,
                            nested ? "at a config's top level, not as a llava's text_config"
                                  : "as a llava's vision_config only");
    if (nested && fam == ML_HF_LLAMA) {
        m->layers = 32;
        m->hidden = 4096;
        m->attn.heads = 32;
        m->embed.vocab = 32000;
        m->mlp.ffn = 11008;
        m->embed.max_positions = 2048;
    }
    return ML_OK;
}

/* vision_feature_layer: an index into the tower's hidden states (0: the
 * embeddings' output, negative from the end) as the layers it reads. */
static ml_status feature_layer(const ml_node *r, ml_model *m, ml_error *err)
{
    const ml_node *n = ml__tree_get(r, "vision_feature_layer");
    long long idx = -2, states = (long long)m->vision.layers + 1;
    if (!ml__hf_is_null(n)) {
        char *end = NULL;
        errno = 0;
        idx = n->type == ML_NODE_SCALAR ? strtoll(n->text, &end, 10) : 0;
        if (n->type != ML_NODE_SCALAR || errno || end == n->text || *end)
            return ml__error_at(err, n, ML_SCHEMA,
                                "vision_feature_layer: expected one layer index (an integer); "
                                "several layers' features concatenated are not modelled");
    }
    long long at = idx < 0 ? states + idx : idx;
    if (at < 0 || at >= states)
        return ml__error_at(err, n ? n : r, ML_RANGE,
                            "vision_feature_layer: %lld is outside the tower's %lld hidden "
                            "states",
                            idx, states);
    m->vision.used = (uint64_t)at;
    return ML_OK;
}

/* The tower: CLIPVisionConfig's values, its defaults for absent keys. */
static ml_status vision_of(const ml_node *r, const ml_node *vc, ml_model *m, ml_error *err)
{
    m->vision.layers = 12;
    m->vision.hidden = 768;
    m->vision.attn.heads = 12;
    m->vision.mlp.ffn = 3072;
    m->vision.image = 224;
    m->vision.patch = 32;
    m->vision.channels = 3;
    m->vision.mlp.activation = ML_ACT_QUICK_GELU;
    if (ml__hf_is_null(vc)) { /* LlavaConfig's own default tower: CLIP ViT-L/14 at 336 */
        m->vision.layers = 24;
        m->vision.hidden = 1024;
        m->vision.attn.heads = 16;
        m->vision.mlp.ffn = 4096;
        m->vision.image = 336;
        m->vision.patch = 14;
        return ML_OK;
    }
    if (vc->type != ML_NODE_MAP)
        return ml__error_at(err, vc, ML_SCHEMA, "vision_config: expected an object");
    const char *t = NULL;
    ml_status st = ml__hf_str(err, vc, "model_type", &t);
    if (st)
        return st;
    if (t && strcmp(t, "clip_vision_model"))
        return ml__error_at(err, ml__tree_get(vc, "model_type"), ML_SCHEMA,
                            "vision_config.model_type '%s' is not modelled: the tower planned "
                            "is CLIP's (clip_vision_model)",
                            t);
    const char *act = NULL;
    if ((st = ml__hf_check_keys(vc, ML_HF_CLIPV, "clip_vision_model", err)) ||
        (st = ml__hf_uint(err, vc, KEYS("num_hidden_layers"), false, 1, 100000,
                          &m->vision.layers)) ||
        (st = ml__hf_uint(err, vc, KEYS("hidden_size"), false, 1, 1u << 20, &m->vision.hidden)) ||
        (st = ml__hf_uint(err, vc, KEYS("num_attention_heads"), false, 1, 1u << 20,
                          &m->vision.attn.heads)) ||
        (st = ml__hf_uint(err, vc, KEYS("intermediate_size"), false, 1, 1u << 24,
                          &m->vision.mlp.ffn)) ||
        (st = ml__hf_uint(err, vc, KEYS("image_size"), false, 1, 1u << 16, &m->vision.image)) ||
        (st = ml__hf_uint(err, vc, KEYS("patch_size"), false, 1, 1u << 16, &m->vision.patch)) ||
        (st = ml__hf_uint(err, vc, KEYS("num_channels"), false, 1, 1u << 16,
                          &m->vision.channels)) ||
        (st = ml__hf_str(err, vc, "hidden_act", &act)))
        return st;
    if (act && strcmp(act, "quick_gelu") && strcmp(act, "gelu"))
        return ml__error_at(err, ml__tree_get(vc, "hidden_act"), ML_SCHEMA,
                            "vision_config.hidden_act '%s' is not modelled: quick_gelu or gelu",
                            act);
    m->vision.mlp.activation =
        !act || !strcmp(act, "quick_gelu") ? ML_ACT_QUICK_GELU : ML_ACT_GELU;
    if (m->vision.hidden % m->vision.attn.heads)
        return ml__error_at(err, ml__tree_get(vc, "num_attention_heads"), ML_SCHEMA,
                            "vision_config.num_attention_heads: %llu does not divide "
                            "hidden_size (%llu)",
                            (unsigned long long)m->vision.attn.heads,
                            (unsigned long long)m->vision.hidden);
    if (m->vision.image % m->vision.patch)
        return ml__error_at(err, ml__tree_get(vc, "patch_size"), ML_SCHEMA,
                            "vision_config.patch_size: %llu does not divide image_size (%llu)",
                            (unsigned long long)m->vision.patch,
                            (unsigned long long)m->vision.image);
    uint64_t g = m->vision.image / m->vision.patch;
    if (g * g + 1 > ML_MAX_TOKENS)
        return ml__error_at(err, ml__tree_get(vc, "image_size"), ML_RANGE,
                            "vision_config.image_size: %llu image tokens, above the %llu a "
                            "sequence holds: use larger patches or smaller images",
                            (unsigned long long)(g * g), (unsigned long long)ML_MAX_TOKENS);
    (void)r;
    return ML_OK;
}

/* The language model: text_config, or LlamaConfig's defaults without one. */
static ml_status text_of(const ml_node *tc, ml_model *m, ml_error *err)
{
    if (!ml__hf_is_null(tc)) {
        if (tc->type != ML_NODE_MAP)
            return ml__error_at(err, tc, ML_SCHEMA, "text_config: expected an object");
        return ml__hf_map_text(tc, m, err); /* without model_type: llama's */
    }
    static const char dflt[] = "{\"model_type\": \"llama\"}";
    ml_node *root = NULL;
    ml_status st = ml__tree_parse(dflt, sizeof dflt - 1, &root, err);
    if (!st)
        st = ml__hf_map_text(root, m, err);
    ml__tree_free(root);
    return st;
}

ml_status ml__hf_map_llava(const ml_node *r, ml_model *m, ml_error *err)
{
    ml_status st;
    const ml_node *tc = ml__tree_get(r, "text_config");
    if ((st = text_of(tc, m, err)))
        return st;
    if (m->type != ML_MODEL_DECODER || m->head.classes || m->moe.experts || m->attn.kv_lora ||
        m->residual.parallel || m->embed.scale || m->residual.post_norms || m->attn.fused_proj ||
        m->norms.kind == ML_NORM_OLMO_LAYERNORM)
        return ml__error_at(err, tc, ML_SCHEMA,
                            "text_config: a llava's language model is planned for the Llama "
                            "layout (llama, mistral, qwen2): this one is not modelled");
    uint64_t v = m->embed.vocab;
    bool tied = false;
    if ((st = vision_of(r, ml__tree_get(r, "vision_config"), m, err)) ||
        (st = feature_layer(r, m, err)) ||
        (st = ml__hf_uint(err, r, KEYS("vocab_size"), false, 1, 1u << 28, &v)) ||
        (st = ml__hf_bool(err, r, "tie_word_embeddings", &tied)))
        return st;
    if (v != m->embed.vocab)
        return ml__error_at(err, ml__tree_get(r, "vocab_size"), ML_SCHEMA,
                            "vocab_size: %llu differs from text_config's (%llu), which the "
                            "language model is built with; remove it or make them agree",
                            (unsigned long long)v, (unsigned long long)m->embed.vocab);
    /* transformers ties the LM head to the text config's
     * tie_word_embeddings (tie_weights: get_text_config()); LlavaConfig
     * carries a true top-level value down to it */
    m->embed.tied = m->embed.tied || tied;
    const char *sel = NULL;
    if ((st = ml__hf_str(err, r, "vision_feature_select_strategy", &sel)))
        return st;
    if (sel && strcmp(sel, "default") && strcmp(sel, "full"))
        return ml__error_at(err, ml__tree_get(r, "vision_feature_select_strategy"), ML_SCHEMA,
                            "vision_feature_select_strategy '%s': default or full", sel);
    m->vision.full = sel && !strcmp(sel, "full");
    m->vision.proj_bias = true;
    if ((st = ml__hf_bool(err, r, "multimodal_projector_bias", &m->vision.proj_bias)))
        return st;
    uint64_t n = ml_model_image_tokens(m), seq = n;
    if ((st = ml__hf_uint(err, r, KEYS("image_seq_length"), false, 1, 1u << 28, &seq)))
        return st;
    if (seq != n)
        return ml__error_at(err, ml__tree_get(r, "image_seq_length"), ML_SCHEMA,
                            "image_seq_length: %llu, but the tower makes %llu image tokens "
                            "((image_size / patch_size)^2%s)",
                            (unsigned long long)seq, (unsigned long long)n,
                            m->vision.full ? " + 1" : "");
    return ML_OK;
}
