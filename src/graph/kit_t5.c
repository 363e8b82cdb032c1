/* T5's layers (kit_t5.h): T5LayerNorm, T5Attention (self and cross; no
 * scaling; the position bias added in place to the scores; softmax over
 * scores.float(), type_as the scores), T5DenseActDense or
 * T5DenseGatedActDense, the dropouts and the residuals, in the order
 * modeling_t5.py runs them. What each op saves: docs/inventory.md, "T5".
 *
 * The inventory lists saved tensors in the order they are declared
 * (docs/graph.md), and T5's order is the chain builders' (ledger/
 * chain_t5.c): a sublayer's norm first, autocast's copies, q and k, the
 * probabilities, then v. Each sublayer therefore declares its tensors
 * first and emits its ops after; a residual declares the next norm's fp32
 * copy of its sum before the sum. */
#include "graph/kit_t5.h"

/* Parameter groups, the order T5's modules register their parameters in:
 * each sublayer's module (the relative_attention_bias after q, k, v and
 * o), then its layer_norm. */
enum { G_SA, G_BIAS, G_SA_NORM, G_CA, G_CA_NORM, G_FF, G_FF_NORM };
_Static_assert((int)G_FF_NORM < (int)MLG_GROUPS, "T5's groups fit the chain's");

/* A (B, rows, width) tensor. */
static uint16_t t3(ml_graph *g, const char *name, uint8_t dtype, uint8_t rows, uint8_t width)
{
    return ml__graph_tensor(g, name, dtype, MLG_ACT, 3, MLG_B, rows, width);
}

/* A (B, H, T, keys) tensor. */
static uint16_t t4(ml_graph *g, const char *name, uint8_t dtype, uint8_t keys, uint8_t flags)
{
    uint16_t t = ml__graph_tensor(g, name, dtype, MLG_ACT, 4, MLG_B, MLG_H, MLG_T, keys);
    g->t[t].flags |= flags;
    return t;
}

static void flag(ml_graph *g, uint16_t t, uint8_t f)
{
    if (t != MLG_NONE)
        g->t[t].flags |= f;
}

/* A parameter of group grp. */
static uint16_t param(ml_graph *g, uint8_t grp, const char *name, uint8_t rows, int cols)
{
    g->group = grp;
    return ml__kit_param(g, name, rows, cols);
}

/* The name of the stream a norm reads: what the builders called it. */
static const char *stream_name(const mlg_t5 *L)
{
    return L->half_stream ? "layer norm input (x * rsqrt)" : "layer norm input";
}

/* The fp32 copy of x that T5LayerNorm's pow reads where the stream is
 * half (x.to(float32)); MLG_NONE where it is fp32 (to() returns x). */
static uint16_t fp32_copy(ml_graph *g, const mlg_t5 *L)
{
    if (!L->half_stream)
        return MLG_NONE;
    return t3(g, "layer norm fp32 copy of input (pow)", MLG_FP32, MLG_T, MLG_D);
}

/* T5LayerNorm of x (xf: its fp32 copy, declared by the residual that made
 * x, or MLG_NONE): variance of x.to(float32) squared, x * rsqrt(variance
 * + eps), cast to the weight's dtype when it is half, weight * h. pow
 * saves its fp32 input, the mul x and rsqrt's result, the scale h. Its
 * output is named `out` (the linear that saves it); group grp. */
static uint16_t t5_norm(ml_graph *g, const mlg_t5 *L, uint16_t x, uint16_t xf, const char *out,
                        uint8_t grp)
{
    if (xf == MLG_NONE)
        xf = fp32_copy(g, L);
    const uint16_t xs = xf != MLG_NONE ? xf : x;
    uint16_t sq = t3(g, "pow output", MLG_FP32, MLG_T, MLG_D);
    flag(g, sq, MLG_T_TMP);
    uint16_t var = ml__graph_tensor(g, "variance", MLG_FP32, MLG_ACT, 2, MLG_B, MLG_T);
    uint16_t ve = ml__graph_tensor(g, "variance + eps", MLG_FP32, MLG_ACT, 2, MLG_B, MLG_T);
    uint16_t rs = ml__graph_tensor(g, "layer norm rsqrt", MLG_FP32, MLG_ACT, 2, MLG_B, MLG_T);
    uint16_t hs = t3(g, L->half_stream ? "layer norm normalised (fp32)" : "layer norm normalised",
                     MLG_FP32, MLG_T, MLG_D);
    uint16_t h = L->half_stream ? t3(g, "layer norm normalised (cast)", MLG_STREAM, MLG_T, MLG_D)
                                : hs;
    uint16_t y = t3(g, out, MLG_STREAM, MLG_T, MLG_D);
    uint16_t W = param(g, grp, "layer_norm.weight", MLG_D, -1);
    if (xf != MLG_NONE)
        ml__kit_grad_step(g, MLG_OP_COPY, "to (float32)", x, xf, "ToCopyBackward0");
    ml__op_save(ml__kit_grad_step(g, MLG_OP_ELEMENTWISE, "pow", xs, sq, "PowBackward0"), xs);
    ml__op_free(ml__kit_grad_step(g, MLG_OP_NORM, "mean", sq, var, "MeanBackward1"), sq);
    ml__op_free(ml__kit_grad_step(g, MLG_OP_ELEMENTWISE, "add (eps)", var, ve, "AddBackward0"), var);
    mlg_op *o = ml__kit_grad_step(g, MLG_OP_ELEMENTWISE, "rsqrt", ve, rs, "RsqrtBackward0");
    ml__op_save(o, rs);
    ml__op_free(o, ve);
    o = ml__kit_grad_step(g, MLG_OP_ELEMENTWISE, "mul (x * rsqrt)", x, hs, "MulBackward0");
    ml__op_in(o, rs);
    ml__op_save(o, x);
    ml__op_save(o, rs);
    ml__op_free(o, xf);
    ml__op_free(o, rs);
    if (h != hs)
        ml__op_free(ml__kit_grad_step(g, MLG_OP_COPY, "to (weight dtype)", hs, h, "ToCopyBackward0"), hs);
    o = ml__kit_grad_step(g, MLG_OP_ELEMENTWISE, "mul (weight)", h, y, "MulBackward0");
    ml__op_save(o, h);
    ml__op_param(o, W);
    ml__op_free(o, h);
    return y;
}

/* A Linear without bias over (B, rows, in) x making y: it reads x or
 * autocast's copy c, and the weight W or its copy w, and saves what it
 * reads but the parameter (a side tensor's entry is the chain's). */
static void t5_linear(ml_graph *g, const char *name, uint16_t x, uint16_t c, uint16_t w,
                      uint16_t W, uint16_t y, uint8_t rows)
{
    ml__kit_cast_ops(g, x, c, w, W);
    const uint16_t xs = c != MLG_NONE ? c : x;
    mlg_op *o = ml__graph_step(g, MLG_OP_MATMUL, name, xs, y, NULL);
    ml__op_save(o, xs);
    ml__op_save(o, w);
    ml__op_param(o, W);
    ml__op_flops(o, 2.0, 4, MLG_B, rows, g->t[W].dim[0], g->t[W].dim[1]);
    ml__op_free(o, c);
    ml__op_free(o, w);
    ml__op_node(o, "MmBackward0");
    ml__op_gin(o, x);
}

/* native_dropout of x into y with its mask m (declared by the caller):
 * the mask saved. */
static void t5_dropout(ml_graph *g, uint16_t x, uint16_t y, uint16_t m)
{
    mlg_op *o = ml__kit_grad_step(g, MLG_OP_DROPOUT, "native_dropout", x, y, "NativeDropoutBackward0");
    ml__op_out(o, m);
    ml__op_save(o, m);
    ml__op_free(o, x);
}

/* The residual x + y: declares the next norm's fp32 copy of the sum (when
 * next and the stream is half: *xf, else MLG_NONE), then the sum. */
static uint16_t t5_residual(ml_graph *g, const mlg_t5 *L, uint16_t x, uint16_t y, bool next,
                            uint16_t *xf)
{
    *xf = next ? fp32_copy(g, L) : MLG_NONE;
    uint16_t s = t3(g, stream_name(L), MLG_STREAM, MLG_T, MLG_D);
    mlg_op *o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "add (residual)", x, s, NULL);
    ml__op_in(o, y);
    ml__op_free(o, y);
    return s;
}

/* One T5Attention's tensors, declared in the inventory's order. */
typedef struct {
    uint8_t keys;                 /* MLG_T, or MLG_TS crossing */
    uint16_t kx;                  /* what k and v project */
    uint16_t cq, ck, cv;          /* autocast's copies of the inputs */
    uint16_t wq, wk, wv, wo;      /* ... of the weights (one entry) */
    uint16_t Wq, Wk, Wv, Wo, Wb;  /* the parameters */
    uint16_t bk, vals, bias;      /* buckets, their embedding; the bias */
    uint16_t amask, cpos;         /* the stack's arguments the bias reads: its
                                     mask, cache_position (side tensors) */
    uint16_t q, k, S, Sf, P, Pc, mask, Pd, v, ctx, oin, o, dmask, dout;
} t5_attn;

/* autocast's copies: the inputs' (one per consumer), the weights' (one
 * entry: the builders' "weight cast copy"), w[0 .. n) of W[0 .. n). */
static void weight_copies(ml_graph *g, const uint16_t *W, uint16_t *w, unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        const mlg_tensor *p = &g->t[W[i]];
        w[i] = ml__graph_tensor(g, "weight cast copy (autocast)", MLG_HALF, MLG_ACT, 2,
                                p->dim[0], p->dim[1]);
        if (i == 0)
            flag(g, w[0], MLG_T_WCAST);
        else if (w[i] < g->nt)
            g->t[w[i]].base = w[0];
    }
}

/* The tensors of a T5Attention after its norm (y); cross: k and v
 * project the encoder's output enc. */
static void attn_tensors(ml_graph *g, const mlg_t5 *L, uint16_t y, uint16_t enc, t5_attn *A)
{
    const bool cross = enc != MLG_NONE;
    A->keys = cross ? MLG_TS : MLG_T;
    A->kx = cross ? enc : y;
    const uint8_t grp = cross ? G_CA : G_SA;
    A->Wq = param(g, grp, "q.weight", MLG_D, MLG_DQ);
    A->Wk = param(g, grp, "k.weight", MLG_D, MLG_DQ);
    A->Wv = param(g, grp, "v.weight", MLG_D, MLG_DQ);
    A->Wo = param(g, grp, "o.weight", MLG_D, MLG_DQ);
    A->cq = A->ck = A->cv = A->wq = A->wk = A->wv = A->wo = MLG_NONE;
    if (L->autocast) {
        const char *kv = cross ? "k/v input (the encoder output)" : "k/v input";
        A->cq = t3(g, "q input", MLG_HALF, MLG_T, MLG_D);
        A->ck = t3(g, kv, MLG_HALF, A->keys, MLG_D);
        A->cv = t3(g, kv, MLG_HALF, A->keys, MLG_D);
        const uint16_t W[4] = {A->Wq, A->Wk, A->Wv, A->Wo};
        uint16_t w[4];
        weight_copies(g, W, w, 4);
        A->wq = w[0], A->wk = w[1], A->wv = w[2], A->wo = w[3];
    }
    A->bk = A->vals = A->Wb = MLG_NONE;
    if (L->first && !cross) {
        A->Wb = param(g, G_BIAS, "relative_attention_bias.weight", MLG_NB, MLG_H);
        A->bk = ml__graph_tensor(g, "relative position buckets (int64)", MLG_INT64, MLG_ACT, 2,
                                 MLG_T, MLG_T);
        A->vals = ml__graph_tensor(g, "relative_attention_bias output", MLG_STREAM, MLG_ACT, 3,
                                   MLG_T, MLG_T, MLG_H);
    }
    /* named as the chain's side tensor it is (ledger/chain_graph_t5.c) */
    A->bias = t4(g,
                 cross        ? "cross-attention position bias (B, H, Td, Ts)"
                 : L->decoder ? "decoder self-attention position bias (B, H, Td, Td)"
                              : "encoder position bias (B, H, Ts, Ts)",
                 MLG_STREAM, A->keys, MLG_T_SIDE);
    if (!L->first)
        g->t[A->bias].role = MLG_INPUT;
    A->q = t3(g, "q (scores matmul)", MLG_COMPUTE, MLG_T, MLG_DQ);
    A->k = t3(g, "k (scores matmul)", MLG_COMPUTE, A->keys, MLG_DQ);
    A->S = t4(g, "scores", MLG_COMPUTE, A->keys, MLG_T_TMP);
    A->Sf = L->fp32_compute ? MLG_NONE : t4(g, "scores (float)", MLG_FP32, A->keys, 0);
    A->P = t4(g, "softmax output (fp32)", MLG_FP32, A->keys, MLG_T_CORE);
    A->Pc = L->fp32_compute ? MLG_NONE
                            : t4(g, "attention probabilities (type_as cast)", MLG_COMPUTE,
                                 A->keys, MLG_T_CORE);
    A->mask = A->Pd = MLG_NONE;
    if (L->dropout) {
        A->mask = t4(g, "attention dropout mask", MLG_BOOL, A->keys, MLG_T_CORE);
        A->Pd = t4(g, "attention probabilities (dropout output)", MLG_COMPUTE, A->keys,
                   MLG_T_CORE);
    }
    A->v = t3(g, "v (context matmul)", MLG_COMPUTE, A->keys, MLG_DQ);
    A->ctx = ml__graph_tensor(g, "context", MLG_COMPUTE, MLG_ACT, 4, MLG_B, MLG_H, MLG_T, MLG_DH);
    A->oin = t3(g, "o input (heads merged)", MLG_COMPUTE, MLG_T, MLG_DQ);
    A->o = t3(g, "o output", MLG_COMPUTE, MLG_T, MLG_D);
    flag(g, A->o, MLG_T_TMP);
    A->dmask = A->dout = MLG_NONE;
    if (L->dropout) {
        A->dmask = t3(g, "attention output dropout mask", MLG_BOOL, MLG_T, MLG_D);
        A->dout = t3(g, "attention output (dropout)", MLG_COMPUTE, MLG_T, MLG_D);
    }
}

/* The position bias: the first layer's self-attention computes it
 * (_relative_position_bucket, the embedding, the mask added), the first
 * cross-attention's is zeros plus the mask; the other layers read it. */
static void bias_ops(ml_graph *g, const t5_attn *A)
{
    if (A->bk != MLG_NONE) {
        ml__graph_step(g, MLG_OP_ELEMENTWISE, "_relative_position_bucket", A->cpos, A->bk,
                       NULL);
        mlg_op *o = ml__kit_grad_step(g, MLG_OP_COPY, "embedding", A->bk, A->vals, "EmbeddingBackward0");
        ml__op_save(o, A->bk);
        ml__op_param(o, A->Wb);
        o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "add (mask)", A->vals, A->bias, NULL);
        ml__op_in(o, A->amask);
        ml__op_free(o, A->vals);
    } else if (g->t[A->bias].role != MLG_INPUT) {
        ml__graph_step(g, MLG_OP_ELEMENTWISE, "zeros + mask", A->amask, A->bias, NULL);
    }
}

/* The attention's ops: projections, scores, the bias, softmax, dropout,
 * the context, the output projection and its dropout. */
static void attn_ops(ml_graph *g, const t5_attn *A, uint16_t y)
{
    t5_linear(g, "q", y, A->cq, A->wq, A->Wq, A->q, MLG_T);
    t5_linear(g, "k", A->kx, A->ck, A->wk, A->Wk, A->k, A->keys);
    t5_linear(g, "v", A->kx, A->cv, A->wv, A->Wv, A->v, A->keys);
    mlg_op *o = ml__kit_grad_step(g, MLG_OP_MATMUL, "matmul (scores)", A->q, A->S, "UnsafeViewBackward0");
    ml__op_in(o, A->k);
    ml__op_save(o, A->q);
    ml__op_save(o, A->k);
    ml__op_flops(o, 2.0, 5, MLG_B, MLG_H, MLG_T, A->keys, MLG_DH);
    o->core = true;
    bias_ops(g, A);
    o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "add_ (position bias)", A->S, MLG_NONE, NULL);
    ml__op_in(o, A->bias);
    uint16_t s = A->S;
    if (A->Sf != MLG_NONE) {
        ml__op_free(ml__kit_grad_step(g, MLG_OP_COPY, "float", s, A->Sf, "ToCopyBackward0"), s);
        s = A->Sf;
    }
    o = ml__kit_grad_step(g, MLG_OP_SOFTMAX, "softmax", s, A->P, "SoftmaxBackward0");
    ml__op_save(o, A->P);
    ml__op_free(o, s);
    uint16_t p = A->P;
    if (A->Pc != MLG_NONE) {
        ml__kit_grad_step(g, MLG_OP_COPY, "type_as", p, A->Pc, "ToCopyBackward0");
        p = A->Pc;
    }
    if (A->Pd != MLG_NONE) {
        t5_dropout(g, p, A->Pd, A->mask);
        p = A->Pd;
    }
    o = ml__kit_grad_step(g, MLG_OP_MATMUL, "matmul (context)", p, A->ctx, "UnsafeViewBackward0");
    ml__op_in(o, A->v);
    ml__op_save(o, p);
    ml__op_save(o, A->v);
    ml__op_flops(o, 2.0, 5, MLG_B, MLG_H, MLG_T, A->keys, MLG_DH);
    o->core = true;
    ml__op_free(ml__kit_grad_step(g, MLG_OP_COPY, "transpose contiguous", A->ctx, A->oin, "CloneBackward0"),
                A->ctx);
    t5_linear(g, "o", A->oin, MLG_NONE, A->wo, A->Wo, A->o, MLG_T);
    if (A->dout != MLG_NONE)
        t5_dropout(g, A->o, A->dout, A->dmask);
}

/* T5LayerSelfAttention or T5LayerCrossAttention (enc: the encoder's
 * output) on x (xf: the fp32 copy its residual declared): the norm, the
 * attention, dropout, the residual; returns the sum, *xf the next norm's
 * copy. */
static uint16_t t5_attention(ml_graph *g, const mlg_t5 *L, uint16_t x, uint16_t *xf,
                             uint16_t enc, const uint16_t args[3])
{
    const bool cross = enc != MLG_NONE;
    const uint16_t y = t5_norm(g, L, x, *xf, "q input", cross ? G_CA_NORM : G_SA_NORM);
    t5_attn A;
    attn_tensors(g, L, y, enc, &A);
    A.amask = cross ? args[2] : args[0];
    A.cpos = args[1];
    attn_ops(g, &A, y);
    return t5_residual(g, L, x, A.dout != MLG_NONE ? A.dout : A.o, true, xf);
}

/* gelu_new of h0 (ml__kit_gelu_new: fp32 under autocast but 0.5 * x);
 * wi_1 of y (c1, w1, W1: its copies, parameter) into h1; returns the
 * gated product, in the activation's dtype. */
static uint16_t gated_gelu(ml_graph *g, const mlg_t5 *L, uint16_t h0, uint16_t y, uint16_t c1,
                           uint16_t w1, uint16_t W1)
{
    const uint8_t p = L->autocast ? MLG_FP32 : MLG_COMPUTE;
    uint16_t ge = ml__kit_gelu_new(g, L->autocast, h0, "gelu_new output (gate)", false);
    uint16_t h1 = t3(g, "wi_1 output", MLG_COMPUTE, MLG_T, MLG_F);
    uint16_t pr = t3(g, "wo input (gated product)", p, MLG_T, MLG_F);
    t5_linear(g, "wi_1", y, c1, w1, W1, h1, MLG_T);
    mlg_op *o = ml__kit_grad_step(g, MLG_OP_ELEMENTWISE, "mul (gate)", ge, pr, "MulBackward0");
    ml__op_in(o, h1);
    ml__op_save(o, ge);
    ml__op_save(o, h1);
    ml__op_free(o, ge);
    ml__op_free(o, h1);
    return pr;
}

/* The activation of h0 (wi's output): ReLU, or the gated GELU with wi_1 of
 * y (its copies c1, w1 and parameter W1). */
static uint16_t activation(ml_graph *g, const mlg_t5 *L, uint16_t h0, uint16_t y, uint16_t c1,
                           uint16_t w1, uint16_t W1)
{
    if (L->gated)
        return gated_gelu(g, L, h0, y, c1, w1, W1);
    uint16_t r = t3(g, "relu output", MLG_COMPUTE, MLG_T, MLG_F);
    mlg_op *o = ml__kit_grad_step(g, MLG_OP_ELEMENTWISE, "relu", h0, r, "ReluBackward0");
    ml__op_save(o, r);
    ml__op_free(o, h0);
    return r;
}

/* wo's input from the activation act (its dtype p): dropout, and under
 * autocast an activation that is not fp32 cast to wo's fp32 weight
 * (.to(wo.weight.dtype)), which autocast casts back (*c: the copy wo
 * saves). The mask, the cast and the copy are declared here. */
static uint16_t wo_input(ml_graph *g, const mlg_t5 *L, uint16_t act, uint16_t *c)
{
    const uint8_t p = g->t[act].dtype;
    uint16_t x = act, m = MLG_NONE, d = MLG_NONE, up = MLG_NONE;
    *c = MLG_NONE;
    if (L->dropout) {
        m = t3(g, "feed-forward dropout mask", MLG_BOOL, MLG_T, MLG_F);
        d = t3(g, "wo input (dropout output)", p, MLG_T, MLG_F);
    }
    if (L->autocast) {
        if (p != MLG_FP32) {
            up = t3(g, "wo input (.to(wo.weight.dtype))", MLG_FP32, MLG_T, MLG_F);
            flag(g, up, MLG_T_TMP);
        }
        *c = t3(g, "wo input (autocast's cast)", MLG_HALF, MLG_T, MLG_F);
    }
    if (d != MLG_NONE) {
        t5_dropout(g, x, d, m);
        x = d;
    }
    if (up != MLG_NONE) {
        ml__op_free(ml__kit_grad_step(g, MLG_OP_COPY, "to (wo.weight.dtype)", x, up, "ToCopyBackward0"), x);
        x = up;
    }
    return x;
}

/* T5LayerFF on x (xf: its residual's fp32 copy): the norm, wi (or wi_0
 * and wi_1), the activation, dropout, wo, dropout, the residual. */
static uint16_t t5_ff(ml_graph *g, const mlg_t5 *L, uint16_t x, uint16_t xf)
{
    const uint16_t y = t5_norm(g, L, x, xf, L->gated ? "wi_0/wi_1 input" : "wi input", G_FF_NORM);
    uint16_t W[3];
    W[0] = param(g, G_FF, L->gated ? "wi_0.weight" : "wi.weight", MLG_D, MLG_F);
    W[1] = L->gated ? param(g, G_FF, "wi_1.weight", MLG_D, MLG_F) : MLG_NONE;
    W[2] = param(g, G_FF, "wo.weight", MLG_F, MLG_D);
    uint16_t c[2] = {MLG_NONE, MLG_NONE}, w[3] = {MLG_NONE, MLG_NONE, MLG_NONE};
    if (L->autocast) {
        const char *name = L->gated ? "wi_0/wi_1 input" : "wi input";
        c[0] = t3(g, name, MLG_HALF, MLG_T, MLG_D);
        c[1] = L->gated ? t3(g, name, MLG_HALF, MLG_T, MLG_D) : MLG_NONE;
        const uint16_t Wl[3] = {W[0], W[L->gated ? 1 : 2], W[2]};
        uint16_t wl[3];
        weight_copies(g, Wl, wl, L->gated ? 3 : 2);
        w[0] = wl[0];
        w[1] = L->gated ? wl[1] : MLG_NONE;
        w[2] = wl[L->gated ? 2 : 1];
    }
    uint16_t h0 = t3(g, L->gated ? (L->autocast ? "wi_0 output" : "wi_0 output (pow)")
                                 : "wi output",
                     MLG_COMPUTE, MLG_T, MLG_F);
    flag(g, h0, MLG_T_TMP);
    t5_linear(g, L->gated ? "wi_0" : "wi", y, c[0], w[0], W[0], h0, MLG_T);
    const uint16_t act = activation(g, L, h0, y, c[1], w[1], W[1]);
    uint16_t cw;
    const uint16_t xin = wo_input(g, L, act, &cw);
    uint16_t out = t3(g, "wo output", MLG_COMPUTE, MLG_T, MLG_D);
    flag(g, out, MLG_T_TMP);
    uint16_t m = MLG_NONE, d = MLG_NONE;
    if (L->dropout) {
        m = t3(g, "feed-forward output dropout mask", MLG_BOOL, MLG_T, MLG_D);
        d = t3(g, "feed-forward output (dropout)", MLG_COMPUTE, MLG_T, MLG_D);
    }
    t5_linear(g, "wo", xin, cw, w[2], W[2], out, MLG_T);
    if (d != MLG_NONE)
        t5_dropout(g, out, d, m);
    uint16_t none;
    return t5_residual(g, L, x, d != MLG_NONE ? d : out, false, &none);
}

bool ml__family_t5_layer(const ml_model *m, const mlg_config *c, bool decoder, bool first,
                         mlg_t5 *L)
{
    if (m->type != ML_MODEL_ENCDEC)
        return false;
    *L = (mlg_t5){.decoder = decoder,
                  .first = first,
                  .gated = m->mlp.activation == ML_ACT_GEGLU,
                  .dropout = m->dropout > 0 && !c->eval,
                  .autocast = c->autocast,
                  .half_stream = c->stream_bytes != 4,
                  .fp32_compute = c->compute_bytes == 4};
    return true;
}

void ml__kit_t5_layer(ml_graph *g, const mlg_t5 *L)
{
    ml__graph_init(g);
    uint16_t x = ml__graph_tensor(g, stream_name(L), MLG_STREAM, MLG_INPUT, 3, MLG_B, MLG_T,
                                  MLG_D);
    uint16_t xf = MLG_NONE;
    uint16_t args[3]; /* T5Stack's arguments to its blocks (kit_t5_stack.c) */
    ml__kit_t5_args(g, L, args);
    x = t5_attention(g, L, x, &xf, MLG_NONE, args);
    if (L->decoder) {
        uint16_t enc = ml__graph_tensor(g, "encoder output", MLG_STREAM, MLG_INPUT, 3, MLG_B,
                                        MLG_TS, MLG_D);
        flag(g, enc, MLG_T_SIDE);
        x = t5_attention(g, L, x, &xf, enc, args);
    }
    g->out = t5_ff(g, L, x, xf);
}

void ml__kit_t5_final(ml_graph *g, const mlg_t5 *L)
{
    ml__graph_init(g);
    /* the builders listed the norm's fp32 copy before its input */
    const uint16_t xf = fp32_copy(g, L);
    uint16_t x = ml__graph_tensor(g, stream_name(L), MLG_STREAM, MLG_INPUT, 3, MLG_B, MLG_T,
                                  MLG_D);
    uint16_t y = t5_norm(g, L, x, xf, L->dropout ? "final layer norm output" : "encoder output",
                         0);
    flag(g, y, MLG_T_TMP);
    if (L->dropout) {
        uint16_t m = t3(g, "encoder output dropout mask", MLG_BOOL, MLG_T, MLG_D);
        uint16_t d = t3(g, "encoder output", MLG_STREAM, MLG_T, MLG_D);
        t5_dropout(g, y, d, m);
        y = d;
    }
    /* the stack's return value, which the decoder's layers read */
    flag(g, y, MLG_T_SIDE);
    g->out = y;
}

void ml__kit_t5_head(ml_graph *g, const mlg_t5 *L, bool tied)
{
    ml__graph_init(g);
    const uint16_t xf = fp32_copy(g, L);
    uint16_t x = ml__graph_tensor(g, stream_name(L), MLG_STREAM, MLG_INPUT, 3, MLG_B, MLG_T,
                                  MLG_D);
    uint16_t y = t5_norm(g, L, x, xf, "lm_head input", 0);
    flag(g, y, MLG_T_TMP);
    if (L->dropout) {
        uint16_t m = t3(g, "decoder output dropout mask", MLG_BOOL, MLG_T, MLG_D);
        uint16_t d = t3(g, "lm_head input", MLG_STREAM, MLG_T, MLG_D);
        t5_dropout(g, y, d, m);
        y = d;
    }
    if (tied) { /* * D^-0.5, a Python float: nothing saved */
        uint16_t r = t3(g, "lm_head input", MLG_STREAM, MLG_T, MLG_D);
        ml__op_free(ml__kit_grad_step(g, MLG_OP_ELEMENTWISE, "mul (D^-0.5)", y, r, "MulBackward0"), y);
        y = r;
    }
    uint16_t c = MLG_NONE, w = MLG_NONE;
    if (L->autocast && !L->half_stream)
        c = t3(g, "lm_head input", MLG_HALF, MLG_T, MLG_D);
    const uint16_t W = param(g, 0, "lm_head.weight", MLG_V, MLG_D);
    if (tied)
        g->t[W].flags |= MLG_T_SHARED;
    if (L->autocast)
        weight_copies(g, &W, &w, 1);
    uint16_t z = t3(g, "logits", MLG_COMPUTE, MLG_T, MLG_V);
    t5_linear(g, "lm_head", y, c, w, W, z, MLG_T);
    g->out = z;
}
