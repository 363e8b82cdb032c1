/* A sequential model's block as an op graph (kit_seq.h): each layer kind
 * as the ops PyTorch's modules run (torch.nn's Linear, Conv2d,
 * BatchNorm2d, LayerNorm, ReLU, GELU, SiLU, Dropout, MaxPool2d,
 * AvgPool2d or a global mean, Flatten, Embedding) and a residual as its
 * body, its shortcut and their sum. The saved tensors are named by the
 * first op to save them and declared in the order they are first saved,
 * the inventory's order (docs/graph.md, "Sequential layers"); sources in
 * docs/inventory.md. */
#include <string.h>

#include "graph/kit.h"
#include "graph/kit_seq.h"

/* The walk through one block: what the ops need to know of each tensor. */
typedef struct {
    ml_graph *g;
    const mlg_seq_config *c;
    mlg_seq_block *info;
    uint16_t in; /* the block's input */
    uint8_t bpe[MLG_MAX_TENSORS + 1];
    bool saved[MLG_MAX_TENSORS + 1];   /* an op saved its storage */
    uint8_t later[MLG_MAX_TENSORS + 1]; /* consumers built after the one
                                           being built (a residual's
                                           shortcut): their gradients reach
                                           its InputBuffer first */
    uint8_t held[MLG_MAX_TENSORS + 1];  /* a residual's frame holds it */
    unsigned depth;    /* residuals entered */
    unsigned nnodes;   /* ops with a backward node so far */
    uint16_t last_op;  /* the last of them */
    uint16_t last_out; /* its output */
    bool refused;      /* a layer the kit does not express, or a size that
                          passed 64 bits */
} sq;

/* The literal size v's dimension (dedup'd); a graph out of slots is full. */
static uint8_t lit(sq *s, uint64_t v)
{
    ml_graph *g = s->g;
    for (uint8_t i = 0; i < g->nlit; i++)
        if (g->lit[i] == v)
            return (uint8_t)(MLG_L0 + i);
    if (g->nlit >= MLG_NLIT) {
        g->full = true;
        return MLG_L0;
    }
    g->lit[g->nlit] = v;
    return (uint8_t)(MLG_L0 + g->nlit++);
}

static uint64_t mul(sq *s, uint64_t a, uint64_t b)
{
    uint64_t r;
    if (__builtin_mul_overflow(a, b, &r))
        s->refused = s->info->overflow = true;
    return r;
}

/* The class of a tensor of bpe bytes per element. */
static uint8_t dtype_of(const sq *s, unsigned bpe)
{
    if (bpe == s->c->stream_bytes)
        return MLG_STREAM;
    return bpe == 1 ? MLG_BOOL : bpe == 2 ? MLG_HALF : bpe == 8 ? MLG_INT64 : MLG_FP32;
}

/* An activation of per_sample elements a sample. */
static uint16_t act(sq *s, const char *name, uint64_t per_sample, unsigned bpe)
{
    uint16_t t = ml__graph_tensor(s->g, name, dtype_of(s, bpe), MLG_ACT, 2, MLG_B,
                                  lit(s, per_sample));
    s->bpe[t] = (uint8_t)bpe;
    return t;
}

/* One of x's shape at bpe bytes per element (a mask, a cast copy): x a
 * layer's output, (B, per sample), or an attention layer's, (B, T, D). */
static uint16_t like(sq *s, const char *name, uint16_t x, unsigned bpe)
{
    const mlg_tensor *p = &s->g->t[x];
    const uint8_t d = dtype_of(s, bpe);
    uint16_t t = p->ndim == 3
                     ? ml__graph_tensor(s->g, name, d, MLG_ACT, 3, p->dim[0], p->dim[1], p->dim[2])
                     : ml__graph_tensor(s->g, name, d, MLG_ACT, 2, p->dim[0], p->dim[1]);
    s->bpe[t] = (uint8_t)bpe;
    return t;
}

/* A tensor of n elements whatever the batch (batch norm's statistics). */
static uint16_t fixed(sq *s, const char *name, uint64_t n, unsigned bpe)
{
    uint16_t t = ml__graph_tensor(s->g, name, dtype_of(s, bpe), MLG_ACT, 1, lit(s, n));
    s->bpe[t] = (uint8_t)bpe;
    return t;
}

static uint16_t param(sq *s, uint64_t rows, uint64_t cols)
{
    if (!cols)
        return ml__graph_tensor(s->g, "parameter", MLG_PARAM, MLG_PARAMETER, 1, lit(s, rows));
    return ml__graph_tensor(s->g, "parameter", MLG_PARAM, MLG_PARAMETER, 2, lit(s, rows),
                            lit(s, cols));
}

static bool model_input(const sq *s, uint16_t t)
{
    return t == s->in && s->c->in_nograd;
}

/* t saved for the first time, by an op that names it what. The chain
 * builders listed a saved tensor where its first saver saved it (the
 * outputs' order), the inventory lists entries in declaration order: when
 * tensors were declared after t (a residual's body before its shortcut,
 * an attention layer's weight copies after its output), t's storage is
 * counted in an entry declared here. */
static void first_save(sq *s, uint16_t t, const char *what)
{
    ml_graph *g = s->g;
    s->saved[t] = true;
    if (t + 1 == g->nt) {
        g->t[t].name = what;
        return;
    }
    g->t[t].base = like(s, what, t, s->bpe[t]);
}

/* Op o saves t, the first saver naming its entry; autocast saves a cast
 * copy instead for a matmul reading an fp32 tensor (one per consumer:
 * casts of activations are not cached). */
static void save(sq *s, mlg_op *o, uint16_t t, const char *what, bool matmul)
{
    if (matmul && s->c->autocast && s->bpe[t] == 4) {
        ml__op_save(o, like(s, what, t, 2));
        return;
    }
    if (t != s->in && !s->saved[t])
        first_save(s, t, what);
    ml__op_save(o, t);
}

/* Op o was x's last reader: its reference goes (nn.Sequential rebinds its
 * one name), unless x is the block's input (its caller's) or a residual's
 * frame still holds it. */
static void consume(sq *s, mlg_op *o, uint16_t x)
{
    if (x != s->in && !s->held[x])
        ml__op_free(o, x);
}

/* The backward node of op o (the last built), which made y from x: x's
 * gradient (none for the model's input; an InputBuffer accumulation when a
 * later-built consumer's gradient reached x first), its parameters'
 * gradients, y's gradient freed once it has run. On the model's input
 * without parameters nothing needs a gradient: no node in autograd's graph. */
static void node(sq *s, mlg_op *o, const char *name, uint16_t x, uint16_t y, bool params)
{
    if (model_input(s, x) && !params) {
        s->info->nodes_off = true;
        return;
    }
    ml__op_node(o, name);
    if (!model_input(s, x)) {
        ml__op_gin(o, x);
        if (s->later[x])
            o->accum = x;
    }
    ml__op_gout(o, y);
    s->nnodes++;
    s->last_op = (uint16_t)(s->g->nop - 1);
    s->last_out = y;
}

/* Linear (on the last axis) or conv2d (per output pixel): rows x kin x out
 * multiply-adds; addmm/mm or convolution_backward makes the input's
 * gradient (when it needs one), the weight's and the bias's. */
static uint16_t matmul(sq *s, const ml_layer *l, uint16_t x, const ml_shape *sh,
                       const ml_shape *o, uint64_t out_ps)
{
    ml_graph *g = s->g;
    const bool lin = l->kind == ML_L_LINEAR;
    const uint64_t kin = lin ? sh->d[sh->rank - 1] : mul(s, mul(s, sh->d[0], l->kernel), l->kernel);
    const uint64_t rows = lin ? mul(s, s->c->B, sh->rank == 2 ? sh->d[0] : 1)
                              : mul(s, s->c->B, o->d[1] * o->d[2]);
    mlg_op *op = ml__graph_op(g, MLG_OP_MATMUL, lin ? "linear" : "conv2d");
    ml__op_in(op, x);
    save(s, op, x, lin ? "linear input" : "conv2d input", true);
    if (s->c->autocast && !model_input(s, x)) {
        /* autocast's weight copy, saved for the input's gradient */
        uint16_t w = ml__graph_tensor(g, "weight cast copy (autocast)", MLG_HALF, MLG_ACT, 2,
                                      lit(s, kin), lit(s, l->out));
        g->t[w].flags |= MLG_T_WCAST;
        ml__op_save(op, w);
    }
    ml__op_param(op, param(s, l->out, kin));
    if (l->bias)
        ml__op_param(op, param(s, l->out, 0));
    ml__op_flops(op, 2.0, 3, lit(s, rows), lit(s, kin), lit(s, l->out));
    uint16_t y = act(s, lin ? "linear output" : "conv2d output", out_ps,
                     s->c->autocast ? 2 : s->bpe[x]);
    ml__op_out(op, y);
    consume(s, op, x);
    node(s, op, lin ? (l->bias ? "AddmmBackward0" : "MmBackward0") : "ConvolutionBackward0", x,
         y, true);
    return y;
}

/* native/cudnn batch_norm saves its input, save_mean and save_invstd (the
 * statistics, fp32, dropped under no_grad; in evaluation it reads the
 * running statistics and makes none); running_mean, running_var and
 * num_batches_tracked are buffers. */
static uint16_t batchnorm(sq *s, uint16_t x, const ml_shape *sh, uint64_t out_ps)
{
    const uint64_t C = sh->d[0];
    mlg_op *op = ml__graph_op(s->g, MLG_OP_NORM, "batch_norm");
    ml__op_in(op, x);
    save(s, op, x, "batchnorm input", false);
    uint16_t st = fixed(s, "batchnorm save_mean+save_invstd", mul(s, C, 2), 4);
    ml__op_save(op, st);
    ml__op_param(op, param(s, C, 0));
    ml__op_param(op, param(s, C, 0));
    s->info->bn_channels += C;
    s->info->nbn++;
    uint16_t y = act(s, "batchnorm output", out_ps, s->bpe[x]);
    ml__op_out(op, y);
    if (!s->c->eval) {
        ml__op_out(op, st);
        ml__op_free(op, st);
    }
    consume(s, op, x);
    node(s, op, "NativeBatchNormBackward0", x, y, true);
    return y;
}

/* native_layer_norm saves its input (autocast runs it in fp32: an fp32
 * copy of a half input), mean and rstd; its output is fp32 under autocast. */
static uint16_t layernorm(sq *s, uint16_t x, const ml_shape *sh, uint64_t out_ps)
{
    const uint64_t last = sh->d[sh->rank - 1];
    mlg_op *op = ml__graph_op(s->g, MLG_OP_NORM, "layer_norm");
    ml__op_in(op, x);
    if (s->c->autocast && s->bpe[x] == 2)
        ml__op_save(op, like(s, "layernorm input (fp32 cast, autocast)", x, 4));
    else
        save(s, op, x, "layernorm input", false);
    uint16_t st = ml__graph_tensor(s->g, "layernorm mean+rstd", MLG_FP32, MLG_ACT, 2, MLG_B,
                                   lit(s, mul(s, ml__shape_elems(sh) / last, 2)));
    s->bpe[st] = 4;
    ml__op_save(op, st);
    ml__op_param(op, param(s, last, 0));
    ml__op_param(op, param(s, last, 0));
    uint16_t y = act(s, "layernorm output", out_ps, s->c->autocast ? 4 : s->bpe[x]);
    ml__op_out(op, y);
    ml__op_out(op, st);
    ml__op_free(op, st);
    consume(s, op, x);
    node(s, op, "NativeLayerNormBackward0", x, y, true);
    return y;
}

/* threshold_backward uses the result; in place, that is x's storage: inside
 * a block, the output is x; on the block's input a new tensor (the replay
 * frees the input before the output exists: the block's `inplace`). */
static uint16_t relu(sq *s, const ml_layer *l, uint16_t x, uint64_t out_ps)
{
    const bool here = l->inplace && x != s->in && !s->held[x] && !s->later[x];
    if (l->inplace && x == s->in && !s->depth)
        s->info->inplace = true;
    mlg_op *op = ml__graph_op(s->g, MLG_OP_ELEMENTWISE, "relu");
    ml__op_in(op, x);
    if (here) {
        save(s, op, x, "relu output (in place)", false);
        node(s, op, "ReluBackward0", x, x, false);
        return x;
    }
    uint16_t y = act(s, "relu output", out_ps, s->bpe[x]);
    ml__op_out(op, y);
    save(s, op, y, "relu output", false);
    consume(s, op, x);
    node(s, op, "ReluBackward0", x, y, false);
    return y;
}

/* An op saving x (gelu, silu, a windowed pooling: save_x) or nothing (a
 * global mean, whose backward keeps sizes only), making y. */
static uint16_t unary(sq *s, uint16_t x, uint64_t out_ps, const char *save_x, const char *name,
                      const char *bwd)
{
    mlg_op *op = ml__graph_op(s->g, MLG_OP_ELEMENTWISE, name);
    ml__op_in(op, x);
    if (save_x)
        save(s, op, x, save_x, false);
    uint16_t y = act(s, name, out_ps, s->bpe[x]);
    ml__op_out(op, y);
    consume(s, op, x);
    node(s, op, bwd, x, y, false);
    return y;
}

/* native_dropout saves its bool mask (dropped under no_grad); in
 * evaluation the identity: the forward pass aliases its output to its
 * input's storage, which the output's reader frees, as the builders had it
 * (no allocation, and the input freed when its alias goes) — inside a
 * residual too (docs/graph.md, "Sequential layers"). */
static uint16_t dropout(sq *s, uint16_t x, uint64_t out_ps)
{
    mlg_op *op = ml__graph_op(s->g, MLG_OP_DROPOUT, "dropout");
    ml__op_in(op, x);
    uint16_t mask = like(s, "dropout mask (bool)", x, 1);
    ml__op_save(op, mask);
    uint16_t y = act(s, "dropout output", out_ps, s->bpe[x]);
    ml__op_out(op, y);
    ml__op_out(op, mask);
    ml__op_free(op, mask);
    consume(s, op, x);
    node(s, op, "NativeDropoutBackward0", x, y, false);
    return y;
}

/* max_pool2d_with_indices saves its input and the int64 indices (which
 * CUDA's kernel always makes: dropped under no_grad). */
static uint16_t maxpool(sq *s, uint16_t x, uint64_t out_ps)
{
    mlg_op *op = ml__graph_op(s->g, MLG_OP_ELEMENTWISE, "max_pool2d");
    ml__op_in(op, x);
    save(s, op, x, "maxpool input", false);
    uint16_t idx = act(s, "maxpool indices (int64)", out_ps, 8);
    ml__op_save(op, idx);
    uint16_t y = act(s, "maxpool output", out_ps, s->bpe[x]);
    ml__op_out(op, y);
    ml__op_out(op, idx);
    ml__op_free(op, idx);
    consume(s, op, x);
    node(s, op, "MaxPool2DWithIndicesBackward0", x, y, false);
    return y;
}

/* embedding saves the ids (the block's input: the model's); its backward,
 * embedding_dense_backward, makes the dense (V, D) weight gradient. */
static uint16_t embedding(sq *s, const ml_layer *l, uint16_t x, uint64_t out_ps)
{
    if (x != s->in) {
        s->refused = true;
        return x;
    }
    mlg_op *op = ml__graph_op(s->g, MLG_OP_COPY, "embedding");
    ml__op_in(op, x);
    save(s, op, x, "token ids (int64)", false);
    ml__op_param(op, param(s, l->vocab, l->dim));
    uint16_t y = act(s, "embedding output", out_ps, s->c->stream_bytes);
    ml__op_out(op, y);
    node(s, op, "EmbeddingBackward0", x, y, true);
    return y;
}

/* The kit's attention words some entries otherwise than the chain
 * builders' seq_attention (since deleted) listed them; the inventory keeps
 * those words, which the outputs print. */
static const char *builders_word(const mlg_tensor *t)
{
    static const struct {
        const char *kit, *builders;
        unsigned ndim; /* 0: any */
    } words[] = {
        {"linear input (autocast copy)", "q/k/v projection input (cast copy)", 0},
        {"weight (autocast copy)", "weight cast copy (autocast)", 0},
        {"dropout mask", "attention dropout mask", 4},
        {"dropout mask", "residual dropout mask", 3},
        {"dropout output", "attention dropout output", 4},
    };
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
        if (!strcmp(t->name, words[i].kit) && (!words[i].ndim || t->ndim == words[i].ndim))
            return words[i].builders;
    return t->name;
}

/* An attention layer on (T, D) samples: nanoGPT's layout (kit.c) with one
 * c_attn projection for q, k and v, no grouped heads, the masked_fill when
 * causal, eager; on its block's input or inside a residual's branch. As
 * the builders had it (docs/graph.md, "Sequential layers"): no backward
 * nodes and the block rule's transients (its forward programs are not
 * derived), no backward FLOPs (its ops marked in info->attn_op). Its sizes
 * are the block's named dimensions: a second attention layer of other
 * sizes in the same block is refused. */
static uint16_t attention(sq *s, const ml_layer *l, uint16_t x, const ml_shape *sh)
{
    mlg_seq_block *info = s->info;
    if (info->attention && (info->T != sh->d[0] || info->D != sh->d[1] || info->H != l->heads)) {
        s->refused = true;
        return x;
    }
    mlg_layer L;
    memset(&L, 0, sizeof L);
    L.autocast = s->c->autocast;
    L.attn.qkv_bias = L.attn.out_bias = l->bias;
    L.attn.dropout = l->p > 0;
    L.attn.unmasked = !l->causal;
    L.attn.fold_views = s->c->B == 1; /* (docs/inventory.md, "A batch of one") */
    info->attention = true;
    info->T = sh->d[0];
    info->D = sh->d[1];
    info->H = l->heads;
    info->nodes_off = true;
    ml_graph *g = s->g;
    /* c_attn saves x itself unless autocast casts it (a copy per consumer):
     * named as the builders' first saver named it */
    const bool cast = s->c->autocast && s->bpe[x] == 4;
    if (!cast && x != s->in && !s->saved[x])
        first_save(s, x, "q/k/v projection input");
    const uint16_t t0 = g->nt, o0 = g->nop;
    const uint16_t h = ml__graph_view(g, "attention input (B, T, D)", x, 3, MLG_B, MLG_T, MLG_D);
    const uint16_t y = ml__kit_attention(g, &L, h);
    for (uint16_t t = t0; t < g->nt; t++)
        g->t[t].name = builders_word(&g->t[t]);
    for (uint16_t k = o0; k < g->nop && k < MLG_MAX_OPS; k++)
        info->attn_op[k] = true;
    info->attn_last = o0;
    s->bpe[y] = (uint8_t)(s->c->autocast ? 2 : s->bpe[x]);
    return y;
}

static uint16_t layers(sq *s, const ml_layer *ls, size_t n, uint16_t x, ml_shape *sh);

/* The residual's sum in backward (docs/ledger.md, "Backward, node by
 * node"): AddBackward0 hands the sum's gradient G itself to both branches.
 * The shortcut runs first (its nodes are younger); a projection's last
 * node leaves G to the body, whose last node frees it. An identity shortcut
 * makes G x's gradient buffer, so the body's last node frees nothing. n0,
 * nb: the node ops before and after the body, whose last is kb making ob. */
static void residual_nodes(sq *s, uint16_t x, uint16_t yb, uint16_t ys, unsigned n0,
                           unsigned nb, uint16_t kb, uint16_t ob)
{
    if (s->info->nodes_off || s->info->nodes_off_recorded)
        return;
    if (s->depth > 1 || nb == n0 || ob != yb) {
        s->info->nodes_off_recorded = true;
        return;
    }
    if (ys != x) {
        if (s->nnodes > nb && s->last_out == ys)
            s->g->op[s->last_op].ngout = 0;
        else
            s->info->nodes_off_recorded = true;
    } else if (!model_input(s, x)) {
        s->g->op[kb].ngout = 0;
    }
}

/* A residual: body and shortcut from the same input, met in a sum, which
 * saves nothing. */
static uint16_t residual(sq *s, const ml_layer *l, uint16_t x, const ml_shape *sh,
                         uint64_t out_ps)
{
    ml_shape s1 = *sh, s2 = *sh;
    s->depth++;
    const unsigned n0 = s->nnodes;
    s->later[x]++;
    s->held[x]++;
    uint16_t yb = layers(s, l->body, l->nbody, x, &s1);
    s->later[x]--;
    const unsigned nb = s->nnodes;
    const uint16_t kb = s->last_op, ob = s->last_out;
    uint16_t ys = l->nshortcut ? layers(s, l->shortcut, l->nshortcut, x, &s2) : x;
    s->held[x]--;
    residual_nodes(s, x, yb, ys, n0, nb, kb, ob);
    s->depth--;
    /* the branches' outputs are the block's transients unless saved */
    if (yb != s->in && !s->saved[yb])
        s->g->t[yb].flags |= MLG_T_TMP;
    if (ys != s->in && !s->saved[ys])
        s->g->t[ys].flags |= MLG_T_TMP;
    mlg_op *op = ml__graph_op(s->g, MLG_OP_ELEMENTWISE, "add (residual)");
    ml__op_in(op, yb);
    ml__op_in(op, ys);
    uint16_t y = act(s, "residual sum", out_ps, s->bpe[yb] > s->bpe[ys] ? s->bpe[yb] : s->bpe[ys]);
    ml__op_out(op, y);
    if (yb != x)
        ml__op_free(op, yb);
    if (ys != x)
        ml__op_free(op, ys);
    consume(s, op, x);
    return y;
}

static uint16_t layer(sq *s, const ml_layer *l, uint16_t x, ml_shape *sh)
{
    ml_shape o;
    char msg[8];
    const ml_layer *where;
    if (!ml__shape_step(l, sh, &o, msg, sizeof msg, &where)) { /* validated at load */
        s->refused = true;
        return x;
    }
    const uint64_t out_ps = ml__shape_elems(&o);
    const bool gelu = l->kind == ML_L_GELU;
    uint16_t y = x;
    switch (l->kind) {
    case ML_L_LINEAR:
    case ML_L_CONV2D:
        y = matmul(s, l, x, sh, &o, out_ps);
        break;
    case ML_L_BATCHNORM:
        y = batchnorm(s, x, sh, out_ps);
        break;
    case ML_L_LAYERNORM:
        y = layernorm(s, x, sh, out_ps);
        break;
    case ML_L_RELU:
        y = relu(s, l, x, out_ps);
        break;
    case ML_L_GELU:
    case ML_L_SILU:
        y = unary(s, x, out_ps, gelu ? "gelu input" : "silu input", gelu ? "gelu" : "silu",
                  gelu ? "GeluBackward0" : "SiluBackward0");
        break;
    case ML_L_DROPOUT:
        if (l->p > 0)
            y = dropout(s, x, out_ps);
        break;
    case ML_L_MAXPOOL:
        y = maxpool(s, x, out_ps);
        break;
    case ML_L_AVGPOOL:
        y = unary(s, x, out_ps, l->global ? NULL : "avgpool input",
                  l->global ? "mean" : "avg_pool2d",
                  l->global ? "MeanBackward1" : "AvgPool2DBackward0");
        break;
    case ML_L_FLATTEN:
        break; /* a view: the same storage, its gradient a view of y's */
    case ML_L_EMBEDDING:
        y = embedding(s, l, x, out_ps);
        break;
    case ML_L_RESIDUAL:
        y = residual(s, l, x, sh, out_ps);
        *sh = o;
        return y;
    case ML_L_ATTENTION:
        y = attention(s, l, x, sh);
        break;
    default:
        s->refused = true;
        break;
    }
    /* an intermediate no op saved by the time its reader ran: one of the
     * block rule's transients */
    if (x != s->in && y != x && !s->saved[x])
        s->g->t[x].flags |= MLG_T_TMP;
    *sh = o;
    return y;
}

static uint16_t layers(sq *s, const ml_layer *ls, size_t n, uint16_t x, ml_shape *sh)
{
    for (size_t i = 0; i < n; i++)
        x = layer(s, &ls[i], x, sh);
    return x;
}

bool ml__seq_block_graph(ml_graph *g, const ml_layer *l, const ml_shape *in,
                         const mlg_seq_config *c, mlg_seq_block *info)
{
    sq s;
    memset(&s, 0, sizeof s);
    memset(info, 0, sizeof *info);
    s.g = g;
    s.c = c;
    s.info = info;
    s.last_op = s.last_out = MLG_NONE;
    ml__graph_init(g);
    s.in = ml__graph_tensor(g, "block input", dtype_of(&s, c->in_bytes), MLG_INPUT, 2, MLG_B,
                            lit(&s, ml__shape_elems(in)));
    s.bpe[s.in] = (uint8_t)c->in_bytes;
    ml_shape sh = *in;
    uint16_t y = layer(&s, l, s.in, &sh);
    if (y == s.in) {
        /* an identity block (flatten, dropout p=0): its backward is a view
         * of the output's gradient, a node that allocates and frees nothing */
        info->identity = true;
        if (!c->in_nograd)
            ml__op_node(ml__graph_op(g, MLG_OP_VIEW, "view"),
                        "ViewBackward0 (flatten; dropout p=0: none)");
    }
    g->out = y;
    info->shape = sh;
    info->out_ps = ml__shape_elems(&sh);
    info->out_bytes = s.bpe[y];
    return !s.refused && ml__graph_valid(g);
}
