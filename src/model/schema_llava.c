/* The model file's multimodal model (Llava, HF LlavaForConditionalGeneration:
 * docs/cli.md, "The model file"; what it keeps: docs/inventory.md, "Llava"):
 * model.stacks with a CLIP vision tower, the projector and a decoder. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "model/schema.h"

static const char *const mm_keys[] = {"type", "stacks", "buffers"};
static const char *const stack_keys[] = {"vision", "projector", "decoder"};
static const char *const vision_keys[] = {"layers",     "hidden",   "heads",
                                          "ffn",        "image_size", "patch_size",
                                          "channels",   "activation", "feature_layer",
                                          "feature_select", "norm",   "attention"};
static const char *const projector_keys[] = {"activation", "bias"};

/* vision.feature_layer: an index into the tower's hidden states (HF
 * vision_feature_layer: 0 the embeddings' output, i the output of layer
 * i, negative from the end, -1 the last layer's) as the layers it reads. */
static ml_status feature_layer(ml_error *err, const ml_node *v, ml_model *m)
{
    const ml_node *n = ml__tree_get(v, "feature_layer");
    long long idx = -2; /* LlavaConfig's default */
    if (n) {
        ml_status st = ml__tree_need_scalar(err, n, "model.stacks.vision.feature_layer",
                                            "a whole number");
        if (st)
            return st;
        char *end = NULL;
        errno = 0;
        idx = strtoll(n->text, &end, 10);
        if (errno || end == n->text || *end)
            return ml__error_at(err, n, ML_SCHEMA,
                                "model.stacks.vision.feature_layer: '%s' is not a whole number "
                                "(an index into the tower's hidden states, -2: the output of "
                                "the last layer but one)",
                                n->text);
    }
    long long states = (long long)m->vision.layers + 1, at = idx < 0 ? states + idx : idx;
    if (at < 0 || at >= states)
        return ml__error_at(err, n ? n : v, ML_RANGE,
                            "model.stacks.vision.feature_layer: %lld is outside the tower's %lld "
                            "hidden states (-%lld to %lld)",
                            idx, states, states, states - 1);
    m->vision.used = (uint64_t)at;
    return ML_OK;
}

static ml_status vision(ml_error *err, const ml_node *v, ml_model *m)
{
    const char *sec = "model.stacks.vision";
    ml_status st;
    if ((st = ml__tree_need_map(err, v, sec)) ||
        (st = ml__tree_check_keys(err, v, sec, vision_keys, ML_COUNT(vision_keys))))
        return st;
    const char *req[] = {"layers", "hidden", "heads", "image_size", "patch_size"};
    for (size_t i = 0; i < ML_COUNT(req); i++)
        if (!ml__tree_get(v, req[i]))
            return ml__error_at(err, v, ML_SCHEMA,
                                "%s.%s: missing; the vision tower needs layers, hidden, heads, "
                                "image_size and patch_size",
                                sec, req[i]);
    m->vision.channels = 3;
    if ((st = ml__tree_uint(err, v, "layers", sec, 1, ML_MAX_LAYERS, &m->vision.layers)) ||
        (st = ml__tree_uint(err, v, "hidden", sec, 1, ML_MAX_HIDDEN, &m->vision.hidden)) ||
        (st = ml__tree_uint(err, v, "heads", sec, 1, ML_MAX_HIDDEN, &m->vision.attn.heads)) ||
        (st = ml__tree_uint(err, v, "image_size", sec, 1, 1u << 16, &m->vision.image)) ||
        (st = ml__tree_uint(err, v, "patch_size", sec, 1, 1u << 16, &m->vision.patch)) ||
        (st = ml__tree_uint(err, v, "channels", sec, 1, 1u << 16, &m->vision.channels)))
        return st;
    m->vision.mlp.ffn = 4 * m->vision.hidden;
    if ((st = ml__tree_uint(err, v, "ffn", sec, 1, ML_MAX_FFN, &m->vision.mlp.ffn)))
        return st;
    if (m->vision.hidden % m->vision.attn.heads)
        return ml__error_at(err, ml__tree_get(v, "heads"), ML_SCHEMA,
                            "%s.heads: %llu does not divide hidden (%llu)", sec,
                            (unsigned long long)m->vision.attn.heads,
                            (unsigned long long)m->vision.hidden);
    if (m->vision.image % m->vision.patch)
        return ml__error_at(err, ml__tree_get(v, "patch_size"), ML_SCHEMA,
                            "%s.patch_size: %llu does not divide image_size (%llu)", sec,
                            (unsigned long long)m->vision.patch,
                            (unsigned long long)m->vision.image);
    uint64_t g = m->vision.image / m->vision.patch;
    if (g * g + 1 > ML_MAX_TOKENS)
        return ml__error_at(err, ml__tree_get(v, "image_size"), ML_RANGE,
                            "%s.image_size: (image_size / patch_size)^2 = %llu image tokens, "
                            "above the %llu a sequence holds: use larger patches or smaller "
                            "images",
                            sec, (unsigned long long)(g * g), (unsigned long long)ML_MAX_TOKENS);
    /* quick_gelu: CLIP's (openai/clip-vit-*); gelu: the exact one */
    static const char *const acts[] = {"quick_gelu", "gelu"};
    static const char *const sel[] = {"default", "full"};
    unsigned a = 0, s = 0;
    if ((st = ml__tree_enum(err, v, "activation", sec, acts, 2, &a)) ||
        (st = ml__tree_enum(err, v, "feature_select", sec, sel, 2, &s)) ||
        (st = ml__schema_only(err, v, sec, "norm", "layernorm",
                              "is not CLIP's (its LayerNorms)")) ||
        (st = ml__schema_only(err, v, sec, "attention", "eager",
                   "is not modelled for the vision tower (its eager layout is)")))
        return st;
    m->vision.mlp.activation = a == 0 ? ML_ACT_QUICK_GELU : ML_ACT_GELU;
    m->vision.full = s == 1;
    return feature_layer(err, v, m);
}

static ml_status projector(ml_error *err, const ml_node *p, ml_model *m)
{
    const char *sec = "model.stacks.projector";
    ml_status st;
    m->vision.proj_bias = true; /* LlavaConfig's multimodal_projector_bias */
    if (!p)
        return ML_OK;
    if ((st = ml__tree_need_map(err, p, sec)) ||
        (st = ml__tree_check_keys(err, p, sec, projector_keys, ML_COUNT(projector_keys))) ||
        (st = ml__schema_only(
             err, p, sec, "activation", "gelu",
             "is not modelled for the projector (LlavaConfig's projector_hidden_act "
             "gelu is)")) ||
        (st = ml__tree_bool(err, p, "bias", sec, &m->vision.proj_bias)))
        return st;
    return ML_OK;
}

ml_status ml__schema_multimodal(ml_error *err, const ml_node *mm, ml_model *m)
{
    ml_status st;
    if ((st = ml__tree_check_keys(err, mm, "model", mm_keys, ML_COUNT(mm_keys))))
        return st;
    const ml_node *s = ml__tree_get(mm, "stacks");
    if (!s)
        return ml__error_at(err, mm, ML_SCHEMA,
                            "model.stacks: missing; a multimodal model has stacks: vision, "
                            "projector and decoder");
    if ((st = ml__tree_need_map(err, s, "model.stacks")) ||
        (st = ml__tree_check_keys(err, s, "model.stacks", stack_keys, ML_COUNT(stack_keys))))
        return st;
    const ml_node *v = ml__tree_get(s, "vision"), *d = ml__tree_get(s, "decoder");
    if (!v || !d)
        return ml__error_at(err, s, ML_SCHEMA,
                            "model.stacks.%s: missing; a multimodal model has stacks: vision, "
                            "projector and decoder",
                            v ? "decoder" : "vision");
    /* the decoder's keys are a decoder model's (their messages say model.) */
    m->type = ML_MODEL_DECODER;
    if ((st = ml__tree_need_map(err, d, "model.stacks.decoder")) ||
        (st = ml__schema_transformer(err, d, m)))
        return st;
    if (m->norms.kind == ML_NORM_OLMO_LAYERNORM)
        return ml__error_at(err, ml__tree_get(d, "norm"), ML_SCHEMA,
                            "model.stacks.decoder.norm: olmo_layernorm is planned in OLMo's own "
                            "decoder, not as a multimodal model's: use rmsnorm");
    if (ml__tree_get(d, "type") || m->embed.image_size || m->head.classes || m->moe.experts ||
        m->attn.kv_lora || m->residual.parallel || !m->residual.prenorm)
        return ml__error_at(err, d, ML_SCHEMA,
                            "model.stacks.decoder: a multimodal model's decoder is planned as "
                            "a pre-norm decoder with an LM head; remove type, image_size, "
                            "classes, experts, kv_lora_rank and parallel_residual");
    if ((st = vision(err, v, m)) || (st = projector(err, ml__tree_get(s, "projector"), m)) ||
        (st = ml__tree_size_or_zero(err, mm, "buffers", "model", &m->buffers)))
        return st;
    return ML_OK;
}

ml_status ml__schema_vision_tower(ml_error *err, const ml_node *t, ml_model *m)
{
    ml_training *tr = &m->config.training;
    const char *names[ML_VT_COUNT];
    for (unsigned i = 0; i < ML_VT_COUNT; i++)
        names[i] = ml_vision_tower_name((ml_vision_tower)i);
    unsigned v = tr->vision_tower;
    ml_status st = ml__tree_enum(err, t, "vision_tower", "training", names, ML_VT_COUNT, &v);
    tr->vision_tower = (ml_vision_tower)v;
    if (st)
        return st;
    if (v != ML_VT_SAME && !m->vision.layers)
        return ml__error_at(err, ml__tree_get(t, "vision_tower"), ML_SCHEMA,
                            "training.vision_tower: a multimodal model's setting; this model has "
                            "no vision tower: remove it");
    /* each sample's image is part of its sequence */
    static const char *const lens[] = {"seq_len", "eval_seq_len"};
    uint64_t n = ml_model_image_tokens(m);
    for (size_t i = 0; i < 2 && n; i++) {
        uint64_t len = i ? tr->eval_seq_len : tr->seq_len;
        if (ml__tree_get(t, lens[i]) && len < n)
            return ml__error_at(err, ml__tree_get(t, lens[i]), ML_RANGE,
                                "training.%s: %llu tokens hold no image: each sample's image is "
                                "%llu of them (model.stacks.vision); give at least %llu",
                                lens[i], (unsigned long long)len, (unsigned long long)n,
                                (unsigned long long)n);
    }
    return ML_OK;
}

uint64_t ml_model_image_tokens(const ml_model *m)
{
    if (!m->vision.layers)
        return 0;
    uint64_t g = m->vision.image / m->vision.patch;
    return g * g + (m->vision.full ? 1 : 0);
}
