/* Families as compositions (families.h): a layer is its components'
 * settings, read off the model; the kit does the rest. */
#include "graph/families.h"

/* The layer settings the model keys set alike in every layout: its
 * components' biases and dropouts, the attention kernel, a rotary, a
 * LayerNorm's bias, the MLP's activation, autocast; Hugging Face's softmax
 * in fp32 cast back to the compute dtype (a bf16 input copied to fp32
 * first). What a layout differs in, its function sets. */
static void common(const ml_model *m, const mlg_config *c, mlg_layer *L)
{
    static const uint8_t act[] = {[ML_ACT_GELU] = MLG_GELU, [ML_ACT_RELU] = MLG_RELU,
                                  [ML_ACT_SWIGLU] = MLG_SWIGLU, [ML_ACT_GEGLU] = MLG_GEGLU};
    const bool drop = m->dropout > 0;
    *L = (mlg_layer){0};
    L->norm = (mlg_norm){MLG_LAYERNORM, m->norms.bias, false, false};
    mlg_attention *a = &L->attn;
    a->qkv_bias = m->attn.qkv_bias;
    a->out_bias = m->bias || m->attn.out_bias;
    a->fused_kernel = c->fused_kernel;
    a->ring = c->ring && c->fused_kernel;
    a->fused_softmax = m->attn.fused_softmax;
    a->dropout = drop;
    /* a dropout's or, under autocast, the residual's cast: the output's
     * gradient is a tensor of its own (ml__kit_layer_residual) */
    a->out_grad = drop || c->autocast;
    a->rope = m->embed.position == ML_POS_ROPE;
    a->probs_cast = c->compute_bytes != 4;
    a->softmax_copy = c->compute_bytes != 4 && !c->fp16;
    a->fold_views = c->one_row;
    L->mlp = (mlg_mlp){m->mlp.gelu_new ? MLG_GELU_NEW : act[m->mlp.activation],
                       m->bias || m->mlp.bias,
                       drop,
                       a->out_grad,
                       false,
                       false,
                       false,
                       false};
    L->autocast = c->autocast;
}

/* HF's eager attention adds a mask in the stream's dtype before its
 * softmax(dtype=fp32): the sum is in the stream's dtype, so it is copied
 * to fp32 first only where that is bf16 (fp16 converts in the kernel;
 * under autocast the stream is fp32). */
static void masked_softmax(const mlg_config *c, mlg_attention *a)
{
    a->softmax_copy = c->stream_bytes != 4 && !c->fp16;
}

/* A layer with one dense MLP and plain self-attention: no experts, latent
 * attention or QuickGELU, and not Falcon's shared norm (the experts, latent
 * attention, the shared norm and CLIP's layer are families of their own,
 * below). */
static bool plain(const ml_model *m)
{
    return !m->residual.shared_norm && !m->moe.experts && !m->attn.kv_lora &&
           m->mlp.activation != ML_ACT_QUICK_GELU;
}

/* ... with LayerNorms, an ungated MLP and none of Gemma 2's or Phi-3's
 * settings: GPT-2's, ViT's, GPT-NeoX's and BERT's layers; */
static bool layernorm_ungated(const ml_model *m)
{
    return plain(m) && m->norms.kind == ML_NORM_LAYERNORM && !m->attn.fused_proj &&
           !m->residual.post_norms && !(m->attn.softcap > 0) &&
           (m->mlp.activation == ML_ACT_GELU || m->mlp.activation == ML_ACT_RELU);
}

/* ... and as many key/value heads as query heads. */
static bool plain_layernorm(const ml_model *m)
{
    return layernorm_ungated(m) && m->attn.kv_heads == m->attn.heads;
}

/* GPT-2's layer; with rotary positions (the video-tokens preset's layout:
 * a LayerNorm pre-norm decoder, not GPT-NeoX's parallel residual) nanoGPT's
 * layer with HF's apply_rotary_pos_emb on c_attn's q and k before the
 * attention core (attn.rope: kit.c, ml__kit_attention; docs/inventory.md);
 * a decoder's, so its forward programs are written (chain_graph.c). */
bool ml__family_gpt2_layer(const ml_model *m, const mlg_config *c, mlg_layer *L)
{
    if (!plain_layernorm(m) || m->type != ML_MODEL_DECODER || !m->residual.prenorm ||
        m->residual.parallel)
        return false;
    common(m, c, L);
    return true;
}

/* HF's decoder layer of Llama's layout with the norm n (Gemma 2's post
 * norms and soft caps when the model has them), whatever its MLP. */
static bool hf_layout(const ml_model *m, const mlg_config *c, mlg_norm n, mlg_layer *L)
{
    if (m->type != ML_MODEL_DECODER || !m->residual.prenorm || m->residual.parallel ||
        m->embed.image_size || m->attn.kv_heads > m->attn.heads)
        return false;
    common(m, c, L);
    L->norm = n;
    mlg_attention *a = &L->attn;
    a->hf = a->mask = true;
    masked_softmax(c, a);
    /* the rotary's products promote to the stream's dtype (fp32 under
     * autocast: apply_rotary_pos_emb with cos and sin in the hidden states'
     * dtype); then eager_attention_forward's softmax(dtype=fp32)
     * .to(query.dtype) copies nothing. Phi-3's one qkv_proj (its rotary's
     * cat and pass) keeps the compute dtype: not modelled */
    a->rot_fp32 = a->rope && c->autocast && !m->attn.fused_proj;
    a->grouped = m->attn.kv_heads < m->attn.heads;
    a->repeat_copy = a->grouped && m->attn.kv_heads > 1;
    a->kv_one = m->attn.kv_heads == 1;
    a->q_one = m->attn.heads == 1;
    /* a cache of Phi-3's views would keep the whole qkv_proj output: not
     * modelled (docs/ledger.md, "The forward, op by op") */
    a->cache = c->eval && m->attn.kv_cache && !m->attn.fused_proj;
    a->fused_proj = a->o_first = L->mlp.fused = m->attn.fused_proj;
    /* sdpa and flash keep nothing for the cap: transformers passes sdpa
     * none, flash caps in place */
    a->softcap = m->attn.softcap > 0 && m->attn.kernel == ML_ATTN_EAGER;
    /* sdpa not dispatched to a fused kernel (here: fp32 with grouped heads,
     * ml__ck_fused_attention) runs the math kernel, is_causal (no mask from
     * transformers) and enable_gqa (transformers' use_gqa_in_sdpa) */
    a->math = m->attn.kernel == ML_ATTN_SDPA && !c->fused_kernel;
    /* Gemma 2's norms of the branches' outputs (compute dtype) make the
     * projections' output gradients */
    a->out_grad = L->mlp.out_grad = m->dropout > 0 || m->residual.post_norms || c->autocast;
    L->hf_order = true;
    L->post_norms = m->residual.post_norms;
    L->post = (mlg_norm){n.kind, false, c->compute_bytes != 4, true};
    return true;
}

/* ... with a dense MLP. */
static bool hf_layer(const ml_model *m, const mlg_config *c, mlg_norm n, mlg_layer *L)
{
    return plain(m) && hf_layout(m, c, n, L);
}

bool ml__family_llama_layer(const ml_model *m, const mlg_config *c, mlg_layer *L)
{
    const mlg_norm n = {MLG_RMSNORM, false, c->stream_bytes != 4, false};
    return m->norms.kind == ML_NORM_RMSNORM && !m->residual.post_norms && !(m->attn.softcap > 0) &&
           hf_layer(m, c, n, L);
}

bool ml__family_gemma_layer(const ml_model *m, const mlg_config *c, mlg_layer *L)
{
    const mlg_norm n = {MLG_GEMMA_RMSNORM, false, c->stream_bytes != 4, false};
    return m->norms.kind == ML_NORM_GEMMA_RMSNORM && hf_layer(m, c, n, L);
}

bool ml__family_olmo_layer(const ml_model *m, const mlg_config *c, mlg_layer *L)
{
    const mlg_norm n = {MLG_OLMO_LAYERNORM, false, c->stream_bytes != 4, false};
    return m->norms.kind == ML_NORM_OLMO_LAYERNORM && !m->residual.post_norms &&
           !(m->attn.softcap > 0) && hf_layer(m, c, n, L);
}

bool ml__family_vit_layer(const ml_model *m, const mlg_config *c, mlg_layer *L)
{
    if (!plain_layernorm(m) || m->type != ML_MODEL_ENCODER || !m->embed.image_size ||
        !m->residual.prenorm || m->residual.parallel)
        return false;
    common(m, c, L);
    L->attn.hf = L->attn.self_out = L->attn.q_last = true;
    L->mlp.keep_act = L->mlp.in_gone = true;
    L->hold_attn = true;
    return true;
}

/* GPT-NeoX's layer; a model file may give it fewer key/value heads than
 * query heads (GPT-NeoX has none): repeat_kv's expand, copied for more
 * than one, as Llama's layout. */
bool ml__family_neox_layer(const ml_model *m, const mlg_config *c, mlg_layer *L)
{
    if (!layernorm_ungated(m) || m->attn.kv_heads > m->attn.heads || m->type != ML_MODEL_DECODER ||
        !m->residual.prenorm || !m->residual.parallel)
        return false;
    common(m, c, L);
    /* query_key_value viewed into heads and chunked (with fewer key/value
     * heads, which GPT-NeoX has not, no such view exists: Phi-3's slices);
     * the rotary's empty pass */
    mlg_attention *a = &L->attn;
    a->hf = a->fused_proj = a->mask = true;
    masked_softmax(c, a);
    a->grouped = m->attn.kv_heads < m->attn.heads;
    a->heads_first = !a->grouped;
    a->repeat_copy = a->grouped && m->attn.kv_heads > 1;
    /* grouped under a fused kernel: the deleted builders counted the
     * kernel's q, k and v as one projection width, the graph's entry is the
     * rotated q and k and v's view, which keeps query_key_value's whole
     * output; no oracle has decided, so the layer is declined and the plan
     * refused (docs/graph.md) */
    if (a->grouped && a->fused_kernel)
        return false;
    L->parallel = true;
    return true;
}

bool ml__family_falcon_layer(const ml_model *m, const mlg_config *c, mlg_layer *L)
{
    /* one key/value head (multi_query) or as many as query heads, as the
     * model file allows; the rest is GPT-NeoX's settings */
    if (!m->residual.shared_norm || m->moe.experts || m->attn.kv_lora ||
        m->norms.kind != ML_NORM_LAYERNORM || m->type != ML_MODEL_DECODER ||
        !m->residual.prenorm || !m->residual.parallel || m->embed.image_size ||
        m->attn.fused_proj || m->residual.post_norms || m->attn.softcap > 0 || m->dropout > 0 ||
        (m->attn.kv_heads != 1 && m->attn.kv_heads != m->attn.heads) ||
        (m->mlp.activation != ML_ACT_GELU && m->mlp.activation != ML_ACT_RELU))
        return false;
    common(m, c, L);
    mlg_attention *a = &L->attn;
    a->hf = a->mask = a->split_heads = a->stream_softmax = true;
    a->grouped = m->attn.kv_heads < m->attn.heads;
    /* the softmax's output (the stream's dtype) cast for PV under autocast */
    a->probs_cast = c->stream_bytes != c->compute_bytes;
    /* the MLP's gradient of the shared norm's output arrives first */
    a->in_buf = true;
    a->cache = c->eval && m->attn.kv_cache;
    L->hf_order = L->parallel = L->shared_norm = true;
    return true;
}

bool ml__family_deepseek_layer(const ml_model *m, const mlg_config *c, mlg_layer *L)
{
    /* DeepSeek's experts (V3's router, V2's sorted dispatch: kit_moe.c);
     * Mixtral's and Qwen2-MoE's routing is ml__family_mixtral_layer's */
    if (!m->attn.kv_lora || (m->moe.experts && !m->moe.router_sigmoid && !m->moe.sort) ||
        m->residual.shared_norm || m->norms.kind != ML_NORM_RMSNORM ||
        m->type != ML_MODEL_DECODER || !m->residual.prenorm || m->residual.parallel ||
        m->embed.image_size || m->attn.fused_proj || m->residual.post_norms ||
        m->attn.softcap > 0 || m->dropout > 0 || m->attn.kv_heads != m->attn.heads ||
        m->mlp.activation == ML_ACT_QUICK_GELU)
        return false;
    common(m, c, L);
    L->norm = (mlg_norm){MLG_RMSNORM, false, c->stream_bytes != 4, false};
    L->latent = (mlg_norm){MLG_RMSNORM, false, c->compute_bytes != 4, false};
    mlg_attention *a = &L->attn;
    a->hf = a->mask = a->latent = true;
    masked_softmax(c, a);
    a->q_lora = m->attn.q_lora > 0;
    /* the chain refuses sdpa and flash with latent attention (chain.c);
     * a block asked for one anyway is the eager layout, as the builders
     * count it */
    a->fused_kernel = a->ring = false;
    L->hf_order = true;
    if (m->moe.experts)
        L->moe = (mlg_moe){m->moe.router_sigmoid ? MLG_MOE_DEEPSEEK_V3 : MLG_MOE_DEEPSEEK_V2,
                           m->moe.renorm, m->moe.grouped_topk, m->moe.shared_ffn > 0,
                           c->stream_bytes == 4, false, false, false, false};
    /* Megatron's dispatch of the routed experts (in place of moe()'s loop,
     * V3's, or V2's sorted one) */
    if (m->moe.experts && c->ep) {
        L->moe.ep = true;
        L->moe.ep_one = c->ep_one;
        L->moe.etp = c->etp;
        L->moe.one_local = c->one_local;
    }
    return true;
}

bool ml__family_mixtral_layer(const ml_model *m, const mlg_config *c, mlg_layer *L)
{
    /* torch.where per expert (kit_mixtral.c), in Llama's layer: not
     * DeepSeek's experts (latent attention, its routers, dense layers) */
    const mlg_norm n = {MLG_RMSNORM, false, c->stream_bytes != 4, false};
    if (!m->moe.experts || m->attn.kv_lora || m->moe.router_sigmoid || m->moe.sort ||
        m->moe.dense_layers || m->residual.shared_norm || m->norms.kind != ML_NORM_RMSNORM ||
        m->residual.post_norms || m->attn.softcap > 0 || m->attn.fused_proj ||
        m->mlp.activation != ML_ACT_SWIGLU || !hf_layout(m, c, n, L))
        return false;
    L->moe = (mlg_moe){MLG_MOE_MIXTRAL, m->moe.renorm, false, m->moe.shared_ffn > 0,
                       c->stream_bytes == 4, c->ep, c->ep && c->ep_one, c->ep && c->etp,
                       c->ep && c->one_local};
    return true;
}

/* BERT's layer; with rotary positions (a text encoder the model file may
 * describe) the same layer with the rotary of Llama's attention, as the
 * chain builders planned it (their field-by-field comparison held it, the
 * last layout they wrote alone). */
bool ml__family_bert_layer(const ml_model *m, const mlg_config *c, mlg_layer *L)
{
    if (!plain_layernorm(m) || m->type != ML_MODEL_ENCODER || m->residual.prenorm ||
        m->embed.image_size || m->residual.parallel)
        return false;
    common(m, c, L);
    mlg_attention *a = &L->attn;
    a->hf = a->bert = a->in_buf = true;
    a->mask = true; /* the extended attention mask, added */
    /* the softmax in the stream's dtype: cast for PV where that is not the
     * compute dtype (autocast) */
    a->probs_cast = c->stream_bytes != c->compute_bytes;
    L->mlp.in_buf = L->mlp.keep_act = true;
    L->postnorm = true;
    return true;
}

bool ml__family_layer(const ml_model *m, const mlg_config *c, mlg_layer *L)
{
    return ml__family_gpt2_layer(m, c, L) || ml__family_llama_layer(m, c, L) ||
           ml__family_gemma_layer(m, c, L) || ml__family_olmo_layer(m, c, L) ||
           ml__family_vit_layer(m, c, L) || ml__family_neox_layer(m, c, L) ||
           ml__family_falcon_layer(m, c, L) || ml__family_deepseek_layer(m, c, L) ||
           ml__family_bert_layer(m, c, L) || ml__family_mixtral_layer(m, c, L);
}

void ml__family_layer_graph(ml_graph *g, const mlg_layer *L)
{
    ml__graph_init(g);
    ml__kit_prenorm_layer(g, L);
}

bool ml__family_head(const ml_model *m, const mlg_config *c, mlg_layer *L)
{
    return ml__family_layer(m, c, L) && !m->head.classes;
}

void ml__family_head_graph(ml_graph *g, const mlg_layer *L, bool tied, bool fused, bool softcap)
{
    ml__graph_init(g);
    ml__kit_lm_head(g, L, tied, fused, softcap);
}

/* Hugging Face's DynamicCache in training (use_cache: on unless gradient
 * checkpointing turns it off, which the replay checks): each layer's
 * update cats its keys and values into new tensors the model's output
 * returns (transformers' cache_utils.py, DynamicLayer.update; its
 * lazy_initialization makes both empty tensors in the keys' dtype, so the
 * values' copy is promoted to it). Where an op saves those copies they are
 * the tensors the graph lists already (the keys and values the fused
 * kernel or the matmuls save); this is the bytes an element of the copies
 * no op saves: GPT-2's with a fused kernel (which keeps c_attn's output
 * whole through the query's view; eager, its matmuls save the copies in
 * place of the contiguous copies the graph lists), autocast's fp32 copies
 * of the rotated keys and of the values promoted to them (the kernel or
 * the matmuls save bf16 casts), and beside grouped heads' repeat_kv
 * copies. 0: none, or a layout whose cache
 * is not modelled (latent attention, Falcon's, Phi-3's and GPT-NeoX's). */
uint8_t ml__family_out_cache_bpe(const ml_model *m, const mlg_config *c, const mlg_layer *L)
{
    const mlg_attention *a = &L->attn;
    if (!m->attn.kv_cache || c->eval || a->ring)
        return 0;
    if (!a->hf) /* nanoGPT's layout is Hugging Face's GPT-2 there; eager, the
                   matmuls save the copies (no contiguous copies of their own),
                   but for a batch of one, whose matmuls keep c_attn's output
                   through q's view and the copies besides */
        return (a->fused_kernel || a->fold_views) && !a->rope && !L->parallel && !a->unmasked &&
                       !a->fused_softmax
                   ? (uint8_t)c->compute_bytes
                   : 0;
    if (a->latent || a->split_heads || a->fused_proj || a->bert || !a->rope)
        return 0;
    if (L->autocast)
        return (uint8_t)c->stream_bytes;
    return !a->fused_kernel && a->repeat_copy ? (uint8_t)c->compute_bytes : 0;
}
