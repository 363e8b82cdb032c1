/* The component kit (kit.h). Each component lists its ops in the order the
 * reference implementation runs them, with the Python references it drops
 * as it returns (nanoGPT's Block, CausalSelfAttention and MLP) and the
 * copies ATen makes (matmul copies a head view it cannot fold into bmm's
 * batch, aten/src/ATen/native/LinearAlgebra.cpp). A block's saved
 * inventory lists its saved tensors in the order they are declared here
 * (docs/graph.md, "The inventory pass"). */
#include <stddef.h>

#include "graph/kit.h"

/* A tensor of the residual stream's shape. */
static uint16_t stream(ml_graph *g, const char *name, uint8_t dtype)
{
    return ml__graph_tensor(g, name, dtype, MLG_ACT, 3, MLG_B, MLG_T, MLG_D);
}

uint16_t ml__kit_param(ml_graph *g, const char *name, uint8_t rows, int cols)
{
    if (cols < 0)
        return ml__graph_tensor(g, name, MLG_PARAM, MLG_PARAMETER, 1, rows);
    return ml__graph_tensor(g, name, MLG_PARAM, MLG_PARAMETER, 2, rows, cols);
}

/* autocast's fp32 inputs: the stream (fp32 under autocast) or an fp32
 * tensor */
static bool cast_input(const ml_graph *g, const mlg_layer *L, uint16_t x)
{
    return L->autocast && (g->t[x].dtype == MLG_STREAM || g->t[x].dtype == MLG_FP32);
}

/* autocast's low-precision copy of an fp32 x (casts of activations are
 * not cached: one per consumer), made now; MLG_NONE without autocast. */
uint16_t ml__kit_cast_copy(ml_graph *g, const mlg_layer *L, uint16_t x)
{
    if (!cast_input(g, L, x))
        return MLG_NONE;
    const mlg_tensor *s = &g->t[x];
    uint16_t c = ml__graph_tensor(g, "linear input (autocast copy)", MLG_HALF, MLG_ACT, s->ndim,
                                  s->dim[0], s->dim[1], s->dim[2]);
    return c;
}

/* autocast's copy of a weight, which the matmul saves (cached per forward). */
uint16_t ml__kit_weight_copy(ml_graph *g, const mlg_layer *L, uint8_t in, uint8_t out)
{
    if (!L->autocast)
        return MLG_NONE;
    uint16_t w = ml__graph_tensor(g, "weight (autocast copy)", MLG_HALF, MLG_ACT, 2, in, out);
    if (w != MLG_NONE)
        g->t[w].flags |= MLG_T_WCAST;
    return w;
}

/* The cast ops making copies c (of x) and w (of the weight W): their
 * kernels and bytes, before the linear that reads them. Autocast's wrapper
 * casts the op's arguments as it passes them on (aten/src/ATen/autocast_mode.h,
 * WrapFunction_: cached_cast(args)... in the call's argument list), which
 * the compilers PyTorch is built with evaluate last to first: the weight's
 * copy is made before the input's (seen on the CPU, 1.13, and in the H200
 * runs' allocator traces, 2.11). */
void ml__kit_cast_ops(ml_graph *g, uint16_t x, uint16_t c, uint16_t w, uint16_t W)
{
    if (w != MLG_NONE)
        ml__graph_step(g, MLG_OP_COPY, "to (autocast, weight)", W, w, NULL);
    if (c != MLG_NONE)
        ml__graph_step(g, MLG_OP_COPY, "to (autocast, input)", x, c, NULL);
}

/* The linear itself, reading xs (x or its cast copy c) and the weight copy
 * w; the copies' references go once it has run. */
mlg_op *ml__kit_linear_with(ml_graph *g, const mlg_linear *lin, uint16_t x, uint16_t c,
                            uint16_t w, uint16_t y)
{
    const uint16_t W = ml__kit_param(g, "weight", lin->in, lin->out);
    const uint16_t bias = lin->bias ? ml__kit_param(g, "bias", lin->out, -1) : MLG_NONE;
    ml__kit_cast_ops(g, x, c, w, W);
    const uint16_t xs = c != MLG_NONE ? c : x;
    mlg_op *o = ml__graph_step(g, MLG_OP_MATMUL, lin->name, xs, y, NULL);
    ml__op_save(o, xs);
    ml__op_save(o, w);
    ml__op_param(o, W);
    ml__op_param(o, bias);
    ml__op_flops(o, 2.0, 4, MLG_B, MLG_T, lin->in, lin->out);
    ml__op_free(o, c);
    ml__op_free(o, w);
    ml__op_node(o, lin->node);
    ml__op_gin(o, x);
    return o;
}

mlg_op *ml__kit_linear(ml_graph *g, const mlg_layer *L, const mlg_linear *lin, uint16_t x,
                       uint16_t y)
{
    uint16_t c = ml__kit_cast_copy(g, L, x);
    uint16_t w = ml__kit_weight_copy(g, L, lin->in, lin->out);
    return ml__kit_linear_with(g, lin, x, c, w, y);
}

uint16_t ml__kit_layernorm_stats(ml_graph *g)
{
    uint16_t st = ml__graph_tensor(g, "layernorm mean+rstd", MLG_FP32, MLG_ACT, 2, MLG_B, MLG_T);
    if (st != MLG_NONE)
        g->t[st].factor = 2;
    return st;
}

uint16_t ml__kit_norm(ml_graph *g, const mlg_norm *n, uint16_t x, bool xbuf)
{
    if (n->kind == MLG_RMSNORM)
        return ml__kit_rmsnorm(g, n, x, xbuf);
    if (n->kind == MLG_OLMO_LAYERNORM)
        return ml__kit_olmo_norm(g, n, x, xbuf);
    if (n->kind == MLG_GEMMA_RMSNORM)
        return ml__kit_gemma_norm(g, n, x, xbuf);
    return ml__kit_layernorm(g, n, x, xbuf, ml__kit_layernorm_stats(g));
}

/* LayerNorm: native_layer_norm saves its input, mean and rstd (fp32 per
 * row); its backward's input gradient goes into the stream's buffer. */
uint16_t ml__kit_layernorm(ml_graph *g, const mlg_norm *n, uint16_t x, bool xbuf, uint16_t st)
{
    uint16_t h = stream(g, "layernorm output", g->t[x].dtype);
    if (h != MLG_NONE)
        g->t[h].flags |= MLG_T_TMP;
    mlg_op *o = ml__graph_step(g, MLG_OP_NORM, "native_layer_norm", x, h, NULL);
    ml__op_out(o, st);
    ml__op_save(o, x);
    ml__op_save(o, st);
    ml__op_param(o, ml__kit_param(g, "weight", MLG_D, -1));
    if (n->bias)
        ml__op_param(o, ml__kit_param(g, "bias", MLG_D, -1));
    ml__op_free(o, st);
    ml__op_node(o, "NativeLayerNormBackward0");
    ml__op_gin(o, x);
    if (!n->held)
        ml__op_gout(o, h);
    if (xbuf)
        o->accum = x;
    return h;
}

uint16_t ml__kit_dropout(ml_graph *g, bool on, uint16_t x, const char *node, bool core,
                         bool held)
{
    if (!on)
        return x;
    const mlg_tensor *s = &g->t[x];
    /* the mask is declared first: the inventory lists it before a saved
     * output (the PV matmul saves the attention dropout's) */
    uint16_t y, mask;
    if (s->ndim == 4) {
        mask = ml__graph_tensor(g, "dropout mask", MLG_BOOL, MLG_ACT, 4, s->dim[0], s->dim[1],
                                s->dim[2], s->dim[3]);
        y = ml__graph_tensor(g, "dropout output", s->dtype, MLG_ACT, 4, s->dim[0], s->dim[1],
                             s->dim[2], s->dim[3]);
    } else {
        mask = ml__graph_tensor(g, "dropout mask", MLG_BOOL, MLG_ACT, 3, s->dim[0], s->dim[1],
                                s->dim[2]);
        y = ml__graph_tensor(g, "dropout output", s->dtype, MLG_ACT, 3, s->dim[0], s->dim[1],
                             s->dim[2]);
    }
    if (core && y != MLG_NONE && mask != MLG_NONE) {
        g->t[y].flags |= MLG_T_CORE;
        g->t[mask].flags |= MLG_T_CORE;
    }
    /* native_dropout: its output and the 1-byte mask it saves */
    mlg_op *o = ml__graph_step(g, MLG_OP_DROPOUT, "native_dropout", x, y, NULL);
    ml__op_out(o, mask);
    ml__op_save(o, mask);
    ml__op_free(o, mask);
    ml__op_free(o, x);
    ml__op_node(o, node);
    ml__op_gin(o, x);
    if (!held)
        ml__op_gout(o, y);
    return y;
}

/* The op making x + y (a new tensor of x's dtype) into *r. */
static mlg_op *add_op(ml_graph *g, uint16_t x, uint16_t y, uint16_t *r)
{
    *r = stream(g, "sum", g->t[x].dtype);
    mlg_op *o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "add", x, *r, NULL);
    ml__op_in(o, y);
    return o;
}

uint16_t ml__kit_add(ml_graph *g, uint16_t x, uint16_t y)
{
    uint16_t r;
    add_op(g, x, y, &r);
    return r;
}

uint16_t ml__kit_residual(ml_graph *g, uint16_t x, uint16_t y)
{
    /* the branch's reference goes with the add; AddBackward0 hands the
     * one gradient to both: no node of its own */
    uint16_t r;
    ml__op_free(add_op(g, x, y, &r), y);
    return r;
}

uint16_t ml__kit_layer_residual(ml_graph *g, const mlg_layer *L, uint16_t x, uint16_t y,
                               bool keep)
{
    uint16_t r;
    mlg_op *o = add_op(g, x, y, &r);
    if (!keep)
        ml__op_free(o, y);
    /* under autocast the stream is fp32 and the branch's output the compute
     * dtype: the sum is fp32 and AddBackward0 casts the gradient it hands
     * the branch to that dtype, a tensor of its own (the stream's it hands
     * on); the branch's last node frees it (out_grad) */
    if (L->autocast) {
        ml__op_node(o, "AddBackward0 (residual: the branch's gradient cast)");
        ml__op_gin(o, y);
    }
    return r;
}

/* softmax(x) under autocast is softmax(x, dtype=fp32) (autocast_mode.h's
 * fp32_set_opt_dtype), which copies bf16 scores to fp32 first
 * (aten/src/ATen/native/SoftMax.cpp; fp16 converts inside CUDA's kernel):
 * the copy's ToCopyBackward0 casts the fp32 input gradient back. Returns
 * the softmax's input. */
static uint16_t softmax_input(ml_graph *g, uint16_t S, bool copy)
{
    if (!copy)
        return S;
    uint16_t Sc = ml__kit_scores(g, "scores (fp32 copy)", MLG_FP32, 0);
    ml__graph_step(g, MLG_OP_COPY, "to (fp32, softmax input)", S, Sc,
                   "ToCopyBackward0 (softmax input)");
    return Sc;
}

/* The softmax of the scores S into P (in the stream's dtype: autocast runs
 * it in fp32, on an fp32 copy of bf16 scores where copy), saving P; S and
 * the copy go. */
static uint16_t softmax_saving(ml_graph *g, uint16_t S, uint16_t P, bool copy)
{
    uint16_t Sx = softmax_input(g, S, copy);
    mlg_op *o = ml__graph_step(g, MLG_OP_SOFTMAX, "softmax", Sx, P, "SoftmaxBackward0");
    ml__op_save(o, P);
    ml__op_free(o, S);
    ml__op_free(o, Sx != S ? Sx : MLG_NONE);
    return P;
}

/* The eager core from q k^T to the softmax: the operands' contiguous
 * copies bmm saves (one saved entry for q's and k's, released by the q k^T
 * node; with fold_views the heads themselves), scale, masked_fill (mask),
 * softmax (copy: on an fp32 copy of the scores, autocast's). Returns the
 * probabilities. */
static uint16_t eager_scores(ml_graph *g, const mlg_attention *a, uint16_t qh, uint16_t kh,
                             bool mask, bool copy)
{
    uint16_t S1;
    if (a->fold_views) {
        S1 = ml__kit_scores(g, "scores (q k^T)", MLG_COMPUTE, MLG_T_TMP);
        ml__kit_qk(g, qh, kh, S1);
    } else {
        uint16_t qkc = ml__kit_heads(g, "q, k contiguous copies (bmm)", MLG_H);
        if (qkc != MLG_NONE)
            g->t[qkc].factor = 2;
        S1 = ml__kit_scores(g, "scores (q k^T)", MLG_COMPUTE, MLG_T_TMP);
        mlg_op *o = ml__graph_op(g, MLG_OP_COPY, "contiguous (q, k for bmm)");
        ml__op_in(o, qh);
        ml__op_in(o, kh);
        ml__op_out(o, qkc);
        ml__op_free(ml__kit_qk(g, qkc, MLG_NONE, S1), qkc);
    }
    uint16_t S2 = ml__kit_scale(g, S1);
    if (!mask)
        return softmax_saving(
            g, S2, ml__kit_scores(g, "softmax output", MLG_STREAM, MLG_T_CORE), copy);
    /* nanoGPT's bias[:, :, :T, :T] == 0, a (T, T) bool masked_fill saves */
    uint16_t TT = ml__graph_tensor(g, "causal mask (masked_fill, bool)", MLG_BOOL, MLG_ACT, 2,
                                   MLG_T, MLG_T);
    if (TT != MLG_NONE)
        g->t[TT].flags |= MLG_T_CORE;
    uint16_t P = ml__kit_scores(g, "softmax output", MLG_STREAM, MLG_T_CORE);
    mlg_op *o = ml__graph_op(g, MLG_OP_ELEMENTWISE, "eq (causal mask)");
    ml__op_out(o, TT);
    uint16_t S3 = ml__kit_scores(g, "scores (masked)", MLG_COMPUTE, 0);
    o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "masked_fill", S2, S3, "MaskedFillBackward0");
    ml__op_in(o, TT);
    ml__op_save(o, TT);
    ml__op_free(o, TT);
    ml__op_free(o, S2);
    return softmax_saving(g, S3, P, copy);
}

/* The probabilities' dropout, autocast's cast back and the PV matmul with
 * v's contiguous copy, a saved entry of its own: BmmBackward0 (P v)
 * releases it, as the engine releases a node's saved variables once it
 * has run (engine.cpp, evaluate_function: fn.release_variables()), long
 * before the q k^T node releases q's and k's. Under autocast the PV
 * matmul casts the fp32 probabilities back: the copy is its wrapper's
 * argument, gone as the product returns (bmm saves it), and `att`, the
 * dropout's fp32 output, stays bound to the attention's end (nanoGPT's
 * `att = self.attn_dropout(att); y = att @ v`). Returns the last name
 * bound to the probabilities (the caller drops it). */
static uint16_t eager_pv(ml_graph *g, const mlg_layer *L, uint16_t P, uint16_t vh, uint16_t *O)
{
    uint16_t probs = ml__kit_dropout(g, L->attn.dropout, P, "NativeDropoutBackward0 (attention)",
                                     true, false);
    const uint16_t pc = L->autocast ? ml__kit_probs_copy(g, probs) : MLG_NONE;
    uint16_t vc = L->attn.fold_views ? MLG_NONE : ml__kit_heads(g, "v contiguous copy (bmm)", MLG_H);
    if (vc != MLG_NONE)
        ml__graph_step(g, MLG_OP_COPY, "contiguous (v for bmm)", vh, vc, NULL);
    const uint16_t vb = vc != MLG_NONE ? vc : vh;
    *O = pc != MLG_NONE ? ml__kit_pv_cast(g, pc, vb, vc) : ml__kit_pv(g, probs, vb, vc);
    return probs;
}

/* The q, k and v heads of a fused c_attn projection on h: its output (a
 * B x T x QKV tensor) and the views of it. */
typedef struct {
    uint16_t qkv, qh, kh, vh;
} qkv_heads;

static qkv_heads fused_projection(ml_graph *g, const mlg_layer *L, uint16_t h)
{
    const mlg_attention *a = &L->attn;
    qkv_heads r;
    /* c_attn: one projection to q, k and v (its output a B x T x QKV
     * tensor they are slices of) */
    uint16_t c = ml__kit_cast_copy(g, L, h), w = ml__kit_weight_copy(g, L, MLG_D, MLG_QKV);
    r.qkv = ml__graph_tensor(g, "q/k/v projection output", MLG_COMPUTE, MLG_ACT, 3, MLG_B, MLG_T,
                             MLG_QKV);
    if (r.qkv != MLG_NONE)
        g->t[r.qkv].flags |= MLG_T_TMP;
    const mlg_linear lin = {"addmm (q/k/v projection)",
                            a->qkv_bias ? "AddmmBackward0 (qkv projection)"
                                        : "MmBackward0 (qkv projection)",
                            MLG_D, MLG_QKV, a->qkv_bias};
    mlg_op *o = ml__kit_linear_with(g, &lin, h, c, w, r.qkv);
    ml__op_gout(o, r.qkv);
    uint16_t q = ml__graph_view(g, "q", r.qkv, 3, MLG_B, MLG_T, MLG_DQ);
    uint16_t k = ml__graph_view(g, "k", r.qkv, 3, MLG_B, MLG_T, MLG_DKV);
    uint16_t v = ml__graph_view(g, "v", r.qkv, 3, MLG_B, MLG_T, MLG_DKV);
    mlg_op *split = ml__graph_op(g, MLG_OP_VIEW, "split (q, k, v)");
    ml__op_in(split, r.qkv);
    ml__op_node(split, "SplitBackward0 (cat of q, k, v)");
    ml__op_gin(split, r.qkv);
    ml__op_gout(split, q);
    ml__op_gout(split, k);
    ml__op_gout(split, v);
    r.qh = ml__graph_view(g, "q heads", r.qkv, 4, MLG_B, MLG_H, MLG_T, MLG_DH);
    r.kh = ml__graph_view(g, "k heads", r.qkv, 4, MLG_B, MLG_HKV, MLG_T, MLG_DH);
    r.vh = ml__graph_view(g, "v heads", r.qkv, 4, MLG_B, MLG_HKV, MLG_T, MLG_DH);
    /* the head views' backward (ViewBackward0) reshapes the transposed
     * gradient: q's and v's arrive from bmm as contiguous heads and are
     * copied; k's, through k^T's bmm, merges back as a view (no node)
     * unless the rotary made it, whose slices' gradients are contiguous
     * heads */
    const uint16_t x[3] = {q, k, v}, hx[3] = {r.qh, r.kh, r.vh};
    static const char *const name[3][2] = {{"view (q heads)", "ViewBackward0 (q, contiguous copy)"},
                                           {"view (k heads)", "ViewBackward0 (k, contiguous copy)"},
                                           {"view (v heads)", "ViewBackward0 (v, contiguous copy)"}};
    for (unsigned i = 0; i < 3; i++)
        ml__kit_view_heads(g, name[i][0], i == 1 && !a->rope ? NULL : name[i][1], x[i], hx[i]);
    return r;
}

void ml__kit_free_storages(ml_graph *g, mlg_op *o, const uint16_t *t, unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        if (t[i] == MLG_NONE)
            continue;
        const uint16_t s = ml__graph_storage(g, t[i]);
        bool seen = false;
        for (unsigned j = 0; j < o->nfree; j++)
            seen |= ml__graph_storage(g, o->free[j]) == s;
        if (!seen)
            ml__op_free(o, s);
    }
}

uint16_t ml__kit_attention_out(ml_graph *g, const mlg_layer *L, uint16_t O, const uint16_t *f,
                               unsigned nf, uint16_t *Oc_out)
{
    const mlg_attention *a = &L->attn;
    /* y.transpose(1, 2).contiguous(): the output projection's input; a
     * view of a fused kernel's output, which it writes as (B, T, H, dh) and
     * returns transposed (cuda/attention.cu; ring attention's elementwise
     * merge keeps that layout): docs/inventory.md */
    const bool view = a->fused_kernel;
    uint16_t Oc = view ? ml__graph_view(g, "output projection input (the kernel's output)", O, 3,
                                        MLG_B, MLG_T, MLG_DQ)
                       : ml__graph_tensor(g, "output projection input", MLG_COMPUTE, MLG_ACT, 3,
                                          MLG_B, MLG_T, MLG_DQ);
    mlg_op *o = view ? ml__graph_op(g, MLG_OP_VIEW, "transpose (attention output)")
                     : ml__graph_step(g, MLG_OP_COPY, "contiguous (attention output)", O, Oc,
                                      NULL);
    ml__op_free(o, view ? MLG_NONE : O); /* (a view's storage is O's: freed with it) */
    ml__kit_free_storages(g, o, f, nf);
    /* its node: the product's (B, H, T, dh) view of bmm's output reshapes
     * the transposed gradient, a copy, but for a batch of one (a view: O's
     * gradient is Oc's, passed on) */
    ml__op_node(o, view || a->fold_views ? NULL : "UnsafeViewBackward0 (attention output)");
    ml__op_gin(o, O);
    ml__op_gout(o, Oc);
    /* c_proj, then the residual dropout; the projection's output gradient
     * is the residual's (the skip's buffer holds it) unless a dropout made
     * its own */
    uint16_t A = ml__graph_tensor(g, "output projection output", MLG_COMPUTE, MLG_ACT, 3, MLG_B,
                                  MLG_T, MLG_D);
    if (A != MLG_NONE)
        g->t[A].flags |= MLG_T_TMP;
    const mlg_linear out = {"addmm (output projection)",
                            a->out_bias ? "AddmmBackward0 (output projection)"
                                        : "MmBackward0 (output projection)",
                            MLG_DQ, MLG_D, a->out_bias};
    const uint8_t grp = g->group;
    if (a->o_first)
        g->group = ml__kit_group(L, MLG_GROUP_ATTN_O);
    o = ml__kit_linear(g, L, &out, Oc, A);
    g->group = grp;
    if (a->out_grad)
        ml__op_gout(o, A);
    uint16_t y = ml__kit_dropout(g, a->dropout, A, "NativeDropoutBackward0 (residual)", false,
                                 !L->autocast);
    *Oc_out = Oc;
    return y;
}

/* scaled_dot_product_attention on nanoGPT's heads (flash,
 * memory-efficient): saves q, k and v, its output and the per-row
 * logsumexp; no T x T tensor exists. Unrotated, q, k and v are views of
 * c_attn's output (one saved entry, qkv); with the rotary, q and k are the
 * rotary's outputs (one entry) and v's view keeps qkv whole. Returns the
 * output. */
static uint16_t nanogpt_fused(ml_graph *g, uint16_t qkv, uint16_t qh, uint16_t kh, uint16_t vh,
                              const mlg_attention *a)
{
    const bool rope = a->rope;
    uint16_t O = ml__kit_heads(g, "attention output (fused)", MLG_H);
    uint16_t lse = ml__graph_tensor(g, "logsumexp", MLG_FP32, MLG_ACT, 3, MLG_B, MLG_H, MLG_T);
    const uint16_t ring = ml__kit_ring_open(g, a->ring);
    mlg_op *o = ml__graph_op(g, MLG_OP_ATTENTION, "scaled_dot_product_attention");
    o->causal = !a->unmasked;
    ml__op_in(o, qh);
    ml__op_in(o, kh);
    ml__op_in(o, vh);
    ml__op_out(o, O);
    ml__op_out(o, lse);
    if (rope) {
        if (kh != MLG_NONE)
            g->t[kh].base = qh; /* listed as one, the rotated q and k */
        ml__op_save(o, qh);
        ml__op_save(o, kh);
    }
    ml__op_save(o, qkv);
    ml__op_save(o, O);
    ml__op_save(o, lse);
    ml__op_flops(o, 4.0, 5, MLG_B, MLG_H, MLG_T, MLG_TKV, MLG_DH);
    ml__kit_ring_close(g, ring);
    return O;
}

uint16_t ml__kit_attention(ml_graph *g, const mlg_layer *L, uint16_t h)
{
    const mlg_attention *a = &L->attn;
    const qkv_heads r = fused_projection(g, L, h);
    const uint16_t qkv = r.qkv, vh = r.vh;
    uint16_t qh = r.qh, kh = r.kh;
    if (a->rope) {
        /* HF's apply_rotary_pos_emb on nanoGPT's q and k heads (views of
         * c_attn's output, rebound to the rotated: new tensors, in q's
         * layout, alive until the attention returns) */
        qh = ml__kit_rope(g, r.qh, MLG_H, MLG_COMPUTE, NULL);
        kh = ml__kit_rope(g, r.kh, MLG_H, MLG_COMPUTE, NULL);
    }
    mlg_op *o;
    uint16_t O, probs = MLG_NONE;
    if (a->fused_kernel) {
        O = nanogpt_fused(g, qkv, qh, kh, vh, a);
    } else {
        uint16_t P = eager_scores(g, a, qh, kh, !a->unmasked && !a->fused_softmax,
                                  L->autocast && a->softmax_copy);
        probs = eager_pv(g, L, P, vh, &O);
    }
    uint16_t Oc, y = ml__kit_attention_out(g, L, O, NULL, 0, &Oc);
    /* the attention returns: the projection's input (saved), the q/k/v
     * output, the rotated q and k and the probabilities go */
    o = ml__graph_release(g, "attention returns");
    ml__op_free(o, Oc);
    ml__op_free(o, qkv);
    if (a->rope) {
        ml__op_free(o, qh);
        ml__op_free(o, kh);
    }
    ml__op_free(o, probs);
    return y;
}

uint16_t ml__kit_mlp(ml_graph *g, const mlg_layer *L, uint16_t h, uint16_t *kept)
{
    const mlg_mlp *p = &L->mlp;
    if (p->act == MLG_SWIGLU || p->act == MLG_GEGLU)
        return ml__kit_glu_mlp(g, L, h);
    if (p->act == MLG_QUICK_GELU)
        return ml__kit_quick_gelu_mlp(g, L, h);
    /* autocast: the input's copy and both weights' copies (the inventory
     * lists them before the activations) */
    uint16_t c = ml__kit_cast_copy(g, L, h);
    uint16_t w1 = ml__kit_weight_copy(g, L, MLG_D, MLG_F);
    uint16_t w2 = ml__kit_weight_copy(g, L, MLG_F, MLG_D);
    uint16_t F1 = ml__graph_tensor(g, "fc output", MLG_COMPUTE, MLG_ACT, 3, MLG_B, MLG_T, MLG_F);
    const bool gelu_new = p->act == MLG_GELU_NEW;
    uint16_t G = gelu_new ? MLG_NONE
                          : ml__graph_tensor(g, "activation output (proj input)", MLG_COMPUTE,
                                             MLG_ACT, 3, MLG_B, MLG_T, MLG_F);
    uint16_t M = ml__graph_tensor(g, "MLP output", MLG_COMPUTE, MLG_ACT, 3, MLG_B, MLG_T, MLG_D);
    if (M != MLG_NONE)
        g->t[M].flags |= MLG_T_TMP;
    const mlg_linear fc = {"addmm (fc)",
                           p->bias ? "AddmmBackward0 (MLP in)" : "MmBackward0 (MLP in)", MLG_D,
                           MLG_F, p->bias};
    mlg_op *o = ml__kit_linear_with(g, &fc, h, c, w1, F1);
    ml__op_gout(o, F1);
    if (p->in_buf)
        o->accum = h;
    const bool relu = p->act == MLG_RELU;
    uint16_t c2 = MLG_NONE;
    if (gelu_new) {
        /* under autocast its output is fp32: proj reads autocast's copy */
        G = ml__kit_gelu_new(g, L->autocast, F1, "activation output (proj input)", !L->autocast);
        c2 = ml__kit_cast_copy(g, L, G);
    } else {
        /* gelu saves its input; relu its result (derivatives.yaml) */
        o = ml__graph_step(g, MLG_OP_ELEMENTWISE, relu ? "relu" : "gelu", F1, G,
                           relu ? "ReluBackward0" : "GeluBackward0");
        ml__op_save(o, relu ? G : F1);
        ml__op_free(o, F1);
    }
    if (relu && F1 != MLG_NONE)
        g->t[F1].flags |= MLG_T_TMP;
    if (p->in_gone)
        ml__op_free(ml__graph_release(g, "the MLP's input rebound"), h);
    const mlg_linear proj = {"addmm (proj)",
                             p->bias ? "AddmmBackward0 (MLP out)" : "MmBackward0 (MLP out)", MLG_F,
                             MLG_D, p->bias};
    o = ml__kit_linear_with(g, &proj, G, c2, w2, M);
    if (kept && p->keep_act)
        *kept = G;
    else
        ml__op_free(o, G);
    if (p->out_grad)
        ml__op_gout(o, M);
    return ml__kit_dropout(g, p->dropout, M, "NativeDropoutBackward0 (residual)", false,
                           !L->autocast);
}

/* A tensor of x's shape and dtype. */
static uint16_t like(ml_graph *g, const char *name, uint16_t x, uint8_t flags)
{
    const mlg_tensor *s = &g->t[x];
    uint16_t t = s->ndim == 4 ? ml__graph_tensor(g, name, s->dtype, MLG_ACT, 4, s->dim[0],
                                                 s->dim[1], s->dim[2], s->dim[3])
                              : ml__graph_tensor(g, name, s->dtype, MLG_ACT, 3, s->dim[0],
                                                 s->dim[1], s->dim[2]);
    if (t != MLG_NONE)
        g->t[t].flags |= flags;
    return t;
}

uint16_t ml__kit_softcap(ml_graph *g, uint16_t x, bool attention)
{
    /* the logits' cap: one of the block rule's transients (as large as the
     * logits); the scores' tanh output belongs to the attention core */
    uint16_t d = like(g, "x / cap", x, attention ? 0 : MLG_T_TMP);
    uint16_t t = like(g, attention ? "attention softcap tanh output" : "final softcap tanh output",
                      x, attention ? MLG_T_CORE : 0);
    uint16_t y = like(g, "tanh * cap", x, 0);
    ml__op_free(ml__graph_step(g, MLG_OP_ELEMENTWISE, "div (softcap)", x, d,
                               attention ? "DivBackward0 (scores / softcap)"
                                         : "DivBackward0 (logits / softcap)"),
                x);
    mlg_op *o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "tanh", d, t,
                               attention ? "TanhBackward0 (softcap)"
                                         : "TanhBackward0 (final softcap)");
    ml__op_save(o, t);
    ml__op_free(o, d);
    ml__op_free(ml__graph_step(g, MLG_OP_ELEMENTWISE, "mul (softcap)", t, y,
                               "MulBackward0 (tanh * softcap)"),
                t);
    return y;
}
