/* HF's rotate-half rotary (apply_rotary_pos_emb, modeling_llama.py and
 * modeling_phi3.py) on a head tensor, op by op with its backward node by
 * node (kit.h). */
#include <stdbool.h>
#include <stddef.h>

#include "graph/kit.h"

/* A product of the rotary run in dt's wider dtype (rot_fp32, which
 * autocast alone sets: the stream's fp32 against a 2-byte compute dtype)
 * makes its input's gradient in fp32, twice the input's bytes, which
 * engine.cpp's validate_outputs casts to the input's dtype: that whole one
 * is a scratch, made first. */
static void wide_grad(mlg_op *o, uint8_t dt)
{
    if (dt == MLG_COMPUTE)
        return;
    o->scratch_in = 2;
    o->scratch_one = true;
    o->scratch_first = true;
}

/* rotate-half rotary on one head tensor x of hd heads (kit.h): (x * cos)
 * + (cat(-x2, x1) * sin), x1 and x2 the halves of x. The products save cos
 * and sin, which need no gradient: nothing of x. The backward, node by
 * node in the engine's order (derivatives.yaml):
 *   MulBackward0 (* sin): grad * sin, the cat's gradient;
 *   CatBackward0: views of it (nothing made);
 *   NegBackward0: -grad, half of x's size;
 *   SliceBackward0 (x2): slice_backward's zero-filled gradient of x, the
 *     first to reach x's InputBuffer; frees the half;
 *   SliceBackward0 (x1): another, added into the buffer; frees the cat's
 *     gradient (its last view);
 *   MulBackward0 (x * cos): grad * cos, added into the buffer; frees the
 *     rotary's incoming gradient, which AddBackward0 passed to both
 *     products.
 * Where the products run in dt's wider dtype (rot_fp32): wide_grad.
 * pass (Phi-3's and GPT-NeoX's fused projections: the op of x's pass,
 * ml__kit_rope_pass, else NULL): the rotated part is cat with the pass
 * into a new contiguous tensor, whose gradient the pass's node frees. */
uint16_t ml__kit_rope(ml_graph *g, uint16_t x, uint8_t hd, uint8_t dt, mlg_op *pass)
{
    uint16_t c1 = ml__kit_heads_as(g, "x * cos", hd, dt), nh = ml__kit_heads(g, "-x2", hd);
    uint16_t ct = ml__kit_heads(g, "cat(-x2, x1)", hd), s1 = ml__kit_heads_as(g, "* sin", hd, dt);
    uint16_t r = ml__kit_heads_as(g, "rotated", hd, dt);
    uint16_t x2 = ml__graph_view(g, "x2", ml__graph_storage(g, x), 4, MLG_B, hd, MLG_T, MLG_DH);
    if (nh != MLG_NONE)
        g->t[nh].flags |= MLG_T_HALF;
    if (x2 != MLG_NONE)
        g->t[x2].flags |= MLG_T_HALF;
    /* (its gradient is the rotary's: AddBackward0 passes it on) */
    mlg_op *o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "mul (cos)", x, c1, NULL);
    ml__op_node(o, "MulBackward0 (x * cos)");
    o->table = MLG_TABLE_COS;
    ml__op_gin(o, x);
    /* with a pass, the rotated part's gradient is a view of the cat's,
     * whose storage the pass's node frees, the last to hold a view of it
     * (CatBackward0's outputs narrow its gradient; ml__kit_rope_pass) */
    if (!pass)
        ml__op_gout(o, r);
    o->accum = x;
    wide_grad(o, dt);
    o = ml__graph_op(g, MLG_OP_VIEW, "slice (x1)");
    ml__op_in(o, x);
    ml__op_node(o, "SliceBackward0 (x1)");
    ml__op_gin(o, x);
    ml__op_gout(o, ct);
    o->accum = x;
    o = ml__graph_op(g, MLG_OP_VIEW, "slice (x2)");
    ml__op_in(o, x);
    ml__op_node(o, "SliceBackward0 (x2)");
    ml__op_gin(o, x);
    ml__op_gout(o, x2);
    o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "neg (x2)", x2, nh, NULL);
    ml__op_node(o, "NegBackward0 (x2)");
    ml__op_gin(o, x2);
    o = ml__graph_step(g, MLG_OP_COPY, "cat", nh, ct, NULL);
    ml__op_free(o, nh);
    o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "mul (sin)", ct, s1, NULL);
    ml__op_free(o, ct);
    ml__op_node(o, "MulBackward0 (* sin)");
    o->table = MLG_TABLE_SIN;
    ml__op_gin(o, ct);
    wide_grad(o, dt);
    o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "add (rotary)", c1, r, NULL);
    ml__op_in(o, s1);
    ml__op_free(o, c1);
    ml__op_free(o, s1);
    if (!pass)
        return r;
    uint16_t rc = ml__kit_heads_as(g, "cat(rotated, pass)", hd, dt);
    o = ml__graph_step(g, MLG_OP_COPY, "cat (rotated, pass)", r, rc, NULL);
    ml__op_free(o, r);
    ml__op_gout(pass, rc);
    return rc;
}

/* Phi-3's (and GPT-NeoX's) apply_rotary_pos_emb splits x into the rotated part and
 * x[..., rotary_dim:], q's and k's before either rotates. The pass is empty
 * when the whole head rotates, yet its SliceBackward0 makes a zero-filled
 * gradient of x's size (derivatives.yaml: slice_backward), added into x's
 * buffer after both rotaries' nodes have run (the engine runs the latest
 * node first: k's pass, then q's). The rotated part x[..., :rotary_dim]
 * spans the axis: no node (TensorIndexing.h, applySlice). */
mlg_op *ml__kit_rope_pass(ml_graph *g, uint16_t x, const char *node)
{
    mlg_op *o = ml__graph_op(g, MLG_OP_VIEW, "slice (pass, empty)");
    ml__op_in(o, x);
    ml__op_node(o, node);
    ml__op_gin(o, x);
    o->accum = x;
    return o;
}
