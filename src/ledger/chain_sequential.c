/* Sequential chains (MLPs, ResNets, small attention stacks): a block per
 * `layers:` entry, from its op graph (graph/kit_seq.c) where the graph
 * expresses it, else (attention inside a residual; docs/graph.md,
 * "Sequential layers") and in the builders-only chain, test_graph's reference, from the builders
 * below. Sources in docs/inventory.md. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ledger/chain_kit.h"
#include "model/shape.h"

/* ---- sequential models ------------------------------------------------ */

/* A tensor flowing between layers; `saved` dedups storages saved by several
 * ops. The block's input and output are boundaries (see chain.h). */
typedef struct tref {
    uint64_t elems;  /* whole micro-batch */
    unsigned bpe;
    bool saved;
    size_t idx;       /* its entry in ch->saved (SIZE_MAX: none listed) */
    bool model_input; /* needs no gradient */
    unsigned later;   /* consumers recorded after the one being built (a
                         residual's shortcut): their gradients reach its
                         InputBuffer first, so this one's is accumulated */
    unsigned held;    /* under no_grad: a residual's frame still holds it */
    struct tref *next;
} tref;

typedef struct {
    ml_chain *ch;
    ml_cblock *b;
    uint64_t B;
    tref *in;    /* the current block's input */
    tref *all;   /* every tref, freed at the end */
    const tref *last_out; /* the output of the last backward node recorded */
    unsigned depth;       /* residuals entered */
    ml_ck_ng ng, g;       /* the block's forward under no_grad and with grad, whose
                             saved tensors stay (docs/ledger.md) */
    tref sink;            /* what the walk gets when out of memory (the build
                             reports ML_NOMEM) */
} seqctx;

static tref *new_ref(seqctx *s, uint64_t per_sample, unsigned bpe)
{
    tref *t = calloc(1, sizeof *t);
    if (!t) {
        s->ch->nomem = true;
        memset(&s->sink, 0, sizeof s->sink);
        s->sink.idx = SIZE_MAX;
        return &s->sink;
    }
    t->elems = ml_mul(s->ch, s->B, per_sample);
    t->bpe = bpe;
    t->idx = SIZE_MAX;
    t->next = s->all;
    s->all = t;
    return t;
}

/* Saves t once; autocast saves a cast copy instead for matmul-class
 * consumers of fp32 tensors. Returns the storage's index when this op is
 * the first to save it (its node releases it), else SIZE_MAX. */
static size_t save_ref(seqctx *s, tref *t, const char *what, bool matmul)
{
    ml_chain *ch = s->ch;
    if (matmul && ch->prec.autocast && t->bpe == 4)
        return ml__ck_save(ch, s->b, what, t->elems, 2, 0);
    if (t == s->in)
        return ml__ck_save(ch, s->b, what, t->elems, t->bpe, ML_SV_INPUT);
    if (t->saved)
        return SIZE_MAX;
    t->saved = true;
    return t->idx = ml__ck_save(ch, s->b, what, t->elems, t->bpe, 0);
}

static uint64_t ref_bytes(seqctx *s, const tref *t)
{
    return ml_mul(s->ch, t->elems, t->bpe);
}

/* Under no_grad, y made from x: y allocated beside the scratch the op
 * frees at once (the statistics, indices or mask its functional does not
 * return), then x freed unless a later op of the block reads it or it is
 * the block's input (nn.Sequential rebinds its one name; docs/ledger.md,
 * "Forward under no_grad"). */
static void ng_made(seqctx *s, const tref *x, const tref *y, uint64_t scratch)
{
    ml_ck_ng_put(&s->ng, ref_bytes(s, y));
    ml_ck_ng_put(&s->ng, scratch);
    ml_ck_ng_drop(&s->ng, scratch);
    /* with grad the scratch is saved (statistics, indices, mask), and so
     * is x when an op saved it */
    ml_ck_ng_put(&s->g, ref_bytes(s, y));
    ml_ck_ng_put(&s->g, scratch);
    if (x != s->in && !x->held) {
        ml_ck_ng_drop(&s->ng, ref_bytes(s, x));
        if (!x->saved)
            ml_ck_ng_drop(&s->g, ref_bytes(s, x));
    }
}

/* Layer l made y from x: its scratch under no_grad (the statistics, indices
 * or mask the functional drops: layer norm's mean and rstd, batch norm's
 * save_mean and save_invstd in training, max pooling's int64 indices, which
 * CUDA's kernel always makes, dropout's mask), then ng_made. In eval mode
 * (the evaluation pass) batch norm reads its running statistics and dropout
 * is the identity: y names x's storage. */
static void ng_layer(seqctx *s, const ml_layer *l, const tref *x, const tref *y,
                     const ml_shape *sh, uint64_t out_ps)
{
    ml_chain *ch = s->ch;
    const bool train = !ch->eval_mode;
    uint64_t scratch = 0;
    if (l->kind == ML_L_LAYERNORM)
        scratch = ml_mul(ch, ml_mul(ch, x->elems / sh->d[sh->rank - 1], 2), 4);
    else if (l->kind == ML_L_BATCHNORM && train)
        scratch = ml_mul(ch, ml_mul(ch, sh->d[0], 2), 4);
    else if (l->kind == ML_L_MAXPOOL)
        scratch = ml_mul(ch, ml_mul(ch, s->B, out_ps), 8);
    else if (l->kind == ML_L_DROPOUT)
        scratch = x->elems;
    if (l->kind == ML_L_DROPOUT && !train) {
        s->ng.bad = s->ng.bad || x == s->in; /* the name's storage is the caller's */
        return;
    }
    ng_made(s, x, y, scratch);
}

/* The block's transients from its programs (out: its output's bytes, 0
 * when it is its input); autocast's cast copies are not in them, nor is
 * selective checkpointing: the block rule. */
static void ng_close(seqctx *s, ml_cblock *b, uint64_t out)
{
    if (s->ch->prec.autocast)
        return;
    ml__ck_ng_close(b, &s->ng, out);
    if (!s->ch->selective)
        ml__ck_grad_close(b, &s->g, out);
}

/* The residual's sum: y, then the branches' outputs and x go (with grad,
 * unless saved). */
static void ng_sum(seqctx *s, const tref *x, const tref *yb, const tref *ys, const tref *y)
{
    const tref *gone[3] = {yb != x ? yb : NULL, ys != x ? ys : NULL,
                           x != s->in && !x->held ? x : NULL};
    ml_ck_ng_put(&s->ng, ref_bytes(s, y));
    ml_ck_ng_put(&s->g, ref_bytes(s, y));
    for (int i = 0; i < 3; i++) {
        if (!gone[i])
            continue;
        ml_ck_ng_drop(&s->ng, ref_bytes(s, gone[i]));
        if (!gone[i]->saved)
            ml_ck_ng_drop(&s->g, ref_bytes(s, gone[i]));
    }
}

/* The backward node of the op that made y from x (docs/ledger.md,
 * "Backward, node by node"): x's gradient (none for the model's input; an
 * InputBuffer accumulation after it when a later-built consumer's gradient
 * reached x first), its parameters' gradients, y's gradient freed once it
 * has run; it releases the saved storages s0 and s1. */
static void seq_node(seqctx *s, const char *what, const tref *x, uint64_t param_elems,
                     const tref *y, size_t s0, size_t s1)
{
    ml_chain *ch = s->ch;
    if (x->model_input && !param_elems) {
        /* y needs no gradient either: no node in autograd's graph */
        s->b->nodes_off = true;
        return;
    }
    uint64_t gx = x->model_input ? 0 : ref_bytes(s, x);
    if (gx && x->later)
        ml__ck_accum(ch, s->b, gx);
    ml__ck_node(ch, s->b, what, gx, ml_mul(ch, param_elems, ch->prec.grad), ref_bytes(s, y), s0,
                s1);
    s->last_out = y;
}

static tref *seq_layers(seqctx *s, const ml_layer *ls, size_t n, tref *x, ml_shape *sh);

/* Linear (on the last axis) or conv2d (per output pixel): rows x kin x out. */
static tref *seq_matmul(seqctx *s, const ml_layer *l, tref *x, const ml_shape *sh,
                        const ml_shape *o, uint64_t out_ps)
{
    ml_chain *ch = s->ch;
    ml_cblock *b = s->b;
    bool lin = l->kind == ML_L_LINEAR;
    uint64_t kin = lin ? sh->d[sh->rank - 1] : ml__ck_mul3(ch, sh->d[0], l->kernel, l->kernel);
    uint64_t rows = lin ? ml_mul(ch, s->B, sh->rank == 2 ? sh->d[0] : 1)
                        : ml_mul(ch, s->B, o->d[1] * o->d[2]);
    size_t sx = save_ref(s, x, lin ? "linear input" : "conv2d input", true);
    if (!x->model_input)
        ml__ck_weight_copy(ch, b, ml_mul(ch, kin, l->out));
    ml__ck_param(ch, b, l->out, kin);
    if (l->bias)
        ml__ck_param(ch, b, l->out, 0);
    /* a layer whose input needs no gradient computes only the weight
     * gradient in backward: F instead of 2F */
    double f = 2.0 * (double)rows * (double)kin * (double)l->out;
    b->flops_fwd += f;
    b->flops_bwd += x->model_input ? f : 2 * f;
    tref *y = new_ref(s, out_ps, ch->prec.autocast ? 2 : x->bpe);
    /* addmm/mm: the input's gradient (grad @ W), the weight's (grad^T @ x),
     * the bias's (a sum); convolution_backward the same three, its
     * output_mask skipping the input's when it needs none */
    uint64_t pe = ml_add(ch, ml_mul(ch, l->out, kin), l->bias ? l->out : 0);
    seq_node(s, lin ? (l->bias ? "AddmmBackward0" : "MmBackward0") : "ConvolutionBackward0", x, pe,
             y, sx, SIZE_MAX);
    return y;
}

/* native/cudnn batch_norm saves input, save_mean, save_invstd; layer_norm
 * input, mean and rstd (autocast runs it in fp32). */
static tref *seq_norm(seqctx *s, const ml_layer *l, tref *x, const ml_shape *sh, uint64_t out_ps)
{
    ml_chain *ch = s->ch;
    ml_cblock *b = s->b;
    /* backward: the input's gradient and the weight's and bias's
     * (native_batch_norm_backward, native_layer_norm_backward) */
    if (l->kind == ML_L_BATCHNORM) {
        size_t sx = save_ref(s, x, "batchnorm input", false);
        size_t st = ml__ck_save(ch, b, "batchnorm save_mean+save_invstd", ml_mul(ch, sh->d[0], 2),
                                4, 0);
        ml__ck_param(ch, b, sh->d[0], 0);
        ml__ck_param(ch, b, sh->d[0], 0);
        /* buffers: running_mean and running_var (the parameters' dtype),
         * num_batches_tracked (int64; torch/nn/modules/batchnorm.py) */
        ch->buffer_bytes = ml_add(ch, ch->buffer_bytes,
                                  ml_add(ch, ml_mul(ch, ml_mul(ch, 2, sh->d[0]), ch->prec.param), 8));
        tref *y = new_ref(s, out_ps, x->bpe);
        seq_node(s, "NativeBatchNormBackward0", x, ml_mul(ch, 2, sh->d[0]), y, sx, st);
        return y;
    }
    uint64_t last = sh->d[sh->rank - 1];
    size_t sx;
    if (ch->prec.autocast && x->bpe == 2)
        sx = ml__ck_save(ch, b, "layernorm input (fp32 cast, autocast)", x->elems, 4, 0);
    else
        sx = save_ref(s, x, "layernorm input", false);
    size_t st = ml__ck_save(ch, b, "layernorm mean+rstd", ml_mul(ch, x->elems / last, 2), 4, 0);
    ml__ck_param(ch, b, last, 0);
    ml__ck_param(ch, b, last, 0);
    tref *y = new_ref(s, out_ps, ch->prec.autocast ? 4 : x->bpe);
    seq_node(s, "NativeLayerNormBackward0", x, ml_mul(ch, 2, last), y, sx, st);
    return y;
}

/* An attention layer on (T, D) samples: the transformer's attention core
 * with one projection for q, k and v, no grouped heads. */
static tref *seq_attention(seqctx *s, const ml_layer *l, tref *x, const ml_shape *sh,
                           uint64_t out_ps)
{
    ml_chain *ch = s->ch;
    ml_ck_dims d;
    memset(&d, 0, sizeof d);
    d.B = s->B;
    d.T = sh->d[0];
    d.BT = ml_mul(ch, d.B, d.T);
    d.D = sh->d[1];
    d.H = d.Hkv = l->heads;
    d.dh = d.D / d.H;
    d.Dkv = d.D;
    d.drop = l->p > 0;
    ml_model fake;
    memset(&fake, 0, sizeof fake);
    fake.bias = l->bias;
    fake.attn.qkv_bias = l->bias;
    fake.attn.kernel = ML_ATTN_EAGER;
    bool cast = ch->prec.autocast && x->bpe == 4;
    bool is_in = x == s->in;
    /* the kit's attention nodes assume a residual around them: no node
     * rule for a bare attention layer yet, nor a forward program */
    s->b->nodes_off = true;
    s->ng.bad = s->g.bad = true;
    ml__ck_attention(ch, s->b, &fake, &d, x->bpe, !is_in && !cast && x->saved, true, l->causal,
                     false, is_in ? ML_SV_INPUT : 0);
    if (!cast)
        x->saved = true;
    return new_ref(s, out_ps, ch->prec.autocast ? 2 : x->bpe);
}

/* The residual's sum in backward (docs/ledger.md, "Backward, node by
 * node"): AddBackward0 hands the sum's gradient G itself to both branches.
 * The shortcut runs first (its nodes are younger); a projection's last
 * node leaves G to the body, whose last node frees it. An identity
 * shortcut makes G x's gradient buffer, so the body's last node frees
 * nothing. nb, ns: the node counts after the body and after the shortcut. */
static void residual_nodes(seqctx *s, const tref *x, const tref *yb, const tref *ys,
                           size_t n0, size_t nb, const tref *ob, size_t ns, const tref *os)
{
    ml_chain *ch = s->ch;
    if (!ch->record_nodes || s->b->nodes_off)
        return;
    if (s->depth > 1 || nb == n0 || ob != yb) {
        /* a residual nested in a residual, a body ending in a view: no rule */
        s->b->nodes_off = true;
        return;
    }
    if (ys != x) {
        if (ns > nb && os == ys)
            ch->nodes[ns - 1].grad_out = 0;
        else
            s->b->nodes_off = true;
    } else if (!x->model_input) {
        ch->nodes[nb - 1].grad_out = 0;
    }
}

/* A residual: body and shortcut from the same input, met in a sum. */
static tref *seq_residual(seqctx *s, const ml_layer *l, tref *x, const ml_shape *sh,
                          uint64_t out_ps)
{
    ml_chain *ch = s->ch;
    ml_shape s1 = *sh, s2 = *sh;
    s->depth++;
    size_t n0 = ch->nnodes;
    /* the shortcut (or the sum, for an identity) consumes x after the body */
    x->later++;
    x->held++; /* under no_grad, the residual's frame holds x until the sum */
    tref *yb = seq_layers(s, l->body, l->nbody, x, &s1);
    x->later--;
    size_t nb = ch->nnodes;
    const tref *ob = s->last_out;
    tref *ys = l->nshortcut ? seq_layers(s, l->shortcut, l->nshortcut, x, &s2) : x;
    x->held--;
    residual_nodes(s, x, yb, ys, n0, nb, ob, ch->nnodes, s->last_out);
    s->depth--;
    /* the two branches meet in the sum, which saves nothing */
    if (yb != s->in)
        ml__ck_note(ch, ml_mul(ch, yb->elems, yb->bpe), yb->saved);
    if (ys != s->in)
        ml__ck_note(ch, ml_mul(ch, ys->elems, ys->bpe), ys->saved);
    tref *y = new_ref(s, out_ps, yb->bpe > ys->bpe ? yb->bpe : ys->bpe);
    ng_sum(s, x, yb, ys, y);
    return y;
}

/* Max pooling (its backward scatters into a zeroed gradient of the input)
 * or average pooling (global: mean(-1, -2), whose backward keeps only
 * sizes: its gradient is the expanded grad divided by the count, a new
 * tensor of the input's size). */
static tref *seq_pool(seqctx *s, const ml_layer *l, tref *x, uint64_t out_ps)
{
    size_t s0 = SIZE_MAX, s1 = SIZE_MAX;
    tref *y;
    if (l->kind == ML_L_MAXPOOL) {
        s0 = save_ref(s, x, "maxpool input", false);
        s1 = ml__ck_save(s->ch, s->b, "maxpool indices (int64)", ml_mul(s->ch, s->B, out_ps), 8,
                         0);
        y = new_ref(s, out_ps, x->bpe);
        seq_node(s, "MaxPool2DWithIndicesBackward0", x, 0, y, s0, s1);
        return y;
    }
    if (!l->global)
        s0 = save_ref(s, x, "avgpool input", false);
    y = new_ref(s, out_ps, x->bpe);
    seq_node(s, l->global ? "MeanBackward1" : "AvgPool2DBackward0", x, 0, y, s0, SIZE_MAX);
    return y;
}

static tref *seq_layer(seqctx *s, const ml_layer *l, tref *x, ml_shape *sh)
{
    ml_chain *ch = s->ch;
    ml_cblock *b = s->b;
    ml_shape o;
    char msg[8];
    const ml_layer *where;
    ml__shape_step(l, sh, &o, msg, sizeof msg, &where); /* validated at load */
    uint64_t out_ps = ml__shape_elems(&o);
    tref *y = x;
    size_t s0 = SIZE_MAX;
    switch (l->kind) {
    case ML_L_LINEAR:
    case ML_L_CONV2D:
        y = seq_matmul(s, l, x, sh, &o, out_ps);
        break;
    case ML_L_BATCHNORM:
    case ML_L_LAYERNORM:
        y = seq_norm(s, l, x, sh, out_ps);
        break;
    case ML_L_RELU:
        /* threshold_backward uses the result; in place, that is x's storage:
         * inside a block, y is x; on the block's input, the replay frees
         * the input before the output exists (unless a checkpoint or the
         * producer keeps it) */
        y = l->inplace && x != s->in && !x->held && !x->later ? x : new_ref(s, out_ps, x->bpe);
        b->inplace = b->inplace || (l->inplace && x == s->in && !s->depth);
        s0 = save_ref(s, y, y == x ? "relu output (in place)" : "relu output", false);
        seq_node(s, "ReluBackward0", x, 0, y, s0, SIZE_MAX);
        break;
    case ML_L_GELU:
    case ML_L_SILU:
        s0 = save_ref(s, x, l->kind == ML_L_GELU ? "gelu input" : "silu input", false);
        y = new_ref(s, out_ps, x->bpe);
        seq_node(s, l->kind == ML_L_GELU ? "GeluBackward0" : "SiluBackward0", x, 0, y, s0,
                 SIZE_MAX);
        break;
    case ML_L_DROPOUT:
        if (l->p > 0) {
            s0 = ml__ck_save(ch, b, "dropout mask (bool)", x->elems, 1, 0);
            y = new_ref(s, out_ps, x->bpe);
            seq_node(s, "NativeDropoutBackward0", x, 0, y, s0, SIZE_MAX);
        }
        break;
    case ML_L_MAXPOOL:
    case ML_L_AVGPOOL:
        y = seq_pool(s, l, x, out_ps);
        break;
    case ML_L_FLATTEN:
        break; /* a view: same storage, and its gradient a view of y's */
    case ML_L_EMBEDDING:
        save_ref(s, x, "token ids (int64)", false);
        ml__ck_param(ch, b, l->vocab, l->dim);
        y = new_ref(s, out_ps, ch->prec.w);
        /* embedding_dense_backward: the dense (V, D) weight gradient */
        seq_node(s, "EmbeddingBackward0", x, ml_mul(ch, l->vocab, l->dim), y, SIZE_MAX, SIZE_MAX);
        break;
    case ML_L_ATTENTION:
        y = seq_attention(s, l, x, sh, out_ps);
        break;
    case ML_L_RESIDUAL:
        y = seq_residual(s, l, x, sh, out_ps);
        return *sh = o, y;
    default:
        break;
    }
    /* an intermediate: created and consumed inside the block (the block's
     * input and output are boundaries, accounted by the replay) */
    if (x != s->in && y != x)
        ml__ck_note(ch, ml_mul(ch, x->elems, x->bpe), x->saved);
    if (y != x)
        ng_layer(s, l, x, y, sh, out_ps);
    *sh = o;
    return y;
}

static tref *seq_layers(seqctx *s, const ml_layer *ls, size_t n, tref *x, ml_shape *sh)
{
    for (size_t i = 0; i < n; i++)
        x = seq_layer(s, &ls[i], x, sh);
    return x;
}

/* The loss on the model output x: cross-entropy (log_softmax + nll_loss)
 * or mean squared error; its inventory the op graph's (graph/kit_head.c),
 * the lists here the builders' reference; the figures the block rule's. */
static ml_status seq_loss(ml_chain *ch, const ml_model *m, const tref *x,
                          const ml_shape *sh, uint64_t B)
{
    ml_cblock *b = ml__ck_begin(ch, "loss", -1);
    if (!b)
        return ML_NOMEM;
    b->fwd_phase = ML_PHASE_LOSS;
    bool graph = false;
    const unsigned lsb = ch->prec.autocast ? 4 : ch->prec.w;
    const bool ce = m->loss == ML_LOSS_CROSS_ENTROPY;
    const uint64_t rows = ce && sh->rank == 2 ? ml_mul(ch, B, sh->d[0]) : B;
    if (!ch->builders_only && ml__ck_seq_loss_graph(ch, b, ce, rows, x->elems, x->bpe, &graph))
        return ML_NOMEM;
    if (!graph && ce) {
        ml__ck_save(ch, b, "log-softmax output", x->elems, lsb, 0);
        ml__ck_save(ch, b, "targets (int64)", rows, 8, ML_SV_BATCH);
        ml__ck_save(ch, b, "nll_loss total_weight (fp32 scalar)", 1, 4, 0);
    } else if (!graph) {
        /* its input (autocast: an fp32 copy) and target */
        if (ch->prec.autocast && x->bpe != 4)
            ml__ck_save(ch, b, "mse input (fp32 cast)", x->elems, 4, 0);
        else
            ml__ck_save(ch, b, "mse input", x->elems, x->bpe, ML_SV_INPUT);
        ml__ck_save(ch, b, "mse target", x->elems, ch->prec.w, ML_SV_BATCH);
    }
    b->in_bytes = ml_mul(ch, x->elems, x->bpe);
    b->in_held = b->ws_formula = true; /* the caller holds the model output */
    b->ws_fwd = ch->prec.autocast ? ml_mul(ch, x->elems, 4) : 0;
    b->unit_fwd = b->ws_fwd;
    if (!ce) {
        /* the elementwise loss, then its mean (ATen's Loss.cpp) */
        b->unit_fwd = ml_mul(ch, x->elems, lsb);
        b->ws_fwd = ml_add(ch, b->ws_fwd, b->unit_fwd);
    }
    b->ws_bwd = ml_mul(ch, ml_mul(ch, x->elems, lsb), 2);
    /* no_grad: what the loss saves is transient, beside the fp32 cast */
    b->ws_nograd = ml_add(ch, b->ws_fwd, b->saved_bytes);
    b->unit = ml_mul(ch, x->elems, lsb);
    return ML_OK;
}

/* Block b from the chain builders: layer l on x, closed. */
static tref *builder_block(seqctx *s, ml_cblock *b, const ml_layer *l, tref *x, ml_shape *sh)
{
    ml_chain *ch = s->ch;
    tref *y = seq_layer(s, l, x, sh);
    uint64_t out_bytes = ml_mul(ch, y->elems, y->bpe);
    if (y != x && y->saved && y->idx != SIZE_MAX) {
        /* the block saved its own output (relu): a boundary tensor,
         * released by the replay, not by a node */
        b->out_saved = true;
        b->saved_bytes -= ch->saved[y->idx].bytes;
        ch->saved[y->idx].flags |= ML_SV_OUTPUT;
        ch->saved[y->idx].node = ML_NODE_NONE;
    }
    if (y == x) {
        /* identity block (flatten, dropout p=0, neither saving): in and
         * out are one storage. Its backward is a view of the output's
         * gradient: a node that allocates and frees nothing */
        b->identity = true;
        if (!x->model_input)
            ml__ck_node(ch, b, "ViewBackward0 (flatten; dropout p=0: none)", 0, 0, 0, SIZE_MAX,
                        SIZE_MAX);
    }
    ml__ck_end(ch, b, out_bytes);
    ng_close(s, b, y == x ? 0 : out_bytes);
    return y;
}

/* Block b from the op graph of layer l (graph/kit_seq.c, chain_graph.c):
 * its output, NULL when the graph does not express the layer (the
 * builders then run it). */
static tref *graph_block(seqctx *s, ml_cblock *b, const ml_layer *l, tref *x, ml_shape *sh,
                         ml_ck_graph *G)
{
    ml_chain *ch = s->ch;
    mlg_seq_block info;
    if (!ml__ck_graph_seq(ch, l, sh, x->bpe, x->model_input, G, &info))
        return NULL;
    b->inplace = info.inplace;
    b->identity = info.identity;
    b->nodes_off = info.nodes_off || (ch->record_nodes && info.nodes_off_recorded);
    /* the batch norms' buffers, as seq_norm has them */
    uint64_t stats = ml_mul(ch, ml_mul(ch, 2, info.bn_channels), ch->prec.param);
    ch->buffer_bytes = ml_add(ch, ch->buffer_bytes, ml_add(ch, stats, ml_mul(ch, 8, info.nbn)));
    ml__ck_graph_emit(ch, b, G, G->tb[G->g.out]);
    /* backward FLOPs: a matmul's twice its forward, once on the model's
     * input; an attention layer's none (docs/graph.md) */
    for (uint16_t k = 0; k < G->g.nop; k++) {
        const double f = info.attn_op[k] ? 0 : ml__graph_op_flops(&G->g.op[k], &G->z);
        if (f > 0)
            b->flops_bwd += G->g.op[k].ngin ? 2 * f : f;
    }
    /* the builders' core FLOPs: one attention layer's however many the
     * block holds (all of one size; docs/graph.md, "Sequential layers") */
    if (info.attention) {
        b->flops_core = 0;
        for (uint16_t k = info.attn_last; k < G->g.nop; k++)
            if (G->g.op[k].core)
                b->flops_core += ml__graph_op_flops(&G->g.op[k], &G->z);
    }
    *sh = info.shape;
    return info.identity ? x : new_ref(s, info.out_ps, info.out_bytes);
}

ml_status ml__chain_build_sequential(const ml_model *m, const ml_config *cfg, ml_chain *ch)
{
    seqctx s;
    memset(&s, 0, sizeof s);
    s.ch = ch;
    s.B = cfg->training.micro_batch;
    ml_shape sh;
    memset(&sh, 0, sizeof sh);
    sh.rank = (unsigned)m->ninput;
    for (size_t i = 0; i < m->ninput; i++)
        sh.d[i] = m->input[i];
    sh.ids = m->seq[0].kind == ML_L_EMBEDDING;
    uint64_t in_ps = ml__shape_elems(&sh);
    ch->B = s.B;
    ch->T = 1;
    ch->c_tokens = s.B;
    ch->c_width = in_ps;
    tref *x = new_ref(&s, in_ps, sh.ids ? 8 : ch->prec.w);
    x->model_input = true;
    /* the node-level backward (docs/ledger.md): fp32 layers for now */
    ch->record_nodes = ch->prec.a == 4 && ch->prec.w == 4 && !ch->prec.autocast;
    ml_status st = ML_OK;
    /* the layers' op graphs (one at a time); the builders-only chain
     * (ml__chain_build_builders) keeps the builders, their reference */
    ml_ck_graph *G = ch->builders_only ? NULL : malloc(sizeof *G);
    if (!ch->builders_only && !G)
        st = ML_NOMEM;
    for (size_t i = 0; i < m->nseq && st == ML_OK && !ch->overflow && !ch->nomem; i++) {
        char name[48];
        snprintf(name, sizeof name, "%zu:%s", i, ml__layer_kind_name(m->seq[i].kind));
        ml_cblock *b = ml__ck_begin(ch, name, (int)i);
        if (!b) {
            st = ML_NOMEM;
            break;
        }
        s.b = b;
        s.in = x;
        s.ng = s.g = (ml_ck_ng){0};
        b->in_bytes = ml_mul(ch, x->elems, x->bpe);
        b->in_nograd = x->model_input;
        tref *y = G ? graph_block(&s, b, &m->seq[i], x, &sh, G) : NULL;
        x = y ? y : builder_block(&s, b, &m->seq[i], x, &sh);
    }
    free(G);
    ch->record_nodes = false;
    ch->n_ckpt = m->nseq;
    if (st == ML_OK)
        st = seq_loss(ch, m, x, &sh, s.B);
    while (s.all) {
        tref *n = s.all->next;
        free(s.all);
        s.all = n;
    }
    return st;
}
