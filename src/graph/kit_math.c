/* scaled_dot_product_attention's math kernel, op by op (kit.h). */
#include <stddef.h>

#include "graph/kit.h"

/* A (B, H, T, dh) copy of x made by repeat_interleave over the groups
 * (an expand, then a flatten that copies); its backward sums them. */
static uint16_t interleave(ml_graph *g, uint16_t x, const char *name, const char *node)
{
    uint16_t r = ml__kit_heads(g, name, MLG_H);
    ml__graph_step(g, MLG_OP_COPY, "repeat_interleave", x, r, node);
    return r;
}

/* The causal mask the kernel builds for is_causal: ones((T, T), bool)
 * .tril(), then where(logical_not, -inf, 0) in q's dtype; the two bool
 * tensors go once the float one exists. */
static uint16_t causal_mask(ml_graph *g)
{
    uint16_t tril = ml__graph_tensor(g, "causal mask: tril (bool)", MLG_BOOL, MLG_ACT, 2, MLG_T,
                                     MLG_T);
    uint16_t inv = ml__graph_tensor(g, "causal mask: logical_not (bool)", MLG_BOOL, MLG_ACT, 2,
                                    MLG_T, MLG_T);
    uint16_t m = ml__graph_tensor(g, "causal mask (additive)", MLG_COMPUTE, MLG_ACT, 2, MLG_T,
                                  MLG_T);
    mlg_op *o = ml__graph_op(g, MLG_OP_ELEMENTWISE, "causal mask (math kernel)");
    ml__op_out(o, tril);
    ml__op_out(o, inv);
    ml__op_out(o, m);
    ml__op_free(o, tril);
    ml__op_free(o, inv);
    return m;
}

uint16_t ml__kit_sdpa_math(ml_graph *g, const mlg_layer *L, uint16_t qr, uint16_t kr,
                           uint16_t vh, bool q_contiguous)
{
    const mlg_attention *a = &L->attn;
    /* query * sqrt(scale): a new tensor in q's layout, bound to the end */
    uint16_t qs = ml__kit_heads(g, "q scaled (math kernel)", MLG_H);
    ml__graph_step(g, MLG_OP_ELEMENTWISE, "mul (q scale)", qr, qs, "MulBackward0 (q scale)");
    uint16_t mask = causal_mask(g);
    /* enable_gqa: key and value repeated to H heads, bound to the end */
    uint16_t krep = interleave(g, kr, "k repeated (repeat_interleave)",
                               "ExpandBackward0 (repeat_interleave of k)");
    uint16_t vrep = interleave(g, vh, "v repeated (repeat_interleave)",
                               "ExpandBackward0 (repeat_interleave of v)");
    /* key.transpose(-2, -1) * sqrt(scale): the bmm's second operand (a
     * temporary of the matmul's expression); the bmm copies q to a
     * contiguous operand unless it is one or the batch is one */
    uint16_t kts = ml__kit_heads(g, "k^T scaled (math kernel)", MLG_H);
    ml__graph_step(g, MLG_OP_ELEMENTWISE, "mul (k^T scale)", krep, kts, "MulBackward0 (k scale)");
    uint16_t qc = q_contiguous || a->fold_views
                      ? MLG_NONE
                      : ml__kit_heads(g, "q contiguous copy (bmm)", MLG_H);
    if (qc != MLG_NONE)
        ml__graph_step(g, MLG_OP_COPY, "contiguous (q for bmm)", qs, qc, NULL);
    uint16_t S = ml__kit_scores(g, "scores (q k^T)", MLG_COMPUTE, MLG_T_TMP);
    mlg_op *o = ml__kit_qk(g, qc != MLG_NONE ? qc : qs, kts, S);
    ml__op_free(o, qc);
    ml__op_free(o, kts);
    /* attn.add_(mask): in place (the scores read and written: listed
     * twice for the traffic), no gradient of its own to make */
    o = ml__graph_op(g, MLG_OP_ELEMENTWISE, "add_ (causal mask)");
    ml__op_in(o, S);
    ml__op_in(o, mask);
    ml__op_in(o, S);
    /* _safe_softmax: softmax's output, isneginf of the scores (one byte
     * each), its rows' all(), then where() written into the output (read
     * and written); the scores and the bool tensors go as it returns. It
     * saves its result. */
    uint16_t P = ml__kit_scores(g, "softmax output", MLG_COMPUTE, MLG_T_CORE);
    uint16_t inf = ml__kit_scores(g, "isneginf (scores)", MLG_BOOL, 0);
    uint16_t rows = ml__graph_tensor(g, "all (masked rows)", MLG_BOOL, MLG_ACT, 3, MLG_B, MLG_H,
                                     MLG_T);
    o = ml__graph_step(g, MLG_OP_SOFTMAX, "softmax (_safe_softmax)", S, P, "SafeSoftmaxBackward0");
    ml__op_save(o, P);
    ml__graph_step(g, MLG_OP_ELEMENTWISE, "isneginf (scores)", S, inf, NULL);
    ml__graph_step(g, MLG_OP_ELEMENTWISE, "all (masked rows)", inf, rows, NULL);
    o = ml__graph_op(g, MLG_OP_ELEMENTWISE, "where (into the softmax output)");
    ml__op_in(o, rows);
    ml__op_in(o, P);
    ml__op_in(o, P);
    ml__op_free(o, inf);
    ml__op_free(o, rows);
    ml__op_free(o, S);
    uint16_t probs =
        ml__kit_dropout(g, a->dropout, P, "NativeDropoutBackward0 (attention)", true, false);
    uint16_t O = ml__kit_pv(g, probs, vrep, MLG_NONE);
    /* the kernel returns its output: its locals and the probabilities
     * (returned beside it, dropped by the caller) go */
    o = ml__graph_release(g, "the math kernel returns");
    ml__op_free(o, qs);
    ml__op_free(o, mask);
    ml__op_free(o, krep);
    ml__op_free(o, vrep);
    ml__op_free(o, probs);
    return O;
}
