/* Transformer chains (GPT-2, Llama, Gemma, BERT, ViT layouts): the
 * embedding, one block per layer, the head and the loss, each with the
 * storages PyTorch's eager autograd keeps for its backward in the reference
 * implementation named in docs/inventory.md (nanoGPT/HF GPT-2, HF Llama, HF
 * Gemma, HF BERT, timm ViT). A storage saved by several ops is listed once,
 * where it is first saved. */
#include <stdio.h>
#include <string.h>

#include "ledger/chain_kit.h"
#include "util/error.h"

/* The RMSNorms (docs/inventory.md, "Llama block", "Gemma block"): x in
 * fp32 (x itself, or a copy when the stream is bf16/fp16), pow(2) and the
 * mul by rsqrt save it; rsqrt saves its result; the scale saves the
 * normalised h: HF LlamaRMSNorm's weight * h.to(dtype) the cast h, HF
 * GemmaRMSNorm's h * (1 + weight.float()) the fp32 h and, since h needs a
 * gradient, the fp32 (1 + weight) vector (D * 4 B); its result is cast back
 * (.type_as(x): nothing saved). */
static unsigned rmsnorm_fwd(ml_chain *ch, ml_cblock *b, const ml_model *m,
                            const ml_ck_dims *d, unsigned xflags, uint64_t *params, bool xbuf)
{
    const unsigned w = ch->prec.w, g = ch->prec.grad;
    const bool gemma = m->norm == ML_NORM_GEMMA_RMSNORM;
    uint64_t BTD = ml_mul(ch, d->BT, d->D);
    uint64_t gD = ml_mul(ch, BTD, w);
    size_t s0, s1, s2, s3 = SIZE_MAX;
    if (w == 4)
        s0 = ml_ck_save(ch, b, "rmsnorm input", BTD, 4, xflags);
    else
        s0 = ml_ck_save(ch, b, "rmsnorm fp32 copy of input", BTD, 4, 0);
    s1 = ml_ck_save(ch, b, "rmsnorm rsqrt", d->BT, 4, 0);
    if (gemma) {
        s2 = ml_ck_save(ch, b, "rmsnorm normalised (fp32)", BTD, 4, 0);
        s3 = ml_ck_save(ch, b, "rmsnorm 1 + weight (fp32)", d->D, 4, 0);
    } else {
        s2 = ml_ck_save(ch, b, w == 4 ? "rmsnorm normalised" : "rmsnorm normalised (cast back)",
                        BTD, w, 0);
    }
    *params = d->D;
    ml_ck_tmp(ch, BTD, w);
    /* backward, in execution order: the scale (its weight gradient sums
     * grad * h, a scratch of x's size; Gemma's add of 1 passes it on), x *
     * rsqrt (the same for rsqrt's), its x gradient into x's buffer (or the
     * buffer, when none exists); rsqrt; mean (expands to x's size); pow; its
     * x gradient into the buffer (derivatives.yaml: mul, add, rsqrt, mean,
     * pow). Recorded for fp32 only, where Gemma's casts are no-ops. */
    uint64_t gR = ml_mul(ch, d->BT, 4);
    ml_ck_accum(ch, b, gD);
    ml_ck_node(ch, b, "PowBackward0 (x^2)", gD, 0, gD, s0, SIZE_MAX);
    ml_ck_node(ch, b, "MeanBackward1", gD, 0, gR, SIZE_MAX, SIZE_MAX);
    ml_ck_node(ch, b, "RsqrtBackward0", gR, 0, gR, s1, SIZE_MAX);
    if (xbuf)
        ml_ck_accum(ch, b, gD);
    ml_ck_node(ch, b, "MulBackward0 (x * rsqrt)", ml_add(ch, gD, gR), 0, gD, SIZE_MAX, SIZE_MAX);
    ml_ck_node_scratch(ch, b, gD);
    ml_ck_node(ch, b, gemma ? "MulBackward0 (h * (1 + weight))" : "MulBackward0 (weight * h)",
               gD, ml_mul(ch, d->D, g), gD, s2, s3);
    ml_ck_node_scratch(ch, b, gD);
    return w;
}

/* A norm on x (w bytes per element). Returns the output's bytes per element
 * and sets *params to its parameter count. xbuf: x's gradient buffer exists
 * before the norm's gradient arrives (a pre-norm block's residual stream,
 * whose skip holds it): the norm's input gradient is accumulated into it. */
static unsigned norm_fwd(ml_chain *ch, ml_cblock *b, const ml_model *m,
                         const ml_ck_dims *d, unsigned xflags, uint64_t *params, bool xbuf)
{
    const unsigned w = ch->prec.w, g = ch->prec.grad;
    uint64_t BTD = ml_mul(ch, d->BT, d->D);
    uint64_t gD = ml_mul(ch, BTD, w);
    if (m->norm == ML_NORM_LAYERNORM) {
        /* native_layer_norm saves input, mean and rstd (fp32 per row) */
        size_t s0 = ml_ck_save(ch, b, "layernorm input", BTD, w, xflags);
        size_t s1 = ml_ck_save(ch, b, "layernorm mean+rstd", ml_mul(ch, d->BT, 2), 4, 0);
        *params = m->bias ? 2 * d->D : d->D;
        ml_ck_tmp(ch, BTD, w);
        if (xbuf)
            ml_ck_accum(ch, b, gD);
        ml_ck_node(ch, b, "NativeLayerNormBackward0", gD, ml_mul(ch, *params, g), gD, s0, s1);
        return w;
    }
    return rmsnorm_fwd(ch, b, m, d, xflags, params, xbuf);
}

/* A norm's np parameters as the module registers them: the weight (D),
 * then a LayerNorm's bias. */
static void norm_params(ml_chain *ch, ml_cblock *b, uint64_t np, uint64_t D)
{
    ml_ck_param(ch, b, D, 0);
    if (np > D)
        ml_ck_param(ch, b, np - D, 0);
}

/* What the MLP's ops keep for its backward (indices in ch->saved,
 * SIZE_MAX: none, or a storage another op saved). */
typedef struct {
    size_t in, act_in, act_out, up, prod;
} mlp_kept;

/* The gated MLP's saved tensors and parameters: down(act(gate(x)) * up(x)),
 * act silu (SwiGLU, Llama) or gelu, exact or tanh (GeGLU, Gemma): the
 * activation saves gate's output (derivatives.yaml: silu, gelu), the mul
 * its output and up's, down the product. fused (Phi-3's gate_up_proj, then
 * chunk(2)): gate and up are views of one (B, T, 2F) output, which the
 * activation and the mul keep alive as one storage (docs/inventory.md). */
static void glu_saves(ml_chain *ch, ml_cblock *b, const ml_ck_dims *d, bool geglu, bool bias,
                      bool fused, mlp_kept *k)
{
    const unsigned a = ch->prec.a;
    uint64_t BTF = ml_mul(ch, d->BT, d->F);
    if (fused) {
        k->act_in = ml_ck_save(ch, b, "gate_up projection output (gate and up views)",
                               ml_mul(ch, 2, BTF), a, 0);
        k->act_out = ml_ck_save(ch, b, geglu ? "gelu output" : "silu output", BTF, a, 0);
        k->up = SIZE_MAX;
    } else {
        k->act_in = ml_ck_save(ch, b, geglu ? "gate projection output (gelu input)"
                                            : "gate projection output (silu input)", BTF, a, 0);
        k->act_out = ml_ck_save(ch, b, geglu ? "gelu output" : "silu output", BTF, a, 0);
        k->up = ml_ck_save(ch, b, "up projection output", BTF, a, 0);
    }
    k->prod = ml_ck_save(ch, b, "gated product (down input)", BTF, a, 0);
    if (fused) { /* gate_up_proj, down_proj */
        ml_ck_linear(ch, b, d->D, ml_mul(ch, 2, d->F), bias);
    } else {     /* gate_proj, up_proj, down_proj */
        ml_ck_linear(ch, b, d->D, d->F, bias);
        ml_ck_linear(ch, b, d->D, d->F, bias);
    }
    ml_ck_linear(ch, b, d->F, d->D, bias);
}

/* The gated MLP's backward nodes, forward order. gate and up read the same
 * input: up's gradient arrives first and becomes the buffer (unless the
 * skip holds one, in_buf), gate's is added; fused: Phi-3's gate_up_proj. gO: the down projection's
 * output gradient it frees (0: the residual's buffer holds it). */
static void glu_nodes(ml_chain *ch, ml_cblock *b, const mlp_kept *k, bool geglu, bool fused,
                      bool in_buf, uint64_t gD, uint64_t gF, uint64_t pin, uint64_t pout,
                      uint64_t gO)
{
    if (fused) {
        /* Phi-3's gate_up_proj and chunk(2): the mul runs first (up's
         * gradient and the activation output's), then the activation, which
         * releases the one (B, T, 2F) storage both views kept;
         * SplitBackward0 cats the two gradients into one of the whole
         * output (split_backward), then the projection */
        uint64_t g2F = ml_mul(ch, 2, gF);
        if (in_buf)
            ml_ck_accum(ch, b, gD);
        ml_ck_node(ch, b, "MmBackward0 (gate_up projection)", gD, ml_mul(ch, 2, pin), g2F, k->in,
                   SIZE_MAX);
        ml_ck_node(ch, b, "SplitBackward0 (chunk into gate, up)", g2F, 0, g2F, SIZE_MAX, SIZE_MAX);
        ml_ck_node(ch, b, geglu ? "GeluBackward0" : "SiluBackward0", gF, 0, gF, k->act_in,
                   SIZE_MAX);
        ml_ck_node(ch, b, geglu ? "MulBackward0 (up * gelu)" : "MulBackward0 (up * silu)", g2F, 0,
                   gF, k->act_out, SIZE_MAX);
        ml_ck_node(ch, b, "MmBackward0 (down projection)", gF, pout, gO, k->prod, SIZE_MAX);
        return;
    }
    ml_ck_accum(ch, b, gD);
    ml_ck_node(ch, b, "MmBackward0 (gate projection)", gD, pin, gF, k->in, SIZE_MAX);
    ml_ck_node(ch, b, geglu ? "GeluBackward0" : "SiluBackward0", gF, 0, gF, k->act_in, SIZE_MAX);
    if (in_buf)
        ml_ck_accum(ch, b, gD);
    ml_ck_node(ch, b, "MmBackward0 (up projection)", gD, pin, gF, SIZE_MAX, SIZE_MAX);
    ml_ck_node(ch, b, geglu ? "MulBackward0 (gelu * up)" : "MulBackward0 (silu * up)",
               ml_mul(ch, 2, gF), 0, gF, k->act_out, k->up);
    ml_ck_node(ch, b, "MmBackward0 (down projection)", gF, pout, gO, k->prod, SIZE_MAX);
}

/* The MLP. in_buf: its input's gradient buffer exists before the MLP's
 * input gradient arrives (post-norm: the residual skip holds it). */
static void mlp_fwd(ml_chain *ch, ml_cblock *b, const ml_model *m, const ml_ck_dims *d,
                    unsigned src_bpe, bool src_saved, bool in_buf)
{
    const unsigned a = ch->prec.a, g = ch->prec.grad;
    uint64_t BTD = ml_mul(ch, d->BT, d->D), BTF = ml_mul(ch, d->BT, d->F);
    uint64_t DF = ml_mul(ch, d->D, d->F);
    bool glu = m->activation == ML_ACT_SWIGLU || m->activation == ML_ACT_GEGLU;
    bool geglu = m->activation == ML_ACT_GEGLU;
    bool bias = m->bias || m->mlp_bias;
    unsigned nin = glu ? 2 : 1;
    /* autocast casts the (fp32) input once per projection that reads it:
     * gate and up, or Phi-3's one gate_up_proj */
    unsigned ncast = m->fused_proj ? 1 : nin;
    mlp_kept k = {SIZE_MAX, SIZE_MAX, SIZE_MAX, SIZE_MAX, SIZE_MAX};
    if (ch->prec.autocast && src_bpe == 4) {
        for (unsigned i = 0; i < ncast; i++)
            ml_ck_save(ch, b, "MLP input (cast copy)", BTD, 2, 0);
    } else if (!src_saved) {
        k.in = ml_ck_save(ch, b, "MLP input", BTD, src_bpe, 0);
    }
    for (unsigned i = 0; i < nin + 1; i++)
        ml_ck_weight_copy(ch, b, DF);
    if (glu) {
        glu_saves(ch, b, d, geglu, bias, m->fused_proj, &k);
    } else if (m->activation == ML_ACT_GELU) {
        k.act_in = ml_ck_save(ch, b, "fc output (gelu input)", BTF, a, 0);
        k.act_out = ml_ck_save(ch, b, "gelu output (proj input)", BTF, a, 0);
        ml_ck_linear(ch, b, d->D, d->F, bias);
        ml_ck_linear(ch, b, d->F, d->D, bias);
    } else {
        /* relu saves its result, which is also the projection's input */
        ml_ck_tmp(ch, BTF, a);
        k.act_out = ml_ck_save(ch, b, "relu output (proj input)", BTF, a, 0);
        ml_ck_linear(ch, b, d->D, d->F, bias);
        ml_ck_linear(ch, b, d->F, d->D, bias);
    }
    b->flops_fwd += (double)(nin + 1) * 2.0 * (double)d->BT * (double)d->D * (double)d->F;
    /* backward nodes, forward order (docs/ledger.md, "Backward, node by
     * node"); the last one's output gradient is the residual's, held by the
     * skip's buffer */
    uint64_t gD = ml_mul(ch, BTD, src_bpe), gF = ml_mul(ch, BTF, a), gO = ml_mul(ch, BTD, a);
    uint64_t pin = ml_mul(ch, ml_add(ch, DF, bias ? d->F : 0), g);
    uint64_t pout = ml_mul(ch, ml_add(ch, DF, bias ? d->D : 0), g);
    if (glu) {
        glu_nodes(ch, b, &k, geglu, m->fused_proj, in_buf, gD, gF, pin, pout, d->drop ? gO : 0);
    } else {
        if (in_buf)
            ml_ck_accum(ch, b, gD);
        ml_ck_node(ch, b, "AddmmBackward0 (MLP in)", gD, pin, gF, k.in, SIZE_MAX);
        ml_ck_node(ch, b, m->activation == ML_ACT_GELU ? "GeluBackward0" : "ReluBackward0", gF,
                   0, gF, m->activation == ML_ACT_GELU ? k.act_in : k.act_out, SIZE_MAX);
        ml_ck_node(ch, b, "AddmmBackward0 (MLP out)", gF, pout, d->drop ? gO : 0,
                   m->activation == ML_ACT_GELU ? k.act_out : SIZE_MAX, SIZE_MAX);
    }
    if (d->drop) {
        size_t s = ml_ck_save(ch, b, "residual dropout mask", BTD, 1, 0);
        ml_ck_node(ch, b, "NativeDropoutBackward0 (residual)", gO, 0, 0, s, SIZE_MAX);
    }
    ml_ck_tmp(ch, BTD, a);
}

/* HF's Llama-layout decoder layers (LlamaDecoderLayer, and Gemma's,
 * Mistral's, Qwen2's, Phi3DecoderLayer) register self_attn, mlp, then
 * input_layernorm and post_attention_layernorm; Phi3Attention registers
 * o_proj before qkv_proj. The block was emitted [norm1 | attention | norm2 |
 * mlp] with the attention's projections before its output projection. */
static void llama_param_order(ml_chain *ch, const ml_model *m, size_t first, size_t attn,
                              size_t norm2, size_t mlp)
{
    /* emitted: norm1 [first, attn), attention [attn, norm2), norm2
     * [norm2, mlp), MLP [mlp, end) */
    ml_ptensor tmp[32];
    const size_t end = ch->nparams, n = end - first;
    if (ch->nomem || n > sizeof tmp / sizeof tmp[0])
        return;
    const size_t n_o = m->fused_proj ? ((m->bias || m->out_bias) ? 2u : 1u) : 0u;
    const size_t from[5] = {norm2 - n_o, attn, mlp, first, norm2};
    const size_t to[5] = {norm2, norm2 - n_o, end, attn, mlp};
    size_t k = 0;
    for (size_t i = 0; i < 5; i++)
        for (size_t j = from[i]; j < to[i]; j++)
            tmp[k++] = ch->params[j];
    memcpy(ch->params + first, tmp, n * sizeof tmp[0]);
}

/* Pre-norm block: x + attn(norm(x)); x + mlp(norm(x)). GPT-2 (layernorm,
 * fused qkv, masked_fill causal mask), Llama and Gemma (their RMSNorms,
 * separate q/k/v, additive mask, fp32 softmax), Phi-3 (Llama's with one
 * qkv_proj: the q, k and v slices are views of its output, which nothing
 * saves, so only the autocast casts of its input and the weight differ),
 * ViT (layernorm, fused qkv, no mask). */
static void prenorm_block(ml_chain *ch, ml_cblock *b, const ml_model *m, const ml_ck_dims *d)
{
    const bool llama = m->norm != ML_NORM_LAYERNORM; /* Llama or Gemma layout */
    const bool causal = m->type == ML_MODEL_DECODER;
    uint64_t np;
    const size_t first = ch->nparams;
    unsigned nb = norm_fwd(ch, b, m, d, ML_SV_INPUT, &np, true);
    norm_params(ch, b, np, d->D);
    const size_t attn = ch->nparams;
    ml_ck_attention(ch, b, m, d, nb, false, !llama || m->fused_proj, causal && !llama, llama, 0);
    const size_t norm2 = ch->nparams;
    if (m->parallel_residual) {
        /* x + attn(ln1(x)) + mlp(ln2(x)): ln2 reads the block input that
         * ln1 already saved; only its statistics are new */
        ml_ck_save(ch, b, "ln_2 mean+rstd", ml_mul(ch, d->BT, 2), 4, 0);
        np = m->bias ? 2 * d->D : d->D;
        nb = ch->prec.w;
    } else {
        nb = norm_fwd(ch, b, m, d, 0, &np, true);
    }
    norm_params(ch, b, np, d->D);
    const size_t mlp = ch->nparams;
    mlp_fwd(ch, b, m, d, nb, false, false);
    if (llama)
        llama_param_order(ch, m, first, attn, norm2, mlp);
}

/* Post-norm block (BERT): x1 = LN(x + attn(x)); out = LN(x1 + mlp(x1)). */
static void postnorm_block(ml_chain *ch, ml_cblock *b, const ml_model *m, const ml_ck_dims *d)
{
    const unsigned w = ch->prec.w;
    uint64_t BTD = ml_mul(ch, d->BT, d->D);
    ml_ck_attention(ch, b, m, d, w, false, false, false, false, ML_SV_INPUT);
    uint64_t np;
    unsigned nb = norm_fwd(ch, b, m, d, 0, &np, false);
    norm_params(ch, b, np, d->D);
    mlp_fwd(ch, b, m, d, nb, false, true);
    nb = norm_fwd(ch, b, m, d, 0, &np, false);
    norm_params(ch, b, np, d->D);
    (void)BTD;
}

/* The shapes of one training micro-batch through the model; ML_RANGE when
 * the sequence is longer than learned positions allow. */
static ml_status dims_of(const ml_model *m, const ml_training *t, ml_chain *ch,
                         ml_ck_dims *d, ml_error *err)
{
    d->B = t->micro_batch;
    d->T = t->seq_len;
    if (m->image_size) {
        uint64_t g = m->image_size / m->patch_size;
        d->T = g * g + 1;
    }
    if (m->position == ML_POS_LEARNED && m->max_positions && d->T > m->max_positions) {
        return ml_errorf(err, ML_RANGE,
                         "training.seq_len: %llu exceeds model.max_positions (%llu) of "
                         "learned positions",
                         (unsigned long long)d->T, (unsigned long long)m->max_positions);
    }
    /* a window shorter than the sequence changes the attention's mask, its
     * kernels and FLOPs: not modelled (docs/hf.md) */
    if (m->sliding_window && d->T > m->sliding_window)
        return ml_errorf(err, ML_RANGE,
                         "a sequence of %llu tokens exceeds the model's sliding_window "
                         "(%llu); attention over a sliding window is not modelled: plan at "
                         "most %llu tokens (seq_len, eval_seq_len)",
                         (unsigned long long)d->T, (unsigned long long)m->sliding_window,
                         (unsigned long long)m->sliding_window);
    d->BT = ml_mul(ch, d->B, d->T);
    d->D = m->hidden;
    d->F = m->ffn;
    d->H = m->heads;
    d->Hkv = m->kv_heads;
    d->dh = m->head_dim ? m->head_dim : m->hidden / m->heads;
    d->Dkv = d->Hkv * d->dh;
    d->V = m->vocab;
    d->drop = m->dropout > 0;
    ch->B = d->B;
    ch->T = d->T;
    ch->c_tokens = d->BT;
    ch->c_width = d->D;
    return ML_OK;
}

/* "block.<i>" without snprintf: this runs for every block of every
 * evaluation (fit and optimal evaluate thousands of plans). */
static void block_name(char name[48], uint64_t i)
{
    char digits[24];
    size_t nd = 0;
    do {
        digits[nd++] = (char)('0' + i % 10);
        i /= 10;
    } while (i);
    memcpy(name, "block.", 6);
    for (size_t k = 0; k < nd; k++)
        name[6 + k] = digits[nd - 1 - k];
    name[6 + nd] = '\0';
}

static ml_status layer_blocks(ml_chain *ch, const ml_model *m, const ml_ck_dims *d)
{
    const bool enc = m->type == ML_MODEL_ENCODER;
    const unsigned w = ch->prec.w;
    uint64_t BTD = ml_mul(ch, d->BT, d->D);
    /* the node-level backward (docs/ledger.md): fp32 eager blocks for now */
    ch->record_nodes = ch->prec.a == 4 && ch->prec.w == 4 && !ch->prec.autocast &&
                       !ml_ck_fused_attention(ch, m) && !m->parallel_residual;
    for (uint64_t i = 0; i < m->layers; i++) {
        char name[48];
        block_name(name, i);
        ml_cblock *b = ml_ck_begin(ch, name, (int)i);
        if (!b)
            return ML_NOMEM;
        b->in_bytes = ml_mul(ch, BTD, w);
        if (m->prenorm)
            prenorm_block(ch, b, m, d);
        else
            postnorm_block(ch, b, m, d);
        ml_ck_end(ch, b, ml_mul(ch, BTD, w));
        if (m->kv_cache)
            b->cache_bytes = ml_mul(ch, ml_mul(ch, 2, ml_mul(ch, d->BT, d->Dkv)), ch->prec.a);
        if (ch->overflow || ch->nomem)
            break;
    }
    ch->record_nodes = false;
    ch->n_ckpt = m->layers;
    /* torch.utils.checkpoint saves every tensor argument of the block: the
     * HF BERT extended mask (B, 1, 1, T) and the HF Llama causal mask, a
     * (1, 1, T, T) tensor expanded over the batch (docs/inventory.md) */
    if (enc && !m->image_size)
        ch->ckpt_side = ml_mul(ch, d->BT, w);
    else if (!enc && m->norm != ML_NORM_LAYERNORM)
        ch->ckpt_side = ml_mul(ch, ml_mul(ch, d->T, d->T), w);
    return ML_OK;
}

/* Decoder head: final norm and the LM head (tied or not). Returns the
 * logits' columns; *rows their rows. */
static uint64_t lm_head(ml_chain *ch, ml_cblock *b, const ml_model *m, const ml_ck_dims *d,
                        uint64_t *rows)
{
    uint64_t np, BTD = ml_mul(ch, d->BT, d->D);
    unsigned nb = norm_fwd(ch, b, m, d, ML_SV_INPUT, &np, false);
    norm_params(ch, b, np, d->D);
    ml_ck_linear_input(ch, b, "lm head input", BTD, nb, false, 0);
    ml_ck_weight_copy(ch, b, ml_mul(ch, d->V, d->D));
    if (!m->tied_embeddings) {
        ml_ck_param(ch, b, d->V, d->D);
    } else {
        /* the tied table's gradient is first created here; with
         * accumulation this block's contribution is a transient */
        b->grad_bytes = ml_mul(ch, ml_mul(ch, d->V, d->D), ch->prec.grad);
        b->grad_accum_bytes = b->grad_bytes;
    }
    *rows = d->BT;
    b->flops_fwd = 2.0 * (double)d->BT * (double)d->D * (double)d->V;
    return d->V;
}

/* BertForMaskedLM's head (modeling_bert.py, BertLMPredictionHead): dense
 * D x D on every token, the activation, LayerNorm, then the decoder over the
 * vocabulary (tied to the word embeddings by default) with its own bias.
 * Saved: the dense input (the last block's output: the boundary), the
 * activation's (gelu: its input; relu: its result), the LayerNorm's input
 * (autocast runs it in fp32: a cast copy) and statistics, the decoder's
 * input (docs/inventory.md, "Heads and losses"). Returns V; *rows B*T. */
static uint64_t mlm_head(ml_chain *ch, ml_cblock *b, const ml_model *m, const ml_ck_dims *d,
                         uint64_t *rows)
{
    const unsigned w = ch->prec.w, a = ch->prec.a;
    uint64_t BTD = ml_mul(ch, d->BT, d->D);
    /* the decoder's bias is the head module's own parameter, registered
     * before its submodules' (model.parameters() lists it first) */
    ml_ck_param(ch, b, d->V, 0);
    ml_ck_linear_input(ch, b, "mlm dense input", BTD, w, false, ML_SV_INPUT);
    ml_ck_weight_copy(ch, b, ml_mul(ch, d->D, d->D));
    ml_ck_param(ch, b, d->D, d->D);
    ml_ck_param(ch, b, d->D, 0);
    bool gelu = m->activation == ML_ACT_GELU;
    ml_ck_save(ch, b, gelu ? "mlm dense output (gelu input)" : "mlm relu output", BTD, a, 0);
    if (gelu || a != w)
        ml_ck_save(ch, b, a != w ? "mlm layernorm input (fp32 cast)" : "mlm layernorm input",
                   BTD, w, 0);
    ml_ck_save(ch, b, "mlm layernorm mean+rstd", ml_mul(ch, d->BT, 2), 4, 0);
    ml_ck_param(ch, b, d->D, 0);
    ml_ck_param(ch, b, d->D, 0);
    ml_ck_tmp(ch, BTD, w);
    ml_ck_linear_input(ch, b, "mlm decoder input (layernorm output)", BTD, w, false, 0);
    ml_ck_weight_copy(ch, b, ml_mul(ch, d->V, d->D));
    if (!m->tied_embeddings) {
        ml_ck_param(ch, b, d->V, d->D);
    } else {
        /* the word embeddings' gradient is first created here, as a tied
         * LM head's (lm_head) */
        b->grad_bytes = ml_mul(ch, ml_mul(ch, d->V, d->D), ch->prec.grad);
        b->grad_accum_bytes = b->grad_bytes;
    }
    *rows = d->BT;
    b->flops_fwd = 2.0 * (double)d->BT * (double)d->D * ((double)d->D + (double)d->V);
    return d->V;
}

/* Encoder head: (ViT's final norm,) the first token, an optional pooler,
 * dropout and the classifier. Returns the classes; *rows the logits' rows. */
static uint64_t classifier_head(ml_chain *ch, ml_cblock *b, const ml_model *m,
                                const ml_ck_dims *d, uint64_t *rows)
{
    const unsigned w = ch->prec.w, a = ch->prec.a;
    uint64_t np, BTD = ml_mul(ch, d->BT, d->D), BD = ml_mul(ch, d->B, d->D);
    unsigned src = w;
    bool src_saved = false;
    if (m->prenorm) { /* ViT: final norm, then the class token */
        unsigned nb = norm_fwd(ch, b, m, d, ML_SV_INPUT, &np, false);
        norm_params(ch, b, np, d->D);
        src = nb;
    }
    /* x[:, 0] is a view: a saving consumer keeps the whole (B, T, D)
     * storage alive unless autocast cast it to a (B, D) copy */
    if (m->pooler) {
        if (ch->prec.autocast && src == 4)
            ml_ck_save(ch, b, "pooler input (cast copy of first token)", BD, 2, 0);
        else
            ml_ck_save(ch, b, "pooler input (view keeps the full hidden state)", BTD, src,
                       m->prenorm ? 0 : ML_SV_INPUT);
        ml_ck_weight_copy(ch, b, ml_mul(ch, d->D, d->D));
        ml_ck_param(ch, b, d->D, d->D);
        ml_ck_param(ch, b, d->D, 0);
        ml_ck_save(ch, b, "pooler tanh output", BD, a, 0);
        b->flops_fwd += 2.0 * (double)d->B * (double)d->D * (double)d->D;
        src = a;
        src_saved = true;
    }
    if (d->drop) {
        ml_ck_save(ch, b, "classifier dropout mask", BD, 1, 0);
        src_saved = false;
        if (!m->pooler)
            src = w;
        ml_ck_linear_input(ch, b, "classifier input (dropout output)", BD, src, false, 0);
    } else if (!m->pooler) {
        if (ch->prec.autocast && src == 4)
            ml_ck_save(ch, b, "classifier input (cast copy of first token)", BD, 2, 0);
        else
            ml_ck_save(ch, b, "classifier input (view keeps the full hidden state)", BTD, src,
                       m->prenorm ? 0 : ML_SV_INPUT);
    } else {
        ml_ck_linear_input(ch, b, "classifier input", BD, src, src_saved, 0);
    }
    ml_ck_weight_copy(ch, b, ml_mul(ch, m->classes, d->D));
    ml_ck_param(ch, b, m->classes, d->D);
    ml_ck_param(ch, b, m->classes, 0);
    *rows = d->B;
    b->flops_fwd += 2.0 * (double)d->B * (double)d->D * (double)m->classes;
    return m->classes;
}

/* Liger Kernel's chunk (liger_kernel/ops/fused_linear_cross_entropy.py,
 * fused_linear_cross_entropy_forward): next_power_of_2(ceil(BT / ceil(V /
 * D))) rows, or training.logits_chunk; at most the BT rows there are. */
static uint64_t fused_chunk_rows(const ml_ck_dims *d, uint64_t asked)
{
    uint64_t rows = asked;
    if (!rows) {
        uint64_t inc = (d->V + d->D - 1) / d->D;
        uint64_t want = (d->BT + inc - 1) / inc;
        rows = 1;
        while (rows < want && rows < (1ull << 62))
            rows <<= 1;
    }
    return rows < d->BT ? rows : d->BT;
}

/* logits: fused, the loss block of a decoder (docs/ledger.md, "The loop's
 * references"): Liger's fused linear cross-entropy on the final norm's
 * output x (BT x D, nb bytes). Its forward allocates the LM head weight's
 * gradient (zeros_like(weight)) and x's (zeros_like(x)), an fp32 loss per
 * row and the bool target mask, then per chunk of rows: logits = x_chunk @
 * W^T, the cross-entropy's gradient written over them in place, x's
 * gradient rows = logits @ W (a temporary, copied in), W's gradient +=
 * logits^T x_chunk (addmm into it). The loop rebinds `logits_chunk` only
 * when the next chunk's product exists, so two chunks' logits are alive at
 * that moment. The backward returns the two gradients (grad_output is 1):
 * nothing new. FLOPs: the three products, all in forward. */
static void fused_loss(ml_chain *ch, ml_cblock *b, const ml_model *m, const ml_ck_dims *d,
                       uint64_t chunk_asked, unsigned nb)
{
    const unsigned a = ch->prec.a;
    uint64_t rows = fused_chunk_rows(d, chunk_asked);
    uint64_t second = d->BT > rows ? (d->BT - rows < rows ? d->BT - rows : rows) : 0;
    uint64_t two = ml_mul(ch, ml_add(ch, rows, second), ml_mul(ch, d->V, a));
    uint64_t one = ml_mul(ch, rows, ml_mul(ch, ml_add(ch, d->V, d->D), a));
    uint64_t rowwise = ml_mul(ch, d->BT, 5); /* loss_1d (fp32) and the target mask */
    b->in_bytes = ml_mul(ch, ml_mul(ch, d->BT, d->D), nb);
    b->ws_fwd = ml_add(ch, two > one ? two : one, rowwise);
    b->unit_fwd = ml_mul(ch, ml_mul(ch, rows, d->V), a);
    ml_ck_save(ch, b, "targets (int64)", d->BT, 8, ML_SV_BATCH);
    if (!m->tied_embeddings) {
        ml_ck_param(ch, b, d->V, d->D);
    } else { /* the tied table's gradient is first created here */
        b->grad_bytes = ml_mul(ch, ml_mul(ch, d->V, d->D), ch->prec.grad);
        b->grad_accum_bytes = b->grad_bytes;
    }
    b->grads_in_fwd = true;
    b->flops_fwd = 6.0 * (double)d->BT * (double)d->D * (double)d->V;
    ml_ck_node(ch, b, "LigerFusedLinearCrossEntropyFunctionBackward (hands over)", 0, 0, 0,
               SIZE_MAX, SIZE_MAX);
    uint64_t ws = b->ws_fwd;
    ml_ck_end(ch, b, 0);
    /* ml_ck_end's estimates are for ops that save: this one's forward
     * transient is the chunks', its backward allocates nothing, and under
     * no_grad its two gradients are transients too */
    b->ws_fwd = ws;
    b->ws_bwd = 0;
    b->unit = b->unit_fwd;
    b->ws_nograd = ml_add(ch, ws, ml_add(ch, b->in_bytes, b->grad_bytes));
}

/* The head block, then the loss: cross-entropy = log_softmax (saves its
 * output; autocast runs it in fp32) + nll_loss (saves the int64 targets);
 * with logits: fused, the final norm and the fused linear cross-entropy. */
static ml_status head_and_loss(ml_chain *ch, const ml_model *m, const ml_ck_dims *d,
                               const ml_training *t)
{
    const unsigned w = ch->prec.w, a = ch->prec.a;
    ml_cblock *b = ml_ck_begin(ch, "head", -1);
    if (!b)
        return ML_NOMEM;
    b->in_bytes = ml_mul(ch, ml_mul(ch, d->BT, d->D), w);
    if (t->logits == ML_LOGITS_FUSED) {
        /* node lists: the norm's, and the fused op's hand-over */
        ch->record_nodes = !ch->prec.autocast;
        uint64_t np;
        unsigned nb = norm_fwd(ch, b, m, d, ML_SV_INPUT, &np, false);
        norm_params(ch, b, np, d->D);
        uint64_t out = ml_mul(ch, ml_mul(ch, d->BT, d->D), nb);
        ml_ck_end(ch, b, out);
        b = ml_ck_begin(ch, "loss", -1);
        if (!b)
            return ML_NOMEM;
        b->fwd_phase = ML_PHASE_LOSS;
        fused_loss(ch, b, m, d, t->logits_chunk, nb);
        ch->record_nodes = false;
        return ML_OK;
    }
    uint64_t rows; /* rows of the logits */
    uint64_t out_classes = m->type != ML_MODEL_ENCODER ? lm_head(ch, b, m, d, &rows)
                           : m->mlm_head              ? mlm_head(ch, b, m, d, &rows)
                                                      : classifier_head(ch, b, m, d, &rows);
    uint64_t logits = ml_mul(ch, rows, out_classes);
    ml_ck_end(ch, b, ml_mul(ch, logits, a));

    b = ml_ck_begin(ch, "loss", -1);
    if (!b)
        return ML_NOMEM;
    b->fwd_phase = ML_PHASE_LOSS;
    unsigned lsb = ch->prec.autocast ? 4 : w;
    ml_ck_save(ch, b, "log-softmax output", logits, lsb, 0);
    ml_ck_save(ch, b, "targets (int64)", rows, 8, ML_SV_BATCH);
    ml_ck_save(ch, b, "nll_loss total_weight (fp32 scalar)", 1, 4, 0);
    if (ch->prec.autocast)
        b->ws_fwd = ml_mul(ch, logits, 4); /* fp32 cast of the logits */
    /* backward: grad of log-probs and grad of logits coexist */
    b->ws_bwd = ml_mul(ch, ml_mul(ch, logits, lsb), 2);
    /* under no_grad (evaluation) what the loss saves is transient, beside
     * the fp32 cast */
    b->ws_nograd = ml_add(ch, b->ws_fwd, b->saved_bytes);
    b->unit_fwd = b->ws_fwd;               /* the fp32 cast */
    b->unit = ml_mul(ch, logits, lsb);     /* two tensors of the logits' size */
    b->in_bytes = ml_mul(ch, logits, a);
    b->in_held = true; /* the model returns the logits to the caller */
    return ML_OK;
}

ml_status ml_chain_build_transformer(const ml_model *m, const ml_config *cfg, ml_chain *ch,
                                     ml_error *err)
{
    ml_ck_dims d;
    ml_status st = dims_of(m, &cfg->training, ch, &d, err);
    if (st == ML_OK)
        st = ml_ck_embedding_block(ch, m, &d);
    if (st == ML_OK)
        st = layer_blocks(ch, m, &d);
    if (st == ML_OK)
        st = head_and_loss(ch, m, &d, &cfg->training);
    if (st != ML_OK)
        return st;
    for (size_t i = 0; i < ch->n; i++)
        if (ch->blocks[i].flops_bwd == 0 && !ch->blocks[i].grads_in_fwd)
            ch->blocks[i].flops_bwd = 2.0 * ch->blocks[i].flops_fwd;
    return ML_OK;
}
