/* Activation inventories, parameters and FLOPs per block.
 *
 * Each builder lists the distinct storages that PyTorch's eager autograd keeps
 * for the block's backward, in the reference implementation named in
 * docs/inventory.md (nanoGPT/HF GPT-2, HF Llama, HF BERT, timm ViT,
 * torchvision ResNet). A storage saved by several ops is listed once, where
 * it is first saved. Formulas and sources: docs/inventory.md. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ledger/chain.h"
#include "model/tree.h"
#include "util/grow.h"
#include "memledger/calib.h"
#include "model/shape.h"

uint64_t ml_mul(ml_chain *ch, uint64_t a, uint64_t b)
{
    uint64_t r;
    if (__builtin_mul_overflow(a, b, &r)) {
        ch->overflow = true;
        return 0;
    }
    return r;
}

uint64_t ml_add(ml_chain *ch, uint64_t a, uint64_t b)
{
    uint64_t r;
    if (__builtin_add_overflow(a, b, &r)) {
        ch->overflow = true;
        return 0;
    }
    return r;
}

static uint64_t mul3(ml_chain *ch, uint64_t a, uint64_t b, uint64_t c)
{
    return ml_mul(ch, ml_mul(ch, a, b), c);
}

ml_prec ml_prec_of(ml_precision p)
{
    /*                        param grad master state a  w  autocast */
    static const ml_prec t[ML_PREC_COUNT] = {
        [ML_PREC_FP32] = {4, 4, 0, 4, 4, 4, false},
        [ML_PREC_AMP_BF16] = {4, 4, 0, 4, 2, 4, true},
        [ML_PREC_AMP_FP16] = {4, 4, 0, 4, 2, 4, true},
        [ML_PREC_BF16_MASTER] = {2, 2, 4, 4, 2, 2, false},
        [ML_PREC_FP16_MASTER] = {2, 2, 4, 4, 2, 2, false},
        [ML_PREC_BF16] = {2, 2, 0, 2, 2, 2, false},
    };
    return t[p];
}

/* ---- building blocks ------------------------------------------------- */

static ml_cblock *block_begin(ml_chain *ch, const char *name, int ckpt_index)
{
    ml_cblock *grown = ml_grow(ch->blocks, ch->n, &ch->cap, sizeof *grown, 16);
    if (!grown) {
        ch->nomem = true;
        return NULL;
    }
    ch->blocks = grown;
    ml_cblock *b = &ch->blocks[ch->n++];
    memset(b, 0, sizeof *b);
    size_t len = strlen(name);
    if (len >= sizeof b->name)
        len = sizeof b->name - 1;
    memcpy(b->name, name, len);
    b->name[len] = '\0';
    b->fwd_phase = ML_PHASE_FORWARD;
    b->ckpt_index = ckpt_index;
    b->saved_first = ch->nsaved;
    ch->max_unsaved = ch->max_tensor = 0;
    return b;
}

static void note_tensor(ml_chain *ch, uint64_t bytes, bool saved)
{
    if (bytes > ch->max_tensor)
        ch->max_tensor = bytes;
    if (!saved && bytes > ch->max_unsaved)
        ch->max_unsaved = bytes;
}

/* Records one saved storage of `elems` elements of `bpe` bytes. */
static void save(ml_chain *ch, ml_cblock *b, const char *what, uint64_t elems, unsigned bpe,
                 unsigned flags)
{
    uint64_t bytes = ml_mul(ch, elems, bpe);
    if (flags & ML_SV_INPUT) {
        /* the block's input is a boundary tensor, accounted by the replay */
        b->in_saved = true;
        note_tensor(ch, bytes, true);
        return;
    }
    ml_saved *s = ml_grow(ch->saved, ch->nsaved, &ch->savedcap, sizeof *s, 64);
    if (!s) {
        ch->nomem = true;
        return;
    }
    ch->saved = s;
    ch->saved[ch->nsaved++] = (ml_saved){what, bytes, flags};
    b->nsaved++;
    b->saved_bytes = ml_add(ch, b->saved_bytes, bytes);
    if (flags & ML_SV_CORE)
        b->core_bytes = ml_add(ch, b->core_bytes, bytes);
    note_tensor(ch, bytes, true);
}

/* An intermediate that nothing saves. */
static void tmp(ml_chain *ch, uint64_t elems, unsigned bpe)
{
    note_tensor(ch, ml_mul(ch, elems, bpe), false);
}

/* A parameter tensor of the block: rows x cols (cols 0 for a vector). */
static void param(ml_chain *ch, ml_cblock *b, uint64_t rows, uint64_t cols)
{
    uint64_t numel = cols ? ml_mul(ch, rows, cols) : rows;
    ml_ptensor *p = ml_grow(ch->params, ch->nparams, &ch->paramcap, sizeof *p, 64);
    if (!p) {
        ch->nomem = true;
        return;
    }
    ch->params = p;
    ch->params[ch->nparams++] = (ml_ptensor){numel, cols ? rows : 0, cols};
    b->params = ml_add(ch, b->params, numel);
    if (numel > ch->max_param_numel)
        ch->max_param_numel = numel;
}

/* Closes a block: transients from its largest tensors (docs/ledger.md,
 * "transients"), gradients its backward creates. */
static void block_end(ml_chain *ch, ml_cblock *b, uint64_t out_bytes)
{
    b->ws_fwd = ml_add(ch, b->ws_fwd, ml_mul(ch, 2, ch->max_unsaved));
    b->ws_nograd = ml_mul(ch, 2, ch->max_tensor);
    b->ws_bwd = ml_add(ch, b->ws_bwd, ml_add(ch, out_bytes, ml_mul(ch, 2, ch->max_tensor)));
    uint64_t g = ml_mul(ch, b->params, ch->prec.grad);
    b->grad_bytes = ml_add(ch, b->grad_bytes, g);
    b->grad_accum_bytes = ml_add(ch, b->grad_accum_bytes, g);
}

/* Saved input of a linear layer whose input storage has `bpe` bytes per
 * element: autocast saves a bf16/fp16 cast copy per consumer (casts of
 * non-leaf tensors are not cached), otherwise the storage itself. The caller
 * passes already_saved when another op saved the same storage. */
static void linear_input(ml_chain *ch, ml_cblock *b, const char *what, uint64_t elems,
                         unsigned bpe, bool already_saved, unsigned flags)
{
    if (ch->prec.autocast && bpe == 4)
        save(ch, b, what, elems, 2, flags & ~(unsigned)ML_SV_INPUT);
    else if (!already_saved)
        save(ch, b, what, elems, bpe, flags);
}

/* autocast caches one low-precision copy of each weight per forward; the
 * matmul saves it for the input gradient (only when its input needs one). */
static void weight_copy(ml_chain *ch, ml_cblock *b, uint64_t elems)
{
    if (ch->prec.autocast) {
        save(ch, b, "weight cast copy (autocast)", elems, 2, 0);
        b->cast_bytes = ml_add(ch, b->cast_bytes, ml_mul(ch, elems, 2));
    }
}

/* ---- transformer pieces ------------------------------------------------ */

typedef struct {
    uint64_t B, T, BT, D, F, H, Hkv, dh, Dkv, V;
    bool drop;
} tdims;

/* A norm on x (w bytes per element). Returns the output's bytes per element
 * and sets *out_saved when the norm itself saved its output. */
static unsigned norm_fwd(ml_chain *ch, ml_cblock *b, const ml_model *m, const tdims *d,
                         unsigned xflags, uint64_t *params)
{
    const unsigned w = ch->prec.w;
    uint64_t BTD = ml_mul(ch, d->BT, d->D);
    if (m->norm == ML_NORM_LAYERNORM) {
        /* native_layer_norm saves input, mean and rstd (fp32 per row) */
        save(ch, b, "layernorm input", BTD, w, xflags);
        save(ch, b, "layernorm mean+rstd", ml_mul(ch, d->BT, 2), 4, 0);
        *params = m->bias ? 2 * d->D : d->D;
        tmp(ch, BTD, w);
        return w;
    }
    /* HF LlamaRMSNorm: x.to(fp32); pow(2) and mul save x32; rsqrt saves its
     * result; weight * h.to(dtype) saves the normalised h. */
    if (w == 4) {
        save(ch, b, "rmsnorm input", BTD, 4, xflags);
        save(ch, b, "rmsnorm rsqrt", d->BT, 4, 0);
        save(ch, b, "rmsnorm normalised", BTD, 4, 0);
    } else {
        save(ch, b, "rmsnorm fp32 copy of input", BTD, 4, 0);
        save(ch, b, "rmsnorm rsqrt", d->BT, 4, 0);
        save(ch, b, "rmsnorm normalised (cast back)", BTD, w, 0);
    }
    *params = d->D;
    tmp(ch, BTD, w);
    return w;
}

/* Whether the attention runs a fused kernel (no T x T tensor). sdpa is
 * torch's scaled_dot_product_attention as its dispatcher picks a kernel
 * (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp): flash, memory-
 * efficient or cuDNN, except that none of them takes fp32 inputs with
 * grouped-query heads (enable_gqa, as transformers passes them), where it
 * runs the math kernel, which keeps what eager attention keeps (measured on
 * an H200: docs/calibration-h200.md). */
static bool fused_attention(const ml_chain *ch, const ml_model *m)
{
    if (m->attention == ML_ATTN_SDPA)
        return !(ch->prec.a == 4 && m->kv_heads < m->heads);
    return m->attention == ML_ATTN_FLASH;
}

/* Self-attention after its input projection(s). src_bpe: bytes per element of
 * the projection input. Adds parameters, FLOPs and saved tensors. */
static void attention_fwd(ml_chain *ch, ml_cblock *b, const ml_model *m, const tdims *d,
                          unsigned src_bpe, bool src_saved, bool fused_qkv, bool causal_mask,
                          bool softmax_fp32, unsigned in_flags)
{
    const unsigned a = ch->prec.a, w = ch->prec.w;
    uint64_t BTD = ml_mul(ch, d->BT, d->D);
    uint64_t qkv_out = ml_add(ch, d->D, ml_mul(ch, 2, d->Dkv));
    uint64_t BHTT = mul3(ch, d->B, d->H, ml_mul(ch, d->T, d->T));
    /* q/k/v projections */
    unsigned ncast = fused_qkv ? 1 : 3;
    if (ch->prec.autocast && src_bpe == 4) {
        for (unsigned i = 0; i < ncast; i++)
            save(ch, b, "q/k/v projection input (cast copy)", BTD, 2, 0);
    } else if (!src_saved) {
        save(ch, b, "q/k/v projection input", BTD, src_bpe, in_flags);
    }
    weight_copy(ch, b, ml_mul(ch, d->D, qkv_out));
    param(ch, b, d->D, qkv_out);
    if (m->qkv_bias)
        param(ch, b, qkv_out, 0);
    tmp(ch, ml_mul(ch, d->BT, qkv_out), a);
    double attn_core = 4.0 * (double)d->B * (double)d->H * (double)d->T * (double)d->T *
                       (double)d->dh;
    b->flops_fwd += 2.0 * (double)d->BT * (double)d->D * (double)qkv_out + attn_core;
    if (fused_attention(ch, m)) {
        /* scaled_dot_product_attention (flash): saves q, k, v, the output and
         * the per-row logsumexp; no T x T tensor exists */
        save(ch, b, "q, k, v (flash)", ml_mul(ch, d->BT, qkv_out), a, 0);
        save(ch, b, "attention output (flash)", BTD, a, 0);
        save(ch, b, "logsumexp (flash)", mul3(ch, d->B, d->H, d->T), 4, 0);
    } else {
        /* matmul of the permuted head views reshapes them into contiguous
         * copies, which bmm saves: q and k for QK^T, v for PV */
        save(ch, b, "q, k, v contiguous copies (bmm)", ml_mul(ch, 3, BTD), a, 0);
        tmp(ch, BHTT, a);
        b->flops_core = attn_core;
        if (causal_mask)
            save(ch, b, "causal mask (masked_fill, bool)", ml_mul(ch, d->T, d->T), 1, ML_SV_CORE);
        unsigned sm = softmax_fp32 ? 4 : w;
        save(ch, b, "softmax output", BHTT, sm, ML_SV_CORE);
        if (d->drop)
            save(ch, b, "attention dropout mask", BHTT, 1, ML_SV_CORE);
        if (sm != a)
            save(ch, b, "attention probabilities cast for PV", BHTT, a, ML_SV_CORE);
        else if (d->drop)
            save(ch, b, "attention dropout output", BHTT, sm, ML_SV_CORE);
    }
    /* output projection: input is the contiguous (B, T, D) attention output */
    save(ch, b, "output projection input", BTD, a, 0);
    weight_copy(ch, b, ml_mul(ch, d->D, d->D));
    param(ch, b, d->D, d->D);
    if (m->bias)
        param(ch, b, d->D, 0);
    b->flops_fwd += 2.0 * (double)d->BT * (double)d->D * (double)d->D;
    if (d->drop)
        save(ch, b, "residual dropout mask", BTD, 1, 0);
    tmp(ch, BTD, a);
}

static void mlp_fwd(ml_chain *ch, ml_cblock *b, const ml_model *m, const tdims *d, unsigned src_bpe,
                    bool src_saved)
{
    const unsigned a = ch->prec.a;
    uint64_t BTD = ml_mul(ch, d->BT, d->D), BTF = ml_mul(ch, d->BT, d->F);
    uint64_t DF = ml_mul(ch, d->D, d->F);
    bool glu = m->activation == ML_ACT_SWIGLU;
    unsigned nin = glu ? 2 : 1;
    if (ch->prec.autocast && src_bpe == 4) {
        for (unsigned i = 0; i < nin; i++)
            save(ch, b, "MLP input (cast copy)", BTD, 2, 0);
    } else if (!src_saved) {
        save(ch, b, "MLP input", BTD, src_bpe, 0);
    }
    for (unsigned i = 0; i < nin + 1; i++)
        weight_copy(ch, b, DF);
    if (glu) {
        /* down(silu(gate(x)) * up(x)): silu saves gate, mul saves silu and
         * up, down saves the product */
        save(ch, b, "gate projection output (silu input)", BTF, a, 0);
        save(ch, b, "silu output", BTF, a, 0);
        save(ch, b, "up projection output", BTF, a, 0);
        save(ch, b, "gated product (down input)", BTF, a, 0);
        param(ch, b, d->D, d->F);
        param(ch, b, d->D, d->F);
        param(ch, b, d->F, d->D);
        if (m->bias) {
            param(ch, b, d->F, 0);
            param(ch, b, d->F, 0);
        }
    } else if (m->activation == ML_ACT_GELU) {
        save(ch, b, "fc output (gelu input)", BTF, a, 0);
        save(ch, b, "gelu output (proj input)", BTF, a, 0);
        param(ch, b, d->D, d->F);
        param(ch, b, d->F, d->D);
        if (m->bias)
            param(ch, b, d->F, 0);
    } else {
        /* relu saves its result, which is also the projection's input */
        tmp(ch, BTF, a);
        save(ch, b, "relu output (proj input)", BTF, a, 0);
        param(ch, b, d->D, d->F);
        param(ch, b, d->F, d->D);
        if (m->bias)
            param(ch, b, d->F, 0);
    }
    if (m->bias)
        param(ch, b, d->D, 0);
    b->flops_fwd += (double)(nin + 1) * 2.0 * (double)d->BT * (double)d->D * (double)d->F;
    if (d->drop)
        save(ch, b, "residual dropout mask", BTD, 1, 0);
    tmp(ch, BTD, a);
}

/* Pre-norm block: x + attn(norm(x)); x + mlp(norm(x)). GPT-2 (layernorm,
 * fused qkv, masked_fill causal mask), Llama (rmsnorm, separate q/k/v,
 * additive mask, fp32 softmax), ViT (layernorm, fused qkv, no mask). */
static void prenorm_block(ml_chain *ch, ml_cblock *b, const ml_model *m, const tdims *d)
{
    const bool llama = m->norm == ML_NORM_RMSNORM;
    const bool causal = m->type == ML_MODEL_DECODER;
    uint64_t np;
    unsigned nb = norm_fwd(ch, b, m, d, ML_SV_INPUT, &np);
    param(ch, b, np, 0);
    attention_fwd(ch, b, m, d, nb, false, !llama, causal && !llama, llama, 0);
    if (m->parallel_residual) {
        /* x + attn(ln1(x)) + mlp(ln2(x)): ln2 reads the block input that
         * ln1 already saved; only its statistics are new */
        save(ch, b, "ln_2 mean+rstd", ml_mul(ch, d->BT, 2), 4, 0);
        np = m->bias ? 2 * d->D : d->D;
        nb = ch->prec.w;
    } else {
        nb = norm_fwd(ch, b, m, d, 0, &np);
    }
    param(ch, b, np, 0);
    mlp_fwd(ch, b, m, d, nb, false);
}

/* Post-norm block (BERT): x1 = LN(x + attn(x)); out = LN(x1 + mlp(x1)). */
static void postnorm_block(ml_chain *ch, ml_cblock *b, const ml_model *m, const tdims *d)
{
    const unsigned w = ch->prec.w;
    uint64_t BTD = ml_mul(ch, d->BT, d->D);
    attention_fwd(ch, b, m, d, w, false, false, false, false, ML_SV_INPUT);
    uint64_t np;
    unsigned nb = norm_fwd(ch, b, m, d, 0, &np);
    param(ch, b, np, 0);
    mlp_fwd(ch, b, m, d, nb, false);
    nb = norm_fwd(ch, b, m, d, 0, &np);
    param(ch, b, np, 0);
    (void)BTD;
}

static ml_status build_transformer(const ml_model *m, const ml_config *cfg, ml_chain *ch,
                                   ml_error *err)
{
    const ml_training *t = &cfg->training;
    const unsigned w = ch->prec.w, a = ch->prec.a;
    tdims d;
    d.B = t->micro_batch;
    d.T = t->seq_len;
    if (m->image_size) {
        uint64_t g = m->image_size / m->patch_size;
        d.T = g * g + 1;
    }
    if (m->position == ML_POS_LEARNED && m->max_positions && d.T > m->max_positions) {
        err->code = ML_RANGE;
        snprintf(err->msg, sizeof err->msg,
                 "training.seq_len: %llu exceeds model.max_positions (%llu) of learned positions",
                 (unsigned long long)d.T, (unsigned long long)m->max_positions);
        return ML_RANGE;
    }
    d.BT = ml_mul(ch, d.B, d.T);
    d.D = m->hidden;
    d.F = m->ffn;
    d.H = m->heads;
    d.Hkv = m->kv_heads;
    d.dh = m->hidden / m->heads;
    d.Dkv = d.Hkv * d.dh;
    d.V = m->vocab;
    d.drop = m->dropout > 0;
    ch->B = d.B;
    ch->T = d.T;
    ch->c_tokens = d.BT;
    ch->c_width = d.D;
    uint64_t BTD = ml_mul(ch, d.BT, d.D);
    const bool enc = m->type == ML_MODEL_ENCODER;

    /* ---- embedding */
    ml_cblock *b = block_begin(ch, "embedding", -1);
    if (!b)
        return ML_NOMEM;
    if (m->image_size) {
        /* ViT: conv patchify (input needs no grad), class token, positions */
        uint64_t px = ml_mul(ch, mul3(ch, d.B, m->channels, m->image_size), m->image_size);
        if (ch->prec.autocast)
            save(ch, b, "image cast copy (patch conv input)", px, 2, 0);
        else
            save(ch, b, "image (patch conv input)", px, w, ML_SV_INPUT);
        uint64_t kin = mul3(ch, m->channels, m->patch_size, m->patch_size);
        param(ch, b, d.D, kin);
        param(ch, b, d.D, 0);
        param(ch, b, d.D, 0);               /* class token */
        param(ch, b, ml_mul(ch, d.T, d.D), 0); /* positions */
        b->flops_fwd = 2.0 * (double)d.B * (double)(d.T - 1) * (double)kin * (double)d.D;
        b->flops_bwd = b->flops_fwd; /* weight gradient only */
        tmp(ch, BTD, a);
        b->in_bytes = ml_mul(ch, px, w);
    } else {
        save(ch, b, "token ids (int64)", d.BT, 8, ML_SV_INPUT);
        b->in_bytes = ml_mul(ch, d.BT, 8);
        param(ch, b, d.V, d.D);
        if (m->position == ML_POS_LEARNED) {
            save(ch, b, "position ids (int64)", d.T, 8, 0);
            param(ch, b, m->max_positions, d.D);
        }
        if (enc && m->token_types) {
            save(ch, b, "token type ids (int64)", d.BT, 8, 0);
            param(ch, b, m->token_types, d.D);
        }
        if (m->position == ML_POS_ROPE)
            save(ch, b, "rotary cos and sin (shared by all blocks)",
                 mul3(ch, 2, d.BT, d.dh), w, 0);
        if (enc) {
            /* BERT: LayerNorm(word + position + type) then dropout */
            save(ch, b, "embedding layernorm input", BTD, w, 0);
            save(ch, b, "embedding layernorm mean+rstd", ml_mul(ch, d.BT, 2), 4, 0);
            param(ch, b, d.D, 0);
            param(ch, b, d.D, 0);
        }
        tmp(ch, BTD, w);
        /* embedding backward builds a dense (V, D) gradient; with tied
         * weights .grad already exists (head backward ran first) and it
         * is added in place, so the dense copy is a transient */
        if (m->tied_embeddings && !enc)
            b->ws_bwd = ml_mul(ch, ml_mul(ch, d.V, d.D), ch->prec.grad);
    }
    if (d.drop)
        save(ch, b, "embedding dropout mask", BTD, 1, 0);
    block_end(ch, b, ml_mul(ch, BTD, w));
    if (!m->image_size && m->tied_embeddings && !enc) {
        /* the tied table's gradient is created by the head's backward */
        uint64_t g = ml_mul(ch, ml_mul(ch, d.V, d.D), ch->prec.grad);
        b->grad_bytes -= g;
    }

    /* ---- transformer blocks */
    for (uint64_t i = 0; i < m->layers; i++) {
        char name[48];
        /* "block.<i>" without snprintf: this runs for every block of every
         * evaluation (fit and optimal evaluate thousands of plans) */
        char digits[24];
        size_t nd = 0;
        uint64_t v = i;
        do {
            digits[nd++] = (char)('0' + v % 10);
            v /= 10;
        } while (v);
        memcpy(name, "block.", 6);
        for (size_t k = 0; k < nd; k++)
            name[6 + k] = digits[nd - 1 - k];
        name[6 + nd] = '\0';
        b = block_begin(ch, name, (int)i);
        if (!b)
            return ML_NOMEM;
        b->in_bytes = ml_mul(ch, BTD, w);
        if (m->prenorm)
            prenorm_block(ch, b, m, &d);
        else
            postnorm_block(ch, b, m, &d);
        block_end(ch, b, ml_mul(ch, BTD, w));
        if (ch->overflow || ch->nomem)
            break;
    }
    ch->n_ckpt = m->layers;
    /* torch.utils.checkpoint saves every tensor argument of the block: the
     * HF BERT extended mask (B, 1, 1, T) and the HF Llama causal mask, a
     * (1, 1, T, T) tensor expanded over the batch (docs/inventory.md) */
    if (enc && !m->image_size)
        ch->ckpt_side = ml_mul(ch, d.BT, w);
    else if (!enc && m->norm == ML_NORM_RMSNORM)
        ch->ckpt_side = ml_mul(ch, ml_mul(ch, d.T, d.T), w);

    /* ---- head */
    b = block_begin(ch, "head", -1);
    if (!b)
        return ML_NOMEM;
    b->in_bytes = ml_mul(ch, BTD, w);
    uint64_t np;
    uint64_t out_classes;
    uint64_t rows; /* rows of the logits */
    if (!enc) {
        unsigned nb = norm_fwd(ch, b, m, &d, ML_SV_INPUT, &np);
        param(ch, b, np, 0);
        linear_input(ch, b, "lm head input", BTD, nb, false, 0);
        weight_copy(ch, b, ml_mul(ch, d.V, d.D));
        if (!m->tied_embeddings) {
            param(ch, b, d.V, d.D);
        } else {
            /* the tied table's gradient is first created here; with
             * accumulation this block's contribution is a transient */
            b->grad_bytes = ml_mul(ch, ml_mul(ch, d.V, d.D), ch->prec.grad);
            b->grad_accum_bytes = b->grad_bytes;
        }
        out_classes = d.V;
        rows = d.BT;
        b->flops_fwd = 2.0 * (double)d.BT * (double)d.D * (double)d.V;
    } else {
        uint64_t BD = ml_mul(ch, d.B, d.D);
        unsigned src = w;
        bool src_saved = false;
        if (m->prenorm) { /* ViT: final norm, then the class token */
            unsigned nb = norm_fwd(ch, b, m, &d, ML_SV_INPUT, &np);
            param(ch, b, np, 0);
            src = nb;
        }
        /* x[:, 0] is a view: a saving consumer keeps the whole (B, T, D)
         * storage alive unless autocast cast it to a (B, D) copy */
        if (m->pooler) {
            if (ch->prec.autocast && src == 4)
                save(ch, b, "pooler input (cast copy of first token)", BD, 2, 0);
            else
                save(ch, b, "pooler input (view keeps the full hidden state)", BTD, src,
                     m->prenorm ? 0 : ML_SV_INPUT);
            weight_copy(ch, b, ml_mul(ch, d.D, d.D));
            param(ch, b, d.D, d.D);
            param(ch, b, d.D, 0);
            save(ch, b, "pooler tanh output", BD, a, 0);
            b->flops_fwd += 2.0 * (double)d.B * (double)d.D * (double)d.D;
            src = a;
            src_saved = true;
        }
        if (d.drop) {
            save(ch, b, "classifier dropout mask", BD, 1, 0);
            src_saved = false;
            if (!m->pooler)
                src = w;
            linear_input(ch, b, "classifier input (dropout output)", BD, src, false, 0);
        } else if (!m->pooler) {
            if (ch->prec.autocast && src == 4)
                save(ch, b, "classifier input (cast copy of first token)", BD, 2, 0);
            else
                save(ch, b, "classifier input (view keeps the full hidden state)", BTD, src,
                     m->prenorm ? 0 : ML_SV_INPUT);
        } else {
            linear_input(ch, b, "classifier input", BD, src, src_saved, 0);
        }
        weight_copy(ch, b, ml_mul(ch, m->classes, d.D));
        param(ch, b, m->classes, d.D);
        param(ch, b, m->classes, 0);
        out_classes = m->classes;
        rows = d.B;
        b->flops_fwd += 2.0 * (double)d.B * (double)d.D * (double)m->classes;
    }
    uint64_t logits = ml_mul(ch, rows, out_classes);
    block_end(ch, b, ml_mul(ch, logits, a));

    /* ---- loss: cross-entropy = log_softmax (saves its output; autocast
     * runs it in fp32) + nll_loss (saves the int64 targets) */
    b = block_begin(ch, "loss", -1);
    if (!b)
        return ML_NOMEM;
    b->fwd_phase = ML_PHASE_LOSS;
    unsigned lsb = ch->prec.autocast ? 4 : w;
    save(ch, b, "log-softmax output", logits, lsb, 0);
    save(ch, b, "targets (int64)", rows, 8, 0);
    save(ch, b, "nll_loss total_weight (fp32 scalar)", 1, 4, 0);
    if (ch->prec.autocast)
        b->ws_fwd = ml_mul(ch, logits, 4); /* fp32 cast of the logits */
    /* backward: grad of log-probs and grad of logits coexist */
    b->ws_bwd = ml_mul(ch, ml_mul(ch, logits, lsb), 2);
    b->in_bytes = ml_mul(ch, logits, a);
    b->in_held = true; /* the model returns the logits to the caller */
    for (size_t i = 0; i < ch->n; i++)
        if (ch->blocks[i].flops_bwd == 0)
            ch->blocks[i].flops_bwd = 2.0 * ch->blocks[i].flops_fwd;
    return ML_OK;
}

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
        save(ch, s->b, what, t->elems, 2, 0);
        return;
    }
    if (t == s->in) {
        save(ch, s->b, what, t->elems, t->bpe, ML_SV_INPUT);
        return;
    }
    if (!t->saved)
        save(ch, s->b, what, t->elems, t->bpe, 0);
    t->saved = true;
}

static tref *seq_layers(seqctx *s, const ml_layer *ls, size_t n, tref *x, ml_shape *sh);

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
    unsigned mm_out = ch->prec.autocast ? 2 : x->bpe;
    switch (l->kind) {
    case ML_L_LINEAR:
    case ML_L_CONV2D: {
        bool lin = l->kind == ML_L_LINEAR;
        uint64_t kin = lin ? sh->d[sh->rank - 1] : mul3(ch, sh->d[0], l->kernel, l->kernel);
        /* rows x kin x out: linear acts on the last axis, conv per pixel */
        uint64_t rows = lin ? ml_mul(ch, s->B, sh->rank == 2 ? sh->d[0] : 1)
                            : ml_mul(ch, s->B, o.d[1] * o.d[2]);
        save_ref(s, x, lin ? "linear input" : "conv2d input", true);
        if (!x->model_input)
            weight_copy(ch, b, ml_mul(ch, kin, l->out));
        param(ch, b, l->out, kin);
        if (l->bias)
            param(ch, b, l->out, 0);
        /* a layer whose input needs no gradient computes only the weight
         * gradient in backward: F instead of 2F */
        double f = 2.0 * (double)rows * (double)kin * (double)l->out;
        b->flops_fwd += f;
        b->flops_bwd += x->model_input ? f : 2 * f;
        y = new_ref(s, out_ps, mm_out);
        break;
    }
    case ML_L_BATCHNORM:
        /* native/cudnn batch_norm saves input, save_mean, save_invstd */
        save_ref(s, x, "batchnorm input", false);
        save(ch, b, "batchnorm save_mean+save_invstd", ml_mul(ch, sh->d[0], 2), 4, 0);
        param(ch, b, sh->d[0], 0);
        param(ch, b, sh->d[0], 0);
        y = new_ref(s, out_ps, x->bpe);
        break;
    case ML_L_LAYERNORM: {
        uint64_t last = sh->d[sh->rank - 1];
        if (ch->prec.autocast && x->bpe == 2)
            save(ch, b, "layernorm input (fp32 cast, autocast)", x->elems, 4, 0);
        else
            save_ref(s, x, "layernorm input", false);
        save(ch, b, "layernorm mean+rstd", ml_mul(ch, x->elems / last, 2), 4, 0);
        param(ch, b, last, 0);
        param(ch, b, last, 0);
        y = new_ref(s, out_ps, ch->prec.autocast ? 4 : x->bpe);
        break;
    }
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
            save(ch, b, "dropout mask (bool)", x->elems, 1, 0);
            y = new_ref(s, out_ps, x->bpe);
        }
        break;
    case ML_L_MAXPOOL:
        save_ref(s, x, "maxpool input", false);
        save(ch, b, "maxpool indices (int64)", ml_mul(ch, s->B, out_ps), 8, 0);
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
        param(ch, b, l->vocab, l->dim);
        y = new_ref(s, out_ps, ch->prec.w);
        break;
    case ML_L_ATTENTION: {
        tdims d;
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
        attention_fwd(ch, b, &fake, &d, x->bpe, !is_in && !cast && x->saved, true, l->causal,
                      false, is_in ? ML_SV_INPUT : 0);
        if (!cast)
            x->saved = true;
        y = new_ref(s, out_ps, ch->prec.autocast ? 2 : x->bpe);
        break;
    }
    case ML_L_RESIDUAL: {
        ml_shape s1 = *sh, s2 = *sh;
        tref *yb = seq_layers(s, l->body, l->nbody, x, &s1);
        tref *ys = l->nshortcut ? seq_layers(s, l->shortcut, l->nshortcut, x, &s2) : x;
        /* the two branches meet in the sum, which saves nothing */
        if (yb != s->in)
            note_tensor(ch, ml_mul(ch, yb->elems, yb->bpe), yb->saved);
        if (ys != s->in)
            note_tensor(ch, ml_mul(ch, ys->elems, ys->bpe), ys->saved);
        y = new_ref(s, out_ps, yb->bpe > ys->bpe ? yb->bpe : ys->bpe);
        return *sh = o, y;
    }
    default:
        break;
    }
    /* an intermediate: created and consumed inside the block (the block's
     * input and output are boundaries, accounted by the replay) */
    if (x != s->in && y != x)
        note_tensor(ch, ml_mul(ch, x->elems, x->bpe), x->saved);
    *sh = o;
    return y;
}

static tref *seq_layers(seqctx *s, const ml_layer *ls, size_t n, tref *x, ml_shape *sh)
{
    for (size_t i = 0; i < n; i++)
        x = seq_layer(s, &ls[i], x, sh);
    return x;
}

static const char *const kind_names[ML_L_KIND_COUNT] = {
    "linear", "conv2d",  "batchnorm", "layernorm", "relu",     "gelu",      "silu",
    "dropout", "maxpool", "avgpool",   "flatten",   "residual", "embedding", "attention"};

static ml_status build_sequential(const ml_model *m, const ml_config *cfg, ml_chain *ch)
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
        snprintf(name, sizeof name, "%zu:%s", i, kind_names[m->seq[i].kind]);
        ml_cblock *b = block_begin(ch, name, (int)i);
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
        block_end(ch, b, out_bytes);
        if (y != x)
            y->model_input = false;
        x = y;
    }
    ch->n_ckpt = m->nseq;
    ml_cblock *b = st ? NULL : block_begin(ch, "loss", -1);
    if (b) {
        b->fwd_phase = ML_PHASE_LOSS;
        b->in_bytes = ml_mul(ch, x->elems, x->bpe);
        b->in_held = true; /* the caller holds the model output */
        unsigned lsb = ch->prec.autocast ? 4 : ch->prec.w;
        if (m->loss == ML_LOSS_CROSS_ENTROPY) {
            uint64_t rows = sh.rank == 2 ? ml_mul(ch, s.B, sh.d[0]) : s.B;
            save(ch, b, "log-softmax output", x->elems, lsb, 0);
            save(ch, b, "targets (int64)", rows, 8, 0);
            save(ch, b, "nll_loss total_weight (fp32 scalar)", 1, 4, 0);
        } else {
            /* mse_loss saves input and target; autocast runs it in fp32, so
             * it saves an fp32 copy of the model output */
            if (ch->prec.autocast && x->bpe != 4)
                save(ch, b, "mse input (fp32 cast)", x->elems, 4, 0);
            else
                save(ch, b, "mse input", x->elems, x->bpe, ML_SV_INPUT);
            save(ch, b, "mse target", x->elems, ch->prec.w, 0);
        }
        if (ch->prec.autocast)
            b->ws_fwd = ml_mul(ch, x->elems, 4);
        b->ws_bwd = ml_mul(ch, ml_mul(ch, x->elems, lsb), 2);
    } else if (!st) {
        st = ML_NOMEM;
    }
    while (s.all) {
        tref *n = s.all->next;
        free(s.all);
        s.all = n;
    }
    return st;
}

/* A measured profile replaces the transformer blocks' inventories with its
 * fit at the model's shape (docs/calibration.md) when it was measured under
 * the model's precision policy (older profiles name only the dtype: then
 * its bytes must be the compute dtype's); the share of the attention core
 * scales with it. The profile's saved bytes leave out autocast's weight
 * copies, which depend on the weights' shapes only: the ledger's own count
 * of them is added back. */
static void apply_profile(ml_chain *ch, const ml_profile *p, const ml_model *m, ml_precision prec)
{
    const char *pp = ml_profile_get(p, "precision");
    bool llama = m->norm == ML_NORM_RMSNORM;
    /* the runner's two block kinds: GPT-2 layout and Llama layout */
    const ml_profile_kind *k = ml_profile_find(p, llama ? "llama_block" : "transformer_block");
    if (*pp ? strcmp(pp, ml_precision_name(prec)) != 0 : ml_profile_dtype_bytes(p) != ch->prec.a) {
        ch->calib_note = "the profile was measured under another precision policy";
        return;
    }
    if (!k || !(k->fit.slope > 0)) {
        ch->calib_note = llama ? "the profile has no llama_block measurements"
                               : "the profile has no transformer_block measurements";
        return;
    }
    /* the runner's attention is eager: its scores and probabilities say
     * nothing about a flash kernel's saved tensors */
    if (fused_attention(ch, m)) {
        ch->calib_note = "the model's attention runs a fused kernel (flash, or sdpa as "
                         "dispatched), the runner's eager";
        return;
    }
    /* c holds the MLP's B*T*F terms at the measured F/D: another ratio
     * (Llama-2's 11008/4096 against the runner's 704/256) would carry them
     * over wrongly */
    for (size_t j = 0; j < k->npoints; j++) {
        const ml_profile_point *q = &k->points[j];
        if (q->F && (double)q->F * (double)ch->c_width != (double)m->ffn * (double)q->D) {
            ch->calib_note = "the profile's blocks were measured at another ffn/hidden ratio "
                             "(re-measure with memledger-calibrate --ffn F)";
            return;
        }
    }
    /* the profile's fit at this shape (its B*H*T^2 and T^2 terms included);
     * points measured at this model's T, D and H give the exact per-sample
     * bytes instead: a straight line in B through them */
    double x = (double)ch->c_tokens * (double)ch->c_width * (double)ch->prec.a;
    double inv = ml_profile_kind_saved(k, ch->B, ch->T, ch->c_width, m->heads, ch->prec.a);
    double *qx = malloc((k->npoints ? k->npoints : 1) * sizeof *qx);
    double *qy = malloc((k->npoints ? k->npoints : 1) * sizeof *qy);
    size_t npt = 0;
    for (size_t j = 0; qx && qy && j < k->npoints; j++) {
        const ml_profile_point *q = &k->points[j];
        if (q->T != ch->T || q->D != ch->c_width || (q->H && q->H != m->heads))
            continue;
        qx[npt] = (double)q->B * (double)q->T * (double)q->D * (double)ch->prec.a;
        qy[npt++] = (double)q->saved_bytes;
    }
    ml_linfit f;
    /* (out of memory: the global fit stands) */
    if (npt >= 2 && ml_linfit_points(qx, qy, npt, &f, NULL) == ML_OK) {
        inv = f.slope * x + f.fixed;
        ch->calib_exact = true;
    }
    free(qx);
    free(qy);
    for (size_t i = 0; i < ch->n; i++) {
        ml_cblock *b = &ch->blocks[i];
        if (b->ckpt_index < 0)
            continue;
        double in = b->in_saved ? (double)b->in_bytes : 0;
        double act = inv - in > 0 ? inv - in : 0; /* activations, weight copies apart */
        double saved = act + (double)b->cast_bytes;
        if (!(saved < 1.8e19))
            continue;
        uint64_t old_act = b->saved_bytes - b->cast_bytes;
        double share = old_act ? (double)b->core_bytes / (double)old_act : 0;
        b->saved_bytes = (uint64_t)llround(saved);
        b->core_bytes = (uint64_t)llround(act * share);
        b->measured = true;
        ch->calibrated++;
        /* the blocks' c as the table prints it: the measured bytes (input
         * included) and the ledger's weight copies */
        ch->calib_c = x > 0 ? (inv + (double)b->cast_bytes) / x : 0;
    }
}

/* Sizes the arrays once: a transformer block lists at most ~24 saved
 * tensors and ~16 parameter tensors, a sequential entry a handful per layer. */
static void reserve(ml_chain *ch, const ml_model *m)
{
    size_t n = m->type == ML_MODEL_SEQUENTIAL ? m->nseq : (size_t)m->layers;
    size_t per = m->type == ML_MODEL_SEQUENTIAL ? 8 : 24;
    ch->cap = n + 4;
    ch->savedcap = per * (n + 4);
    ch->paramcap = 16 * (n + 4);
    ch->blocks = malloc(ch->cap * sizeof *ch->blocks);
    ch->saved = malloc(ch->savedcap * sizeof *ch->saved);
    ch->params = malloc(ch->paramcap * sizeof *ch->params);
    if (!ch->blocks || !ch->saved || !ch->params) {
        free(ch->blocks);
        free(ch->saved);
        free(ch->params);
        ch->blocks = NULL;
        ch->saved = NULL;
        ch->params = NULL;
        ch->cap = ch->savedcap = ch->paramcap = 0; /* grow on demand instead */
    }
}

ml_status ml_chain_build(const ml_model *m, const ml_config *cfg, ml_chain *ch, ml_error *err)
{
    memset(ch, 0, sizeof *ch);
    reserve(ch, m);
    ch->prec = ml_prec_of(cfg->training.precision);
    ml_status st = m->type == ML_MODEL_SEQUENTIAL ? build_sequential(m, cfg, ch)
                                                 : build_transformer(m, cfg, ch, err);
    if (st == ML_OK && cfg->calib && m->type != ML_MODEL_SEQUENTIAL)
        apply_profile(ch, cfg->calib, m, cfg->training.precision);
    if (st == ML_OK && ch->nomem)
        st = ML_NOMEM;
    if (st == ML_OK && ch->overflow) {
        err->code = ML_OVERFLOW;
        snprintf(err->msg, sizeof err->msg,
                 "byte counts exceed 64 bits for micro_batch %llu x seq_len %llu: use smaller values",
                 (unsigned long long)cfg->training.micro_batch,
                 (unsigned long long)cfg->training.seq_len);
        st = ML_OVERFLOW;
    }
    if (st == ML_NOMEM)
        ml_error_at(err, NULL, ML_NOMEM, "out of memory");
    if (st)
        ml_chain_free(ch);
    return st;
}

void ml_chain_free(ml_chain *ch)
{
    free(ch->blocks);
    free(ch->saved);
    free(ch->params);
    memset(ch, 0, sizeof *ch);
}
