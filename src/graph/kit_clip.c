/* LLaVA's CLIP vision tower as the kit's components (kit.h, families.h):
 * HF CLIPEncoderLayer (modeling_clip.py, transformers 4.5x) is ViT's
 * pre-LayerNorm layer (q/k/v and out projections with biases, the scores
 * scaled, softmax in fp32 cast back, no mask, no dropout) with CLIPMLP's
 * QuickGELU; the tower's last layer also runs post_layernorm on its class
 * tokens. Every setting comes from the model's vision tower (m->vision), none
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

/* HF CLIPVisionTransformer's post_layernorm (the norm n) of the class
 * tokens x[:, 0, :] of the tower's last output x; keeps: it
 * saves its input (x's storage) and statistics. */
static void clip_pooled(ml_graph *g, const mlg_norm *n, uint16_t x, bool keeps)
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
    if (!m->vision.layers || !m->vision.attn.heads || m->vision.hidden % m->vision.attn.heads)
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
    a->fold_views = c->one_row;
    L->mlp = (mlg_mlp){m->vision.mlp.activation == ML_ACT_QUICK_GELU ? MLG_QUICK_GELU : MLG_GELU,
                       true,
                       false,
                       false,
                       false,
                       false,
                       false,
                       false};
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
    clip_pooled(g, &L->norm, out, pool == MLG_CLIP_POOLED_KEPT);
}

/* CLIPVisionEmbeddings then pre_layrnorm (modeling_clip.py): the patch
 * conv (no bias) on pixels that need no grad, so its backward is the
 * weight's gradient only and it keeps the pixels (the batch the loop
 * holds: nothing listed) or autocast's copy of them, with the weight's
 * copy; the class embedding concatenated in front (cat promotes
 * autocast's 16-bit patches to the stream's fp32); the position
 * embedding added (looked up with the position_ids buffer, the caller's);
 * then the LayerNorm, which keeps its input and its statistics. The
 * modules register class_embedding, patch_embedding, position_embedding,
 * then pre_layrnorm (the groups only order them). No node list: the block rule, as the
 * builders had it. */
void ml__kit_clip_embedding(ml_graph *g, const mlg_clip_embed *E)
{
    ml__graph_init(g);
    const uint8_t img = ml__graph_lit(g, E->image), kin = ml__graph_lit(g, E->kin),
                  np = ml__graph_lit(g, E->npatches);
    uint16_t x = ml__graph_tensor(g, "pixel values", MLG_STREAM, MLG_INPUT, 2, MLG_B, img);
    g->t[x].flags |= MLG_T_SIDE;
    uint16_t xs = x, w = MLG_NONE;
    if (E->autocast) {
        xs = ml__graph_tensor(g, "image cast copy (patch conv input)", MLG_HALF, MLG_ACT, 2,
                              MLG_B, img);
        ml__graph_step(g, MLG_OP_COPY, "to (autocast, image)", x, xs, NULL);
        w = ml__graph_tensor(g, "weight cast copy (autocast)", MLG_HALF, MLG_ACT, 2, MLG_D, kin);
        g->t[w].flags |= MLG_T_WCAST;
        ml__graph_step(g, MLG_OP_COPY, "to (autocast, weight)", MLG_NONE, w, NULL);
    }
    g->group = MLG_GROUP_NORM1;
    const uint16_t cls = ml__kit_param(g, "class_embedding", MLG_D, -1);
    g->group = MLG_GROUP_ATTN_O;
    const uint16_t pw = ml__kit_param(g, "patch_embedding weight", MLG_D, kin);
    const uint16_t pos = ml__kit_param(g, "position_embedding weight", MLG_T, MLG_D);
    uint16_t p = ml__graph_tensor(g, "patch embeddings", MLG_COMPUTE, MLG_ACT, 3, MLG_B, np,
                                  MLG_D);
    g->t[p].flags |= MLG_T_TMP;
    mlg_op *o = ml__graph_step(g, MLG_OP_MATMUL, "convolution (patch_embedding)", xs, p, NULL);
    ml__op_save(o, xs);
    ml__op_save(o, w);
    ml__op_param(o, pw);
    ml__op_flops(o, 2.0, 4, MLG_B, np, kin, MLG_D);
    ml__op_free(o, w);
    if (xs != x)
        ml__op_free(o, xs);
    uint16_t c = ml__graph_tensor(g, "embeddings (class token first)", MLG_STREAM, MLG_ACT, 3,
                                  MLG_B, MLG_T, MLG_D);
    g->t[c].flags |= MLG_T_TMP;
    o = ml__graph_step(g, MLG_OP_COPY, "cat (class_embedding)", p, c, NULL);
    ml__op_param(o, cls);
    ml__op_free(o, p);
    uint16_t s = ml__graph_tensor(g, "pre_layrnorm input (embeddings)", MLG_STREAM, MLG_ACT, 3,
                                  MLG_B, MLG_T, MLG_D);
    o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "add (position_embedding)", c, s, NULL);
    ml__op_param(o, pos);
    ml__op_free(o, c);
    uint16_t st = ml__graph_tensor(g, "pre_layrnorm mean+rstd", MLG_FP32, MLG_ACT, 2, MLG_B,
                                   MLG_T);
    g->t[st].factor = 2;
    uint16_t y = ml__graph_tensor(g, "pre_layrnorm output", MLG_STREAM, MLG_ACT, 3, MLG_B, MLG_T,
                                  MLG_D);
    o = ml__graph_step(g, MLG_OP_NORM, "native_layer_norm (pre_layrnorm)", s, y, NULL);
    ml__op_out(o, st);
    ml__op_save(o, s);
    ml__op_save(o, st);
    g->group = MLG_GROUP_ATTN;
    ml__op_param(o, ml__kit_param(g, "pre_layrnorm weight", MLG_D, -1));
    ml__op_param(o, ml__kit_param(g, "pre_layrnorm bias", MLG_D, -1));
    ml__op_free(o, s);
}

/* linear_1's input: the feature slice hidden_states[feature][:, 1:] (a
 * view of the block's input; with feature_select full, the whole hidden
 * state, which the linear keeps; so with one image, whose slice the
 * reshape to (tokens, width) keeps a view), autocast's copy of it, or,
 * the slice not contiguous, the copy matmul's reshape makes. */
static uint16_t projector_input(ml_graph *g, const mlg_llava_projector *P, uint8_t n, uint8_t dv)
{
    const uint8_t tv = ml__graph_lit(g, P->tokens);
    uint16_t x = ml__graph_tensor(g, "vision hidden state (the feature layer's)", MLG_STREAM,
                                  MLG_INPUT, 3, MLG_B, tv, dv);
    uint16_t f = ml__graph_view(g, "image features (the feature slice)", x, 3, MLG_B, n, dv);
    if (P->keeps_hidden)
        return f;
    uint16_t c = P->autocast
                     ? ml__graph_tensor(g, "linear_1 input (cast copy of the feature)", MLG_HALF,
                                        MLG_ACT, 3, MLG_B, n, dv)
                     : ml__graph_tensor(g, "linear_1 input (contiguous copy of the slice)",
                                        MLG_COMPUTE, MLG_ACT, 3, MLG_B, n, dv);
    ml__graph_step(g, MLG_OP_COPY, P->autocast ? "to (autocast)" : "contiguous (reshape)", f, c,
                   NULL);
    return c;
}

/* A projector linear (in x D, with its bias) on x into y, keeping x and
 * autocast's copy of its weight; its FLOPs the caller's. */
static mlg_op *projector_linear(ml_graph *g, const char *name, uint16_t x, uint16_t y,
                                uint8_t in, uint16_t wc, bool bias)
{
    mlg_op *o = ml__graph_step(g, MLG_OP_MATMUL, name, x, y, NULL);
    ml__op_save(o, x);
    ml__op_save(o, wc);
    ml__op_param(o, ml__kit_param(g, "weight", in, MLG_D));
    if (bias)
        ml__op_param(o, ml__kit_param(g, "bias", MLG_D, -1));
    ml__op_free(o, wc);
    return o;
}

/* LlavaMultiModalProjector (linear_1, GELU, linear_2; GELU keeps its
 * input, each linear its own), then the image features cast to the
 * embeddings' dtype and masked_scatter into the token embeddings (a side
 * tensor) where the image tokens are: it keeps the mask, a view of
 * (input_ids == image_token_id), B*T bools (derivatives.yaml:
 * masked_scatter). HF's check inputs_embeds[special_image_mask].numel()
 * makes the selected rows and, under grad, their int64 indices (B*n x 3):
 * transients. No node list: the block rule, as the builders had it. */
void ml__kit_llava_projector(ml_graph *g, const mlg_llava_projector *P)
{
    ml__graph_init(g);
    const uint8_t dv = ml__graph_lit(g, P->width), n = ml__graph_lit(g, P->images);
    /* the two linears' products as the builders summed them: one product
     * over Dv + D, counted on linear_2, so that large sizes round alike */
    const uint8_t sum = ml__graph_lit(g, P->summed);
    uint16_t x = projector_input(g, P, n, dv);
    uint16_t w1 = MLG_NONE, w2 = MLG_NONE;
    if (P->autocast) {
        w1 = ml__graph_tensor(g, "weight cast copy (autocast)", MLG_HALF, MLG_ACT, 2, dv, MLG_D);
        w2 = ml__graph_tensor(g, "weight cast copy (autocast)", MLG_HALF, MLG_ACT, 2, MLG_D,
                              MLG_D);
        g->t[w1].flags |= MLG_T_WCAST;
        g->t[w2].flags |= MLG_T_WCAST;
        ml__graph_step(g, MLG_OP_COPY, "to (autocast, linear_1 weight)", MLG_NONE, w1, NULL);
        ml__graph_step(g, MLG_OP_COPY, "to (autocast, linear_2 weight)", MLG_NONE, w2, NULL);
    }
    uint16_t h = ml__graph_tensor(g, "linear_1 output (gelu input)", MLG_COMPUTE, MLG_ACT, 3,
                                  MLG_B, n, MLG_D);
    uint16_t a = ml__graph_tensor(g, "gelu output (linear_2 input)", MLG_COMPUTE, MLG_ACT, 3,
                                  MLG_B, n, MLG_D);
    uint16_t o2 = ml__graph_tensor(g, "linear_2 output", MLG_COMPUTE, MLG_ACT, 3, MLG_B, n, MLG_D);
    uint16_t cast = P->cast ? ml__graph_tensor(g, "image features (to inputs_embeds.dtype)",
                                               MLG_STREAM, MLG_ACT, 3, MLG_B, n, MLG_D)
                            : o2;
    uint16_t sel = ml__graph_tensor(g, "inputs_embeds[special_image_mask]", MLG_STREAM, MLG_ACT,
                                    3, MLG_B, n, MLG_D);
    uint16_t idx = ml__graph_tensor(g, "its indices (nonzero)", MLG_INT64, MLG_ACT, 3, MLG_B, n,
                                    MLG_D);
    g->t[idx].factor = 3;
    uint16_t mask = ml__graph_tensor(g, "image token mask (bool)", MLG_BOOL, MLG_ACT, 2, MLG_B,
                                     MLG_T);
    uint16_t emb = ml__graph_tensor(g, "token embeddings (inputs_embeds)", MLG_STREAM, MLG_INPUT,
                                    3, MLG_B, MLG_T, MLG_D);
    g->t[emb].flags |= MLG_T_SIDE;
    uint16_t y = ml__graph_tensor(g, "inputs_embeds (image features merged)", MLG_STREAM, MLG_ACT,
                                  3, MLG_B, MLG_T, MLG_D);
    g->t[o2].flags |= MLG_T_TMP;
    g->t[cast].flags |= MLG_T_TMP;
    g->t[sel].flags |= MLG_T_TMP;
    g->t[idx].flags |= MLG_T_TMP;
    projector_linear(g, "addmm (linear_1)", x, h, dv, w1, P->bias);
    mlg_op *o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "gelu", h, a, NULL);
    ml__op_save(o, h);
    o = projector_linear(g, "addmm (linear_2)", a, o2, MLG_D, w2, P->bias);
    ml__op_flops(o, 2.0, 4, MLG_B, n, MLG_D, sum);
    if (P->cast)
        ml__op_free(ml__graph_step(g, MLG_OP_COPY, "to (inputs_embeds.dtype)", o2, cast, NULL), o2);
    ml__graph_step(g, MLG_OP_ELEMENTWISE, "eq (image_token_id)", MLG_NONE, mask, NULL);
    o = ml__graph_step(g, MLG_OP_COPY, "index (inputs_embeds[mask])", emb, sel, NULL);
    ml__op_out(o, idx);
    ml__op_free(o, sel);
    ml__op_free(o, idx);
    o = ml__graph_step(g, MLG_OP_COPY, "masked_scatter", emb, y, NULL);
    ml__op_in(o, mask);
    ml__op_in(o, cast);
    ml__op_save(o, mask);
    ml__op_free(o, cast);
}
