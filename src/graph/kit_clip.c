/* LLaVA's CLIP vision tower as the kit's components (kit.h, families.h):
 * HF CLIPEncoderLayer (modeling_clip.py, transformers 4.5x) is ViT's
 * pre-LayerNorm layer (q/k/v and out projections with biases, the scores
 * scaled, softmax in fp32 cast back, no mask, no dropout) with CLIPMLP's
 * QuickGELU; the tower's last layer also runs post_layernorm on its class
 * tokens. Every setting comes from the model's vision stack (vis_*), none
 * from its decoder: a field the decoder gains cannot leak into the tower.
 * What each op keeps: docs/inventory.md, "Llava". */
#include "graph/families.h"

uint16_t ml__kit_quick_gelu_mlp(ml_graph *g, const mlg_layer *L, uint16_t h)
{
    const mlg_mlp *p = &L->mlp;
    /* autocast: the input's copy and both weights' copies (the inventory
     * lists them before the activations) */
    uint16_t c = ml__kit_cast_copy(g, L, h);
    uint16_t w1 = ml__kit_weight_copy(g, L, MLG_D, MLG_F);
    uint16_t w2 = ml__kit_weight_copy(g, L, MLG_F, MLG_D);
    uint16_t F1 = ml__graph_tensor(g, "fc1 output (quick_gelu input)", MLG_COMPUTE, MLG_ACT, 3,
                                   MLG_B, MLG_T, MLG_F);
    uint16_t S = ml__graph_tensor(g, "1.702 * x", MLG_COMPUTE, MLG_ACT, 3, MLG_B, MLG_T, MLG_F);
    uint16_t Sg = ml__graph_tensor(g, "quick_gelu sigmoid output", MLG_COMPUTE, MLG_ACT, 3,
                                   MLG_B, MLG_T, MLG_F);
    uint16_t P = ml__graph_tensor(g, "quick_gelu output (fc2 input)", MLG_COMPUTE, MLG_ACT, 3,
                                  MLG_B, MLG_T, MLG_F);
    uint16_t M = ml__graph_tensor(g, "MLP output", MLG_COMPUTE, MLG_ACT, 3, MLG_B, MLG_T, MLG_D);
    if (S != MLG_NONE)
        g->t[S].flags |= MLG_T_TMP;
    if (M != MLG_NONE)
        g->t[M].flags |= MLG_T_TMP;
    const mlg_linear fc1 = {"addmm (fc1)", "AddmmBackward0 (MLP in)", MLG_D, MLG_F, p->bias};
    mlg_op *o = ml__kit_linear_with(g, &fc1, h, c, w1, F1);
    ml__op_gout(o, F1);
    /* x * sigmoid(1.702 * x) (activations.py, QuickGELUActivation): the
     * product by a Python number keeps only a host scalar; its gradient
     * for x, the younger node's, is added into the buffer the product's
     * made */
    o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "mul (1.702 * x)", F1, S,
                       "MulBackward0 (1.702 * x)");
    o->accum = F1;
    o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "sigmoid", S, Sg, "SigmoidBackward0");
    ml__op_save(o, Sg); /* sigmoid_backward(grad, result) */
    ml__op_free(o, S);
    /* mul keeps both factors; fc1's output goes as the activation returns */
    o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "mul (x * sigmoid)", F1, P,
                       "MulBackward0 (x * sigmoid)");
    ml__op_in(o, Sg);
    ml__op_gin(o, Sg);
    ml__op_save(o, F1);
    ml__op_save(o, Sg);
    ml__op_free(o, F1);
    ml__op_free(o, Sg);
    const mlg_linear fc2 = {"addmm (fc2)", "AddmmBackward0 (MLP out)", MLG_F, MLG_D, p->bias};
    o = ml__kit_linear_with(g, &fc2, P, MLG_NONE, w2, M);
    ml__op_free(o, P);
    if (p->out_grad)
        ml__op_gout(o, M);
    return ml__kit_dropout(g, p->dropout, M, "NativeDropoutBackward0 (residual)", false, true);
}

void ml__kit_clip_pooled(ml_graph *g, const mlg_norm *n, uint16_t x, bool keeps)
{
    /* last_hidden_state[:, 0, :], a view; LayerNorm over it keeps the view
     * (x's storage) and one mean and rstd per sample */
    uint16_t cls = ml__graph_view(g, "class tokens (pooled_output)", x, 2, MLG_B, MLG_D);
    uint16_t st = ml__graph_tensor(g, "post_layernorm mean+rstd", MLG_FP32, MLG_ACT, 1, MLG_B);
    if (st != MLG_NONE)
        g->t[st].factor = 2;
    uint16_t y = ml__graph_tensor(g, "post_layernorm output", MLG_STREAM, MLG_ACT, 2, MLG_B,
                                  MLG_D);
    mlg_op *o = ml__graph_step(g, MLG_OP_NORM, "native_layer_norm (post_layernorm)", cls, y, NULL);
    ml__op_out(o, st);
    if (keeps) {
        ml__op_save(o, cls);
        ml__op_save(o, st);
    }
    ml__op_param(o, ml__kit_param(g, "weight", MLG_D, -1));
    if (n->bias)
        ml__op_param(o, ml__kit_param(g, "bias", MLG_D, -1));
    ml__op_free(o, st);
    /* LLaVA reads the hidden states, never pooler_output: no gradient
     * reaches the norm (no node), its output goes with the tower's return */
    ml__op_free(ml__graph_release(g, "pooler_output unused"), y);
}

bool ml__family_clip_layer(const ml_model *m, const mlg_config *c, mlg_layer *L)
{
    if (!m->vis_layers || !m->vis_heads || m->vis_hidden % m->vis_heads)
        return false;
    *L = (mlg_layer){0};
    L->norm = (mlg_norm){MLG_LAYERNORM, true, false, false};
    mlg_attention *a = &L->attn;
    /* CLIPAttention: q_proj, k_proj, v_proj, out_proj with biases; eager
     * (the model's attention key is its decoder's; the chain plans the
     * tower's eager), no mask, no rotary (learned positions in the
     * embeddings), attention_dropout 0 */
    a->hf = true;
    a->qkv_bias = a->out_bias = true;
    a->probs_cast = c->compute_bytes != 4;
    a->softmax_copy = c->compute_bytes != 4 && !c->fp16;
    L->mlp = (mlg_mlp){m->vis_quick_gelu ? MLG_QUICK_GELU : MLG_GELU, true, false, false, false,
                       false, false};
    L->autocast = c->autocast;
    return true;
}

void ml__family_clip_graph(ml_graph *g, const mlg_layer *L, mlg_clip_pool pool)
{
    ml__graph_init(g);
    const uint16_t out = ml__kit_prenorm_layer(g, L);
    if (pool == MLG_CLIP_LAYER)
        return;
    /* CLIPVisionTransformer registers post_layernorm after the encoder:
     * after the layer's parameters */
    g->group = ml__kit_group(L, MLG_GROUP_POST_MLP);
    ml__kit_clip_pooled(g, &L->norm, out, pool == MLG_CLIP_POOLED_KEPT);
}
