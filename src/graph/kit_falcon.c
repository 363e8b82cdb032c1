/* Hugging Face's FalconAttention (kit.h; modeling_falcon.py, the rotary
 * path; docs/inventory.md, "Falcon block"): one query_key_value projection
 * whose output _split_heads cuts into q, k and v, each viewed as
 * (B, h, T, dh) heads; then HF's attention on them (kit_hf.c):
 * the rotary, the eager core with the softmax in the stream's dtype (or a
 * fused kernel), the dense projection. */
#include <stddef.h>

#include "graph/kit.h"

static uint16_t act3(ml_graph *g, const char *name, uint8_t w)
{
    return ml__graph_tensor(g, name, MLG_COMPUTE, MLG_ACT, 3, MLG_B, MLG_T, w);
}

void ml__kit_falcon_lists(ml_graph *g, const mlg_attention *a, uint16_t lists[2])
{
    static const char *const name[2] = {"key index list (multi_query)",
                                        "value index list (multi_query)"};
    for (unsigned i = 0; i < 2; i++) {
        lists[i] = MLG_NONE;
        if (!a->split_heads || !a->grouped)
            continue;
        lists[i] = ml__graph_tensor(g, name[i], MLG_INT64, MLG_ACT, 0);
        if (lists[i] != MLG_NONE)
            g->t[lists[i]].flags |= MLG_T_KEPT;
    }
}

/* multi_query (one key/value head): fused_qkv[..., [-2], :] (or [-1]).
 * Advanced indexing makes the list on the device and copies the picked
 * (B, T, 1, dh) piece; IndexBackward0 saves the list (derivatives.yaml,
 * index.Tensor), whose Python temporary goes once the op has run. */
static uint16_t pick(ml_graph *g, uint16_t qkv, uint16_t list, mlg_op **op)
{
    uint16_t piece = act3(g, "picked key/value head (index copy)", MLG_DKV);
    mlg_op *o = ml__graph_op(g, MLG_OP_COPY, "index (multi_query)");
    ml__op_in(o, qkv);
    ml__op_out(o, list);
    ml__op_out(o, piece);
    ml__op_save(o, list);
    ml__op_free(o, list);
    *op = o;
    return piece;
}

/* query_key_value on h, then _split_heads. multi_query: the output viewed
 * as (B, T, H + 2, dh), q the slice [..., :-2, :], k and v picked (above);
 * otherwise (lists MLG_NONE) viewed as (B, T, H, 3, dh) and q, k and v
 * its selects. Then transpose(1, 2).reshape to the shape the transpose
 * already has: a view (reshape copies only where no view can have the
 * sizes, TensorShape.cpp), of qkv's storage or of a picked piece's, with no
 * gradient of its own. Backward, per piece: SliceBackward0 or
 * SelectBackward0 (q's; all three without multi_query), or
 * IndexBackward0 (a picked k or v: index_put into zeros), each makes a
 * zero-filled gradient of the whole output and puts the piece's in; the
 * first to arrive (v's: the engine runs v, k, q) becomes the output's
 * InputBuffer, k's and q's are added. h's gradient buffer is the MLP's
 * when the norm is shared (in_buf). Returns the pieces and their heads
 * (a piece MLG_NONE where its storage is qkv's), qkv bound. */
static mlg_qkv split_heads(ml_graph *g, const mlg_layer *L, uint16_t h, const uint16_t lists[2])
{
    const mlg_attention *a = &L->attn;
    mlg_qkv r;
    uint16_t c = ml__kit_cast_copy(g, L, h), w = ml__kit_weight_copy(g, L, MLG_D, MLG_QKV);
    uint16_t qkv = act3(g, "query_key_value output", MLG_QKV);
    if (qkv != MLG_NONE)
        g->t[qkv].flags |= MLG_T_TMP;
    const mlg_linear lin = {"mm (query_key_value)", "MmBackward0 (qkv projection)", MLG_D,
                            MLG_QKV, a->qkv_bias};
    mlg_op *o = ml__kit_linear_with(g, &lin, h, c, w, qkv);
    ml__op_gout(o, qkv);
    if (a->in_buf)
        o->accum = h;
    const bool mq = lists[0] != MLG_NONE;
    static const char *const node[2][3] = {
        {"SelectBackward0 (q of qkv)", "SelectBackward0 (k of qkv)", "SelectBackward0 (v of qkv)"},
        {"SliceBackward0 (q of qkv)", "IndexBackward0 (k of qkv)", "IndexBackward0 (v of qkv)"}};
    uint16_t *own[3] = {&r.q, &r.k, &r.v}, *hv[3] = {&r.qh, &r.kh, &r.vh};
    for (unsigned i = 0; i < 3; i++) {
        const uint8_t width = i == 0 ? MLG_DQ : MLG_DKV, nh = i == 0 ? MLG_H : MLG_HKV;
        const bool picked = i > 0 && mq;
        uint16_t piece;
        if (picked) {
            piece = pick(g, qkv, lists[i - 1], &o);
        } else {
            piece = ml__graph_view(g, "piece of query_key_value", qkv, 3, MLG_B, MLG_T, width);
            o = ml__graph_op(g, MLG_OP_VIEW, i == 0 && mq ? "slice" : "select");
        }
        ml__op_node(o, node[mq][i]);
        ml__op_gin(o, qkv);
        ml__op_gout(o, piece);
        if (i < 2)
            o->accum = qkv;
        const uint16_t heads = ml__graph_view(g, "heads", picked ? piece : qkv, 4, MLG_B, nh,
                                              MLG_T, MLG_DH);
        ml__kit_view_heads(g, "transpose, reshape (heads, a view)", NULL, piece, heads);
        /* the tensor whose storage the name holds, the rotary's rebinding
         * and the attention's return drop it: a picked piece's own */
        *own[i] = picked ? piece : MLG_NONE;
        *hv[i] = heads;
    }
    r.bound = qkv; /* fused_qkv, bound until the attention returns */
    return r;
}

uint16_t ml__kit_falcon_attention(ml_graph *g, const mlg_layer *L, uint16_t h,
                                  const uint16_t lists[2], uint16_t *held, uint16_t *k,
                                  uint16_t *v)
{
    const mlg_qkv p = split_heads(g, L, h, lists);
    return ml__kit_hf_attention_on(g, L, &p, held, k, v);
}
