/* gelu_new, transformers' NewGELUActivation (activations.py):
 * 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * pow(x, 3)))), a
 * composite of elementwise ops, each saving what its derivative reads
 * (tools/autograd/derivatives.yaml): pow its input, tanh its result, the
 * last mul both operands (0.5 * x and 1 + tanh); the muls by a Python float
 * and the additions save no tensor. HF GPT-2's default activation, Phi-2's,
 * T5 v1.1's gated feed-forward's (kit.h). */
#include "graph/kit.h"

/* A (B, T, F) tensor. */
static uint16_t btf(ml_graph *g, const char *name, uint8_t dtype)
{
    return ml__graph_tensor(g, name, dtype, MLG_ACT, 3, MLG_B, MLG_T, MLG_F);
}

/* An op of x into y with its node: with nodes, one that also frees y's
 * gradient (node NULL: none, the gradient passed on to x, as AddBackward's
 * is); else one whose node makes x's gradient alone. */
static mlg_op *op(ml_graph *g, bool nodes, uint8_t kind, const char *name, uint16_t x,
                  uint16_t y, const char *node)
{
    return nodes ? ml__graph_step(g, kind, name, x, y, node)
                 : ml__kit_grad_step(g, kind, name, x, y, node);
}

uint16_t ml__kit_gelu_new(ml_graph *g, bool autocast, uint16_t x, const char *out_name,
                          bool nodes)
{
    /* CUDA autocast runs pow in fp32 (autocast_mode.cpp's fp32 list) on a
     * copy of x, and what follows it is fp32 by promotion, but 0.5 * x */
    const uint8_t p = autocast ? MLG_FP32 : MLG_COMPUTE;
    uint16_t xf = autocast ? btf(g, "activation input, fp32 copy (pow)", MLG_FP32) : MLG_NONE;
    uint16_t p3 = btf(g, "pow(x, 3)", p);
    if (p3 != MLG_NONE)
        g->t[p3].flags |= MLG_T_TMP;
    uint16_t m1 = btf(g, "0.044715 * x^3", p);
    uint16_t s1 = btf(g, "x + 0.044715 * x^3", p);
    uint16_t s2 = btf(g, "sqrt(2 / pi) * (.)", p);
    uint16_t th = btf(g, "gelu_new tanh output", p);
    uint16_t hx = btf(g, "gelu_new 0.5 * x", MLG_COMPUTE);
    uint16_t op1 = btf(g, "gelu_new 1 + tanh", p);
    uint16_t y = btf(g, out_name, p);
    /* 0.5 * x first: Python evaluates the product's left operand before
     * its right (so its node runs last in backward) */
    mlg_op *h = op(g, nodes, MLG_OP_ELEMENTWISE, "mul (0.5)", x, hx, "MulBackward1");
    uint16_t xs = x;
    if (xf != MLG_NONE) {
        op(g, nodes, MLG_OP_COPY, "to (autocast, float32)", x, xf, "ToCopyBackward0");
        xs = xf;
    }
    mlg_op *o = op(g, nodes, MLG_OP_ELEMENTWISE, "pow", xs, p3, "PowBackward0");
    ml__op_save(o, xs);
    ml__op_free(o, xf);
    if (nodes) {
        /* x's gradient buffer holds what AddBackward0 hands it (below): the
         * gradient of pow's x, then of 0.5 * x, are added into it in place;
         * pow_backward's two temporaries of x's size come before the
         * result and go after it (FunctionsManual.cpp, pow_backward) */
        o->accum = xs;
        o->scratch_in = 2;
        o->scratch_first = true;
        h->accum = x;
    }
    /* (with nodes, m1's gradient is the one x's buffer holds: its node
     * frees it not) */
    ml__op_free(ml__kit_grad_step(g, MLG_OP_ELEMENTWISE, "mul (0.044715)", p3, m1, "MulBackward1"),
                p3);
    /* x + m1: AddBackward0 hands its gradient on to both (x's added into
     * its buffer in place, no tensor made) */
    o = op(g, nodes, MLG_OP_ELEMENTWISE, "add", x, s1, nodes ? NULL : "AddBackward0");
    ml__op_in(o, m1);
    ml__op_free(o, m1);
    ml__op_free(op(g, nodes, MLG_OP_ELEMENTWISE, "mul (sqrt(2 / pi))", s1, s2, "MulBackward1"),
                s1);
    o = op(g, nodes, MLG_OP_ELEMENTWISE, "tanh", s2, th, "TanhBackward0");
    ml__op_save(o, th);
    ml__op_free(o, s2);
    /* 1 + th: AddBackward1 hands the gradient on to th */
    ml__op_free(op(g, nodes, MLG_OP_ELEMENTWISE, "add (1)", th, op1, nodes ? NULL : "AddBackward1"),
                th);
    o = op(g, nodes, MLG_OP_ELEMENTWISE, "mul", hx, y, "MulBackward0");
    ml__op_in(o, op1);
    ml__op_save(o, hx);
    ml__op_save(o, op1);
    if (nodes) { /* other's gradient first (the codegen's sorted order), then self's */
        o->ngin = 0;
        ml__op_gin(o, op1);
        ml__op_gin(o, hx);
    }
    ml__op_free(o, hx);
    ml__op_free(o, op1);
    ml__op_free(o, x);
    return y;
}
