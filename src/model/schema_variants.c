/* The model file's keys of two layer variants (schema.c calls these after
 * the other transformer keys): Falcon's shared_norm and norm_bias, and the
 * mixture of experts' experts and experts_per_tok (docs/cli.md, "The model
 * file"; what they change: docs/inventory.md, "Falcon block" and "Mixtral
 * block"). */
#include "model/schema.h"

ml_status ml_schema_falcon(ml_error *err, const ml_node *mm, ml_model *m)
{
    ml_status st;
    m->norm_bias = m->bias;
    if ((st = ml_tree_bool(err, mm, "norm_bias", "model", &m->norm_bias)) ||
        (st = ml_tree_bool(err, mm, "shared_norm", "model", &m->shared_norm)))
        return st;
    if (m->shared_norm && (!m->parallel_residual || m->norm != ML_NORM_LAYERNORM ||
                           m->dropout > 0 || m->bias ||
                           (m->kv_heads != 1 && m->kv_heads != m->heads)))
        return ml_error_at(err, ml_tree_get(mm, "shared_norm"), ML_SCHEMA,
                           "model.shared_norm: Falcon's layer (one norm for both branches, its "
                           "attention) needs parallel_residual: true, norm: layernorm, "
                           "dropout: 0, bias: false (norm_bias: true) and kv_heads 1 or "
                           "heads");
    if (ml_tree_get(mm, "norm_bias") && m->norm != ML_NORM_LAYERNORM)
        return ml_error_at(err, ml_tree_get(mm, "norm_bias"), ML_SCHEMA,
                           "model.norm_bias: the LayerNorms' biases; an RMSNorm has none");
    return ML_OK;
}

ml_status ml_schema_experts(ml_error *err, const ml_node *mm, ml_model *m)
{
    ml_status st;
    m->experts = 0;
    m->experts_per_tok = 0;
    m->expert_ffn = m->shared_expert_ffn = 0;
    m->expert_renorm = true;
    if ((st = ml_tree_uint(err, mm, "experts", "model", 1, 4096, &m->experts)) ||
        (st = ml_tree_uint(err, mm, "experts_per_tok", "model", 1, 4096, &m->experts_per_tok)) ||
        (st = ml_tree_uint(err, mm, "expert_ffn", "model", 1, ML_MAX_FFN, &m->expert_ffn)) ||
        (st = ml_tree_uint(err, mm, "shared_expert_ffn", "model", 1, ML_MAX_FFN,
                           &m->shared_expert_ffn)) ||
        (st = ml_tree_bool(err, mm, "expert_renorm", "model", &m->expert_renorm)))
        return st;
    const char *const only[] = {"expert_ffn", "shared_expert_ffn", "expert_renorm"};
    for (size_t i = 0; i < 3; i++)
        if (ml_tree_get(mm, only[i]) && !ml_tree_get(mm, "experts"))
            return ml_error_at(err, ml_tree_get(mm, only[i]), ML_SCHEMA,
                               "model.%s: a mixture of experts' key: give experts: N", only[i]);
    const ml_node *at = ml_tree_get(mm, "experts") ? ml_tree_get(mm, "experts")
                                                   : ml_tree_get(mm, "experts_per_tok");
    if (!at)
        return ML_OK;
    if (m->experts < 2)
        return ml_error_at(err, at, ML_SCHEMA,
                           "model.experts: a mixture of experts needs experts: 2 or more (one "
                           "dense MLP: leave the key out)");
    if (!m->experts_per_tok)
        m->experts_per_tok = 2; /* MixtralConfig's num_experts_per_tok */
    if (m->experts_per_tok > m->experts)
        return ml_error_at(err, ml_tree_get(mm, "experts_per_tok"), ML_SCHEMA,
                           "model.experts_per_tok: %llu is more than the %llu experts",
                           (unsigned long long)m->experts_per_tok,
                           (unsigned long long)m->experts);
    if (m->type != ML_MODEL_DECODER || !m->prenorm || m->norm == ML_NORM_LAYERNORM ||
        m->activation != ML_ACT_SWIGLU || m->parallel_residual || m->fused_proj ||
        m->post_norms || m->dropout > 0 || m->bias || m->mlp_bias)
        return ml_error_at(err, at, ML_SCHEMA,
                           "model.experts: planned for Mixtral's layer only: a pre-norm decoder "
                           "with norm: rmsnorm, activation: swiglu, no biases, no "
                           "parallel_residual, fused_projections or post_norms, and dropout: 0");
    return ML_OK;
}
