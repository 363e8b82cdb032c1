/* The heads and the loss as op graphs (kit_head.h), in the order the
 * chain builders listed what they keep (ledger/chain_head.c). */
#include "graph/kit_head.h"

void ml__kit_ce_loss(ml_graph *g, uint64_t rows, uint64_t classes)
{
    ml__graph_init(g);
    const uint8_t r = ml__graph_lit(g, rows), c = ml__graph_lit(g, classes);
    uint16_t x = ml__graph_tensor(g, "logits", MLG_COMPUTE, MLG_INPUT, 2, r, c);
    uint16_t ls = ml__graph_tensor(g, "log-softmax output", MLG_STREAM, MLG_ACT, 2, r, c);
    mlg_op *o = ml__graph_step(g, MLG_OP_SOFTMAX, "log_softmax", x, ls, NULL);
    ml__op_save(o, ls);
    uint16_t y = ml__graph_tensor(g, "targets (int64)", MLG_INT64, MLG_BATCH, 1, r);
    uint16_t tw = ml__graph_tensor(g, "nll_loss total_weight (fp32 scalar)", MLG_FP32, MLG_ACT, 0);
    uint16_t loss = ml__graph_tensor(g, "loss", MLG_FP32, MLG_ACT, 0);
    o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "nll_loss", ls, loss, NULL);
    ml__op_in(o, y);
    ml__op_out(o, tw);
    ml__op_save(o, y);
    ml__op_save(o, tw);
    g->out = MLG_NONE;
}

void ml__kit_megatron_ce(ml_graph *g, uint64_t rows, uint64_t classes, bool fp32_logits)
{
    ml__graph_init(g);
    const uint8_t r = ml__graph_lit(g, rows), c = ml__graph_lit(g, classes);
    uint16_t x = ml__graph_tensor(g, "logits", MLG_COMPUTE, MLG_INPUT, 2, r, c);
    /* fp32 logits: .float() returns them, and the softmax is made in
     * their own storage */
    uint16_t sm = x;
    if (!fp32_logits) {
        sm = ml__graph_tensor(g, "softmax (fp32: the logits' .float() copy, in place)", MLG_FP32,
                              MLG_ACT, 2, r, c);
        ml__graph_step(g, MLG_OP_COPY, "float()", x, sm, NULL);
    }
    uint16_t y = ml__graph_tensor(g, "targets (int64)", MLG_INT64, MLG_BATCH, 1, r);
    uint16_t mask = ml__graph_tensor(g, "target mask (bool)", MLG_BOOL, MLG_ACT, 1, r);
    uint16_t mt = ml__graph_tensor(g, "masked targets (int64)", MLG_INT64, MLG_ACT, 1, r);
    uint16_t loss = ml__graph_tensor(g, "loss per token (fp32)", MLG_FP32, MLG_ACT, 1, r);
    mlg_op *o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "vocab_parallel_cross_entropy", sm, loss,
                               NULL);
    ml__op_in(o, y);
    ml__op_out(o, mask);
    ml__op_out(o, mt);
    ml__op_save(o, sm);
    ml__op_save(o, mask);
    ml__op_save(o, mt);
    g->out = MLG_NONE;
}

void ml__kit_mse_loss(ml_graph *g, uint64_t n, uint8_t in_dtype, bool cast)
{
    ml__graph_init(g);
    const uint8_t e = ml__graph_lit(g, n);
    uint16_t x = ml__graph_tensor(g, "mse input", in_dtype, MLG_INPUT, 1, e);
    uint16_t xf = x;
    if (cast) {
        xf = ml__graph_tensor(g, "mse input (fp32 cast)", MLG_FP32, MLG_ACT, 1, e);
        ml__graph_step(g, MLG_OP_COPY, "to fp32 (autocast)", x, xf, NULL);
    }
    uint16_t y = ml__graph_tensor(g, "mse target", MLG_STREAM, MLG_BATCH, 1, e);
    uint16_t loss = ml__graph_tensor(g, "loss", MLG_FP32, MLG_ACT, 0);
    mlg_op *o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "mse_loss", xf, loss, NULL);
    ml__op_in(o, y);
    ml__op_save(o, xf);
    ml__op_save(o, y);
    g->out = MLG_NONE;
}

/* GenericForSequenceClassification's pooling without pad_token_id: the
 * last position, a select keeping arange(B) (IndexBackward0's index);
 * with it, (input_ids != pad).to(int32) * arange(T) (int32, made and freed
 * in turn), its argmax (the last non-pad token, int64, kept), arange(B),
 * then logits[arange(B), last]. The (B, T, classes) logits, the int32 mask
 * and arange(T) stay bound until the model's forward returns after the
 * loss: the loss block holds them (ledger/chain_head.c), so they go with
 * the pooled logits here. Returns the pooled logits. */
static uint16_t pool_last(ml_graph *g, uint16_t S, uint8_t cls, bool pad)
{
    uint16_t ar = ml__graph_tensor(g, "pooling batch index (arange, int64)", MLG_INT64, MLG_ACT,
                                   1, MLG_B);
    uint16_t am = MLG_NONE, mi = MLG_NONE, at = MLG_NONE;
    if (pad) {
        am = ml__graph_tensor(g, "pooling last-token index (argmax, int64)", MLG_INT64, MLG_ACT,
                              1, MLG_B);
        uint16_t ne = ml__graph_tensor(g, "input_ids != pad", MLG_BOOL, MLG_ACT, 2, MLG_B, MLG_T);
        /* int32: 4 bytes, the fp32 class's */
        mi = ml__graph_tensor(g, "non-pad mask (int32)", MLG_FP32, MLG_ACT, 2, MLG_B, MLG_T);
        at = ml__graph_tensor(g, "arange(T) (int32)", MLG_FP32, MLG_ACT, 1, MLG_T);
        uint16_t pr = ml__graph_tensor(g, "mask * arange", MLG_FP32, MLG_ACT, 2, MLG_B, MLG_T);
        ml__graph_step(g, MLG_OP_ELEMENTWISE, "ne (pad token)", MLG_NONE, ne, NULL);
        ml__op_free(ml__graph_step(g, MLG_OP_COPY, "to (int32)", ne, mi, NULL), ne);
        ml__graph_step(g, MLG_OP_ELEMENTWISE, "arange (T)", MLG_NONE, at, NULL);
        mlg_op *o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "mul (mask, arange)", mi, pr, NULL);
        ml__op_in(o, at);
        ml__op_free(ml__graph_step(g, MLG_OP_ELEMENTWISE, "argmax", pr, am, NULL), pr);
    }
    ml__graph_step(g, MLG_OP_ELEMENTWISE, "arange (B)", MLG_NONE, ar, NULL);
    uint16_t P = ml__graph_tensor(g, "pooled logits", MLG_COMPUTE, MLG_ACT, 2, MLG_B, cls);
    mlg_op *o = ml__graph_step(g, MLG_OP_COPY, "index (last token)", S, P,
                               "IndexBackward0 (pooling)");
    ml__op_in(o, ar);
    ml__op_save(o, ar);
    ml__op_save(o, am);
    ml__op_free(o, ar);
    ml__op_free(o, am);
    const uint16_t locals[3] = {S, mi, at};
    ml__kit_free_storages(g, ml__graph_release(g, "head returns"), locals, 3);
    return P;
}

void ml__kit_seq_cls_head(ml_graph *g, const mlg_layer *L, uint64_t classes, bool pad)
{
    ml__graph_init(g);
    const uint8_t cls = ml__graph_lit(g, classes);
    uint16_t x = ml__graph_tensor(g, "head input", MLG_STREAM, MLG_INPUT, 3, MLG_B, MLG_T, MLG_D);
    uint16_t h = ml__kit_norm(g, &L->norm, x, false);
    uint16_t c = ml__kit_cast_copy(g, L, h), w = ml__kit_weight_copy(g, L, cls, MLG_D);
    /* score: D -> classes, no bias, on every token */
    uint16_t S = ml__graph_tensor(g, "score logits (every token)", MLG_COMPUTE, MLG_ACT, 3, MLG_B,
                                  MLG_T, cls);
    g->t[S].flags |= MLG_T_TMP;
    uint16_t W = ml__kit_param(g, "score weight", cls, MLG_D);
    ml__kit_cast_ops(g, h, c, w, W);
    const uint16_t hs = c != MLG_NONE ? c : h;
    mlg_op *o = ml__graph_step(g, MLG_OP_MATMUL, "mm (score)", hs, S, NULL);
    ml__op_save(o, hs);
    ml__op_save(o, w);
    ml__op_param(o, W);
    ml__op_flops(o, 2.0, 4, MLG_B, MLG_T, MLG_D, cls);
    ml__op_free(o, c);
    ml__op_free(o, w);
    ml__op_node(o, "MmBackward0 (score)");
    ml__op_gin(o, h);
    ml__op_gout(o, S);
    ml__op_free(ml__graph_release(g, "norm output rebound"), h);
    pool_last(g, S, cls, pad);
}

/* (final_softcap: transformers soft-caps the LM logits only,
 * Gemma2ForCausalLM.forward; its sequence classifier is the generic one) */
bool ml__family_seq_cls_head(const ml_model *m, const mlg_config *c, mlg_layer *L)
{
    return m->type == ML_MODEL_DECODER && m->head.classes && ml__family_layer(m, c, L);
}

/* x[:, 0]: a view (a saving consumer keeps the whole (B, T, D) storage). */
static uint16_t first_token(ml_graph *g, uint16_t x)
{
    return ml__graph_view(g, "first token (x[:, 0])", x, 2, MLG_B, MLG_D);
}

/* A Linear (in: D, out wide) on the (B, D) x, saving what it reads: x or,
 * under autocast, the low-precision copy of an fp32 x, made after the
 * weight's (ml__kit_cast_ops) and gone as the linear returns; autocast's
 * weight copy saved too. Its (B, out) output. */
static uint16_t linear_bd(ml_graph *g, const mlg_layer *L, uint16_t x, uint8_t out,
                          const char *name, const char *yname)
{
    uint16_t w = ml__kit_weight_copy(g, L, out, MLG_D);
    uint16_t W = ml__kit_param(g, "weight", out, MLG_D);
    uint16_t bias = ml__kit_param(g, "bias", out, -1);
    uint16_t y = ml__graph_tensor(g, yname, MLG_COMPUTE, MLG_ACT, 2, MLG_B, out);
    uint16_t c = ml__kit_cast_copy(g, L, x);
    ml__kit_cast_ops(g, x, c, w, W);
    const uint16_t xs = c != MLG_NONE ? c : x;
    mlg_op *o = ml__graph_step(g, MLG_OP_MATMUL, name, xs, y, NULL);
    ml__op_save(o, xs);
    ml__op_save(o, w);
    ml__op_param(o, W);
    ml__op_param(o, bias);
    ml__op_flops(o, 2.0, 3, MLG_B, MLG_D, out);
    ml__op_free(o, w);
    ml__op_free(o, c);
    return y;
}

void ml__kit_encoder_classifier(ml_graph *g, const mlg_layer *L, uint64_t classes, bool prenorm,
                                bool pooler, bool dropout)
{
    ml__graph_init(g);
    const uint8_t cls = ml__graph_lit(g, classes);
    uint16_t x = ml__graph_tensor(g, "head input", MLG_STREAM, MLG_INPUT, 3, MLG_B, MLG_T, MLG_D);
    /* what the head makes before the classifier, freed as it returns (the
     * input is the stream's, not the head's) */
    uint16_t made[4] = {MLG_NONE, MLG_NONE, MLG_NONE, MLG_NONE};
    if (prenorm)
        made[0] = x = ml__kit_norm(g, &L->norm, x, false);
    uint16_t h = first_token(g, x);
    if (pooler) {
        /* BertPooler: dense (D -> D), tanh (saves its result) */
        uint16_t y = linear_bd(g, L, h, MLG_D, "addmm (pooler)", "pooler dense output");
        uint16_t t = ml__graph_tensor(g, "pooler tanh output", MLG_COMPUTE, MLG_ACT, 2, MLG_B,
                                      MLG_D);
        mlg_op *o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "tanh (pooler)", y, t, NULL);
        ml__op_save(o, t);
        ml__op_free(o, y);
        made[2] = h = t;
    }
    if (dropout) {
        uint16_t mask = ml__graph_tensor(g, "classifier dropout mask", MLG_BOOL, MLG_ACT, 2,
                                         MLG_B, MLG_D);
        uint16_t y = ml__graph_tensor(g, "classifier input (dropout output)", g->t[h].dtype,
                                      MLG_ACT, 2, MLG_B, MLG_D);
        mlg_op *o = ml__graph_step(g, MLG_OP_DROPOUT, "native_dropout (classifier)", h, y, NULL);
        ml__op_out(o, mask);
        ml__op_save(o, mask);
        ml__op_free(o, mask); /* (under no_grad the functional drops it) */
        made[3] = h = y;
    }
    linear_bd(g, L, h, cls, "addmm (classifier)", "logits");
    /* the model returns the logits (under no_grad all the head holds; with
     * grad the classifier's saved input and the norm's statistics stay) */
    ml__kit_free_storages(g, ml__graph_release(g, "head returns"), made, 4);
}

/* The settings an encoder's head reads (its final norm, the masked-LM
 * transform's activation, autocast) from the model's layer family; a text
 * encoder with rotary positions, whose layers the kit does not express
 * (the BERT layer has no rotary), from the same layer without them: the
 * head reads no positions. */
static bool encoder_head_layer(const ml_model *m, const mlg_config *c, mlg_layer *L)
{
    if (ml__family_layer(m, c, L))
        return true;
    if (m->embed.position != ML_POS_ROPE || m->embed.image_size)
        return false;
    ml_model unrotated = *m;
    unrotated.embed.position = ML_POS_NONE;
    return ml__family_layer(&unrotated, c, L);
}

bool ml__family_encoder_classifier(const ml_model *m, const mlg_config *c, mlg_layer *L)
{
    return m->type == ML_MODEL_ENCODER && m->head.classes && !m->head.mlm &&
           encoder_head_layer(m, c, L);
}

/* BertLMPredictionHead's transform: dense (D -> D), the activation (GELU
 * saves its input, ReLU its result), a LayerNorm (autocast runs it on an
 * fp32 copy) with a weight and a bias whatever the layers' norms have.
 * Returns the LayerNorm's output. */
static uint16_t mlm_transform(ml_graph *g, const mlg_layer *L, uint16_t x)
{
    const bool gelu = L->mlp.act == MLG_GELU;
    uint16_t c = ml__kit_cast_copy(g, L, x), w = ml__kit_weight_copy(g, L, MLG_D, MLG_D);
    uint16_t W = ml__kit_param(g, "dense weight", MLG_D, MLG_D);
    uint16_t bias = ml__kit_param(g, "dense bias", MLG_D, -1);
    uint16_t y = ml__graph_tensor(g, "mlm dense output", MLG_COMPUTE, MLG_ACT, 3, MLG_B, MLG_T,
                                  MLG_D);
    ml__kit_cast_ops(g, x, c, w, W);
    const uint16_t xs = c != MLG_NONE ? c : x;
    mlg_op *o = ml__graph_step(g, MLG_OP_MATMUL, "addmm (mlm dense)", xs, y, NULL);
    ml__op_save(o, xs);
    ml__op_save(o, w);
    ml__op_param(o, W);
    ml__op_param(o, bias);
    ml__op_free(o, c);
    ml__op_free(o, w);
    uint16_t h = ml__graph_tensor(g, gelu ? "mlm gelu output" : "mlm relu output", MLG_COMPUTE,
                                  MLG_ACT, 3, MLG_B, MLG_T, MLG_D);
    o = ml__graph_step(g, MLG_OP_ELEMENTWISE, gelu ? "gelu (mlm)" : "relu (mlm)", y, h, NULL);
    ml__op_save(o, gelu ? y : h);
    ml__op_free(o, y);
    uint16_t hn = h;
    if (L->autocast) {
        hn = ml__graph_tensor(g, "mlm layernorm input (fp32 cast)", MLG_STREAM, MLG_ACT, 3, MLG_B,
                              MLG_T, MLG_D);
        ml__graph_step(g, MLG_OP_COPY, "to (fp32, layernorm)", h, hn, NULL);
    }
    const mlg_norm n = {MLG_LAYERNORM, true, false, false};
    uint16_t st = ml__kit_layernorm_stats(g);
    uint16_t out = ml__kit_layernorm(g, &n, hn, false, st);
    const uint16_t rebound[2] = {h, hn};
    ml__kit_free_storages(g, ml__graph_release(g, "activation output rebound"), rebound, 2);
    return out;
}

void ml__kit_mlm_head(ml_graph *g, const mlg_layer *L, bool tied)
{
    ml__graph_init(g);
    /* the dense's and the decoder's products as the builders summed them:
     * one product over D + V (dimension L0), counted on the decoder */
    const uint8_t dv = MLG_L0;
    g->lit[0] = 0;
    g->nlit = 1;
    uint16_t x = ml__graph_tensor(g, "head input", MLG_STREAM, MLG_INPUT, 3, MLG_B, MLG_T, MLG_D);
    /* the decoder's bias is the head module's own parameter, registered
     * before its submodules' (model.parameters() lists it first) */
    g->group = 0;
    uint16_t vb = ml__kit_param(g, "decoder bias", MLG_V, -1);
    g->group = 1;
    uint16_t h = mlm_transform(g, L, x);
    uint16_t c = ml__kit_cast_copy(g, L, h), w = ml__kit_weight_copy(g, L, MLG_V, MLG_D);
    uint16_t logits = ml__graph_tensor(g, "logits", MLG_COMPUTE, MLG_ACT, 3, MLG_B, MLG_T, MLG_V);
    /* the (V, D) decoder: its own, or the word embeddings (tied: its
     * gradient is first created here, chain_head.c) */
    uint16_t W = ml__kit_param(g, "decoder weight", MLG_V, MLG_D);
    if (tied && W != MLG_NONE)
        g->t[W].flags |= MLG_T_SHARED;
    ml__kit_cast_ops(g, h, c, w, W);
    const uint16_t hs = c != MLG_NONE ? c : h;
    mlg_op *o = ml__graph_step(g, MLG_OP_MATMUL, "addmm (mlm decoder)", hs, logits, NULL);
    ml__op_save(o, hs);
    ml__op_save(o, w);
    ml__op_param(o, W);
    ml__op_param(o, vb);
    ml__op_flops(o, 2.0, 4, MLG_B, MLG_T, MLG_D, dv);
    ml__op_free(o, c);
    ml__op_free(o, w);
    ml__op_free(ml__graph_release(g, "head returns"), h);
}

bool ml__family_mlm_head(const ml_model *m, const mlg_config *c, mlg_layer *L)
{
    return m->type == ML_MODEL_ENCODER && m->head.mlm && encoder_head_layer(m, c, L);
}

void ml__kit_fused_ce(ml_graph *g, bool tied)
{
    ml__graph_init(g);
    uint16_t x = ml__graph_tensor(g, "final norm output", MLG_STREAM, MLG_INPUT, 3, MLG_B, MLG_T,
                                  MLG_D);
    uint16_t y = ml__graph_tensor(g, "targets (int64)", MLG_INT64, MLG_BATCH, 2, MLG_B, MLG_T);
    uint16_t W = ml__kit_param(g, "lm_head weight", MLG_V, MLG_D);
    if (tied && W != MLG_NONE)
        g->t[W].flags |= MLG_T_SHARED;
    uint16_t loss = ml__graph_tensor(g, "loss", MLG_FP32, MLG_ACT, 0);
    /* the chunks' logits, the cross-entropy's gradient over them and the
     * two gradients' products, all in the forward */
    mlg_op *o = ml__graph_step(g, MLG_OP_MATMUL, "fused linear cross-entropy", x, loss, NULL);
    ml__op_in(o, y);
    ml__op_save(o, y);
    ml__op_param(o, W);
    ml__op_flops(o, 6.0, 4, MLG_B, MLG_T, MLG_D, MLG_V);
    /* its backward hands over the gradients its forward made: nothing new */
    ml__op_node(ml__graph_release(g, "returns"),
                "LigerFusedLinearCrossEntropyFunctionBackward (hands over)");
}
