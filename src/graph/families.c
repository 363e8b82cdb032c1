/* Families as compositions (families.h). */
#include "graph/families.h"

bool ml__family_gpt2_layer(const ml_model *m, bool autocast, bool fused_kernel, mlg_layer *L)
{
    /* the layouts the kit does not express yet keep their chain builders
     * (ledger/chain_transformer.c): rotary, grouped-query heads, other
     * norms, residual arrangements, MLPs and attention variants */
    if (m->type != ML_MODEL_DECODER || !m->prenorm || m->norm != ML_NORM_LAYERNORM ||
        m->position == ML_POS_ROPE || m->parallel_residual || m->shared_norm || m->experts ||
        m->kv_lora || m->image_size || m->vis_layers || m->post_norms || m->fused_proj ||
        m->attn_softcap > 0 || m->kv_heads != m->heads ||
        (m->activation != ML_ACT_GELU && m->activation != ML_ACT_RELU))
        return false;
    L->norm = (mlg_norm){MLG_LAYERNORM, m->norm_bias};
    L->attn = (mlg_attention){m->qkv_bias, m->bias || m->out_bias, fused_kernel, m->dropout > 0};
    L->mlp = (mlg_mlp){m->activation == ML_ACT_RELU ? MLG_RELU : MLG_GELU, m->bias || m->mlp_bias,
                       m->dropout > 0};
    L->autocast = autocast;
    return true;
}

void ml__family_layer_graph(ml_graph *g, const mlg_layer *L)
{
    ml__graph_init(g);
    ml__kit_prenorm_layer(g, L);
}
