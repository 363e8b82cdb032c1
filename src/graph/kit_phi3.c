/* Phi-3's fused projections (kit.h; Hugging Face modeling_phi3.py eager,
 * docs/inventory.md "Phi-3 block"): one qkv_proj whose output q, k and v
 * are slices of, and one gate_up_proj chunked into gate and up; GPT-NeoX's
 * query_key_value, viewed into heads and chunked (modeling_gpt_neox.py). */
#include <stddef.h>

#include "graph/kit.h"

static uint16_t act3(ml_graph *g, const char *name, uint8_t w)
{
    return ml__graph_tensor(g, name, MLG_COMPUTE, MLG_ACT, 3, MLG_B, MLG_T, w);
}

/* GPTNeoXAttention: query_key_value's output qkv viewed (B, T, H, 3 dh)
 * and transposed to (B, H, T, 3 dh), then chunked into q, k and v (each
 * dh of a head's 3 dh). Backward: SplitBackward0 cats the three heads'
 * gradients into one contiguous (B, H, T, 3 dh) tensor (split_backward in
 * FunctionsManual.cpp), TransposeBackward0 is a view, and ViewBackward0's
 * reshape of that transposed gradient to qkv's shape copies it: two
 * tensors of qkv's size, where Phi-3's slices make one each. */
static mlg_qkv heads_then_chunk(ml_graph *g, uint16_t qkv)
{
    mlg_qkv r = {.bound = MLG_NONE};
    const uint16_t heads = ml__graph_view(g, "heads (q, k, v of each)", qkv, 3, MLG_B, MLG_T,
                                          MLG_QKV);
    ml__kit_view_heads(g, "view, transpose (heads)",
                       "ViewBackward0 (qkv heads, contiguous copy)", qkv, heads);
    mlg_op *o = ml__graph_op(g, MLG_OP_VIEW, "chunk (q, k, v)");
    ml__op_node(o, "SplitBackward0 (chunk into q, k, v)");
    ml__op_gin(o, heads);
    uint16_t *hv[3] = {&r.qh, &r.kh, &r.vh};
    for (unsigned i = 0; i < 3; i++) {
        *hv[i] = ml__graph_view(g, "heads", qkv, 4, MLG_B, i == 0 ? MLG_H : MLG_HKV, MLG_T,
                                MLG_DH);
        ml__op_gout(o, *hv[i]);
    }
    r.q = r.qh;
    r.k = r.kh;
    r.v = r.vh;
    return r;
}

/* qkv_proj; q, k, v = its output's slices, then each viewed into heads.
 * Backward, the views' nodes first (the engine runs the latest first: v's,
 * k's, q's), each view's reshape copying the transposed gradient; then the
 * slices': SliceBackward0 makes a zero-filled gradient of the whole output
 * and copies the slice's in, the first to arrive (v's) becoming the
 * output's InputBuffer, k's and q's added and freed. */
mlg_qkv ml__kit_phi3_projection(ml_graph *g, const mlg_layer *L, uint16_t h)
{
    const mlg_attention *a = &L->attn;
    mlg_qkv r = {.bound = MLG_NONE};
    uint16_t c = ml__kit_cast_copy(g, L, h), w = ml__kit_weight_copy(g, L, MLG_D, MLG_QKV);
    uint16_t qkv = act3(g, "q/k/v projection output", MLG_QKV);
    if (qkv != MLG_NONE)
        g->t[qkv].flags |= MLG_T_TMP;
    const mlg_linear lin = {a->qkv_bias ? "addmm (qkv projection)" : "mm (qkv projection)",
                            a->qkv_bias ? "AddmmBackward0 (qkv projection)"
                                        : "MmBackward0 (qkv projection)",
                            MLG_D, MLG_QKV, a->qkv_bias};
    mlg_op *o = ml__kit_linear_with(g, &lin, h, c, w, qkv);
    ml__op_gout(o, qkv);
    if (a->heads_first)
        return heads_then_chunk(g, qkv);
    static const char *const sl[3] = {"SliceBackward0 (q of qkv)", "SliceBackward0 (k of qkv)",
                                      "SliceBackward0 (v of qkv)"};
    uint16_t *out[3] = {&r.q, &r.k, &r.v}, *hv[3] = {&r.qh, &r.kh, &r.vh};
    for (unsigned i = 0; i < 3; i++) {
        const uint8_t width = i == 0 ? MLG_DQ : MLG_DKV;
        *out[i] = ml__graph_view(g, "slice of qkv", qkv, 3, MLG_B, MLG_T, width);
        o = ml__graph_op(g, MLG_OP_VIEW, "slice");
        ml__op_node(o, sl[i]);
        ml__op_gin(o, qkv);
        ml__op_gout(o, *out[i]);
        if (i < 2)
            o->accum = qkv;
    }
    for (unsigned i = 0; i < 3; i++) {
        const uint8_t nh = i == 0 ? MLG_H : MLG_HKV;
        *hv[i] = ml__graph_view(g, "heads", qkv, 4, MLG_B, nh, MLG_T, MLG_DH);
        ml__kit_view_heads(g, "view (heads)", "ViewBackward0 (head view, contiguous copy)",
                           *out[i], *hv[i]);
    }
    return r;
}

/* Phi3MLP: gate, up = gate_up_proj(x).chunk(2); up = up * act(gate);
 * down_proj(up). The activation saves the gate view and the mul the up
 * view: both keep the whole (B, T, 2F) output alive, one storage; the
 * mul saves the activation's output, down its input. SplitBackward0 cats
 * the two gradients into one of the whole output (split_backward). */
uint16_t ml__kit_phi3_mlp(ml_graph *g, const mlg_layer *L, uint16_t h)
{
    const mlg_mlp *p = &L->mlp;
    const bool geglu = p->act == MLG_GEGLU;
    /* autocast: the input's copy, and the weights' copies as the builders
     * list them: three of D x F (gate_up's 2 D F as two) */
    uint16_t c = ml__kit_cast_copy(g, L, h);
    uint16_t wa = ml__kit_weight_copy(g, L, MLG_D, MLG_F);
    uint16_t wb = ml__kit_weight_copy(g, L, MLG_D, MLG_F);
    uint16_t wd = ml__kit_weight_copy(g, L, MLG_F, MLG_D);
    uint16_t GU = act3(g, "gate_up projection output (gate and up views)", MLG_F2);
    uint16_t A1 = act3(g, geglu ? "gelu output" : "silu output", MLG_F);
    uint16_t Pr = act3(g, "gated product (down input)", MLG_F);
    uint16_t M = ml__graph_tensor(g, "MLP output", MLG_COMPUTE, MLG_ACT, 3, MLG_B, MLG_T, MLG_D);
    if (M != MLG_NONE)
        g->t[M].flags |= MLG_T_TMP;
    if (wb != MLG_NONE)
        ml__op_out(ml__graph_op(g, MLG_OP_COPY, "to (autocast, weight)"), wb);
    const mlg_linear gu = {"mm (gate_up projection)", "MmBackward0 (gate_up projection)", MLG_D,
                           MLG_F2, p->bias};
    mlg_op *o = ml__kit_linear_with(g, &gu, h, c, wa, GU);
    ml__op_save(o, wb);
    ml__op_free(o, wb);
    ml__op_gout(o, GU);
    uint16_t gate = ml__graph_view(g, "gate", GU, 3, MLG_B, MLG_T, MLG_F);
    uint16_t up = ml__graph_view(g, "up", GU, 3, MLG_B, MLG_T, MLG_F);
    o = ml__graph_op(g, MLG_OP_VIEW, "chunk (gate, up)");
    ml__op_node(o, "SplitBackward0 (chunk into gate, up)");
    ml__op_gin(o, GU);
    ml__op_gout(o, gate);
    ml__op_gout(o, up);
    o = ml__graph_step(g, MLG_OP_ELEMENTWISE, geglu ? "gelu" : "silu", gate, A1,
                       geglu ? "GeluBackward0" : "SiluBackward0");
    ml__op_save(o, gate);
    o = ml__graph_op(g, MLG_OP_ELEMENTWISE, "mul (up * act)");
    ml__op_in(o, up);
    ml__op_in(o, A1);
    ml__op_out(o, Pr);
    ml__op_save(o, A1);
    ml__op_save(o, up);
    ml__op_free(o, A1);
    ml__op_node(o, geglu ? "MulBackward0 (up * gelu)" : "MulBackward0 (up * silu)");
    ml__op_gin(o, up);
    ml__op_gin(o, A1);
    ml__op_gout(o, Pr);
    const mlg_linear down = {"mm (down projection)", "MmBackward0 (down projection)", MLG_F, MLG_D,
                             p->bias};
    o = ml__kit_linear_with(g, &down, Pr, MLG_NONE, wd, M);
    if (p->out_grad)
        ml__op_gout(o, M);
    /* Phi3MLP returns: the product and gate_up's output go */
    o = ml__graph_release(g, "mlp returns");
    ml__op_free(o, Pr);
    ml__op_free(o, GU);
    return ml__kit_dropout(g, p->dropout, M, "NativeDropoutBackward0 (residual)", false, true);
}
