/* The softmax of HF's eager attention (kit.h, ml__kit_hf_softmax):
 * eager_attention_forward's softmax(dtype=fp32) and its cast back,
 * BertSelfAttention's and FalconAttention's in the stream's dtype, each
 * with the dropout on the probabilities. */
#include <stddef.h>

#include "graph/kit.h"

/* BertSelfAttention's: softmax in the stream's dtype (autocast runs it in
 * fp32), saving its result, then dropout, then the PV matmul's cast of
 * the probabilities (autocast: not the stream's dtype); the masked scores
 * stay bound (attention_scores) until it returns. FalconAttention's
 * F.softmax(scores + mask, dtype=hidden_states.dtype) is the same without
 * a dropout, the sum a temporary. */
static uint16_t softmax_stream(ml_graph *g, const mlg_layer *L, uint16_t S3)
{
    const mlg_attention *a = &L->attn;
    uint16_t P = ml__kit_scores(g, "softmax output", MLG_STREAM, MLG_T_CORE);
    mlg_op *o = ml__graph_step(g, MLG_OP_SOFTMAX, "softmax", S3, P, "SoftmaxBackward0");
    ml__op_save(o, P);
    if (!a->bert) /* Falcon's scores + mask: a temporary */
        ml__op_free(o, S3);
    uint16_t probs = ml__kit_dropout(g, a->dropout, P, "NativeDropoutBackward0 (attention)", true,
                                     false);
    return a->probs_cast ? ml__kit_probs_cast(g, probs) : probs;
}

uint16_t ml__kit_hf_softmax(ml_graph *g, const mlg_layer *L, uint16_t S3)
{
    const mlg_attention *a = &L->attn;
    if (a->bert || a->stream_softmax)
        return softmax_stream(g, L, S3);
    uint16_t Sc = a->softmax_copy ? ml__kit_scores(g, "scores (fp32 copy)", MLG_FP32, 0) : MLG_NONE;
    uint16_t P = ml__kit_scores(g, "softmax output", MLG_FP32, MLG_T_CORE);
    /* the copy's ToCopyBackward0 casts the fp32 gradient back */
    if (Sc != MLG_NONE)
        ml__graph_step(g, MLG_OP_COPY, "to (fp32, softmax input)", S3, Sc,
                       "ToCopyBackward0 (softmax input)");
    mlg_op *o = ml__graph_step(g, MLG_OP_SOFTMAX, "softmax", Sc != MLG_NONE ? Sc : S3, P, NULL);
    ml__op_save(o, P);
    ml__op_free(o, Sc);
    /* softmax(...).to(query.dtype) rebinds the scores once the cast is made */
    const bool cast = a->probs_cast && !a->rot_fp32;
    ml__op_free(o, cast ? MLG_NONE : S3);
    ml__op_node(o, "SoftmaxBackward0");
    ml__op_gin(o, Sc != MLG_NONE ? Sc : S3);
    ml__op_gout(o, P);
    uint16_t probs = cast ? ml__kit_probs_cast(g, P) : P;
    if (cast)
        ml__op_free(ml__graph_release(g, "scores rebound"), S3);
    return ml__kit_dropout(g, a->dropout, probs, "NativeDropoutBackward0 (attention)", true, false);
}
