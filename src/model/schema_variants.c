/* The model file's keys of the layer variants (schema.c calls these after
 * the other transformer keys): Falcon's shared_norm and norm_bias, the
 * mixture of experts' keys, and multi-head latent attention's (docs/cli.md,
 * "The model file"; what they change: docs/inventory.md, "Falcon block",
 * "Mixtral block" and "DeepSeek-V3 block"). */
#include <string.h>

#include "model/schema.h"

static const char *const transformer_keys[] = {
    "type", "layers", "hidden", "heads", "kv_heads", "ffn", "activation", "norm",
    "norm_position", "vocab", "position", "max_positions", "tied_embeddings", "bias",
    "attention", "dropout", "classes", "pooler", "token_types", "image_size", "patch_size",
    "channels", "qkv_bias", "parallel_residual", "head_dim", "embedding_scale",
    "fused_projections", "mlm_head", "buffers", "post_norms", "attn_scalar", "attn_softcap",
    "final_softcap", "norm_bias", "shared_norm", "experts", "experts_per_tok", "expert_ffn",
    "shared_expert_ffn", "expert_renorm", "shared_expert_gate", "router", "dense_layers",
    "kv_lora_rank", "q_lora_rank", "rope_head_dim", "v_head_dim", "expert_dispatch",
    "grouped_topk", "rope_complex"};

const char *const *ml__schema_transformer_keys(size_t *count)
{
    *count = sizeof transformer_keys / sizeof transformer_keys[0];
    return transformer_keys;
}

ml_status ml__schema_falcon(ml_error *err, const ml_node *mm, ml_model *m)
{
    ml_status st;
    m->norms.bias = m->bias;
    if ((st = ml__tree_bool(err, mm, "norm_bias", "model", &m->norms.bias)) ||
        (st = ml__tree_bool(err, mm, "shared_norm", "model", &m->residual.shared_norm)))
        return st;
    if (m->residual.shared_norm &&
        (!m->residual.parallel || m->norms.kind != ML_NORM_LAYERNORM || m->dropout > 0 ||
         m->bias || (m->attn.kv_heads != 1 && m->attn.kv_heads != m->attn.heads)))
        return ml__error_at(err, ml__tree_get(mm, "shared_norm"), ML_SCHEMA,
                            "model.shared_norm: Falcon's layer (one norm for both branches, its "
                            "attention) needs parallel_residual: true, norm: layernorm, "
                            "dropout: 0, bias: false (norm_bias: true) and kv_heads 1 or "
                            "heads");
    if (ml__tree_get(mm, "norm_bias") && m->norms.kind != ML_NORM_LAYERNORM)
        return ml__error_at(err, ml__tree_get(mm, "norm_bias"), ML_SCHEMA,
                            "model.norm_bias: the LayerNorms' biases; an RMSNorm has none");
    return ML_OK;
}

/* DeepSeek-V2's dispatch keys: expert_dispatch: sort, grouped_topk. */
static ml_status experts_dispatch(ml_error *err, const ml_node *mm, ml_model *m)
{
    static const char *const dispatch[] = {"where", "sort"};
    unsigned dsp = 0;
    ml_status st;
    m->moe.grouped_topk = false;
    if ((st = ml__tree_enum(err, mm, "expert_dispatch", "model", dispatch, 2, &dsp)) ||
        (st = ml__tree_bool(err, mm, "grouped_topk", "model", &m->moe.grouped_topk)))
        return st;
    m->moe.sort = dsp == 1;
    if (m->moe.sort && m->moe.router_sigmoid)
        return ml__error_at(err, ml__tree_get(mm, "expert_dispatch"), ML_SCHEMA,
                            "model.expert_dispatch: sort is DeepSeek-V2's layer, whose router is "
                            "a softmax: drop router: sigmoid (DeepSeek-V3's)");
    if (m->moe.sort && ml__tree_get(mm, "expert_renorm") && m->moe.renorm)
        return ml__error_at(err, ml__tree_get(mm, "expert_renorm"), ML_SCHEMA,
                            "model.expert_renorm: DeepSeek-V2's router (expert_dispatch: sort) "
                            "does not renormalise its top-k weights: set it false or leave it "
                            "out");
    if (m->moe.sort)
        m->moe.renorm = false;
    if (m->moe.grouped_topk && !m->moe.sort)
        return ml__error_at(err, ml__tree_get(mm, "grouped_topk"), ML_SCHEMA,
                            "model.grouped_topk: DeepSeek-V2's group_limited_greedy; it needs "
                            "expert_dispatch: sort");
    return ML_OK;
}

/* router: softmax (Mixtral's) or sigmoid (DeepSeek-V3's), the dispatch,
 * dense_layers and shared_expert_gate, after the expert counts. */
static ml_status experts_kinds(ml_error *err, const ml_node *mm, ml_model *m)
{
    static const char *const routers[] = {"softmax", "sigmoid"};
    unsigned r = 0;
    ml_status st;
    m->moe.shared_gate = true;
    m->moe.dense_layers = 0;
    if ((st = ml__tree_enum(err, mm, "router", "model", routers, 2, &r)) ||
        (st = ml__tree_uint(err, mm, "dense_layers", "model", 0, ML_MAX_LAYERS,
                            &m->moe.dense_layers)) ||
        (st = ml__tree_bool(err, mm, "shared_expert_gate", "model", &m->moe.shared_gate)))
        return st;
    m->moe.router_sigmoid = r == 1;
    if ((st = experts_dispatch(err, mm, m)))
        return st;
    /* Qwen2-MoE's shared expert has a sigmoid gate, DeepSeek-V2's and
     * DeepSeek-V3's shared experts none: the layers planned */
    bool gate = m->moe.shared_gate;
    m->moe.shared_gate = !m->moe.router_sigmoid && !m->moe.sort;
    if (ml__tree_get(mm, "shared_expert_gate") && m->moe.shared_ffn && gate != m->moe.shared_gate)
        return ml__error_at(err, ml__tree_get(mm, "shared_expert_gate"), ML_SCHEMA,
                            "model.shared_expert_gate: %s is not modelled here (the planned "
                            "layers: a gated shared expert with router: softmax and "
                            "expert_dispatch: where, Qwen2-MoE's; ungated shared experts with "
                            "router: sigmoid, DeepSeek-V3's, or expert_dispatch: sort, "
                            "DeepSeek-V2's)",
                            gate ? "true" : "false");
    if (ml__tree_get(mm, "shared_expert_gate") && !m->moe.shared_ffn)
        return ml__error_at(err, ml__tree_get(mm, "shared_expert_gate"), ML_SCHEMA,
                            "model.shared_expert_gate: the shared expert's gate; give "
                            "shared_expert_ffn: N");
    if (m->moe.dense_layers >= m->layers && ml__tree_get(mm, "dense_layers"))
        return ml__error_at(err, ml__tree_get(mm, "dense_layers"), ML_SCHEMA,
                            "model.dense_layers: %llu of the %llu layers dense leaves no layer "
                            "with experts: leave out experts instead",
                            (unsigned long long)m->moe.dense_layers,
                            (unsigned long long)m->layers);
    return ML_OK;
}

ml_status ml__schema_experts(ml_error *err, const ml_node *mm, ml_model *m)
{
    ml_status st;
    m->moe.experts = 0;
    m->moe.per_token = 0;
    m->moe.expert_ffn = m->moe.shared_ffn = 0;
    m->moe.renorm = true;
    m->moe.router_sigmoid = m->moe.sort = m->moe.grouped_topk = false;
    /* 0 is the documented "none" of experts (one dense MLP), expert_ffn
     * (ffn) and shared_expert_ffn (no shared expert) */
    if ((st = ml__tree_uint(err, mm, "experts", "model", 0, 4096, &m->moe.experts)) ||
        (st = ml__tree_uint(err, mm, "experts_per_tok", "model", 1, 4096, &m->moe.per_token)) ||
        (st = ml__tree_uint(err, mm, "expert_ffn", "model", 0, ML_MAX_FFN, &m->moe.expert_ffn)) ||
        (st = ml__tree_uint(err, mm, "shared_expert_ffn", "model", 0, ML_MAX_FFN,
                            &m->moe.shared_ffn)) ||
        (st = ml__tree_bool(err, mm, "expert_renorm", "model", &m->moe.renorm)))
        return st;
    const char *const only[] = {"expert_ffn",      "shared_expert_ffn",  "expert_renorm",
                                "router",          "dense_layers",       "shared_expert_gate",
                                "expert_dispatch", "grouped_topk",       "experts_per_tok"};
    const ml_node *given = ml__tree_get(mm, "experts");
    for (size_t i = 0; i < sizeof only / sizeof only[0]; i++)
        if (ml__tree_get(mm, only[i]) && !m->moe.experts)
            return ml__error_at(err, ml__tree_get(mm, only[i]), ML_SCHEMA,
                                "model.%s: a mixture of experts' key%s: give experts: N (2 or "
                                "more), or remove it",
                                only[i], given ? ", and experts is 0 (one dense MLP)" : "");
    const ml_node *at = given;
    if (!m->moe.experts)
        return ML_OK;
    if (m->moe.experts < 2)
        return ml__error_at(err, at, ML_SCHEMA,
                            "model.experts: a mixture of experts needs experts: 2 or more (one "
                            "dense MLP: 0, or leave the key out)");
    if (!m->moe.per_token)
        m->moe.per_token = 2; /* MixtralConfig's num_experts_per_tok */
    if (m->moe.per_token > m->moe.experts)
        return ml__error_at(err, ml__tree_get(mm, "experts_per_tok"), ML_SCHEMA,
                            "model.experts_per_tok: %llu is more than the %llu experts",
                            (unsigned long long)m->moe.per_token,
                            (unsigned long long)m->moe.experts);
    if (m->type != ML_MODEL_DECODER || !m->residual.prenorm ||
        m->norms.kind == ML_NORM_LAYERNORM || m->mlp.activation != ML_ACT_SWIGLU ||
        m->residual.parallel || m->attn.fused_proj || m->residual.post_norms || m->dropout > 0 ||
        m->bias || m->mlp.bias)
        return ml__error_at(err, at, ML_SCHEMA,
                            "model.experts: planned for Mixtral's layer only: a pre-norm decoder "
                            "with norm: rmsnorm, activation: swiglu, no biases, no "
                            "parallel_residual, fused_projections or post_norms, and dropout: 0");
    return experts_kinds(err, mm, m);
}

/* Multi-head latent attention (HF DeepseekV3Attention): kv_lora_rank turns
 * it on; head_dim is the q/k head (qk_nope_head_dim + qk_rope_head_dim),
 * rope_head_dim its rotated part, v_head_dim the value head. */
ml_status ml__schema_mla(ml_error *err, const ml_node *mm, ml_model *m)
{
    ml_status st;
    m->attn.kv_lora = m->attn.q_lora = m->attn.rope_dim = m->attn.v_dim = 0;
    m->embed.rope_complex = false;
    if ((st = ml__tree_uint(err, mm, "kv_lora_rank", "model", 1, ML_MAX_HIDDEN,
                            &m->attn.kv_lora)) ||
        (st = ml__tree_bool(err, mm, "rope_complex", "model", &m->embed.rope_complex)) ||
        (st = ml__tree_uint(err, mm, "q_lora_rank", "model", 1, ML_MAX_HIDDEN, &m->attn.q_lora)) ||
        (st = ml__tree_uint(err, mm, "rope_head_dim", "model", 2, ML_MAX_HIDDEN,
                            &m->attn.rope_dim)) ||
        (st = ml__tree_uint(err, mm, "v_head_dim", "model", 1, ML_MAX_HIDDEN, &m->attn.v_dim)))
        return st;
    const char *const only[] = {"q_lora_rank", "rope_head_dim", "v_head_dim", "rope_complex"};
    for (size_t i = 0; i < 4; i++)
        if (ml__tree_get(mm, only[i]) && !m->attn.kv_lora)
            return ml__error_at(err, ml__tree_get(mm, only[i]), ML_SCHEMA,
                                "model.%s: a key of multi-head latent attention: give "
                                "kv_lora_rank: N",
                                only[i]);
    if (!m->attn.kv_lora)
        return ML_OK;
    const ml_node *at = ml__tree_get(mm, "kv_lora_rank");
    uint64_t dh = m->attn.head_dim ? m->attn.head_dim : m->hidden / m->attn.heads;
    if (m->type != ML_MODEL_DECODER || !m->residual.prenorm || m->norms.kind != ML_NORM_RMSNORM ||
        m->embed.position != ML_POS_ROPE || m->bias || m->attn.qkv_bias || m->dropout > 0 ||
        m->attn.kv_heads != m->attn.heads || m->residual.parallel || m->attn.fused_proj ||
        m->residual.post_norms || m->attn.softcap > 0)
        return ml__error_at(err, at, ML_SCHEMA,
                            "model.kv_lora_rank: multi-head latent attention is planned in "
                            "DeepSeek-V3's layer only: a pre-norm decoder with norm: rmsnorm, "
                            "position: rope, bias: false, no qkv_bias, dropout: 0, kv_heads "
                            "equal to heads, "
                            "and no parallel_residual, fused_projections, post_norms or "
                            "attn_softcap");
    if (!m->attn.rope_dim || m->attn.rope_dim % 2 || m->attn.rope_dim >= dh)
        return ml__error_at(err, ml__tree_get(mm, "rope_head_dim") ? ml__tree_get(mm, "rope_head_dim")
                                                                 : at,
                           ML_SCHEMA,
                           "model.rope_head_dim: the rotated part of the %llu-wide q/k head "
                           "(head_dim) must be given, even and smaller than it",
                           (unsigned long long)dh);
    if (!m->attn.v_dim)
        m->attn.v_dim = dh - m->attn.rope_dim; /* DeepSeek's v_head_dim = qk_nope_head_dim */
    return ML_OK;
}

ml_status ml__schema_olmo(ml_error *err, const ml_node *mm, ml_model *m)
{
    if (m->norms.kind != ML_NORM_OLMO_LAYERNORM)
        return ML_OK;
    /* the first setting OLMo's layer does not have, named as a key */
    static const char *const keys[] = {
        "type",         "norm_position", "parallel_residual", "experts",      "kv_lora_rank",
        "post_norms",   "fused_projections", "attn_softcap", "final_softcap", "classes",
        "kv_heads",     "activation"};
    const bool bad[] = {m->type != ML_MODEL_DECODER,
                        !m->residual.prenorm,
                        m->residual.parallel,
                        m->moe.experts > 0,
                        m->attn.kv_lora > 0,
                        m->residual.post_norms,
                        m->attn.fused_proj,
                        m->attn.softcap > 0,
                        m->head.final_softcap > 0,
                        m->head.classes > 0,
                        m->attn.kv_heads > m->attn.heads,
                        m->mlp.activation == ML_ACT_QUICK_GELU};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (bad[i])
            return ml__error_at(err, ml__tree_get(mm, "norm"), ML_SCHEMA,
                                "model.norm: olmo_layernorm (OLMo's LayerNorm without weight or "
                                "bias, in fp32) is planned in OLMo's layer: a pre-norm decoder "
                                "with one dense MLP and a language-model head; model.%s is "
                                "another layout's: remove or change it, or use norm: layernorm "
                                "or rmsnorm",
                                keys[i]);
    return ML_OK;
}
