/* The embeddings as an op graph (kit_embed.h): what eager autograd keeps
 * for each (docs/inventory.md, "Embeddings"), in the order the chain
 * builders listed it (ledger/chain_embed.c): the token ids, the position
 * ids, the token type ids, the rotary's cos and sin, the LayerNorm's input
 * and statistics, the dropout's mask; the parameters as the modules
 * register them. The embedding's backward keeps the block rule (no node
 * list), as the builders had it. */
#include "graph/kit_embed.h"

bool ml__family_embedding(const ml_model *m, const mlg_config *c, bool drop, mlg_embed *E)
{
    const bool enc = m->type == ML_MODEL_ENCODER;
    *E = (mlg_embed){0};
    E->patches = m->embed.image_size > 0;
    E->autocast = c->autocast;
    E->scale = m->embed.scale;
    E->learned = m->embed.position == ML_POS_LEARNED;
    E->types = enc && m->embed.token_types;
    E->layernorm = enc;
    E->dropout = drop;
    E->vocab_parallel = m->embed.vocab_parallel;
    if (m->embed.position == ML_POS_ROPE)
        E->rotary = m->embed.rope_complex ? MLG_ROTARY_COMPLEX : MLG_ROTARY_COS_SIN;
    return true;
}

static uint16_t stream(ml_graph *g, const char *name, uint8_t dtype, uint8_t flags)
{
    uint16_t t = ml__graph_tensor(g, name, dtype, MLG_ACT, 3, MLG_B, MLG_T, MLG_D);
    g->t[t].flags |= flags;
    return t;
}

/* x + y (their last references go): the sum, named what the next op
 * saves it as. */
static uint16_t add(ml_graph *g, uint16_t x, uint16_t y, const char *name, uint8_t dtype)
{
    uint16_t s = stream(g, name, dtype, MLG_T_TMP);
    mlg_op *o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "add (embeddings)", x, s, NULL);
    ml__op_in(o, y);
    ml__op_free(o, x);
    ml__op_free(o, y);
    return s;
}

/* A lookup in the table (rows x D) by the int64 ids: the result, of
 * shape (B, T, D) (per_token) or (T, D). */
static uint16_t lookup(ml_graph *g, uint16_t ids, const char *table, uint8_t rows,
                       bool per_token)
{
    uint16_t W = ml__kit_param(g, table, rows, MLG_D);
    uint16_t e = per_token ? stream(g, "embeddings", MLG_STREAM, MLG_T_TMP)
                           : ml__graph_tensor(g, "embeddings", MLG_STREAM, MLG_ACT, 2, MLG_T,
                                              MLG_D);
    mlg_op *o = ml__graph_step(g, MLG_OP_COPY, "embedding", ids, e, NULL);
    ml__op_save(o, ids);
    ml__op_param(o, W);
    return e;
}

/* Megatron's VocabParallelEmbedding above one tensor rank
 * (megatron/core/tensor_parallel/layers.py, VocabParallelEmbedding.forward):
 * input_mask = (ids < start) | (ids >= end), a bool (B, T) made of two;
 * masked_input = ids.clone() - start, an int64 (B, T) made from a clone
 * (the masked ones set to 0 in place); the lookup by masked_input, which
 * F.embedding saves. Returns masked_input; *mask the mask, which the
 * output's zeroing saves (vocab_parallel_zero). */
static uint16_t vocab_parallel_ids(ml_graph *g, uint16_t tok, uint16_t *mask)
{
    uint16_t lt = ml__graph_tensor(g, "ids < start (bool)", MLG_BOOL, MLG_ACT, 2, MLG_B, MLG_T);
    uint16_t ge = ml__graph_tensor(g, "ids >= end (bool)", MLG_BOOL, MLG_ACT, 2, MLG_B, MLG_T);
    *mask = ml__graph_tensor(g, "vocab-parallel input mask (bool)", MLG_BOOL, MLG_ACT, 2, MLG_B,
                             MLG_T);
    uint16_t c = ml__graph_tensor(g, "token ids clone (int64)", MLG_INT64, MLG_ACT, 2, MLG_B, MLG_T);
    uint16_t mi = ml__graph_tensor(g, "masked ids (int64)", MLG_INT64, MLG_ACT, 2, MLG_B, MLG_T);
    g->t[lt].flags |= MLG_T_TMP;
    g->t[ge].flags |= MLG_T_TMP;
    g->t[c].flags |= MLG_T_TMP;
    ml__graph_step(g, MLG_OP_ELEMENTWISE, "lt (the rank's first row)", tok, lt, NULL);
    ml__graph_step(g, MLG_OP_ELEMENTWISE, "ge (past the rank's rows)", tok, ge, NULL);
    mlg_op *o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "or (input_mask)", lt, *mask, NULL);
    ml__op_in(o, ge);
    ml__op_free(o, lt);
    ml__op_free(o, ge);
    ml__graph_step(g, MLG_OP_COPY, "clone (ids)", tok, c, NULL);
    ml__op_free(ml__graph_step(g, MLG_OP_ELEMENTWISE, "sub (the rank's first row)", c, mi, NULL),
                c);
    return mi;
}

/* output_parallel[input_mask, :] = 0.0: index_put_ in place (CopySlices
 * over IndexPutBackward0), which saves the mask. */
static void vocab_parallel_zero(ml_graph *g, uint16_t x, uint16_t mask)
{
    mlg_op *o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "index_put_ (masked rows to 0)", x,
                               MLG_NONE, NULL);
    ml__op_in(o, mask);
    ml__op_save(o, mask);
}

/* The ids an op makes (arange, a zeros buffer expanded): int64. */
static uint16_t ids(ml_graph *g, const char *name, bool per_token)
{
    uint16_t t = per_token ? ml__graph_tensor(g, name, MLG_INT64, MLG_ACT, 2, MLG_B, MLG_T)
                           : ml__graph_tensor(g, name, MLG_INT64, MLG_ACT, 1, MLG_T);
    ml__graph_step(g, MLG_OP_COPY, "ids", MLG_NONE, t, NULL);
    return t;
}

/* The rotary's cos and sin in the stream's dtype, each (1, T, rot): the
 * position ids a model makes when given none are cache_position[None],
 * one row for the whole batch (LlamaModel.forward; the rotary's
 * inv_freq expanded to position_ids.shape[0], modeling_llama.py), two
 * tensors (cos, then sin); or DeepSeek-V2's (1, T, rot / 2) complex64
 * freqs_cis (Llama4TextRotaryEmbedding's, as wide in fp32 pairs as rot).
 * Kept for every layer. */
static void rotary(ml_graph *g, const mlg_embed *E)
{
    if (!E->rotary)
        return;
    if (E->rotary == MLG_ROTARY_COMPLEX) {
        uint16_t cs = ml__graph_tensor(g, "rotary freqs_cis, complex64 (shared by all blocks)",
                                       MLG_FP32, MLG_ACT, 2, MLG_T, ml__graph_lit(g, E->rot));
        g->t[cs].table = MLG_TABLE_CIS;
        ml__op_save(ml__graph_step(g, MLG_OP_ELEMENTWISE, "rotary embedding", MLG_NONE, cs, NULL),
                    cs);
        return;
    }
    const uint8_t rot = ml__graph_lit(g, E->rot);
    uint16_t c = ml__graph_tensor(g, "rotary cos (shared by all blocks)", MLG_STREAM, MLG_ACT, 2,
                                  MLG_T, rot);
    uint16_t s = ml__graph_tensor(g, "rotary sin (shared by all blocks)", MLG_STREAM, MLG_ACT, 2,
                                  MLG_T, rot);
    g->t[c].table = MLG_TABLE_COS;
    g->t[s].table = MLG_TABLE_SIN;
    mlg_op *o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "rotary embedding", MLG_NONE, c, NULL);
    ml__op_out(o, s);
    ml__op_save(o, c);
    ml__op_save(o, s);
}

/* Token embeddings (HF's Embedding modules; Gemma's scale, a host scalar
 * mul saves: nothing on the device), then the positions, the token types
 * and the rotary (kept for every layer), their sum, BERT's LayerNorm. A
 * LayerNorm over the lookup alone (a text encoder with rotary positions
 * and no token types) saves the lookup's output, which the builders list
 * after the rotary's (their "embedding layernorm input"): the rotary
 * comes first there. */
static uint16_t tokens(ml_graph *g, const mlg_embed *E)
{
    uint16_t tok = ml__graph_tensor(g, "token ids (int64)", MLG_INT64, MLG_INPUT, 2, MLG_B, MLG_T);
    const bool bare = E->layernorm && !E->learned && !E->types;
    if (bare)
        rotary(g, E);
    uint16_t mask = MLG_NONE;
    const uint16_t by = E->vocab_parallel ? vocab_parallel_ids(g, tok, &mask) : tok;
    uint16_t x = lookup(g, by, "word embeddings", MLG_V, true);
    if (mask != MLG_NONE)
        vocab_parallel_zero(g, x, mask);
    if (E->scale) {
        uint16_t s = stream(g, "embeddings * normalizer", MLG_STREAM, MLG_T_TMP);
        ml__op_free(ml__graph_step(g, MLG_OP_ELEMENTWISE, "mul (sqrt(D))", x, s, NULL), x);
        x = s;
    }
    uint16_t pos = MLG_NONE, typ = MLG_NONE;
    if (E->learned) {
        uint16_t p = ids(g, "position ids (int64)", false);
        pos = lookup(g, p, "position embeddings", ml__graph_lit(g, E->positions), false);
    }
    if (E->types) {
        uint16_t t = ids(g, "token type ids (int64)", true);
        typ = lookup(g, t, "token type embeddings", ml__graph_lit(g, E->ntypes), true);
    }
    if (!bare)
        rotary(g, E);
    const char *sum = E->layernorm ? "embedding layernorm input" : "embeddings";
    if (typ != MLG_NONE)
        x = add(g, x, typ, pos != MLG_NONE ? "embeddings" : sum, MLG_STREAM);
    if (pos != MLG_NONE)
        x = add(g, x, pos, sum, MLG_STREAM);
    if (!E->layernorm)
        return x;
    uint16_t st = ml__graph_tensor(g, "embedding layernorm mean+rstd", MLG_FP32, MLG_ACT, 2, MLG_B,
                                   MLG_T);
    g->t[st].factor = 2;
    uint16_t y = stream(g, "embedding layernorm output", MLG_STREAM, MLG_T_TMP);
    mlg_op *o = ml__graph_step(g, MLG_OP_NORM, "native_layer_norm (embeddings)", x, y, NULL);
    ml__op_out(o, st);
    ml__op_save(o, x);
    ml__op_save(o, st);
    ml__op_param(o, ml__kit_param(g, "layernorm weight", MLG_D, -1));
    ml__op_param(o, ml__kit_param(g, "layernorm bias", MLG_D, -1));
    ml__op_free(o, x);
    return y;
}

/* HF ViTEmbeddings: the conv patchify of an image that needs no grad (its
 * input, or autocast's cast copy, and the weight's copy saved), the class
 * token concatenated, the positions added; the weight's gradient only. */
static uint16_t patches(ml_graph *g, const mlg_embed *E)
{
    const uint8_t img = ml__graph_lit(g, E->image), kin = ml__graph_lit(g, E->kin),
                  np = ml__graph_lit(g, E->npatches);
    uint16_t x = ml__graph_tensor(g, "image (patch conv input)", MLG_STREAM, MLG_INPUT, 2, MLG_B,
                                  img);
    uint16_t xs = x, w = MLG_NONE;
    if (E->autocast) {
        xs = ml__graph_tensor(g, "image cast copy (patch conv input)", MLG_HALF, MLG_ACT, 2,
                              MLG_B, img);
        ml__graph_step(g, MLG_OP_COPY, "to (autocast, image)", x, xs, NULL);
        w = ml__graph_tensor(g, "weight cast copy (autocast)", MLG_HALF, MLG_ACT, 2, MLG_D, kin);
        g->t[w].flags |= MLG_T_WCAST;
        ml__graph_step(g, MLG_OP_COPY, "to (autocast, weight)", MLG_NONE, w, NULL);
    }
    uint16_t p = ml__graph_tensor(g, "patch embeddings", MLG_COMPUTE, MLG_ACT, 3, MLG_B, np,
                                  MLG_D);
    mlg_op *o = ml__graph_step(g, MLG_OP_MATMUL, "convolution (patches)", xs, p, NULL);
    ml__op_save(o, xs);
    ml__op_save(o, w);
    ml__op_param(o, ml__kit_param(g, "patch conv weight", MLG_D, kin));
    ml__op_param(o, ml__kit_param(g, "patch conv bias", MLG_D, -1));
    ml__op_flops(o, 2.0, 4, MLG_B, np, kin, MLG_D);
    ml__op_free(o, w);
    if (xs != x)
        ml__op_free(o, xs);
    uint16_t c = stream(g, "embeddings (class token first)", MLG_COMPUTE, MLG_T_TMP);
    o = ml__graph_step(g, MLG_OP_COPY, "cat (class token)", p, c, NULL);
    /* its gradient: cat's backward narrows the embeddings' gradient, and
     * expand's (the batch's copies) sums that slice, but for one image */
    g->grad_view = ml__kit_param(g, "class token", MLG_D, -1);
    ml__op_param(o, g->grad_view);
    ml__op_free(o, p);
    uint16_t s = stream(g, "embeddings", MLG_COMPUTE, MLG_T_TMP);
    o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "add (positions)", c, s, NULL);
    ml__op_param(o, ml__kit_param(g, "position embeddings", ml__graph_lit(g, E->td), -1));
    ml__op_free(o, c);
    return s;
}

void ml__kit_embedding(ml_graph *g, const mlg_embed *E)
{
    ml__graph_init(g);
    uint16_t x = E->patches ? patches(g, E) : tokens(g, E);
    if (!E->dropout)
        return;
    uint16_t mask = ml__graph_tensor(g, "embedding dropout mask", MLG_BOOL, MLG_ACT, 3, MLG_B,
                                     MLG_T, MLG_D);
    uint16_t y = stream(g, "dropout output", g->t[x].dtype, 0);
    mlg_op *o = ml__graph_step(g, MLG_OP_DROPOUT, "native_dropout (embeddings)", x, y, NULL);
    ml__op_out(o, mask);
    ml__op_save(o, mask);
    ml__op_free(o, x);
}
