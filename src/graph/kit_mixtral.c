/* Mixtral's and Qwen2-MoE's mixture-of-experts MLPs (kit.h): HF
 * MixtralSparseMoeBlock.forward (modeling_mixtral.py) and
 * Qwen2MoeSparseMoeBlock (modeling_qwen2_moe.py: the top-k weights
 * renormalised only with norm_topk_prob, a shared expert on every token
 * gated by a sigmoid), with what PyTorch's eager autograd keeps for each of
 * their ops (docs/inventory.md, "Mixtral block").
 *
 * The experts run one at a time on the rows routed to them (torch.where
 * per expert): one expert is the graph's repeated group (graph.h,
 * mlg_repeat), expanded by the passes once per expert with rows, at the
 * rows the planner's routing model gives each (ml_graph_sizes.runs: the
 * busiest first with training.expert_imbalance, the others balanced). The
 * builders' simplifications, kept: the cast of the weights back to the
 * stream's dtype, the one_hot expert mask and the index ops' indices are
 * not counted; autocast's weight copies of the experts are three entries
 * of E experts each, after the experts' tensors. */
#include <stddef.h>

#include "graph/kit_mixtral.h"

static uint16_t act(ml_graph *g, const char *name, uint8_t dtype, uint8_t w)
{
    return ml__graph_tensor(g, name, dtype, MLG_ACT, 3, MLG_B, MLG_T, w);
}

/* One expert's rows: (MLG_NE, w). */
static uint16_t rows(ml_graph *g, const char *name, uint8_t dtype, uint8_t w)
{
    return ml__graph_tensor(g, name, dtype, MLG_ACT, 2, MLG_NE, w);
}

void ml__kit_flag(ml_graph *g, uint16_t t, uint8_t f)
{
    if (t != MLG_NONE)
        g->t[t].flags |= f;
}

/* An op's backward node: its name, the gradients it allocates (a, b) and
 * frees (y); MLG_NONE: none. */
static void node(mlg_op *o, const char *name, uint16_t a, uint16_t b, uint16_t y)
{
    ml__op_node(o, name);
    ml__op_gin(o, a);
    ml__op_gin(o, b);
    ml__op_gout(o, y);
}

/* The router's tensors in the inventory's order, then the op each makes. */
typedef struct {
    uint16_t c, w, logits, S, idx, wk, sum, old, W;
} router_t;

/* gate (D -> E) on the norm's output h (mm keeps h, or autocast's cast),
 * softmax in fp32 (keeps its result), topk (keeps its int64 indices;
 * zero-filled and scattered in backward), with renorm `routing_weights /=
 * sum` (keeps the fp32 sum and a copy of the values it overwrites; the
 * sum's gradient is an expanded view added in place). Returns the top-k
 * weights, fp32. */
static uint16_t router(ml_graph *g, const mlg_layer *L, uint16_t h)
{
    router_t r;
    r.c = L->autocast ? act(g, "router input (cast copy)", MLG_HALF, MLG_D) : MLG_NONE;
    r.w = ml__kit_weight_copy(g, L, MLG_D, MLG_E);
    r.logits = act(g, "router logits", MLG_COMPUTE, MLG_E);
    ml__kit_flag(g, r.logits, MLG_T_TMP);
    r.S = act(g, "router softmax output (fp32)", MLG_FP32, MLG_E);
    r.idx = act(g, "top-k indices (int64)", MLG_INT64, MLG_K);
    r.wk = act(g, "top-k weights (fp32)", MLG_FP32, MLG_K);
    r.sum = r.old = MLG_NONE;
    if (L->moe.renorm) {
        r.sum = ml__graph_tensor(g, "top-k weight sum (fp32)", MLG_FP32, MLG_ACT, 2, MLG_B, MLG_T);
        r.old = act(g, "top-k weights before the in-place divide (fp32)", MLG_FP32, MLG_K);
    }
    r.W = ml__kit_param(g, "gate.weight", MLG_D, MLG_E);
    const uint16_t x = r.c != MLG_NONE ? r.c : h;
    ml__kit_cast_ops(g, h, r.c, r.w, r.W);
    mlg_op *o = ml__graph_step(g, MLG_OP_MATMUL, "mm (router)", x, r.logits, NULL);
    ml__op_save(o, x);
    ml__op_save(o, r.w);
    ml__op_param(o, r.W);
    ml__op_flops(o, 2.0, 4, MLG_B, MLG_T, MLG_D, MLG_E);
    ml__op_free(o, r.c);
    ml__op_free(o, r.w);
    node(o, "MmBackward0 (router)", h, MLG_NONE, r.logits);
    o->accum = h;
    o = ml__graph_step(g, MLG_OP_SOFTMAX, "softmax (fp32)", r.logits, r.S,
                       "SoftmaxBackward0 (router)");
    ml__op_save(o, r.S);
    ml__op_free(o, r.logits);
    o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "topk", r.S, r.wk,
                       "TopkBackward0 (zero-filled, scattered)");
    ml__op_out(o, r.idx);
    ml__op_save(o, r.idx);
    if (L->moe.renorm) {
        o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "sum (top-k weights)", r.wk, r.sum, NULL);
        node(o, "SumBackward1 (an expanded view, added in place)", MLG_NONE, MLG_NONE, r.sum);
        o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "div_ (in place: a copy of the weights)", r.wk,
                           r.old, NULL);
        ml__op_in(o, r.sum);
        ml__op_save(o, r.sum);
        ml__op_save(o, r.old);
        node(o, "DivBackward0 (in place)", r.wk, r.sum, r.wk);
        /* other (the sum, broadcast) before self in the codegen's sorted
         * order: div_tensor_other_backward's -grad * ((self / other) /
         * other) makes three temporaries and its whole result, then
         * div_tensor_self_backward's grad / other is self's gradient, then
         * validate_outputs' sum_to reduces other's (FunctionsManual.cpp,
         * engine.cpp): four of the weights' size before the two, the
         * first three (self / other, its / other, -grad) freed at the
         * expression's end, before self's gradient */
        o->scratch_in = 4;
        o->scratch_first = true;
        o->scratch_early = 3;
    }
    return r.wk;
}

/* One expert's tensors (kit_mixtral.h): Hugging Face's loop gathers each
 * expert's rows and weights itself (torch.where's indices, the rows, the
 * weights). */
void ml__kit_expert_tensors(ml_graph *g, const mlg_layer *L, uint8_t hd, bool dispatched,
                            mlg_expert *e)
{
    e->where = e->x = e->rw = MLG_NONE;
    if (!dispatched) {
        e->where = ml__graph_tensor(g, "expert token indices (torch.where, int64)", MLG_INT64,
                                    MLG_ACT, 1, MLG_NE);
        if (e->where != MLG_NONE)
            g->t[e->where].factor = 2; /* idx and top_x */
    }
    e->c1 = e->c3 = MLG_NONE;
    if (L->autocast) {
        e->c1 = rows(g, "expert input cast for w1", MLG_HALF, MLG_D);
        e->c3 = rows(g, "expert input cast for w3", MLG_HALF, MLG_D);
    }
    if (!dispatched)
        e->x = rows(g, "expert input (gathered rows)", hd, MLG_D);
    e->G1 = rows(g, "expert w1 output (silu input)", MLG_COMPUTE, MLG_FE);
    e->A1 = rows(g, "expert silu output", MLG_COMPUTE, MLG_FE);
    e->U = rows(g, "expert w3 output", MLG_COMPUTE, MLG_FE);
    e->P = rows(g, "expert product (w2 input)", MLG_COMPUTE, MLG_FE);
    e->Y = rows(g, "expert output (weighted by the router)", MLG_COMPUTE, MLG_D);
    if (!dispatched)
        e->rw = ml__graph_tensor(g, "gathered routing weights", hd, MLG_ACT, 1, MLG_NE);
    e->Z = rows(g, dispatched ? "weighted expert output (cat's source)"
                              : "weighted expert output (index_add_ source)",
                hd, MLG_D);
}

mlg_op *ml__kit_expert_mm(ml_graph *g, const char *name, const char *nname, uint16_t x,
                          uint16_t c, uint16_t w, uint16_t W, uint16_t y)
{
    const uint16_t xs = c != MLG_NONE ? c : x;
    mlg_op *o = ml__graph_step(g, MLG_OP_MATMUL, name, xs, y, NULL);
    ml__op_save(o, xs);
    ml__op_save(o, w);
    ml__op_param(o, W);
    ml__op_free(o, c);
    node(o, nname, x, MLG_NONE, y);
    return o;
}

/* One expert on its rows of h, in the forward's op order: torch.where's
 * indices, the rows (IndexBackward0: h's gradient, added into its buffer
 * except by the last expert without a shared one), w1, silu, w3, the
 * product, w2, the routing weights' rows (their gradient added into the
 * top-k weights' except by the last expert), the weighting (a scratch of
 * w2's output's gradient), index_add_ into the sum (it keeps its source). */
static void expert_ops(ml_graph *g, const mlg_layer *L, const mlg_expert *e, uint16_t h,
                       uint16_t wk, const uint16_t W[3], const uint16_t wc[3])
{
    ml__graph_step(g, MLG_OP_ELEMENTWISE, "where (the expert's rows)", wk, e->where, NULL);
    mlg_op *o = ml__graph_step(g, MLG_OP_COPY, "index (the expert's rows of h)", h, e->x,
                               "IndexBackward0 (the expert's rows of h)");
    ml__op_in(o, e->where);
    ml__op_save(o, e->where);
    o->accum = h;
    o->accum_but_last = !L->moe.shared;
    ml__kit_cast_ops(g, e->x, e->c1, MLG_NONE, MLG_NONE);
    o = ml__kit_expert_mm(g, "mm (w1)", "MmBackward0 (w1)", e->x, e->c1, wc[0], W[0], e->G1);
    /* the three matmuls of every expert, one term over their K·B·T rows
     * as the builders add them */
    ml__op_flops(o, 6.0, 5, MLG_K, MLG_B, MLG_T, MLG_D, MLG_FE);
    o->accum = e->x;
    o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "silu", e->G1, e->A1, "SiluBackward0 (expert)");
    ml__op_save(o, e->G1);
    ml__kit_cast_ops(g, e->x, e->c3, MLG_NONE, MLG_NONE);
    ml__kit_expert_mm(g, "mm (w3)", "MmBackward0 (w3)", e->x, e->c3, wc[1], W[2], e->U);
    o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "mul (silu * w3)", e->A1, e->P,
                       "MulBackward0 (silu * w3)");
    ml__op_in(o, e->U);
    ml__op_save(o, e->A1);
    ml__op_save(o, e->U);
    ml__op_gin(o, e->U);
    ml__kit_expert_mm(g, "mm (w2)", "MmBackward0 (w2)", e->P, MLG_NONE, wc[2], W[1], e->Y);
    o = ml__graph_step(g, MLG_OP_COPY, "index (the expert's routing weights)", wk, e->rw,
                       "IndexBackward0 (the expert's routing weights)");
    o->accum = wk;
    o->accum_but_last = true;
    o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "mul (expert output * weights)", e->Y, e->Z,
                       "MulBackward0 (expert output * weights)");
    ml__op_in(o, e->rw);
    ml__op_save(o, e->Y);
    ml__op_save(o, e->rw);
    ml__op_gin(o, e->rw);
    /* other (the weights, broadcast over the row) before self in the
     * codegen's sorted order: grad * Y whole, then Y's gradient, then
     * validate_outputs' sum_to of the weights' (engine.cpp) */
    o->scratch_in = 1;
    o->scratch_first = true;
    o = ml__graph_op(g, MLG_OP_ELEMENTWISE, "index_add_ (into the sum)");
    ml__op_in(o, e->Z);
    ml__op_save(o, e->Z);
    node(o, "IndexAddBackward0 (index_select of the sum's gradient)", e->Z, MLG_NONE, MLG_NONE);
}

/* The routed experts' weights, after one expert's tensors: autocast's
 * copies of the rank's E (or E / ep) experts' weights (three entries, each
 * released with the block: no instance's node), the weights themselves
 * (w1, w2, w3 of each expert in turn, as the builders list them:
 * MLG_T_EXPERT), and the busiest expert's intermediate (a transient). */
void ml__kit_expert_weights(ml_graph *g, const mlg_layer *L, uint16_t wc[3], uint16_t W[3])
{
    for (unsigned i = 0; i < 3; i++) {
        wc[i] = MLG_NONE;
        if (L->autocast) {
            wc[i] = ml__graph_tensor(g, "experts' weights (autocast copy)", MLG_HALF, MLG_ACT, 3,
                                     MLG_EL, MLG_D, MLG_FE);
            ml__kit_flag(g, wc[i], MLG_T_WCAST | MLG_T_KEPT);
        }
    }
    const uint8_t grp = g->group;
    /* the module group of their own (Mixtral's after its gate; DeepSeek's
     * before its gate, which is the next group's) */
    g->group = ml__kit_group(L, L->moe.kind == MLG_MOE_MIXTRAL ? MLG_GROUP_MLP2 : MLG_GROUP_MLP);
    W[0] = ml__kit_param(g, "w1", MLG_D, MLG_FE);
    W[1] = ml__kit_param(g, "w2", MLG_FE, MLG_D);
    W[2] = ml__kit_param(g, "w3", MLG_D, MLG_FE);
    g->group = grp;
    for (unsigned i = 0; i < 3; i++)
        ml__kit_flag(g, W[i], MLG_T_EXPERT);
    ml__kit_flag(g,
                 ml__graph_tensor(g, "the busiest expert's intermediate", MLG_COMPUTE, MLG_ACT,
                                  2, MLG_ROWS, MLG_FE),
                 MLG_T_TMP);
}

/* The routed experts on h with the top-k weights wk: one expert's tensors
 * (the repeated group), autocast's copies of the E experts' weights, the
 * weights themselves (w1, w2, w3 of each expert in turn, as the builders
 * list them: MLG_T_EXPERT), the transients (the busiest expert's
 * intermediate, the (B*T, D) sum index_add_ builds), then the ops: the
 * weights' casts, and one expert's ops (the repeated group). Returns the
 * sum. */
static uint16_t experts(ml_graph *g, const mlg_layer *L, uint16_t h, uint16_t wk)
{
    const uint8_t hd = g->t[h].dtype;
    mlg_expert e;
    const uint16_t t0 = g->nt;
    ml__kit_expert_tensors(g, L, hd, false, &e);
    const uint16_t t1 = g->nt;
    uint16_t wc[3], W[3];
    ml__kit_expert_weights(g, L, wc, W);
    const uint16_t sum = act(g, "routed experts' sum", hd, MLG_D);
    ml__kit_flag(g, sum, MLG_T_TMP);
    ml__graph_step(g, MLG_OP_ELEMENTWISE, "zeros (final_hidden_states)", MLG_NONE, sum, NULL);
    for (unsigned i = 0; i < 3; i++)
        ml__kit_cast_ops(g, MLG_NONE, MLG_NONE, wc[i], W[i]);
    const uint16_t o0 = g->nop;
    expert_ops(g, L, &e, h, wk, W, wc);
    ml__graph_repeat(g, t0, t1, o0, g->nop);
    return sum;
}

/* A literal dimension of size n (graph.h, MLG_L0). */
static uint8_t literal(ml_graph *g, uint64_t n)
{
    if (g->nlit >= MLG_NLIT) {
        g->full = true;
        return MLG_L0;
    }
    g->lit[g->nlit] = n;
    return (uint8_t)(MLG_L0 + g->nlit++);
}

/* Qwen2-MoE's shared expert, a SwiGLU of width FS on every token (its
 * gate_proj and up_proj read h, which the router saved; autocast casts h
 * for each, and for shared_expert_gate), scaled by
 * sigmoid(shared_expert_gate(h)), a (B, T, 1) gate: the sigmoid keeps its
 * result, the mul that and the expert's output; the sum with the routed
 * experts' keeps nothing. shared_expert_gate reads h last: its gradient is
 * h's buffer. Returns the sum. */
static uint16_t shared(ml_graph *g, const mlg_layer *L, uint16_t h, uint16_t routed)
{
    const uint8_t one = literal(g, 1);
    uint16_t c[3];
    for (unsigned i = 0; i < 3; i++)
        c[i] = ml__kit_cast_copy(g, L, h);
    uint16_t wg = ml__kit_weight_copy(g, L, MLG_D, MLG_FS);
    uint16_t wu = ml__kit_weight_copy(g, L, MLG_D, MLG_FS);
    uint16_t wd = ml__kit_weight_copy(g, L, MLG_FS, MLG_D);
    uint16_t wq = ml__kit_weight_copy(g, L, MLG_D, one);
    uint16_t G1 = act(g, "shared expert gate_proj output (silu input)", MLG_COMPUTE, MLG_FS);
    uint16_t A1 = act(g, "shared expert silu output", MLG_COMPUTE, MLG_FS);
    uint16_t U = act(g, "shared expert up_proj output", MLG_COMPUTE, MLG_FS);
    uint16_t P = act(g, "shared expert product (down_proj input)", MLG_COMPUTE, MLG_FS);
    uint16_t sg = act(g, "shared expert gate sigmoid output", MLG_COMPUTE, one);
    uint16_t Y = act(g, "shared expert output (gated)", MLG_COMPUTE, MLG_D);
    uint16_t gl = act(g, "shared_expert_gate output", MLG_COMPUTE, one);
    uint16_t out = act(g, "routed + shared", g->t[routed].dtype, MLG_D);
    ml__kit_flag(g, act(g, "shared expert intermediate", MLG_COMPUTE, MLG_FS), MLG_T_TMP);
    const uint8_t grp = g->group;
    g->group = ml__kit_group(L, MLG_GROUP_MLP3);
    const mlg_linear lg = {"mm (shared gate_proj)", "MmBackward0 (shared gate_proj)", MLG_D,
                           MLG_FS, false};
    const mlg_linear lu = {"mm (shared up_proj)", "MmBackward0 (shared up_proj)", MLG_D, MLG_FS,
                           false};
    const mlg_linear ld = {"mm (shared down_proj)", "MmBackward0 (shared down_proj)", MLG_FS,
                           MLG_D, false};
    const mlg_linear lq = {"mm (shared_expert_gate)", "MmBackward0 (shared_expert_gate)", MLG_D,
                           one, false};
    mlg_op *o = ml__kit_linear_with(g, &lg, h, c[0], wg, G1);
    /* the four matmuls' FLOPs, summed op by op where the builders add one
     * sum: equal while exact in a double */
    ml__op_flops(o, 6.0, 4, MLG_B, MLG_T, MLG_D, MLG_FS);
    ml__op_gout(o, G1);
    o->accum = h;
    o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "silu", G1, A1, "SiluBackward0 (shared)");
    ml__op_save(o, G1);
    o = ml__kit_linear_with(g, &lu, h, c[1], wu, U);
    ml__op_flops(o, 0.0, 0);
    ml__op_gout(o, U);
    o->accum = h;
    o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "mul (silu * up)", A1, P,
                       "MulBackward0 (shared silu * up)");
    ml__op_in(o, U);
    ml__op_save(o, A1);
    ml__op_save(o, U);
    ml__op_gin(o, U);
    o = ml__kit_linear_with(g, &ld, P, MLG_NONE, wd, Y);
    ml__op_flops(o, 0.0, 0);
    ml__op_gout(o, Y);
    o = ml__kit_linear_with(g, &lq, h, c[2], wq, gl);
    ml__op_gout(o, gl);
    g->group = grp;
    o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "sigmoid", gl, sg, "SigmoidBackward0 (shared gate)");
    ml__op_save(o, sg);
    ml__op_free(o, gl);
    o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "mul (sigmoid * shared)", Y, MLG_NONE,
                       "MulBackward0 (sigmoid * shared)");
    ml__op_in(o, sg);
    ml__op_save(o, Y);
    ml__op_save(o, sg);
    ml__op_gin(o, sg);
    /* other (the shared output) before self (the gate, broadcast) in the
     * codegen's sorted order: grad * sigmoid is the output's gradient,
     * then grad * Y whole, which validate_outputs' sum_to reduces to the
     * gate's (engine.cpp); the whole made before the gate's gradient as
     * the scratch-first order makes it (both the output's size) */
    o->scratch_in = 1;
    o->scratch_first = true;
    ml__graph_step(g, MLG_OP_ELEMENTWISE, "add (routed + shared)", routed, out, NULL);
    return out;
}

uint16_t ml__kit_mixtral_moe(ml_graph *g, const mlg_layer *L, uint16_t h)
{
    uint16_t wk = router(g, L, h);
    uint16_t y = L->moe.ep ? ml__kit_mixtral_experts_ep(g, L, h, wk) : experts(g, L, h, wk);
    return L->moe.shared ? shared(g, L, h, y) : y;
}
