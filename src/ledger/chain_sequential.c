/* Sequential chains (MLPs, CNNs such as torchvision's ResNet, small
 * attention stacks): one block per `layers:` entry, a residual's branches
 * inside their entry. Sources in docs/inventory.md. */
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
    bool model_input; /* needs no gradient */
    struct tref *next;
} tref;

typedef struct {
    ml_chain *ch;
    ml_cblock *b;
    uint64_t B;
    tref *in;    /* the current block's input */
    tref *all;   /* every tref, freed at the end */
} seqctx;

static tref *new_ref(seqctx *s, uint64_t per_sample, unsigned bpe)
{
    tref *t = calloc(1, sizeof *t);
    if (!t) {
        s->ch->nomem = true;
        static tref sink; /* keeps the walk going; the build reports ML_NOMEM */
        memset(&sink, 0, sizeof sink);
        return &sink;
    }
    t->elems = ml_mul(s->ch, s->B, per_sample);
    t->bpe = bpe;
    t->next = s->all;
    s->all = t;
    return t;
}

/* Saves t once; autocast saves a cast copy instead for matmul-class
 * consumers of fp32 tensors. */
static void save_ref(seqctx *s, tref *t, const char *what, bool matmul)
{
    ml_chain *ch = s->ch;
    if (matmul && ch->prec.autocast && t->bpe == 4) {
        ml_ck_save(ch, s->b, what, t->elems, 2, 0);
        return;
    }
    if (t == s->in) {
        ml_ck_save(ch, s->b, what, t->elems, t->bpe, ML_SV_INPUT);
        return;
    }
    if (!t->saved)
        ml_ck_save(ch, s->b, what, t->elems, t->bpe, 0);
    t->saved = true;
}

static tref *seq_layers(seqctx *s, const ml_layer *ls, size_t n, tref *x, ml_shape *sh);

/* Linear (on the last axis) or conv2d (per output pixel): rows x kin x out. */
static tref *seq_matmul(seqctx *s, const ml_layer *l, tref *x, const ml_shape *sh,
                        const ml_shape *o, uint64_t out_ps)
{
    ml_chain *ch = s->ch;
    ml_cblock *b = s->b;
    bool lin = l->kind == ML_L_LINEAR;
    uint64_t kin = lin ? sh->d[sh->rank - 1] : ml_ck_mul3(ch, sh->d[0], l->kernel, l->kernel);
    uint64_t rows = lin ? ml_mul(ch, s->B, sh->rank == 2 ? sh->d[0] : 1)
                        : ml_mul(ch, s->B, o->d[1] * o->d[2]);
    save_ref(s, x, lin ? "linear input" : "conv2d input", true);
    if (!x->model_input)
        ml_ck_weight_copy(ch, b, ml_mul(ch, kin, l->out));
    ml_ck_param(ch, b, l->out, kin);
    if (l->bias)
        ml_ck_param(ch, b, l->out, 0);
    /* a layer whose input needs no gradient computes only the weight
     * gradient in backward: F instead of 2F */
    double f = 2.0 * (double)rows * (double)kin * (double)l->out;
    b->flops_fwd += f;
    b->flops_bwd += x->model_input ? f : 2 * f;
    return new_ref(s, out_ps, ch->prec.autocast ? 2 : x->bpe);
}

/* native/cudnn batch_norm saves input, save_mean, save_invstd; layer_norm
 * input, mean and rstd (autocast runs it in fp32). */
static tref *seq_norm(seqctx *s, const ml_layer *l, tref *x, const ml_shape *sh, uint64_t out_ps)
{
    ml_chain *ch = s->ch;
    ml_cblock *b = s->b;
    if (l->kind == ML_L_BATCHNORM) {
        save_ref(s, x, "batchnorm input", false);
        ml_ck_save(ch, b, "batchnorm save_mean+save_invstd", ml_mul(ch, sh->d[0], 2), 4, 0);
        ml_ck_param(ch, b, sh->d[0], 0);
        ml_ck_param(ch, b, sh->d[0], 0);
        return new_ref(s, out_ps, x->bpe);
    }
    uint64_t last = sh->d[sh->rank - 1];
    if (ch->prec.autocast && x->bpe == 2)
        ml_ck_save(ch, b, "layernorm input (fp32 cast, autocast)", x->elems, 4, 0);
    else
        save_ref(s, x, "layernorm input", false);
    ml_ck_save(ch, b, "layernorm mean+rstd", ml_mul(ch, x->elems / last, 2), 4, 0);
    ml_ck_param(ch, b, last, 0);
    ml_ck_param(ch, b, last, 0);
    return new_ref(s, out_ps, ch->prec.autocast ? 4 : x->bpe);
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
    fake.qkv_bias = l->bias;
    fake.attention = ML_ATTN_EAGER;
    bool cast = ch->prec.autocast && x->bpe == 4;
    bool is_in = x == s->in;
    ml_ck_attention(ch, s->b, &fake, &d, x->bpe, !is_in && !cast && x->saved, true, l->causal,
                    false, is_in ? ML_SV_INPUT : 0);
    if (!cast)
        x->saved = true;
    return new_ref(s, out_ps, ch->prec.autocast ? 2 : x->bpe);
}

/* A residual: body and shortcut from the same input, met in a sum. */
static tref *seq_residual(seqctx *s, const ml_layer *l, tref *x, const ml_shape *sh,
                          uint64_t out_ps)
{
    ml_chain *ch = s->ch;
    ml_shape s1 = *sh, s2 = *sh;
    tref *yb = seq_layers(s, l->body, l->nbody, x, &s1);
    tref *ys = l->nshortcut ? seq_layers(s, l->shortcut, l->nshortcut, x, &s2) : x;
    /* the two branches meet in the sum, which saves nothing */
    if (yb != s->in)
        ml_ck_note(ch, ml_mul(ch, yb->elems, yb->bpe), yb->saved);
    if (ys != s->in)
        ml_ck_note(ch, ml_mul(ch, ys->elems, ys->bpe), ys->saved);
    return new_ref(s, out_ps, yb->bpe > ys->bpe ? yb->bpe : ys->bpe);
}

static tref *seq_layer(seqctx *s, const ml_layer *l, tref *x, ml_shape *sh)
{
    ml_chain *ch = s->ch;
    ml_cblock *b = s->b;
    ml_shape o;
    char msg[8];
    const ml_layer *where;
    ml_shape_step(l, sh, &o, msg, sizeof msg, &where); /* validated at load */
    uint64_t out_ps = ml_shape_elems(&o);
    tref *y = x;
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
        /* threshold_backward uses the result; in-place relu saves the same */
        y = new_ref(s, out_ps, x->bpe);
        save_ref(s, y, "relu output", false);
        break;
    case ML_L_GELU:
    case ML_L_SILU:
        save_ref(s, x, l->kind == ML_L_GELU ? "gelu input" : "silu input", false);
        y = new_ref(s, out_ps, x->bpe);
        break;
    case ML_L_DROPOUT:
        if (l->p > 0) {
            ml_ck_save(ch, b, "dropout mask (bool)", x->elems, 1, 0);
            y = new_ref(s, out_ps, x->bpe);
        }
        break;
    case ML_L_MAXPOOL:
        save_ref(s, x, "maxpool input", false);
        ml_ck_save(ch, b, "maxpool indices (int64)", ml_mul(ch, s->B, out_ps), 8, 0);
        y = new_ref(s, out_ps, x->bpe);
        break;
    case ML_L_AVGPOOL:
        /* global pooling is mean(-1,-2), whose backward keeps only sizes */
        if (!l->global)
            save_ref(s, x, "avgpool input", false);
        y = new_ref(s, out_ps, x->bpe);
        break;
    case ML_L_FLATTEN:
        break; /* a view: same storage */
    case ML_L_EMBEDDING:
        save_ref(s, x, "token ids (int64)", false);
        ml_ck_param(ch, b, l->vocab, l->dim);
        y = new_ref(s, out_ps, ch->prec.w);
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
        ml_ck_note(ch, ml_mul(ch, x->elems, x->bpe), x->saved);
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
 * or mean squared error. */
static ml_status seq_loss(ml_chain *ch, const ml_model *m, const tref *x,
                          const ml_shape *sh, uint64_t B)
{
    ml_cblock *b = ml_ck_begin(ch, "loss", -1);
    if (!b)
        return ML_NOMEM;
    b->fwd_phase = ML_PHASE_LOSS;
    b->in_bytes = ml_mul(ch, x->elems, x->bpe);
    b->in_held = true; /* the caller holds the model output */
    unsigned lsb = ch->prec.autocast ? 4 : ch->prec.w;
    if (m->loss == ML_LOSS_CROSS_ENTROPY) {
        uint64_t rows = sh->rank == 2 ? ml_mul(ch, B, sh->d[0]) : B;
        ml_ck_save(ch, b, "log-softmax output", x->elems, lsb, 0);
        ml_ck_save(ch, b, "targets (int64)", rows, 8, 0);
        ml_ck_save(ch, b, "nll_loss total_weight (fp32 scalar)", 1, 4, 0);
    } else {
        /* mse_loss saves input and target; autocast runs it in fp32, so
         * it saves an fp32 copy of the model output */
        if (ch->prec.autocast && x->bpe != 4)
            ml_ck_save(ch, b, "mse input (fp32 cast)", x->elems, 4, 0);
        else
            ml_ck_save(ch, b, "mse input", x->elems, x->bpe, ML_SV_INPUT);
        ml_ck_save(ch, b, "mse target", x->elems, ch->prec.w, 0);
    }
    if (ch->prec.autocast)
        b->ws_fwd = ml_mul(ch, x->elems, 4);
    b->ws_bwd = ml_mul(ch, ml_mul(ch, x->elems, lsb), 2);
    /* under no_grad (evaluation) what the loss saves is transient, beside
     * the fp32 cast */
    b->ws_nograd = ml_add(ch, b->ws_fwd, b->saved_bytes);
    b->unit_fwd = b->ws_fwd;
    b->unit = ml_mul(ch, x->elems, lsb);
    return ML_OK;
}

ml_status ml_chain_build_sequential(const ml_model *m, const ml_config *cfg, ml_chain *ch)
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
    uint64_t in_ps = ml_shape_elems(&sh);
    ch->B = s.B;
    ch->T = 1;
    ch->c_tokens = s.B;
    ch->c_width = in_ps;
    tref *x = new_ref(&s, in_ps, sh.ids ? 8 : ch->prec.w);
    x->model_input = true;
    ml_status st = ML_OK;
    for (size_t i = 0; i < m->nseq && !ch->overflow && !ch->nomem; i++) {
        char name[48];
        snprintf(name, sizeof name, "%zu:%s", i, ml_layer_kind_name(m->seq[i].kind));
        ml_cblock *b = ml_ck_begin(ch, name, (int)i);
        if (!b) {
            st = ML_NOMEM;
            break;
        }
        s.b = b;
        s.in = x;
        b->in_bytes = ml_mul(ch, x->elems, x->bpe);
        tref *y = seq_layer(&s, &m->seq[i], x, &sh);
        uint64_t out_bytes = ml_mul(ch, y->elems, y->bpe);
        if (y != x && y->saved) {
            /* the block saved its own output (relu): a boundary tensor */
            b->out_saved = true;
            b->saved_bytes -= out_bytes;
            for (size_t k = ch->nsaved; k-- > b->saved_first;)
                if (ch->saved[k].bytes == out_bytes && !(ch->saved[k].flags & ML_SV_OUTPUT)) {
                    ch->saved[k].flags |= ML_SV_OUTPUT;
                    break;
                }
        }
        if (y == x) {
            /* identity block (flatten, dropout p=0): in and out are one
             * storage; whoever saves it, the replay counts it once */
            b->identity = true;
            if (b->in_saved) {
                b->in_saved = false;
                b->out_saved = true;
            }
        }
        ml_ck_end(ch, b, out_bytes);
        if (y != x)
            y->model_input = false;
        x = y;
    }
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
