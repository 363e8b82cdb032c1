/* Transformer chains (GPT-2, Llama, Gemma, BERT, ViT layouts): the
 * embedding, one block per layer, the head and the loss, each with the
 * storages PyTorch's eager autograd keeps for its backward in the reference
 * implementation named in docs/inventory.md (nanoGPT/HF GPT-2, HF Llama, HF
 * Gemma, HF BERT, HF ViT). A storage saved by several ops is listed once,
 * where it is first saved. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ledger/chain_kit.h"
#include "util/error.h"

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
        k->act_in = ml__ck_save(ch, b, "gate_up projection output (gate and up views)",
                                ml_mul(ch, 2, BTF), a, 0);
        k->act_out = ml__ck_save(ch, b, geglu ? "gelu output" : "silu output", BTF, a, 0);
        k->up = SIZE_MAX;
    } else {
        k->act_in = ml__ck_save(ch, b, geglu ? "gate projection output (gelu input)"
                                            : "gate projection output (silu input)", BTF, a, 0);
        k->act_out = ml__ck_save(ch, b, geglu ? "gelu output" : "silu output", BTF, a, 0);
        k->up = ml__ck_save(ch, b, "up projection output", BTF, a, 0);
    }
    k->prod = ml__ck_save(ch, b, "gated product (down input)", BTF, a, 0);
    if (fused) { /* gate_up_proj, down_proj */
        ml__ck_linear(ch, b, d->D, ml_mul(ch, 2, d->F), bias);
    } else {     /* gate_proj, up_proj, down_proj */
        ml__ck_linear(ch, b, d->D, d->F, bias);
        ml__ck_linear(ch, b, d->D, d->F, bias);
    }
    ml__ck_linear(ch, b, d->F, d->D, bias);
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
            ml__ck_accum(ch, b, gD);
        ml__ck_node(ch, b, "MmBackward0 (gate_up projection)", gD, ml_mul(ch, 2, pin), g2F, k->in,
                    SIZE_MAX);
        ml__ck_node(ch, b, "SplitBackward0 (chunk into gate, up)", g2F, 0, g2F, SIZE_MAX, SIZE_MAX);
        ml__ck_node(ch, b, geglu ? "GeluBackward0" : "SiluBackward0", gF, 0, gF, k->act_in,
                    SIZE_MAX);
        ml__ck_node(ch, b, geglu ? "MulBackward0 (up * gelu)" : "MulBackward0 (up * silu)", g2F, 0,
                    gF, k->act_out, SIZE_MAX);
        ml__ck_node(ch, b, "MmBackward0 (down projection)", gF, pout, gO, k->prod, SIZE_MAX);
        return;
    }
    ml__ck_accum(ch, b, gD);
    ml__ck_node(ch, b, "MmBackward0 (gate projection)", gD, pin, gF, k->in, SIZE_MAX);
    ml__ck_node(ch, b, geglu ? "GeluBackward0" : "SiluBackward0", gF, 0, gF, k->act_in, SIZE_MAX);
    if (in_buf)
        ml__ck_accum(ch, b, gD);
    ml__ck_node(ch, b, "MmBackward0 (up projection)", gD, pin, gF, SIZE_MAX, SIZE_MAX);
    ml__ck_node(ch, b, geglu ? "MulBackward0 (gelu * up)" : "MulBackward0 (silu * up)",
                ml_mul(ch, 2, gF), 0, gF, k->act_out, k->up);
    ml__ck_node(ch, b, "MmBackward0 (down projection)", gF, pout, gO, k->prod, SIZE_MAX);
}

/* The MLP. in_buf: its input's gradient buffer exists before the MLP's
 * input gradient arrives (post-norm: the residual skip holds it). */
static void mlp_fwd(ml_chain *ch, ml_cblock *b, const ml_model *m, const ml_ck_dims *d,
                    unsigned src_bpe, bool src_saved, bool in_buf)
{
    const unsigned a = ch->prec.a, g = ch->prec.grad;
    uint64_t BTD = ml_mul(ch, d->BT, d->D), BTF = ml_mul(ch, d->BT, d->F);
    uint64_t DF = ml_mul(ch, d->D, d->F);
    bool glu = m->mlp.activation == ML_ACT_SWIGLU || m->mlp.activation == ML_ACT_GEGLU;
    bool geglu = m->mlp.activation == ML_ACT_GEGLU;
    bool bias = m->bias || m->mlp.bias;
    unsigned nin = glu ? 2 : 1;
    /* autocast casts the (fp32) input once per projection that reads it:
     * gate and up, or Phi-3's one gate_up_proj */
    unsigned ncast = m->attn.fused_proj ? 1 : nin;
    mlp_kept k = {SIZE_MAX, SIZE_MAX, SIZE_MAX, SIZE_MAX, SIZE_MAX};
    if (ch->prec.autocast && src_bpe == 4) {
        for (unsigned i = 0; i < ncast; i++)
            ml__ck_save(ch, b, "MLP input (cast copy)", BTD, 2, 0);
    } else if (!src_saved) {
        k.in = ml__ck_save(ch, b, "MLP input", BTD, src_bpe, 0);
    }
    for (unsigned i = 0; i < nin + 1; i++)
        ml__ck_weight_copy(ch, b, DF);
    if (glu) {
        glu_saves(ch, b, d, geglu, bias, m->attn.fused_proj, &k);
    } else if (m->mlp.activation == ML_ACT_QUICK_GELU) {
        /* x * sigmoid(1.702 * x) (activations.py, QuickGELUActivation): the
         * scalar's mul keeps nothing on the device (its 0-dim scalar is host
         * memory), sigmoid keeps its result, the product both factors; the
         * product is fc2's input */
        k.act_in = ml__ck_save(ch, b, "fc1 output (quick_gelu input)", BTF, a, 0);
        ml__ck_tmp(ch, BTF, a); /* 1.702 * x */
        k.act_out = ml__ck_save(ch, b, "quick_gelu sigmoid output", BTF, a, 0);
        k.prod = ml__ck_save(ch, b, "quick_gelu output (fc2 input)", BTF, a, 0);
        ml__ck_linear(ch, b, d->D, d->F, bias);
        ml__ck_linear(ch, b, d->F, d->D, bias);
    } else if (m->mlp.activation == ML_ACT_GELU) {
        k.act_in = ml__ck_save(ch, b, "fc output (gelu input)", BTF, a, 0);
        k.act_out = ml__ck_save(ch, b, "gelu output (proj input)", BTF, a, 0);
        ml__ck_linear(ch, b, d->D, d->F, bias);
        ml__ck_linear(ch, b, d->F, d->D, bias);
    } else {
        /* relu saves its result, which is also the projection's input */
        ml__ck_tmp(ch, BTF, a);
        k.act_out = ml__ck_save(ch, b, "relu output (proj input)", BTF, a, 0);
        ml__ck_linear(ch, b, d->D, d->F, bias);
        ml__ck_linear(ch, b, d->F, d->D, bias);
    }
    b->flops_fwd += (double)(nin + 1) * 2.0 * (double)d->BT * (double)d->D * (double)d->F;
    /* backward nodes, forward order (docs/ledger.md, "Backward, node by
     * node"); the last one's output gradient is the residual's, held by the
     * skip's buffer */
    uint64_t gD = ml_mul(ch, BTD, src_bpe), gF = ml_mul(ch, BTF, a), gO = ml_mul(ch, BTD, a);
    uint64_t pin = ml_mul(ch, ml_add(ch, DF, bias ? d->F : 0), g);
    uint64_t pout = ml_mul(ch, ml_add(ch, DF, bias ? d->D : 0), g);
    if (glu) {
        glu_nodes(ch, b, &k, geglu, m->attn.fused_proj, in_buf, gD, gF, pin, pout,
                  (d->drop || m->residual.post_norms) ? gO : 0);
    } else {
        if (in_buf)
            ml__ck_accum(ch, b, gD);
        ml__ck_node(ch, b, "AddmmBackward0 (MLP in)", gD, pin, gF, k.in, SIZE_MAX);
        ml__ck_node(ch, b, m->mlp.activation == ML_ACT_GELU ? "GeluBackward0" : "ReluBackward0",
                    gF, 0, gF, m->mlp.activation == ML_ACT_GELU ? k.act_in : k.act_out, SIZE_MAX);
        /* its output's gradient is the residual's unless a dropout or a
         * post norm (Gemma 2's layer) made its own, as the GLU's */
        ml__ck_node(ch, b, "AddmmBackward0 (MLP out)", gF, pout,
                    (d->drop || m->residual.post_norms) ? gO : 0,
                    m->mlp.activation == ML_ACT_GELU ? k.act_out : SIZE_MAX, SIZE_MAX);
    }
    if (d->drop) {
        size_t s = ml__ck_save(ch, b, "residual dropout mask", BTD, 1, 0);
        ml__ck_node(ch, b, "NativeDropoutBackward0 (residual)", gO, 0, 0, s, SIZE_MAX);
    }
    ml__ck_tmp(ch, BTD, a);
}

/* HF's Llama-layout decoder layers (LlamaDecoderLayer, and Gemma's,
 * Mistral's, Qwen2's, Phi3DecoderLayer) register self_attn, mlp, then
 * input_layernorm and post_attention_layernorm; Gemma2DecoderLayer then
 * pre_feedforward_layernorm and post_feedforward_layernorm (its
 * post_attention_layernorm is the attention output's); Phi3Attention
 * registers o_proj before qkv_proj. The block was emitted [norm1 |
 * attention | post-attention norm | norm2 | mlp | post-MLP norm] (the post
 * norms Gemma 2's only) with the attention's projections before its output
 * projection: at[] holds where each part starts. */
static void llama_param_order(ml_chain *ch, const ml_model *m, const size_t at[6])
{
    enum { FIRST, ATTN, POST_ATTN, NORM2, MLP, POST_MLP };
    ml_ptensor small[32], *tmp = small; /* a Mixtral layer has 7 + 3 x experts */
    const size_t first = at[FIRST], end = ch->nparams, n = end - first;
    if (ch->nomem)
        return;
    if (n > sizeof small / sizeof small[0] && !(tmp = malloc(n * sizeof *tmp))) {
        ch->nomem = true;
        return;
    }
    const size_t n_o = m->attn.fused_proj ? ((m->bias || m->attn.out_bias) ? 2u : 1u) : 0u;
    const size_t pa = at[POST_ATTN];
    const size_t from[7] = {pa - n_o, at[ATTN], at[MLP], first, pa, at[NORM2], at[POST_MLP]};
    const size_t to[7] = {pa, pa - n_o, at[POST_MLP], at[ATTN], at[NORM2], at[MLP], end};
    size_t k = 0;
    for (size_t i = 0; i < 7; i++)
        for (size_t j = from[i]; j < to[i]; j++)
            tmp[k++] = ch->params[j];
    memcpy(ch->params + first, tmp, n * sizeof tmp[0]);
    if (tmp != small)
        free(tmp);
}

/* Gemma 2's norm on a residual branch's output (the attention's, the
 * MLP's: a bytes per element) before the add: its input's gradient has no
 * buffer yet, its output's is the residual's, held by the skip. */
static void post_norm(ml_chain *ch, ml_cblock *b, const ml_model *m, const ml_ck_dims *d)
{
    const ml_ck_norm_io io = {ch->prec.a, 0, false, true};
    uint64_t np;
    ml__ck_norm_fwd(ch, b, m, d, &io, &np);
    ml__ck_norm_params(ch, b, np, d->D);
}

/* Pre-norm block: x + attn(norm(x)); x + mlp(norm(x)). GPT-2 (layernorm,
 * fused qkv, masked_fill causal mask), Llama and Gemma (their RMSNorms,
 * separate q/k/v, additive mask, fp32 softmax), Gemma 2 (x + norm(attn(
 * norm(x))); x + norm(mlp(norm(x))): post_norms), Phi-3 (Llama's with one
 * qkv_proj: the q, k and v slices are views of its output, which nothing
 * saves, so only the autocast casts of its input and the weight differ),
 * ViT (layernorm, separate q/k/v as HF ViTSelfAttention, no mask). */
void ml__ck_prenorm_block(ml_chain *ch, ml_cblock *b, const ml_model *m, const ml_ck_dims *d)
{
    const bool llama = m->norms.kind != ML_NORM_LAYERNORM; /* Llama or Gemma layout */
    const bool causal = m->type == ML_MODEL_DECODER;
    uint64_t np;
    size_t at[6];
    at[0] = ch->nparams;
    unsigned nb = ml__ck_stream_norm(ch, b, m, d, ML_SV_INPUT, &np, true);
    ml__ck_norm_params(ch, b, np, d->D);
    at[1] = ch->nparams;
    /* Falcon (shared_norm): an additive mask, and the softmax in the
     * stream's dtype (softmax(dtype=hidden_states.dtype)) */
    const bool falcon = m->residual.shared_norm;
    if (falcon && d->Hkv == 1 && d->H > 1) {
        /* _split_heads picks the key and the value with index lists
         * (fused_qkv[..., [-2], :]): IndexBackward0 saves each list, one
         * int64 on the device */
        ml__ck_save(ch, b, "key index list (multi_query)", 1, 8, 0);
        ml__ck_save(ch, b, "value index list (multi_query)", 1, 8, 0);
    }
    /* the norm's output gradient: the MLP's (its backward runs first)
     * becomes the buffer, the q/k/v projection's is added in place */
    if (falcon)
        ml__ck_accum(ch, b, ml_mul(ch, ml_mul(ch, d->BT, d->D), nb));
    /* HF GPT-NeoX (parallel_residual): eager_attention_forward's additive
     * mask and fp32 softmax, as Llama's */
    const bool hf = llama || m->residual.parallel;
    /* HF ViT and CLIP: query, key and value, three Linears; their
     * eager_attention_forward asks softmax for fp32 and casts back */
    ml__ck_attention(ch, b, m, d, nb, false,
                     (!llama && !m->embed.image_size) || m->attn.fused_proj, causal && !hf,
                     falcon ? ch->prec.w == 4 : hf || m->embed.image_size, 0);
    at[2] = ch->nparams;
    if (m->residual.post_norms)
        post_norm(ch, b, m, d);
    at[3] = ch->nparams;
    bool mlp_in_saved = false;
    if (falcon) {
        /* x + attn(ln(x)) + mlp(ln(x)): the MLP reads the tensor the q/k/v
         * projection saved (autocast casts it again, a copy of its own) */
        np = 0;
        mlp_in_saved = true;
    } else if (m->residual.parallel) {
        /* x + attn(ln1(x)) + mlp(ln2(x)): ln2 reads the block input that
         * ln1 already saved; only its statistics are new */
        size_t s2 = ml__ck_save(ch, b, "ln_2 mean+rstd", ml_mul(ch, d->BT, 2), 4, 0);
        np = m->norms.bias ? 2 * d->D : d->D;
        /* its backward: the input's gradient added into the buffer the
         * skip holds, after the MLP's input gradient it consumes */
        uint64_t gD = ml_mul(ch, ml_mul(ch, d->BT, d->D), ch->prec.w);
        ml__ck_accum(ch, b, gD);
        ml__ck_node(ch, b, "NativeLayerNormBackward0", gD, ml_mul(ch, np, ch->prec.grad),
                    gD, s2, SIZE_MAX);
        nb = ch->prec.w;
    } else {
        nb = ml__ck_stream_norm(ch, b, m, d, 0, &np, true);
    }
    if (np)
        ml__ck_norm_params(ch, b, np, d->D);
    at[4] = ch->nparams;
    mlp_fwd(ch, b, m, d, nb, mlp_in_saved, false);
    at[5] = ch->nparams;
    if (m->residual.post_norms)
        post_norm(ch, b, m, d);
    if (llama || falcon)
        llama_param_order(ch, m, at);
}

/* Post-norm block (BERT): x1 = LN(x + attn(x)); out = LN(x1 + mlp(x1)). */
static void postnorm_block(ml_chain *ch, ml_cblock *b, const ml_model *m, const ml_ck_dims *d)
{
    const unsigned w = ch->prec.w;
    uint64_t BTD = ml_mul(ch, d->BT, d->D);
    ml__ck_attention(ch, b, m, d, w, false, false, false, false, ML_SV_INPUT);
    uint64_t np;
    unsigned nb = ml__ck_stream_norm(ch, b, m, d, 0, &np, false);
    ml__ck_norm_params(ch, b, np, d->D);
    mlp_fwd(ch, b, m, d, nb, false, true);
    nb = ml__ck_stream_norm(ch, b, m, d, 0, &np, false);
    ml__ck_norm_params(ch, b, np, d->D);
    (void)BTD;
}

/* The shapes of one training micro-batch through the model; ML_RANGE when
 * the sequence is longer than learned positions allow. */
ml_status ml__ck_dims_of(const ml_model *m, const ml_training *t, ml_chain *ch, ml_ck_dims *d,
                       ml_error *err)
{
    d->B = t->micro_batch;
    d->T = t->seq_len;
    if (m->embed.image_size) {
        uint64_t g = m->embed.image_size / m->embed.patch_size;
        d->T = g * g + 1;
    }
    if (m->embed.position == ML_POS_LEARNED && m->embed.max_positions &&
        d->T > m->embed.max_positions) {
        return ml__errorf(err, ML_RANGE,
                          "training.seq_len: %llu exceeds model.max_positions (%llu) of "
                          "learned positions",
                          (unsigned long long)d->T, (unsigned long long)m->embed.max_positions);
    }
    /* a window shorter than the sequence changes the attention's mask, its
     * kernels and FLOPs: not modelled (docs/hf.md) */
    if (m->attn.sliding_window && d->T > m->attn.sliding_window)
        return ml__errorf(err, ML_RANGE,
                          "a sequence of %llu tokens exceeds the model's sliding_window "
                          "(%llu); attention over a sliding window is not modelled: plan at "
                          "most %llu tokens (training.seq_len, training.eval_seq_len)",
                          (unsigned long long)d->T, (unsigned long long)m->attn.sliding_window,
                          (unsigned long long)m->attn.sliding_window);
    /* GenericForSequenceClassification without a pad token: "Cannot handle
     * batch sizes > 1 if no padding token is defined." */
    if (m->head.classes && m->type == ML_MODEL_DECODER && m->head.cls_no_pad && d->B > 1)
        return ml__errorf(err, ML_RANGE,
                          "a batch of %llu with no pad_token_id: transformers' sequence "
                          "classification finds each sequence's last token by its padding and "
                          "refuses batches above 1 without one; set pad_token_id in the config, "
                          "or set training.%s to 1",
                          (unsigned long long)d->B, ch->eval_mode ? "eval_batch" : "micro_batch");
    d->BT = ml_mul(ch, d->B, d->T);
    d->D = m->hidden;
    d->F = m->mlp.ffn;
    d->H = m->attn.heads;
    d->Hkv = m->attn.kv_heads;
    d->dh = m->attn.head_dim ? m->attn.head_dim : m->hidden / m->attn.heads;
    d->Dkv = d->Hkv * d->dh;
    d->V = m->embed.vocab;
    d->drop = m->dropout > 0;
    d->expert_imbalance = t->expert_imbalance > 1 ? t->expert_imbalance : 1;
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

/* The keys and values a layer's forward returns with use_cache
 * (DynamicCache keeps the tensors its first update is given). Latent
 * attention: the keys, H heads of head_dim (fp32 under autocast, where the
 * rotated part is fp32 and the cat promotes; DeepSeek-V2 casts it back),
 * and the values, a view that keeps kv_b_proj's whole output alive. */
static uint64_t kv_cache_bytes(ml_chain *ch, const ml_model *m, const ml_ck_dims *d)
{
    const unsigned a = ch->prec.a;
    if (!m->attn.kv_lora)
        return ml_mul(ch, ml_mul(ch, 2, ml_mul(ch, d->BT, d->Dkv)), a);
    unsigned kb = ch->prec.autocast && !m->embed.rope_complex ? 4 : a;
    uint64_t keys = ml_mul(ch, ml__ck_mul3(ch, d->BT, d->H, d->dh), kb);
    uint64_t kv_b = ml__ck_mul3(ch, d->BT, d->H, d->dh - m->attn.rope_dim + m->attn.v_dim);
    return ml_add(ch, keys, ml_mul(ch, kv_b, a));
}

/* A layer's layout: 1 for DeepSeek's expert layers (after the first
 * dense_layers), 0 for every other layer. */
static unsigned layout_of(const ml_model *m, uint64_t layer)
{
    return m->moe.experts && layer >= m->moe.dense_layers ? 1u : 0u;
}

ml_status ml__ck_layer_blocks(ml_chain *ch, const ml_model *m, const ml_ck_dims *d)
{
    const bool enc = m->type == ML_MODEL_ENCODER;
    const unsigned w = ch->prec.w;
    uint64_t BTD = ml_mul(ch, d->BT, d->D);
    ch->record_nodes = ml__ck_node_level(ch, m);
    /* the layers' op graphs where the component kit expresses their
     * layouts, one per layout: DeepSeek's first dense_layers layers (a
     * dense MLP) and its expert layers; each layout's first block is
     * emitted, the layout's others copy it */
    ml_ck_graph *G = malloc(2 * sizeof *G);
    if (!G)
        return ML_NOMEM;
    bool graph = !ch->builders_only;
    for (unsigned k = 0; k < 2 && graph; k++) {
        const uint64_t first = k ? m->moe.dense_layers : 0; /* the layout's first layer */
        if (layout_of(m, first) == k && first < m->layers)
            graph = ml__ck_graph_layer_at(ch, m, d, first, &G[k]);
    }
    /* the mixtures of experts and latent attention exist in the op graph
     * only: a layer it declines is not modelled (the caller says so) */
    if (!graph && (m->moe.experts || m->attn.kv_lora)) {
        free(G);
        return ML_RANGE;
    }
    size_t proto[2] = {SIZE_MAX, SIZE_MAX}, pfirst[2] = {0, 0}, pcount[2] = {0, 0};
    for (uint64_t i = 0; i < m->layers; i++) {
        char name[48];
        block_name(name, i);
        ml_cblock *b = ml__ck_begin(ch, name, (int)(ch->mask_ckpt0 + i));
        if (!b) {
            free(G);
            return ML_NOMEM;
        }
        b->in_bytes = ml_mul(ch, BTD, w);
        const unsigned k = layout_of(m, i);
        if (graph && proto[k] != SIZE_MAX) {
            ml__ck_graph_repeat(ch, b, proto[k], pfirst[k], pcount[k]);
        } else if (graph) {
            pfirst[k] = ch->nparams;
            ml__ck_graph_emit(ch, b, &G[k], ml_mul(ch, BTD, w));
            pcount[k] = ch->nparams - pfirst[k];
            proto[k] = (size_t)(b - ch->blocks);
        } else {
            if (m->residual.prenorm)
                ml__ck_prenorm_block(ch, b, m, d);
            else
                postnorm_block(ch, b, m, d);
            ml__ck_end(ch, b, ml_mul(ch, BTD, w));
            ml__ck_forward_layer(ch, b, m, d);
        }
        /* DeepSeek-V3's router's score-correction bias: a buffer of E fp32
         * values per expert layer (the builders count it in the router) */
        if (graph && k && m->moe.router_sigmoid)
            ch->buffer_bytes = ml_add(ch, ch->buffer_bytes, ml_mul(ch, m->moe.experts, 4));
        if (m->attn.kv_cache)
            b->cache_bytes = kv_cache_bytes(ch, m, d);
        if (ch->overflow || ch->nomem)
            break;
    }
    free(G);
    ch->record_nodes = false;
    ch->n_ckpt = ch->mask_ckpt0 + m->layers;
    /* torch.utils.checkpoint saves every tensor argument of the block: the
     * HF BERT extended mask (B, 1, 1, T) and the HF Llama causal mask, a
     * (1, 1, T, T) tensor expanded over the batch, with the rotary models'
     * position ids (cache_position, T int64: position_ids is a view of it)
     * (docs/inventory.md); HF GPT-NeoX's and Falcon's layers take the same two */
    ch->mask_in_forward = m->attn.kernel == ML_ATTN_EAGER;
    if (enc && !m->embed.image_size)
        ch->ckpt_side = ml_mul(ch, d->BT, w);
    else if (!enc && (m->norms.kind != ML_NORM_LAYERNORM || m->residual.parallel))
        ch->ckpt_side = ml_add(ch, ml_mul(ch, ml_mul(ch, d->T, d->T), w),
                               m->embed.position == ML_POS_ROPE ? ml_mul(ch, d->T, 8) : 0);
    return ML_OK;
}

ml_status ml__ck_layers_declined(const ml_model *m, ml_error *err)
{
    return ml__errorf(err, ML_RANGE,
                      "%s's layers (%s) at this shape and precision are not modelled: the op "
                      "graph declines them and no other rule plans them",
                      m->name,
                      m->attn.kv_lora && m->moe.experts
                          ? "multi-head latent attention, mixture of experts"
                      : m->attn.kv_lora ? "multi-head latent attention"
                                        : "mixture of experts");
}

ml_status ml__chain_build_transformer(const ml_model *m, const ml_config *cfg, ml_chain *ch,
                                      ml_error *err)
{
    ml_ck_dims d;
    ml_status st = ml__ck_dims_of(m, &cfg->training, ch, &d, err);
    if (st == ML_OK)
        st = ml__ck_embedding_block(ch, m, &d);
    if (st == ML_OK && (st = ml__ck_layer_blocks(ch, m, &d)) == ML_RANGE)
        return ml__ck_layers_declined(m, err);
    if (st == ML_OK)
        st = ml__ck_head_and_loss(ch, m, &d, &cfg->training);
    if (st != ML_OK)
        return st;
    for (size_t i = 0; i < ch->n; i++)
        if (ch->blocks[i].flops_bwd == 0 && !ch->blocks[i].grads_in_fwd)
            ch->blocks[i].flops_bwd = 2.0 * ch->blocks[i].flops_fwd;
    return ML_OK;
}
