/* The attention core's tensors and ops, shared by the kit's attention
 * layouts (kit.h): the (B, H, T, T) scores and probabilities, the head
 * tensors, the two batched products (q k^T and P v), the scale,
 * autocast's cast of the probabilities for the P v product, and ring
 * attention's buffers around a fused kernel. */
#include "graph/kit.h"

/* A (B, H, T, T) tensor: the scores and probabilities. */
uint16_t ml__kit_scores(ml_graph *g, const char *name, uint8_t dtype, uint8_t flags)
{
    uint16_t t = ml__graph_tensor(g, name, dtype, MLG_ACT, 4, MLG_B, MLG_H, MLG_T, MLG_T);
    if (t != MLG_NONE)
        g->t[t].flags |= flags;
    return t;
}

uint16_t ml__kit_heads(ml_graph *g, const char *name, uint8_t h)
{
    return ml__kit_heads_as(g, name, h, MLG_COMPUTE);
}

uint16_t ml__kit_heads_as(ml_graph *g, const char *name, uint8_t h, uint8_t dt)
{
    return ml__graph_tensor(g, name, dt, MLG_ACT, 4, MLG_B, h, MLG_T, MLG_DH);
}

void ml__kit_view_heads(ml_graph *g, const char *name, const char *node, uint16_t y, uint16_t hv)
{
    mlg_op *o = ml__graph_op(g, MLG_OP_VIEW, name);
    if (!node) { /* the heads' gradient is y's */
        ml__op_in(o, y);
        ml__op_out(o, hv);
        return;
    }
    ml__op_node(o, node);
    ml__op_gin(o, y);
    ml__op_gout(o, hv);
}

/* The attention core's batched matmul out = a b: BmmBackward0 saves both
 * operands and makes both gradients; 2 B H T T d FLOPs (d: the heads' width,
 * MLG_DH, or latent attention's value width). */
static mlg_op *core_bmm(ml_graph *g, const char *name, const char *node, uint16_t a, uint16_t b,
                        uint16_t out, uint8_t d)
{
    /* BmmBackward0 makes mat2's gradient first (derivatives.yaml's inputs
     * in sorted order: mat2, self) */
    mlg_op *o = ml__graph_op(g, MLG_OP_MATMUL, name);
    ml__op_in(o, a);
    ml__op_in(o, b);
    ml__op_out(o, out);
    ml__op_node(o, node);
    ml__op_gin(o, b);
    ml__op_gin(o, a);
    ml__op_gout(o, out);
    ml__op_save(o, a);
    ml__op_save(o, b);
    ml__op_flops(o, 2.0, 5, MLG_B, MLG_H, MLG_T, MLG_T, d);
    o->core = true;
    return o;
}

mlg_op *ml__kit_qk(ml_graph *g, uint16_t qb, uint16_t kb, uint16_t S)
{
    return core_bmm(g, "bmm (q k^T)", "BmmBackward0 (q k^T)", qb, kb, S, MLG_DH);
}

uint16_t ml__kit_scale(ml_graph *g, uint16_t S)
{
    uint16_t S2 = ml__kit_scores(g, "scores (scaled)", MLG_COMPUTE, 0);
    ml__op_free(ml__graph_step(g, MLG_OP_ELEMENTWISE, "mul (scale)", S, S2,
                               "MulBackward0/DivBackward0 (scale)"),
                S);
    return S2;
}

uint16_t ml__kit_scale_inplace(ml_graph *g, uint16_t S)
{
    uint16_t S2 = ml__graph_view(g, "scores (scaled in place)", S, 4, MLG_B, MLG_H, MLG_T, MLG_T);
    ml__kit_view_heads(g, "div_ (scale)", "DivBackward0 (scale, in place)", S, S2);
    return S2;
}

/* The probabilities P copied to the compute dtype for the PV matmul; its op
 * in *o. */
static uint16_t probs_copy(ml_graph *g, uint16_t P, mlg_op **o)
{
    uint16_t Pc = ml__kit_scores(g, "attention probabilities cast for PV", MLG_COMPUTE, MLG_T_CORE);
    *o = ml__graph_step(g, MLG_OP_COPY, "to (compute dtype)", P, Pc,
                        "ToCopyBackward0 (probabilities)");
    return Pc;
}

uint16_t ml__kit_probs_copy(ml_graph *g, uint16_t P)
{
    mlg_op *o;
    return probs_copy(g, P, &o);
}

uint16_t ml__kit_probs_cast(ml_graph *g, uint16_t P)
{
    mlg_op *o;
    uint16_t Pc = probs_copy(g, P, &o);
    ml__op_free(o, P);
    return Pc;
}

mlg_op *ml__kit_pv_into(ml_graph *g, uint16_t probs, uint16_t vb, uint16_t O, uint8_t d)
{
    return core_bmm(g, "bmm (P v)", "BmmBackward0 (P v)", probs, vb, O, d);
}

uint16_t ml__kit_pv(ml_graph *g, uint16_t probs, uint16_t vb, uint16_t vc)
{
    uint16_t O = ml__kit_heads(g, "attention output (P v)", MLG_H);
    ml__op_free(ml__kit_pv_into(g, probs, vb, O, MLG_DH), vc);
    return O;
}

uint16_t ml__kit_autocast_copy(ml_graph *g, uint16_t x, uint8_t h, const char *name)
{
    uint16_t c = ml__kit_heads(g, name, h);
    ml__graph_step(g, MLG_OP_COPY, "to (autocast)", x, c, "ToCopyBackward0 (autocast, heads)");
    return c;
}

uint16_t ml__kit_pv_cast(ml_graph *g, uint16_t Pc, uint16_t vb, uint16_t vc)
{
    uint16_t O = ml__kit_heads(g, "attention output (P v)", MLG_H);
    mlg_op *o = ml__kit_pv_into(g, Pc, vb, O, MLG_DH);
    ml__op_free(o, vc);
    ml__op_free(o, Pc);
    return O;
}

uint16_t ml__kit_ring_open(ml_graph *g, bool ring)
{
    if (!ring)
        return MLG_NONE;
    /* (one op: its three outputs; the kernel's own op follows) */
    mlg_op *o = ml__graph_op(g, MLG_OP_VIEW, "ring attention's buffers");
    ml__op_out(o, ml__graph_tensor(g, "ring: keys and values all-gathered", MLG_COMPUTE, MLG_ACT,
                                   5, ml__graph_lit(g, 2), MLG_B, MLG_HKV, MLG_TKV, MLG_DH));
    ml__op_out(o, ml__graph_tensor(g, "ring: the merge's fp32 output and temporaries", MLG_FP32,
                                   MLG_ACT, 5, ml__graph_lit(g, 4), MLG_B, MLG_H, MLG_T, MLG_DH));
    ml__op_out(o, ml__kit_heads(g, "ring: a step's output", MLG_H));
    /* transients of the block rule too (where the forward is not the
     * graph's op-by-op pass) */
    for (unsigned j = 0; j < o->nout; j++)
        if (o->out[j] != MLG_NONE)
            g->t[o->out[j]].flags |= MLG_T_TMP;
    return (uint16_t)(g->nop - 1);
}

void ml__kit_ring_close(ml_graph *g, uint16_t open)
{
    if (open == MLG_NONE)
        return;
    const mlg_op *a = &g->op[open];
    mlg_op *o = ml__graph_release(g, "ring attention returns");
    for (unsigned j = 0; j < a->nout; j++)
        ml__op_free(o, a->out[j]);
}

mlg_op *ml__kit_grad_step(ml_graph *g, uint8_t kind, const char *name, uint16_t x, uint16_t y,
                          const char *node)
{
    mlg_op *o = ml__graph_step(g, kind, name, x, y, NULL);
    ml__op_node(o, node);
    ml__op_gin(o, x);
    return o;
}
