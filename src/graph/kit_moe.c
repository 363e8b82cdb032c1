/* DeepSeek's mixture-of-experts MLPs (kit.h): DeepseekV3MoE and
 * DeepseekV2MoE in transformers 4.5x's modeling_deepseek_v3.py and
 * modeling_deepseek_v2.py, with what PyTorch's eager autograd keeps for
 * each of their ops (tools/autograd/derivatives.yaml; docs/inventory.md,
 * "DeepSeek-V3 block" and "DeepSeek-V2"), with a backward at block level
 * (latent attention's layers record no node): the saved tensors, the
 * parameters, the transients and the FLOPs.
 *
 * The planner's routing model: the N = k*B*T (token, expert) pairs are
 * counted whole (their rows summed over the experts are N whatever the
 * routing); the busiest expert's rows (training.expert_imbalance, at most
 * B*T: MLG_ROWS) size its intermediates, a transient. The inventory lists
 * the tensors in the order they are declared here, the builders' order. */
#include <stddef.h>

#include "graph/kit_mixtral.h" /* the dispatch */

/* The routing scores' dtype: F.linear in fp32, autocast's bf16. */
static uint8_t scores(const mlg_layer *L)
{
    return L->autocast ? MLG_HALF : MLG_FP32;
}

static uint16_t act(ml_graph *g, const char *name, uint8_t dtype, uint8_t w)
{
    return ml__graph_tensor(g, name, dtype, MLG_ACT, 3, MLG_B, MLG_T, w);
}

/* A (k, B, T, w) tensor: one row per (token, expert) pair. */
static uint16_t pairs(ml_graph *g, const char *name, uint8_t dtype, uint8_t w)
{
    return ml__graph_tensor(g, name, dtype, MLG_ACT, 4, MLG_K, MLG_B, MLG_T, w);
}

static void flag(ml_graph *g, uint16_t t, uint8_t f)
{
    if (t != MLG_NONE)
        g->t[t].flags |= f;
}

/* The routers' `F.linear(x.type(float32), weight.type(float32))` on the
 * norm's output h: x itself in fp32, fp32 copies of x and of the weight
 * when the stream is not (pure bf16), autocast's bf16 casts of both (x is
 * fp32 there). Returns the logits, in the scores' dtype (a transient). */
static uint16_t router_linear(ml_graph *g, const mlg_layer *L, uint16_t h)
{
    const mlg_moe *e = &L->moe;
    uint16_t x = h, w = MLG_NONE;
    if (L->autocast)
        x = act(g, "router input (cast copy)", MLG_HALF, MLG_D);
    else if (!e->h32)
        x = act(g, "router input (fp32 copy)", MLG_FP32, MLG_D);
    if (L->autocast) {
        w = ml__kit_weight_copy(g, L, MLG_E, MLG_D);
    } else if (!e->h32) {
        w = ml__graph_tensor(g, "router weight (fp32 copy)", MLG_FP32, MLG_ACT, 2, MLG_E, MLG_D);
    }
    uint16_t logits = act(g, "router logits", scores(L), MLG_E);
    flag(g, logits, MLG_T_TMP);
    const uint8_t grp = g->group;
    g->group = ml__kit_group(L, MLG_GROUP_MLP2);
    uint16_t W = ml__kit_param(g, "gate.weight", MLG_E, MLG_D);
    g->group = grp;
    if (x != h)
        ml__graph_step(g, MLG_OP_COPY, "type(float32) / to (router input)", h, x, NULL);
    if (w != MLG_NONE)
        ml__graph_step(g, MLG_OP_COPY, "type(float32) / to (router weight)", W, w, NULL);
    mlg_op *o = ml__graph_step(g, MLG_OP_MATMUL, "linear (router)", x, logits, NULL);
    ml__op_save(o, x);
    ml__op_save(o, w);
    ml__op_param(o, W);
    ml__op_flops(o, 2.0, 4, MLG_B, MLG_T, MLG_D, MLG_E);
    if (x != h)
        ml__op_free(o, x);
    ml__op_free(o, w);
    return logits;
}

/* DeepseekV3TopkRouter after its linear: sigmoid (keeps its result, the
 * scores), the top-k under no_grad, gather (keeps the scores, the same
 * storage, and its int64 index), the in-place renormalisation by sum +
 * 1e-20 (keeps the denominator, fp32: CUDA autocast's sum, and a copy of
 * what it overwrites), the scale by routed_scaling_factor (a Python float:
 * nothing). moe()'s one_hot mask is a transient. Returns the weights. */
static uint16_t router_v3(ml_graph *g, const mlg_layer *L, uint16_t logits)
{
    const uint8_t sdt = scores(L);
    uint16_t S = act(g, "router sigmoid scores", sdt, MLG_E);
    /* (moe()'s: not under Megatron's dispatch) */
    uint16_t hot = L->moe.ep ? MLG_NONE
                             : ml__graph_tensor(g, "one_hot expert mask", MLG_INT64, MLG_ACT, 4,
                                                MLG_B, MLG_T, MLG_K, MLG_E);
    flag(g, hot, MLG_T_TMP);
    uint16_t idx = act(g, "top-k indices (gather's index, int64)", MLG_INT64, MLG_K);
    uint16_t wk = act(g, "top-k weights", sdt, MLG_K);
    mlg_op *o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "sigmoid (router scores)", logits, S, NULL);
    ml__op_save(o, S);
    ml__op_free(o, logits);
    ml__graph_step(g, MLG_OP_ELEMENTWISE, "topk (no_grad)", S, idx, NULL);
    o = ml__graph_step(g, MLG_OP_COPY, "gather (top-k weights)", S, wk, NULL);
    ml__op_in(o, idx);
    ml__op_save(o, S);
    ml__op_save(o, idx);
    if (L->moe.renorm) {
        uint16_t sum = ml__graph_tensor(g, "top-k weight sum + 1e-20", MLG_FP32, MLG_ACT, 2,
                                        MLG_B, MLG_T);
        uint16_t old = act(g, "top-k weights before the in-place divide", sdt, MLG_K);
        ml__graph_step(g, MLG_OP_ELEMENTWISE, "sum + 1e-20", wk, sum, NULL);
        o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "div_ (in place: a copy of the weights)", wk,
                           old, NULL);
        ml__op_in(o, sum);
        ml__op_save(o, sum);
        ml__op_save(o, old);
    }
    if (hot != MLG_NONE)
        ml__graph_step(g, MLG_OP_VIEW, "one_hot (moe)", idx, hot, NULL);
    return wk;
}

/* DeepseekV2MoEGate after its linear: softmax in fp32 (keeps its result),
 * group_limited_greedy's masked_fill (keeps its (B*T, E) bool mask), topk
 * (keeps its int64 indices); moe()'s cnts, an int64 (B*T, E) transient;
 * the scale by routed_scaling_factor (a new tensor). Returns the indices;
 * *wk the scaled weights, declared by the caller's order. */
static uint16_t router_v2(ml_graph *g, const mlg_layer *L, uint16_t logits)
{
    uint16_t S = act(g, "router softmax scores (fp32)", MLG_FP32, MLG_E);
    uint16_t mask = L->moe.grouped ? act(g, "group mask (masked_fill, bool)", MLG_BOOL, MLG_E)
                                   : MLG_NONE;
    uint16_t idx = act(g, "top-k indices (int64)", MLG_INT64, MLG_K);
    /* moe()'s (not under Megatron's dispatch) */
    uint16_t cnts = L->moe.ep ? MLG_NONE : act(g, "cnts (expert counts)", MLG_INT64, MLG_E);
    flag(g, cnts, MLG_T_TMP);
    mlg_op *o = ml__graph_step(g, MLG_OP_SOFTMAX, "softmax (fp32)", logits, S, NULL);
    ml__op_save(o, S);
    ml__op_free(o, logits);
    if (mask != MLG_NONE) {
        o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "masked_fill (group_limited_greedy)", S, mask,
                           NULL);
        ml__op_save(o, mask);
    }
    o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "topk", S, idx, NULL);
    ml__op_save(o, idx);
    if (cnts != MLG_NONE)
        ml__graph_step(g, MLG_OP_ELEMENTWISE, "scatter_ (cnts)", idx, cnts, NULL);
    return idx;
}

/* Under Megatron's dispatch, V2's weights: topk's values (the scores at the
 * indices: topk's second output) scaled by routed_scaling_factor (a new
 * tensor), fp32; topk's values go once scaled. Returns the scaled ones. */
static uint16_t weights_v2(ml_graph *g, uint16_t idx)
{
    uint16_t v = act(g, "top-k weights (fp32)", MLG_FP32, MLG_K);
    uint16_t sw = act(g, "scaled top-k weights (fp32)", MLG_FP32, MLG_K);
    flag(g, v, MLG_T_TMP);
    ml__graph_step(g, MLG_OP_ELEMENTWISE, "topk (values)", idx, v, NULL);
    ml__op_free(ml__graph_step(g, MLG_OP_ELEMENTWISE, "mul (routed_scaling_factor)", v, sw, NULL),
                v);
    return sw;
}

/* The rows x (pairs: the experts' gathered rows; else every token, the
 * shared experts') SwiGLU, its saved tensors declared in the builders'
 * order: gate_proj and up_proj keep x (autocast: a cast each), silu gate's output, the mul silu's and
 * up's outputs, down_proj the product; then autocast's weight copies. The
 * parameters (gate, up, down) join group grp, each once per expert when
 * experts; fl: the FLOP factor of the three matmuls, one term. Returns the
 * down projection's output. */
typedef struct {
    bool pairs, experts;
    uint8_t width; /* mlg_dim: the expert's or the shared experts' */
    const char *x_name;
    uint8_t grp;
} swiglu_at;

static uint16_t rows(ml_graph *g, const swiglu_at *s, const char *name, uint8_t dtype, uint8_t w)
{
    return s->pairs ? pairs(g, name, dtype, w) : act(g, name, dtype, w);
}

static uint16_t weight_copy(ml_graph *g, const mlg_layer *L, const swiglu_at *s, uint8_t in,
                            uint8_t out)
{
    if (!s->experts)
        return ml__kit_weight_copy(g, L, in, out);
    if (!L->autocast)
        return MLG_NONE;
    uint16_t w = ml__graph_tensor(g, "experts' weights (autocast copy)", MLG_HALF, MLG_ACT, 3,
                                  MLG_E, in, out);
    flag(g, w, MLG_T_WCAST);
    return w;
}

static uint16_t swiglu(ml_graph *g, const mlg_layer *L, const swiglu_at *s, uint16_t x)
{
    const uint8_t F = s->width;
    uint16_t c1 = MLG_NONE, c2 = MLG_NONE;
    if (L->autocast) {
        c1 = rows(g, s, s->x_name, MLG_HALF, MLG_D);
        c2 = rows(g, s, s->x_name, MLG_HALF, MLG_D);
    }
    uint16_t G1 = rows(g, s, "gate_proj output (silu input)", MLG_COMPUTE, F);
    uint16_t A1 = rows(g, s, "silu output", MLG_COMPUTE, F);
    uint16_t U = rows(g, s, "up_proj output", MLG_COMPUTE, F);
    uint16_t P = rows(g, s, "gated product (down_proj input)", MLG_COMPUTE, F);
    uint16_t wg = weight_copy(g, L, s, MLG_D, F), wu = weight_copy(g, L, s, MLG_D, F);
    uint16_t wd = weight_copy(g, L, s, F, MLG_D);
    uint16_t Y = rows(g, s, s->pairs ? "expert output (down_proj)" : "shared experts output",
                      MLG_COMPUTE, MLG_D);
    const uint8_t grp = g->group;
    g->group = s->grp;
    uint16_t Wg = ml__kit_param(g, "gate_proj", MLG_D, F);
    uint16_t Wu = ml__kit_param(g, "up_proj", MLG_D, F);
    uint16_t Wd = ml__kit_param(g, "down_proj", F, MLG_D);
    g->group = grp;
    if (s->experts) {
        flag(g, Wg, MLG_T_EXPERT);
        flag(g, Wu, MLG_T_EXPERT);
        flag(g, Wd, MLG_T_EXPERT);
    }
    ml__kit_cast_ops(g, x, c1, wg, Wg);
    mlg_op *o = ml__graph_step(g, MLG_OP_MATMUL, "mm (gate_proj)", c1 != MLG_NONE ? c1 : x, G1,
                               NULL);
    ml__op_save(o, c1 != MLG_NONE ? c1 : x);
    ml__op_save(o, wg);
    ml__op_param(o, Wg);
    /* the three matmuls' FLOPs, one term as the builders add them */
    if (s->pairs)
        ml__op_flops(o, 6.0, 5, MLG_K, MLG_B, MLG_T, MLG_D, F);
    else
        ml__op_flops(o, 6.0, 4, MLG_B, MLG_T, MLG_D, F);
    o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "silu", G1, A1, NULL);
    ml__op_save(o, G1);
    ml__kit_cast_ops(g, x, c2, wu, Wu);
    o = ml__graph_step(g, MLG_OP_MATMUL, "mm (up_proj)", c2 != MLG_NONE ? c2 : x, U, NULL);
    ml__op_save(o, c2);
    ml__op_save(o, wu);
    ml__op_param(o, Wu);
    o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "mul (silu * up)", A1, P, NULL);
    ml__op_in(o, U);
    ml__op_save(o, A1);
    ml__op_save(o, U);
    ml__kit_cast_ops(g, P, MLG_NONE, wd, Wd);
    o = ml__graph_step(g, MLG_OP_MATMUL, "mm (down_proj)", P, Y, NULL);
    ml__op_save(o, P);
    ml__op_save(o, wd);
    ml__op_param(o, Wd);
    return Y;
}

/* The busiest expert's intermediates (its rows x the expert's width, the
 * rows the routing model gives it) and the (B*T, D) fp32 sum the
 * combine builds: transients. */
static void busiest(ml_graph *g)
{
    uint16_t t = ml__graph_tensor(g, "the busiest expert's intermediate", MLG_COMPUTE, MLG_ACT, 2,
                                  MLG_ROWS, MLG_FE);
    flag(g, t, MLG_T_TMP);
    flag(g, act(g, "routed experts' sum", MLG_FP32, MLG_D), MLG_T_TMP);
}

/* The DeepSeek shared experts: one SwiGLU of moe_intermediate_size *
 * n_shared_experts on the norm's output h, added without a gate. gate_proj
 * and up_proj keep h: in fp32 the router saved it already; in pure bf16
 * the inventory lists it here (h's entry is this one), as the builders
 * do. */
static uint16_t shared(ml_graph *g, const mlg_layer *L, uint16_t h)
{
    if (!L->moe.h32 && !L->autocast && g->t[h].role == MLG_ACT && g->t[h].base == MLG_NONE)
        g->t[h].base = act(g, "shared experts input", g->t[h].dtype, MLG_D);
    const swiglu_at s = {false, false, MLG_FS, "shared experts input (cast copy)",
                         ml__kit_group(L, MLG_GROUP_MLP3)};
    uint16_t Y = swiglu(g, L, &s, h);
    uint16_t t = act(g, "shared experts' intermediate", MLG_COMPUTE, MLG_FS);
    flag(g, t, MLG_T_TMP);
    return Y;
}

/* The routed experts on the pairs' rows (gathered from h, w bytes each):
 * their SwiGLUs, then what the combine keeps (V3: the output, the
 * gathered weights, the weighted product index_add_ keeps; V2: index_put_
 * back into pair order, keeping only sizes, the fp32 copy the in-place mul
 * keeps, the weights). */
static uint16_t experts(ml_graph *g, const mlg_layer *L, uint16_t h, uint16_t wk)
{
    const bool v3 = L->moe.kind == MLG_MOE_DEEPSEEK_V3;
    const uint8_t sdt = scores(L);
    const swiglu_at s = {true, true, MLG_FE,
                         v3 ? "expert input (gathered rows)" : "rows sorted by expert",
                         ml__kit_group(L, MLG_GROUP_MLP)};
    /* hidden_states[token_indices]: a copy of the rows (autocast: each
     * projection saves its own cast instead) */
    uint16_t x = pairs(g, s.x_name, g->t[h].dtype, MLG_D);
    ml__graph_step(g, MLG_OP_COPY, "index (the experts' rows)", h, x, NULL);
    uint16_t Y = swiglu(g, L, &s, x);
    uint16_t out;
    if (v3) {
        uint16_t wg = ml__graph_tensor(g, "gathered top-k weights", sdt, MLG_ACT, 3, MLG_K, MLG_B,
                                       MLG_T);
        out = pairs(g, "weighted expert output (index_add_ source)", sdt, MLG_D);
        ml__graph_step(g, MLG_OP_COPY, "index (top-k weights)", wk, wg, NULL);
        mlg_op *o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "mul (expert output * weights)", Y, out,
                                   NULL);
        ml__op_in(o, wg);
        ml__op_save(o, Y);
        ml__op_save(o, wg);
        o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "index_add_", out, MLG_NONE, NULL);
        ml__op_save(o, out);
    } else {
        uint16_t t1 = pairs(g, "outputs in pair order (index_put_)", MLG_COMPUTE, MLG_D);
        uint16_t t2 = pairs(g, "outputs in pair order (fp32)", MLG_FP32, MLG_D);
        flag(g, t1, MLG_T_TMP);
        flag(g, t2, MLG_T_TMP);
        uint16_t old = pairs(g, "outputs in pair order before the in-place mul (fp32 copy)",
                             MLG_FP32, MLG_D);
        ml__graph_step(g, MLG_OP_COPY, "index_put_ (pair order)", Y, t1, NULL);
        ml__graph_step(g, MLG_OP_COPY, "to (fp32)", t1, t2, NULL);
        /* the scale by routed_scaling_factor: a new tensor, which the
         * in-place mul keeps */
        uint16_t sw = act(g, "scaled top-k weights (fp32)", MLG_FP32, MLG_K);
        ml__graph_step(g, MLG_OP_ELEMENTWISE, "mul (routed_scaling_factor)", wk, sw, NULL);
        mlg_op *o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "mul_ (in place, the weights)", t2, old,
                                   NULL);
        ml__op_in(o, sw);
        ml__op_save(o, old);
        ml__op_save(o, sw);
        out = t2;
    }
    busiest(g);
    return out;
}

uint16_t ml__kit_moe(ml_graph *g, const mlg_layer *L, uint16_t h)
{
    const bool v3 = L->moe.kind == MLG_MOE_DEEPSEEK_V3;
    uint16_t logits = router_linear(g, L, h);
    uint16_t wk = MLG_NONE;
    if (L->moe.ep) { /* Megatron's dispatch of the routed experts */
        const uint16_t w = v3 ? router_v3(g, L, logits) : weights_v2(g, router_v2(g, L, logits));
        uint16_t y = ml__kit_mixtral_experts_ep(g, L, h, w);
        if (L->moe.shared)
            shared(g, L, h);
        return y;
    }
    if (v3) {
        wk = router_v3(g, L, logits);
    } else {
        uint16_t idx = wk = router_v2(g, L, logits);
        /* moe(): argsort of the pairs (int64, kept by index_put_), their
         * rows `argsort // k` (int64, kept by the indexing) */
        uint16_t order = ml__graph_tensor(g, "pair order (argsort, int64)", MLG_INT64, MLG_ACT, 3,
                                          MLG_K, MLG_B, MLG_T);
        uint16_t prow = ml__graph_tensor(g, "pair rows (argsort // k, int64)", MLG_INT64,
                                         MLG_ACT, 3, MLG_K, MLG_B, MLG_T);
        mlg_op *o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "argsort", idx, order, NULL);
        ml__op_save(o, order);
        o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "floor_divide (k)", order, prow, NULL);
        ml__op_save(o, prow);
    }
    if (v3) {
        /* moe(): torch.where's (n_e, 2) int64 storage per expert */
        uint16_t w = ml__graph_tensor(g, "expert token indices (torch.where, int64)", MLG_INT64,
                                      MLG_ACT, 3, MLG_K, MLG_B, MLG_T);
        if (w != MLG_NONE)
            g->t[w].factor = 2;
        mlg_op *o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "where (expert rows)", wk, w, NULL);
        ml__op_save(o, w);
    }
    uint16_t y = experts(g, L, h, wk);
    if (L->moe.shared)
        shared(g, L, h);
    return y;
}
