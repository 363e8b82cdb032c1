/* The layers and heads as compositions of the kit's components (kit.h):
 * a pre-norm layer (GPT-2's, Llama's, Gemma's and Gemma 2's post norms,
 * Phi-3's, OLMo's, ViT's, DeepSeek's with latent attention), GPT-NeoX's
 * and Falcon's parallel ones, BERT's post-norm one, a decoder's LM head.
 * Each reads as the reference implementation's forward reads;
 * docs/graph.md. */
#include <stddef.h>

#include "graph/kit.h"

/* The group of a layer's component: its rank in the order the layer's
 * modules register their parameters. */
uint8_t ml__kit_group(const mlg_layer *L, unsigned component)
{
    /* nanoGPT's Block: ln_1, attn, ln_2, mlp; HF's decoder layers:
     * self_attn (Phi-3: o_proj first), mlp, input_layernorm,
     * post_attention_layernorm (Gemma 2: the attention's post norm), then
     * Gemma 2's pre_feedforward_layernorm and post_feedforward_layernorm;
     * a mixture of experts' modules in three groups (kit_moe.c; HF's
     * layers only: the nanoGPT order would put them after POST_MLP) */
    static const uint8_t hf[MLG_GROUPS] = {
        [MLG_GROUP_ATTN_O] = 0, [MLG_GROUP_ATTN] = 1,      [MLG_GROUP_MLP] = 2,
        [MLG_GROUP_MLP2] = 3,   [MLG_GROUP_MLP3] = 4,      [MLG_GROUP_NORM1] = 5,
        [MLG_GROUP_POST_ATTN] = 6, [MLG_GROUP_NORM2] = 7, [MLG_GROUP_POST_MLP] = 8};
    return L->hf_order ? hf[component] : (uint8_t)component;
}

/* The layer returns: its first sum (or the MLP's output), the attention
 * weights HF's layer kept (`hidden_states, _ = self.self_attn(...)`) and
 * what the KV cache took over (the replay counts the cache) go. */
static void layer_returns(ml_graph *g, uint16_t sum, uint16_t held, uint16_t ck, uint16_t cv)
{
    mlg_op *o = ml__graph_release(g, "layer returns");
    ml__op_free(o, sum);
    ml__op_free(o, held);
    /* k and v may be views of one storage (Falcon's query_key_value
     * output without multi_query or a rotary): freed once */
    const uint16_t kv[2] = {ck, cv};
    ml__kit_free_storages(g, o, kv, 2);
}

/* Gemma 2's norm of a branch's output y (before its residual add); y goes
 * unless the norm saved it. */
static uint16_t post_norm(ml_graph *g, const mlg_layer *L, uint16_t y, unsigned component)
{
    if (!L->post_norms)
        return y;
    g->group = ml__kit_group(L, component);
    uint16_t z = ml__kit_norm(g, &L->post, y, false);
    ml__op_free(ml__graph_release(g, "branch output rebound"), y);
    return z;
}

/* GPT-NeoX's layer (GPTNeoXLayer with use_parallel_residual): both norms
 * read the input, whose gradient buffer the skip holds; the attention's
 * and the MLP's outputs are added to it. Falcon's (FalconDecoderLayer,
 * parallel_attn, the old decoder architecture: shared_norm): one
 * input_layernorm feeds both branches, its output bound until the layer
 * returns; the MLP's input gradient arrives first and is the output's
 * buffer (the attention's projection adds into it); mlp_output +=
 * attention_output in place, then dropout_add (p 0: the identity) adds
 * the residual. */
static void parallel_layer(ml_graph *g, const mlg_layer *L, uint16_t x)
{
    uint16_t held = MLG_NONE, ck = MLG_NONE, cv = MLG_NONE, lists[2] = {MLG_NONE, MLG_NONE};
    g->group = ml__kit_group(L, MLG_GROUP_NORM1);
    uint16_t h;
    if (L->attn.split_heads) {
        /* the inventory lists the norm's statistics, Falcon's index lists,
         * then the norm's output (the order the allocator simulation
         * allocates them in, as the chain builders list them) */
        const uint16_t st = ml__kit_layernorm_stats(g);
        ml__kit_falcon_lists(g, &L->attn, lists);
        h = ml__kit_layernorm(g, &L->norm, x, true, st);
    } else {
        h = ml__kit_norm(g, &L->norm, x, true);
    }
    g->group = ml__kit_group(L, MLG_GROUP_ATTN);
    uint16_t a = L->attn.split_heads ? ml__kit_falcon_attention(g, L, h, lists, &held, &ck, &cv)
                                     : ml__kit_hf_attention(g, L, h, &held, &ck, &cv);
    if (!L->shared_norm) {
        ml__op_free(ml__graph_release(g, "norm output (an argument) goes"), h);
        g->group = ml__kit_group(L, MLG_GROUP_NORM2);
        h = ml__kit_norm(g, &L->norm, x, true);
    }
    g->group = ml__kit_group(L, MLG_GROUP_MLP);
    uint16_t m = ml__kit_mlp(g, L, h, NULL);
    ml__op_free(ml__graph_release(g, "norm output (an argument) goes"), h);
    if (L->shared_norm) {
        /* mlp_output += attention_output: AddBackward0 hands the one
         * gradient to both, no node of its own */
        mlg_op *o = ml__graph_op(g, MLG_OP_ELEMENTWISE, "add_ (mlp_output += attention_output)");
        ml__op_in(o, m);
        ml__op_in(o, a);
        uint16_t out = ml__kit_add(g, x, m); /* residual + mlp_output */
        (void)out;
        ml__op_free(ml__graph_release(g, "attention output goes"), a);
    } else {
        /* mlp_output + attn_output + hidden_states: the first sum a
         * temporary of the expression, attn_output and mlp_output bound
         * to the layer's return (GPTNeoXLayer.forward's locals) */
        uint16_t t = ml__kit_add(g, m, a);
        uint16_t out = ml__kit_residual(g, x, t);
        (void)out;
        ml__op_free(ml__graph_release(g, "attention output goes"), a);
    }
    layer_returns(g, m, held, ck, cv);
}

/* HF BertLayer: BertAttention (BertSelfAttention, then BertSelfOutput:
 * dense, dropout, LayerNorm(h + input)), then feed_forward_chunk:
 * BertIntermediate (dense, act), whose output it holds through BertOutput
 * (dense, dropout, LayerNorm(h + attention output)). Each sum's addends
 * stay bound through its LayerNorm; the parameters as BertLayer registers
 * them: the attention's, its LayerNorm, the MLP's, the last LayerNorm. */
static void postnorm_layer(ml_graph *g, const mlg_layer *L, uint16_t x)
{
    uint16_t ctx = MLG_NONE, ck, cv, kept = MLG_NONE;
    g->group = ml__kit_group(L, MLG_GROUP_ATTN);
    uint16_t a = ml__kit_hf_attention(g, L, x, &ctx, &ck, &cv);
    uint16_t r = ml__kit_add(g, x, a); /* the stream's dtype (autocast promotes) */
    g->group = ml__kit_group(L, MLG_GROUP_POST_ATTN);
    uint16_t h = ml__kit_norm(g, &L->norm, r, false);
    const uint16_t after_attn[3] = {r, a, ctx};
    ml__kit_free_storages(g, ml__graph_release(g, "BertAttention returns"), after_attn, 3);
    g->group = ml__kit_group(L, MLG_GROUP_MLP);
    uint16_t m = ml__kit_mlp(g, L, h, &kept);
    uint16_t r2 = ml__kit_add(g, h, m);
    g->group = ml__kit_group(L, MLG_GROUP_POST_MLP);
    uint16_t out = ml__kit_norm(g, &L->norm, r2, false);
    (void)out;
    const uint16_t at_return[4] = {r2, m, kept, h};
    ml__kit_free_storages(g, ml__graph_release(g, "layer returns"), at_return, 4);
}

uint16_t ml__kit_prenorm_layer(ml_graph *g, const mlg_layer *L)
{
    uint16_t x = ml__graph_tensor(g, "layer input", MLG_STREAM, MLG_INPUT, 3, MLG_B, MLG_T, MLG_D);
    if (L->parallel) {
        parallel_layer(g, L, x);
        return MLG_NONE;
    }
    if (L->postnorm) {
        postnorm_layer(g, L, x);
        return MLG_NONE;
    }
    uint16_t held = MLG_NONE, ck = MLG_NONE, cv = MLG_NONE;
    g->group = ml__kit_group(L, MLG_GROUP_NORM1);
    uint16_t h = ml__kit_norm(g, &L->norm, x, true);
    g->group = ml__kit_group(L, MLG_GROUP_ATTN);
    uint16_t a = L->attn.latent ? ml__kit_mla_attention(g, L, h)
                 : L->attn.hf   ? ml__kit_hf_attention(g, L, h, &held, &ck, &cv)
                                : ml__kit_attention(g, L, h);
    mlg_op *o = ml__graph_release(g, "norm output rebound");
    if (L->attn.self_out) {
        /* ViTAttention returns: the context goes with its argument */
        ml__op_free(o, held);
        held = MLG_NONE;
    }
    ml__op_free(o, h);
    a = post_norm(g, L, a, MLG_GROUP_POST_ATTN);
    /* ViT's attention_output is a local of the layer's forward: the sum
     * takes the stream, the branch's output goes when the layer returns */
    uint16_t r = ml__kit_layer_residual(g, L, x, a, L->hold_attn);
    g->group = ml__kit_group(L, MLG_GROUP_NORM2);
    h = ml__kit_norm(g, &L->norm, r, true);
    g->group = ml__kit_group(L, MLG_GROUP_MLP);
    uint16_t act = MLG_NONE;
    uint16_t m = L->moe.kind == MLG_MOE_MIXTRAL ? ml__kit_mixtral_moe(g, L, h)
                 : L->moe.kind                 ? ml__kit_moe(g, L, h)
                                               : ml__kit_mlp(g, L, h, &act);
    if (!L->mlp.in_gone || L->moe.kind) /* (the dense MLP alone frees it early) */
        ml__op_free(ml__graph_release(g, "norm output rebound"), h);
    m = post_norm(g, L, m, MLG_GROUP_POST_MLP);
    uint16_t out = ml__kit_layer_residual(g, L, r, m, false);
    /* ViTOutput returns: its argument, the activation's output, rebound */
    if (act != MLG_NONE)
        ml__op_free(ml__graph_release(g, "the MLP's activation rebound"), act);
    layer_returns(g, r, held, ck, cv);
    if (L->hold_attn)
        ml__op_free(ml__graph_release(g, "attention_output goes"), a);
    return out;
}

void ml__kit_lm_head(ml_graph *g, const mlg_layer *L, bool tied, bool fused, bool softcap)
{
    uint16_t x = ml__graph_tensor(g, "head input", MLG_STREAM, MLG_INPUT, 3, MLG_B, MLG_T, MLG_D);
    uint16_t h = ml__kit_norm(g, &L->norm, x, false);
    if (fused)
        return;
    uint16_t c = ml__kit_cast_copy(g, L, h), w = ml__kit_weight_copy(g, L, MLG_V, MLG_D);
    uint16_t logits = ml__graph_tensor(g, "logits", MLG_COMPUTE, MLG_ACT, 3, MLG_B, MLG_T, MLG_V);
    /* the (V, D) weight: its own, or the embeddings' (tied: its gradient is
     * first created here, counted by this block's node) */
    uint16_t W = ml__kit_param(g, "lm_head weight", MLG_V, MLG_D);
    if (tied && W != MLG_NONE)
        g->t[W].flags |= MLG_T_SHARED;
    /* the logits: h (or its autocast copy) times the (V, D) weight */
    ml__kit_cast_ops(g, h, c, w, W);
    const uint16_t hs = c != MLG_NONE ? c : h;
    mlg_op *o = ml__graph_step(g, MLG_OP_MATMUL, "mm (LM head)", hs, logits, NULL);
    ml__op_save(o, hs);
    ml__op_save(o, w);
    ml__op_param(o, W);
    ml__op_flops(o, 2.0, 4, MLG_B, MLG_T, MLG_D, MLG_V);
    ml__op_free(o, c);
    ml__op_free(o, w);
    ml__op_node(o, "MmBackward0 (LM head)");
    ml__op_gin(o, h);
    ml__op_gout(o, logits);
    /* the model returns the logits; the norm's output goes */
    ml__op_free(ml__graph_release(g, "head returns"), h);
    if (softcap)
        ml__kit_softcap(g, logits, false);
}
