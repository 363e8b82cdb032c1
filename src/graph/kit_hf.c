/* The Hugging Face components of the kit (kit.h): LlamaRMSNorm,
 * LlamaAttention with eager_attention_forward (or a fused kernel through
 * sdpa/flash), LlamaMLP's gated MLP — modeling_llama.py's eager path, op
 * by op, with the references each function drops as it returns and what
 * autograd saves (tools/autograd/derivatives.yaml; docs/inventory.md,
 * "Llama block"). */
#include <stddef.h>

#include "graph/kit.h"

static uint16_t act3(ml_graph *g, const char *name, uint8_t dtype, uint8_t w)
{
    return ml__graph_tensor(g, name, dtype, MLG_ACT, 3, MLG_B, MLG_T, w);
}

static uint16_t stat(ml_graph *g, const char *name)
{
    return ml__graph_tensor(g, name, MLG_FP32, MLG_ACT, 2, MLG_B, MLG_T);
}

/* The RMSNorms' shared start: x (or its fp32 copy xf) squared, its mean,
 * + eps, rsqrt (saved), x * rsqrt (hn, fp32); returns hn. keep_var: the
 * mean stays bound (LlamaRMSNorm's `variance`) until *var_out is dropped;
 * else it goes with the + eps (GemmaRMSNorm's _norm, one expression). */
static uint16_t rms_core(ml_graph *g, const mlg_norm *n, uint8_t w, uint16_t x, uint16_t xf,
                         bool xbuf, bool keep_var, uint16_t *var_out)
{
    const bool up = n->upcast;
    uint16_t x2 = act3(g, "x^2", MLG_FP32, w);
    uint16_t var = stat(g, "variance"), ve = stat(g, "variance + eps");
    uint16_t rs = stat(g, "rmsnorm rsqrt");
    uint16_t hn = act3(g, "rmsnorm normalised", MLG_FP32, w);
    if (up)
        ml__graph_step(g, MLG_OP_COPY, "to (fp32)", x, xf, "ToCopyBackward0 (norm input)");
    mlg_op *o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "pow", xf, x2, "PowBackward0 (x^2)");
    ml__op_save(o, xf);
    o->accum = xf;
    /* pow_backward: grad * (2 * x.pow(1)), two temporaries of x's size
     * made before the result and freed after it
     * (tools/autograd/FunctionsManual.cpp, pow_backward) */
    o->scratch_in = 2;
    o->scratch_first = true;
    o = ml__graph_step(g, MLG_OP_NORM, "mean", x2, var, "MeanBackward1");
    ml__op_free(o, x2);
    o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "add (eps)", var, ve, NULL);
    if (!keep_var)
        ml__op_free(o, var);
    o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "rsqrt", ve, rs, "RsqrtBackward0");
    ml__op_save(o, rs);
    ml__op_free(o, ve);
    /* derivatives.yaml's rsqrt: -0.5 * grad * result.pow(3), two
     * temporaries before the result */
    o->scratch_in = 2;
    o->scratch_first = true;
    o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "mul (x * rsqrt)", xf, hn,
                       "MulBackward0 (x * rsqrt)");
    ml__op_in(o, rs);
    ml__op_save(o, xf);
    ml__op_save(o, rs);
    ml__op_free(o, rs);
    if (up)
        ml__op_free(o, xf); /* the upcast, rebound */
    ml__op_gin(o, rs);
    /* other (rsqrt, broadcast) before self in the codegen's sorted order:
     * grad * x whole, then x's gradient, then sum_to's rsqrt gradient */
    o->scratch_in = 1;
    o->scratch_first = true;
    if (xbuf)
        o->accum = xf;
    *var_out = keep_var ? var : MLG_NONE;
    return hn;
}

/* out = _norm(x.float()); out = out * (1.0 + weight.float()); return
 * out.type_as(x). The scale saves the fp32 h and, since h needs a
 * gradient, the fp32 (1 + weight) vector (D · 4 B); type_as saves
 * nothing. */
uint16_t ml__kit_gemma_norm(ml_graph *g, const mlg_norm *n, uint16_t x, bool xbuf)
{
    const bool up = n->upcast;
    const uint8_t sd = g->t[x].dtype;
    uint16_t xf = up ? act3(g, "rmsnorm fp32 copy of input", MLG_FP32, MLG_D) : x, var;
    uint16_t hn = rms_core(g, n, MLG_D, x, xf, xbuf, false, &var);
    uint16_t w1 = ml__graph_tensor(g, "rmsnorm 1 + weight (fp32)", MLG_FP32, MLG_ACT, 1, MLG_D);
    uint16_t pr = act3(g, "rmsnorm output (fp32)", MLG_FP32, MLG_D);
    uint16_t y = up ? act3(g, "rmsnorm output", sd, MLG_D) : pr;
    if (y != MLG_NONE)
        g->t[y].flags |= MLG_T_TMP;
    uint16_t W = ml__graph_tensor(g, "weight", MLG_PARAM, MLG_PARAMETER, 1, MLG_D);
    mlg_op *o = ml__graph_op(g, MLG_OP_ELEMENTWISE, "add (1 + weight)");
    ml__op_in(o, W);
    ml__op_out(o, w1);
    if (up) {
        /* a 2-byte weight's .float() is a copy: the product's node makes
         * (1 + weight)'s fp32 gradient, which ToCopyBackward0 (after
         * AddBackward0, which passes it) casts into the weight's */
        ml__op_param(o, W);
        ml__op_node(o, "ToCopyBackward0 (weight.float())");
        ml__op_gout(o, w1);
    }
    o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "mul (h * (1 + weight))", hn, pr, NULL);
    ml__op_in(o, w1);
    if (!up)
        ml__op_param(o, W);
    ml__op_save(o, hn);
    ml__op_save(o, w1);
    ml__op_free(o, w1);
    ml__op_free(o, hn);
    ml__op_node(o, "MulBackward0 (h * (1 + weight))");
    ml__op_gin(o, hn);
    if (up)
        ml__op_gin(o, w1);
    if (!n->held)
        ml__op_gout(o, pr);
    /* other ((1 + weight), broadcast) first in the sorted order: its
     * gradient whole before h's, then sum_to's */
    o->scratch_in = 1;
    o->scratch_first = true;
    if (up) {
        o = ml__graph_step(g, MLG_OP_COPY, "type_as", pr, y, "ToCopyBackward0 (type_as)");
        ml__op_free(o, pr);
    }
    return y;
}

/* h = x.to(fp32); variance = h.pow(2).mean(-1); h = h * rsqrt(variance +
 * eps); return weight * h.to(x.dtype). pow and the mul save h, rsqrt its
 * result, the scale the normalised h as it reads it; 2.x's mean keeps no
 * input. */
uint16_t ml__kit_rmsnorm(ml_graph *g, const mlg_norm *n, uint16_t x, bool xbuf)
{
    return ml__kit_rmsnorm_of(g, n, x, xbuf, MLG_D, g->t[x].dtype);
}

uint16_t ml__kit_rmsnorm_of(ml_graph *g, const mlg_norm *n, uint16_t x, bool xbuf, uint8_t w,
                            uint8_t dtype)
{
    const bool up = n->upcast;
    const uint8_t sd = g->t[x].dtype;
    uint16_t xf = up ? act3(g, "rmsnorm fp32 copy of input", MLG_FP32, w) : x, var;
    uint16_t hn = rms_core(g, n, w, x, xf, xbuf, true, &var);
    uint16_t hc = up ? act3(g, "rmsnorm normalised (cast back)", sd, w) : MLG_NONE;
    uint16_t y = act3(g, "rmsnorm output", dtype, w);
    if (y != MLG_NONE)
        g->t[y].flags |= MLG_T_TMP;
    if (up)
        ml__graph_step(g, MLG_OP_COPY, "to (stream dtype)", hn, hc, "ToCopyBackward0 (h.to)");
    const uint16_t hs = up ? hc : hn;
    mlg_op *o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "mul (weight)", hs, y, NULL);
    ml__op_param(o, ml__graph_tensor(g, "weight", MLG_PARAM, MLG_PARAMETER, 1, w));
    ml__op_save(o, hs);
    ml__op_free(o, hc);
    ml__op_free(o, hn);
    ml__op_node(o, "MulBackward0 (weight * h)");
    ml__op_gin(o, hs);
    if (!n->held)
        ml__op_gout(o, y);
    o->scratch_in = 1;
    ml__op_free(ml__graph_release(g, "variance, at return"), var);
    return y;
}

/* OlmoLayerNorm: F.layer_norm(x.to(fp32), (D,), None, None).to(x.dtype).
 * native_layer_norm saves its input (the fp32 copy when x is not fp32),
 * mean and rstd; the copies save nothing (ToCopyBackward0); no parameters. */
uint16_t ml__kit_olmo_norm(ml_graph *g, const mlg_norm *n, uint16_t x, bool xbuf)
{
    const bool up = n->upcast;
    const uint8_t sd = g->t[x].dtype;
    uint16_t xf = up ? act3(g, "layernorm fp32 copy of input", MLG_FP32, MLG_D) : x;
    uint16_t st = stat(g, "layernorm mean+rstd");
    if (st != MLG_NONE)
        g->t[st].factor = 2;
    uint16_t hn = act3(g, "layernorm output (fp32)", MLG_FP32, MLG_D);
    uint16_t y = up ? act3(g, "layernorm output", sd, MLG_D) : hn;
    if (y != MLG_NONE)
        g->t[y].flags |= MLG_T_TMP;
    mlg_op *o;
    if (up) {
        o = ml__graph_step(g, MLG_OP_COPY, "to (fp32)", x, xf, "ToCopyBackward0 (norm input)");
        if (xbuf)
            o->accum = x;
    }
    o = ml__graph_step(g, MLG_OP_NORM, "native_layer_norm (no weight)", xf, hn,
                       "NativeLayerNormBackward0");
    ml__op_out(o, st);
    ml__op_save(o, xf);
    ml__op_save(o, st);
    ml__op_free(o, st);
    if (up)
        ml__op_free(o, xf); /* the copy's reference goes with the call */
    if (xbuf && !up)
        o->accum = x;
    if (up) {
        o = ml__graph_step(g, MLG_OP_COPY, "to (stream dtype)", hn, y,
                           "ToCopyBackward0 (norm output)");
        ml__op_free(o, hn);
    }
    return y;
}

/* Projection i's (q, k, v) output y viewed into heads; its backward
 * reshapes the transposed gradient, a copy (ViewBackward0) except with one
 * head (one kv head for k and v), whose gradient reshapes as a view: then
 * the heads' gradient is the projection output's. (With T = 1 every view's
 * would: a size the graph does not know, the copy made.) k's gradient
 * without a rotary comes from k^T's bmm laid out (B, T, D) with T the
 * fastest dimension: the view's reshape keeps it, and the linear's fold of
 * it to (B*T, D) for mm copies it (UnsafeViewBackward0), counted here,
 * but for a batch of one, whose fold is a view. */
static uint16_t head_view(ml_graph *g, const mlg_attention *a, unsigned i, uint16_t y,
                          const char *name)
{
    const uint16_t hv = ml__graph_view(g, "heads", y, 4, MLG_B, i == 0 ? MLG_H : MLG_HKV, MLG_T,
                                       MLG_DH);
    const bool view = (i ? a->kv_one : a->q_one) || (i == 1 && a->fold_views && !a->rope);
    ml__kit_view_heads(g, name, view ? NULL : "ViewBackward0 (head view, contiguous copy)", y,
                       hv);
    return hv;
}

/* q_proj, k_proj, v_proj on h (each with autocast's copies) and the head
 * views (k, v, q with q_last); the gradients of the first two go into the
 * buffer of h's gradient that the last's makes (backward runs v, k, q).
 * Phi-3's one qkv_proj: kit_phi3.c. */
static mlg_qkv projections(ml_graph *g, const mlg_layer *L, uint16_t h)
{
    const mlg_attention *a = &L->attn;
    if (a->fused_proj)
        return ml__kit_phi3_projection(g, L, h);
    uint16_t c[3], w[3];
    for (unsigned i = 0; i < 3; i++)
        c[i] = ml__kit_cast_copy(g, L, h);
    w[0] = ml__kit_weight_copy(g, L, MLG_D, MLG_DQ);
    w[1] = ml__kit_weight_copy(g, L, MLG_D, MLG_DKV);
    /* each copy an entry of its own, released by its product's node (the
     * cache holds it to the autocast region's end, the forward's:
     * autocast_mode.cpp, cached_cast and clear_cache) */
    w[2] = ml__kit_weight_copy(g, L, MLG_D, MLG_DKV);
    /* the block rule's transient: the three outputs as one */
    uint16_t all = act3(g, "q, k, v projection outputs", MLG_COMPUTE, MLG_QKV);
    if (all != MLG_NONE)
        g->t[all].flags |= MLG_T_TMP;
    mlg_qkv r = {.bound = MLG_NONE};
    /* with a bias, addmm: its node makes the input's gradient first */
    static const char *const name[2][3][3] = {
        {{"mm (q projection)", "MmBackward0 (q projection)", "view (q heads)"},
         {"mm (k projection)", "MmBackward0 (k projection)", "view (k heads)"},
         {"mm (v projection)", "MmBackward0 (v projection)", "view (v heads)"}},
        {{"addmm (q projection)", "AddmmBackward0 (q projection)", "view (q heads)"},
         {"addmm (k projection)", "AddmmBackward0 (k projection)", "view (k heads)"},
         {"addmm (v projection)", "AddmmBackward0 (v projection)", "view (v heads)"}}};
    uint16_t *out[3] = {&r.q, &r.k, &r.v}, *hv[3] = {&r.qh, &r.kh, &r.vh};
    /* ViTSelfAttention projects k, v, then q */
    static const unsigned order[2][3] = {{0, 1, 2}, {1, 2, 0}};
    for (unsigned n = 0; n < 3; n++) {
        const unsigned i = order[a->q_last][n];
        const uint8_t width = i == 0 ? MLG_DQ : MLG_DKV;
        *out[i] = act3(g, "projection output", MLG_COMPUTE, width);
        const mlg_linear lin = {name[a->qkv_bias][i][0], name[a->qkv_bias][i][1], MLG_D, width,
                                a->qkv_bias};
        mlg_op *o = ml__kit_linear_with(g, &lin, h, c[i], w[i], *out[i]);
        ml__op_gout(o, *out[i]);
        if (n < 2 || a->in_buf)
            o->accum = h;
        /* BertSelfAttention views q into heads after k and v (its
         * mixed_query_layer): q's view's node runs first in backward */
        if (!(a->bert && i == 0))
            *hv[i] = head_view(g, a, i, *out[i], name[a->qkv_bias][i][2]);
    }
    if (a->bert)
        *hv[0] = head_view(g, a, 0, *out[0], name[a->qkv_bias][0][2]);
    return r;
}

/* repeat_kv of x (hkv heads) to H heads: expand, then a reshape that
 * copies (more than one kv head) or stays a zero-stride view (one, which
 * matmul copies instead); its backward sums the groups. */
static uint16_t repeat_kv(ml_graph *g, const mlg_attention *a, uint16_t x, const char *node)
{
    uint16_t r = a->repeat_copy ? ml__kit_heads_as(g, "repeat_kv output", MLG_H, g->t[x].dtype)
                                : ml__graph_view(g, "expanded", ml__graph_storage(g, x), 4, MLG_B,
                                                 MLG_H, MLG_T, MLG_DH);
    mlg_op *o = ml__graph_op(g, a->repeat_copy ? MLG_OP_COPY : MLG_OP_VIEW, "repeat_kv");
    ml__op_in(o, x);
    if (a->repeat_copy)
        ml__op_out(o, r);
    ml__op_node(o, node);
    ml__op_gin(o, x);
    ml__op_gout(o, r);
    return r;
}

/* eager()'s q k^T: bmm's operands q's copy unless the cat made it
 * contiguous; k as repeat_kv copied it (copied), as the cat made it (as
 * many kv heads as q heads), or a copy; one saved entry for q's and k's
 * (the first's), released by the q k^T node. Under rot_fp32 the matmul
 * reads autocast's copies of the fp32 rotated q and of k as repeat_kv
 * made it (ToCopyBackward0 each, k's first; the copies keep the layouts:
 * q's is copied contiguous for bmm, k's transposed view is bmm's as it is
 * where repeat_kv copied it), which go once the product is made. Returns
 * the scores; *vc the tensor of v's contiguous copy, made later (MLG_NONE:
 * none, where repeat_kv copied v). */
static uint16_t scores_qk(ml_graph *g, const mlg_attention *a, uint16_t qr, uint16_t kr,
                          uint16_t krep, bool copied, bool cat, uint16_t *vc)
{
    /* (a batch of one: no copies, bmm saves the operands as they are) */
    const bool fold = a->fold_views;
    uint16_t qc = cat || fold ? MLG_NONE : ml__kit_heads(g, "q, k contiguous copies (bmm)", MLG_H);
    /* (autocast's copy of k repeated by a zero-stride expand is laid out
     * for bmm: no copy) */
    uint16_t kc = copied || fold || (cat && !a->grouped) || (a->rot_fp32 && a->grouped)
                      ? MLG_NONE
                      : ml__kit_heads(g, "k contiguous copy (bmm)", MLG_H);
    *vc = copied || fold ? MLG_NONE : ml__kit_heads(g, "v contiguous copy (bmm)", MLG_H);
    uint16_t qs = qr, ks = copied || fold ? krep : kr;
    if (a->rot_fp32) { /* (the wrapper's arguments last to first: ml__kit_cast_ops) */
        ks = ml__kit_autocast_copy(g, krep, MLG_H, "k (autocast copy for q k^T)");
        qs = ml__kit_autocast_copy(g, qs, MLG_H, "q (autocast copy for q k^T)");
    }
    const uint16_t qb = qc != MLG_NONE ? qc : qs;
    const uint16_t kb = kc != MLG_NONE ? kc : ks;
    const uint16_t entry = ml__graph_storage(g, qb);
    if (!fold && ml__graph_storage(g, kb) != entry)
        g->t[ml__graph_storage(g, kb)].base = entry;
    uint16_t S1 = ml__kit_scores(g, "scores (q k^T)", MLG_COMPUTE, MLG_T_TMP);
    if (qc != MLG_NONE || kc != MLG_NONE) {
        mlg_op *copy = ml__graph_op(g, MLG_OP_COPY, "contiguous (q, k for bmm)");
        if (qc != MLG_NONE)
            ml__op_in(copy, qs);
        if (kc != MLG_NONE)
            ml__op_in(copy, a->rot_fp32 ? ks : krep);
        ml__op_out(copy, qc);
        ml__op_out(copy, kc);
    }
    mlg_op *o = ml__kit_qk(g, qb, kb, S1);
    ml__op_free(o, qc);
    ml__op_free(o, kc);
    /* autocast's copies are the arguments of its wrapper around matmul,
     * alive until it returns (autocast_mode.h, cached_cast: the call's
     * temporaries): after the product, even where matmul copied them */
    if (a->rot_fp32) {
        ml__op_free(o, qs);
        ml__op_free(o, ks);
    }
    return S1;
}

/* eager_attention_forward on the (rotated) heads: q k^T of the operands'
 * contiguous copies (repeat_kv's outputs saved themselves: q's and k's one
 * entry, released by the q k^T node, v's by the P v node), scale, the additive
 * causal mask, the softmax (ml__kit_hf_softmax), P v. Returns the
 * probabilities (HF returns them as the weights); *O the PV product, *kr
 * and *vr repeat_kv's outputs (MLG_NONE: views), dropped as it returns. */
static uint16_t eager(ml_graph *g, const mlg_layer *L, uint16_t qr, uint16_t kr, uint16_t vh,
                      uint16_t *O, uint16_t *krep_out, uint16_t *vrep_out, uint16_t *scores)
{
    const mlg_attention *a = &L->attn;
    uint16_t krep = a->grouped ? repeat_kv(g, a, kr, "ExpandBackward0 (repeat_kv of k)") : kr;
    /* Falcon's multi_query: no repeat_kv, at::matmul broadcasts the one
     * key/value head itself (expand, then the reshape's copy); v's in the
     * PV matmul, after the softmax, so its ExpandBackward0 runs right after
     * that matmul's backward, before the softmax's */
    const bool late_v = a->split_heads && a->grouped && !a->repeat_copy;
    uint16_t vrep =
        a->grouped && !late_v ? repeat_kv(g, a, vh, "ExpandBackward0 (repeat_kv of v)") : vh;
    const bool copied = a->grouped && a->repeat_copy; /* bmm saves them as they are */
    /* the rotary made q and k contiguous with a fused qkv (its cat); on
     * Falcon's views of query_key_value its muls keep the views' layout
     * (TensorIterator follows its operands' strides), which bmm copies as
     * it copies a head view; v stays a strided view of the projection's
     * output, which bmm copies, or (Falcon's multi_query) a picked copy
     * that it expands */
    const bool cat = a->fused_proj && a->rope;
    *krep_out = copied ? krep : MLG_NONE;
    *vrep_out = copied ? vrep : MLG_NONE;
    /* v as repeat_kv copied it, as _split_heads made it, or a copy: its
     * own saved entry, released by the PV node, its only saver */
    uint16_t vc;
    uint16_t S1 = scores_qk(g, a, qr, kr, krep, copied, cat, &vc);
    mlg_op *o;
    uint16_t S2 = a->split_heads ? ml__kit_scale_inplace(g, S1) : ml__kit_scale(g, S1);
    if (a->softcap)
        S2 = ml__kit_softcap(g, S2, true);
    uint16_t S3 = S2;
    if (a->mask) {
        /* the additive mask is in the stream's dtype (transformers makes it
         * in inputs_embeds' dtype: masking_utils.py, create_causal_mask), so
         * the sum is promoted to it: under autocast fp32, whose backward
         * (AddBackward0) casts the gradient back to the scores' dtype.
         * Falcon's sum is a temporary, one of the block rule's */
        S3 = a->stream_softmax ? ml__kit_scores(g, "scores + mask", MLG_STREAM, MLG_T_TMP)
                               : ml__kit_scores(g, "scores (masked)", MLG_STREAM, 0);
        o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "add (causal mask)", S2, S3, NULL);
        /* (Falcon's softmax(scores + mask) rebinds the scores once it returns) */
        ml__op_free(o, a->stream_softmax ? MLG_NONE : S2);
        if (L->autocast) {
            ml__op_node(o, "AddBackward0 (the masked scores, cast back)");
            ml__op_gin(o, S2);
            ml__op_gout(o, S3);
        }
    }
    uint16_t probs = ml__kit_hf_softmax(g, L, S3);
    if (a->mask && a->stream_softmax)
        ml__op_free(ml__graph_release(g, "scores rebound"), S2);
    *scores = a->bert ? S3 : MLG_NONE; /* bound until the attention returns */
    if (late_v)
        vrep = repeat_kv(g, a, vh, "ExpandBackward0 (the PV matmul's broadcast of v)");
    /* (with a batch of one, late_v's broadcast view itself) */
    const uint16_t vb = copied ? vrep : vc != MLG_NONE ? vc : vrep;
    if (vc != MLG_NONE)
        ml__graph_step(g, MLG_OP_COPY, "contiguous (v for bmm)", vrep, vc, NULL);
    *O = a->rot_fp32 ? ml__kit_pv_cast(g, ml__kit_probs_copy(g, probs), vb, vc)
                     : ml__kit_pv(g, probs, vb, vc);
    return probs;
}

/* scaled_dot_product_attention: saves q, k and v (listed as one), its
 * output and the per-row logsumexp; no T x T tensor. */
static uint16_t fused(ml_graph *g, uint16_t qr, uint16_t kr, uint16_t vh, const mlg_attention *a)
{
    uint16_t O = ml__kit_heads(g, "attention output (fused)", MLG_H);
    uint16_t lse = ml__graph_tensor(g, "logsumexp", MLG_FP32, MLG_ACT, 3, MLG_B, MLG_H, MLG_T);
    const uint16_t q = ml__graph_storage(g, qr);
    g->t[ml__graph_storage(g, kr)].base = q;
    g->t[ml__graph_storage(g, vh)].base = q;
    const uint16_t ring = ml__kit_ring_open(g, a->ring);
    mlg_op *o = ml__graph_op(g, MLG_OP_ATTENTION, "scaled_dot_product_attention");
    o->causal = a->mask && !a->bert;
    ml__op_in(o, qr);
    ml__op_in(o, kr);
    ml__op_in(o, vh);
    ml__op_out(o, O);
    ml__op_out(o, lse);
    ml__op_save(o, qr);
    ml__op_save(o, kr);
    ml__op_save(o, vh);
    ml__op_save(o, O);
    ml__op_save(o, lse);
    ml__op_flops(o, 4.0, 5, MLG_B, MLG_H, MLG_T, MLG_TKV, MLG_DH);
    ml__kit_ring_close(g, ring);
    return O;
}

uint16_t ml__kit_hf_attention(ml_graph *g, const mlg_layer *L, uint16_t h, uint16_t *held,
                              uint16_t *k, uint16_t *v)
{
    const mlg_qkv p = projections(g, L, h);
    return ml__kit_hf_attention_on(g, L, &p, held, k, v);
}

uint16_t ml__kit_hf_attention_on(ml_graph *g, const mlg_layer *L, const mlg_qkv *pp,
                                 uint16_t *held, uint16_t *k, uint16_t *v)
{
    const mlg_attention *a = &L->attn;
    const mlg_qkv p = *pp;
    uint16_t qr = p.qh, kr = p.kh;
    if (a->rope) {
        /* apply_rotary_pos_emb; the caller's rebinding frees the unrotated
         * q and k (Phi-3's are views of qkv_proj's output) */
        const bool pass = a->fused_proj;
        mlg_op *qp = pass ? ml__kit_rope_pass(g, p.qh, "SliceBackward0 (q pass, empty)") : NULL;
        mlg_op *kp = pass ? ml__kit_rope_pass(g, p.kh, "SliceBackward0 (k pass, empty)") : NULL;
        const uint8_t dt = a->rot_fp32 ? MLG_STREAM : MLG_COMPUTE;
        qr = ml__kit_rope(g, p.qh, MLG_H, dt, qp);
        kr = ml__kit_rope(g, p.kh, MLG_HKV, dt, kp);
        if (!pass) {
            mlg_op *o = ml__graph_release(g, "q, k rebound to the rotated");
            ml__op_free(o, p.q);
            ml__op_free(o, p.k);
        }
    }
    uint16_t O, probs = MLG_NONE, krep = MLG_NONE, vrep = MLG_NONE;
    uint16_t S3 = MLG_NONE;
    if (a->fused_kernel && a->rot_fp32) {
        /* the kernel reads autocast's copies of the fp32 rotated q and k
         * (ToCopyBackward0 each), which it saves; without grad they go
         * once it has run */
        const uint16_t ka = ml__kit_autocast_copy(g, kr, MLG_HKV, "k (autocast copy for the kernel)");
        const uint16_t qa = ml__kit_autocast_copy(g, qr, MLG_H, "q (autocast copy for the kernel)");
        O = fused(g, qa, ka, p.vh, a);
        mlg_op *o = ml__graph_release(g, "autocast's copies of q and k");
        ml__op_free(o, qa);
        ml__op_free(o, ka);
    } else if (a->fused_kernel)
        O = fused(g, qr, kr, p.vh, a);
    else if (a->math) /* the rotary's cat made q contiguous with a fused qkv */
        O = ml__kit_sdpa_math(g, L, qr, kr, p.vh, a->fused_proj && a->rope);
    else
        probs = eager(g, L, qr, kr, p.vh, &O, &krep, &vrep, &S3);
    if (a->bert || a->self_out) {
        /* BertSelfAttention (ViTSelfAttention alike: no masked scores)
         * returns the context alone: q, k, v, the scores and the
         * probabilities go; BertSelfOutput's dense and dropout follow; the
         * context is the layer's to drop */
        const uint16_t go[7] = {qr, kr, p.vh, S3, probs, krep, vrep};
        uint16_t Oc, y = ml__kit_attention_out(g, L, O, go, 7, &Oc);
        *k = *v = MLG_NONE;
        *held = Oc;
        return y;
    }
    const uint16_t rep[2] = {krep, vrep};
    uint16_t Oc, y = ml__kit_attention_out(g, L, O, rep, 2, &Oc);
    /* the attention returns: its projection's input, q, and k and v
     * unless the KV cache keeps them (to the layer's end); its weights
     * stay bound in the layer, but for FalconDecoderLayer's, which keeps
     * only what follows the output (attn_outputs[1:]: layer_past) */
    mlg_op *o = ml__graph_release(g, "attention returns");
    const uint16_t weights = a->split_heads ? probs : MLG_NONE;
    uint16_t go[6] = {Oc, qr, kr, p.vh, p.bound, weights};
    /* what shares a storage the cache keeps stays with it (Falcon's heads,
     * views of query_key_value's output) */
    for (unsigned i = 0; i < 6 && a->cache; i++)
        if (go[i] != MLG_NONE && (ml__graph_storage(g, go[i]) == ml__graph_storage(g, kr) ||
                                  ml__graph_storage(g, go[i]) == ml__graph_storage(g, p.vh)))
            go[i] = MLG_NONE;
    ml__kit_free_storages(g, o, go, 6);
    *k = a->cache ? kr : MLG_NONE;
    *v = a->cache ? p.vh : MLG_NONE;
    *held = a->split_heads ? MLG_NONE : probs;
    return y;
}

/* LlamaMLP: down_proj(act_fn(gate_proj(x)) * up_proj(x)); act silu
 * (SwiGLU) or gelu (GeGLU): the activation saves gate's output, the mul
 * both factors, down the product (derivatives.yaml: silu, gelu, mul). */
uint16_t ml__kit_glu_mlp(ml_graph *g, const mlg_layer *L, uint16_t h)
{
    const mlg_mlp *p = &L->mlp;
    if (p->fused)
        return ml__kit_phi3_mlp(g, L, h);
    const bool geglu = p->act == MLG_GEGLU;
    uint16_t c1 = ml__kit_cast_copy(g, L, h), c2 = ml__kit_cast_copy(g, L, h);
    uint16_t wg = ml__kit_weight_copy(g, L, MLG_D, MLG_F);
    uint16_t wu = ml__kit_weight_copy(g, L, MLG_D, MLG_F);
    uint16_t wd = ml__kit_weight_copy(g, L, MLG_F, MLG_D);
    uint16_t G1 = act3(g, "gate projection output", MLG_COMPUTE, MLG_F);
    uint16_t A1 = act3(g, "activation output", MLG_COMPUTE, MLG_F);
    uint16_t U = act3(g, "up projection output", MLG_COMPUTE, MLG_F);
    uint16_t Pr = act3(g, "gated product (down input)", MLG_COMPUTE, MLG_F);
    uint16_t M = act3(g, "MLP output", MLG_COMPUTE, MLG_D);
    if (M != MLG_NONE)
        g->t[M].flags |= MLG_T_TMP;
    const mlg_linear gate = {"mm (gate projection)", "MmBackward0 (gate projection)", MLG_D, MLG_F,
                             p->bias};
    mlg_op *o = ml__kit_linear_with(g, &gate, h, c1, wg, G1);
    ml__op_gout(o, G1);
    o->accum = h;
    o = ml__graph_step(g, MLG_OP_ELEMENTWISE, geglu ? "gelu" : "silu", G1, A1,
                       geglu ? "GeluBackward0" : "SiluBackward0");
    ml__op_save(o, G1);
    ml__op_free(o, G1);
    const mlg_linear up = {"mm (up projection)", "MmBackward0 (up projection)", MLG_D, MLG_F,
                           p->bias};
    o = ml__kit_linear_with(g, &up, h, c2, wu, U);
    ml__op_gout(o, U);
    o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "mul (act * up)", A1, Pr,
                       geglu ? "MulBackward0 (gelu * up)" : "MulBackward0 (silu * up)");
    ml__op_in(o, U);
    ml__op_save(o, A1);
    ml__op_save(o, U);
    ml__op_free(o, A1);
    ml__op_free(o, U);
    ml__op_gin(o, U);
    const mlg_linear down = {"mm (down projection)", "MmBackward0 (down projection)", MLG_F, MLG_D,
                             p->bias};
    o = ml__kit_linear_with(g, &down, Pr, MLG_NONE, wd, M);
    ml__op_free(o, Pr);
    if (p->out_grad)
        ml__op_gout(o, M);
    return ml__kit_dropout(g, p->dropout, M, "NativeDropoutBackward0 (residual)", false,
                           !L->autocast);
}
