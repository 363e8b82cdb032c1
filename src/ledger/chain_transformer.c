/* Transformer chains (GPT-2, Llama, Gemma, BERT, ViT layouts and the
 * others of docs/graph.md): the embedding, one block per layer, the head
 * and the loss, every block from its op graph (chain_graph.c); a layout
 * the graph declines is refused, not planned by another rule. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ledger/chain_kit.h"
#include "util/error.h"

/* A mixture of experts' part of the dims and the chain's fields: the
 * rank's experts (ml__ep_refused has checked that ep divides them), the
 * dispatch and its capacity. */
static ml_status moe_dims(const ml_model *m, const ml_training *t, ml_chain *ch, ml_ck_dims *d,
                          ml_error *err)
{
    d->ep = m->moe.experts ? ml_training_ep(t) : 1;
    d->etp = m->moe.experts ? ml_training_etp(t) : 1;
    d->dispatch = ml__ep_dispatched(m, t);
    d->capacity = d->dispatch ? t->expert_capacity : 0;
    d->pad = d->dispatch && t->expert_pad;
    /* Megatron's permute views the padded pairs as (experts, capacity) rows
     * of the rank's tokens: it cannot pad past them */
    const uint64_t C = d->pad ? ml__ck_ep_capacity(d, ml_mul(ch, m->moe.per_token, d->BTs),
                                                   m->moe.experts)
                              : 0;
    if (C > d->BTs)
        return ml__errorf(err, ML_RANGE,
                          "training.expert_pad: a capacity of %llu pairs an expert exceeds "
                          "the rank's %llu tokens, which Megatron's permute cannot pad past; "
                          "give training.expert_capacity at most %g",
                          (unsigned long long)C, (unsigned long long)d->BTs,
                          floor((double)m->moe.experts / (double)m->moe.per_token * 1000) /
                              1000);
    ch->ep = d->ep;
    ch->etp = d->etp;
    ch->ep_tp = m->moe.experts && t->tensor_parallel > 1 ? t->tensor_parallel : 1;
    ch->ep_dispatch = d->dispatch;
    /* the routed experts run on the rank's tokens whole (or split by etp),
     * a shared expert as a tensor-parallel MLP */
    ch->tp_parts = m->moe.experts ? 1 + (m->moe.shared_ffn > 0) : 2;
    ch->moe_k = m->moe.per_token;
    ch->moe_experts = m->moe.experts;
    /* the experts' data-parallel ranks are not the rest's: w1, w3 (D x FE)
     * and w2 (FE x D) of each of its experts (FE the rank's: / etp) */
    if (d->ep * d->etp != ch->ep_tp)
        ch->ep_layer_params = ml_mul(ch, ml_mul(ch, m->moe.experts / d->ep, 3),
                                     ml_mul(ch, d->D, m->moe.expert_ffn ? m->moe.expert_ffn
                                                                        : d->F));
    return ML_OK;
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
    /* context parallelism: a rank holds T / cp of each sequence (ml__cp_refused
     * has checked that cp divides it) */
    d->cp = t->context_parallel > 1 && !m->embed.image_size ? t->context_parallel : 1;
    d->T /= d->cp;
    d->BT = ml_mul(ch, d->B, d->T);
    d->sp = ml_training_sp(t) ? t->tensor_parallel : 1;
    /* the fullest rank's tokens: a length tp does not divide is padded */
    d->BTs = ml_mul(ch, d->B, d->T / d->sp + (d->T % d->sp != 0));
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
    ch->cp = d->cp;
    ch->cp_kv = d->cp > 1 ? ml_mul(ch, d->BT, d->Dkv) : 0;
    ch->c_tokens = d->BT;
    ch->c_width = d->D;
    return moe_dims(m, t, ch, d, err);
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

/* The bytes an element of the keys and values a layer's forward returns
 * with use_cache: DynamicCache's first update cats them onto empty tensors
 * of the keys' dtype (transformers' cache_utils.py, DynamicLayer.
 * lazy_initialization and update), so the values' copy takes the keys'
 * dtype, which under autocast is fp32 for rotated keys (the rotary tables
 * are fp32 and the product promotes). */
unsigned ml__kv_cache_bpe(const ml_chain *ch, const ml_model *m)
{
    return ch->prec.autocast && m->embed.position == ML_POS_ROPE ? 4 : ch->prec.a;
}

/* The keys and values a layer's forward returns with use_cache (above):
 * b's cache_bytes and, where they are a key and a value tensor of (B,
 * kv_heads, T, head_dim) each, cache_unit, one's bytes. Latent attention:
 * the keys, H heads of head_dim (fp32 under autocast, where the rotated
 * part is fp32 and the cat promotes; DeepSeek-V2 casts it back), and the
 * values, a view that keeps kv_b_proj's whole output alive. */
static void kv_cache(ml_chain *ch, ml_cblock *b, const ml_model *m, const ml_ck_dims *d)
{
    const unsigned a = ch->prec.a;
    if (!m->attn.kv_lora) {
        b->cache_unit = ml_mul(ch, ml_mul(ch, d->BT, d->Dkv), ml__kv_cache_bpe(ch, m));
        b->cache_bytes = ml_mul(ch, 2, b->cache_unit);
        return;
    }
    unsigned kb = ch->prec.autocast && !m->embed.rope_complex ? 4 : a;
    uint64_t keys = ml_mul(ch, ml__ck_mul3(ch, d->BT, d->H, d->dh), kb);
    uint64_t kv_b = ml__ck_mul3(ch, d->BT, d->H, d->dh - m->attn.rope_dim + m->attn.v_dim);
    b->cache_bytes = ml_add(ch, keys, ml_mul(ch, kv_b, a));
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
    uint64_t BTD = ml_mul(ch, d->BTs, d->D);
    ch->record_nodes = ml__ck_node_level(ch, m);
    /* the layers' op graphs where the component kit expresses their
     * layouts, one per layout: DeepSeek's first dense_layers layers (a
     * dense MLP) and its expert layers; each layout's first block is
     * emitted, the layout's others copy it */
    ml_ck_graph *G = malloc(2 * sizeof *G);
    if (!G)
        return ML_NOMEM;
    bool graph = true;
    for (unsigned k = 0; k < 2 && graph; k++) {
        const uint64_t first = k ? m->moe.dense_layers : 0; /* the layout's first layer */
        if (layout_of(m, first) == k && first < m->layers)
            graph = ml__ck_graph_layer_at(ch, m, d, first, &G[k]);
    }
    /* every layer from the op graph: a layout it declines is not
     * modelled (the caller says so) */
    if (!graph) {
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
        b->moe = k == 1;
        b->nodes_off = m->mlp.gelu_new && ch->prec.autocast; /* (kit_gelu.c) */
        if (proto[k] != SIZE_MAX) {
            ml__ck_graph_repeat(ch, b, proto[k], pfirst[k], pcount[k]);
        } else {
            pfirst[k] = ch->nparams;
            ml__ck_graph_emit(ch, b, &G[k], ml_mul(ch, BTD, w));
            pcount[k] = ch->nparams - pfirst[k];
            proto[k] = (size_t)(b - ch->blocks);
        }
        /* DeepSeek-V3's router's score-correction bias: a buffer of E fp32
         * values per expert layer (the router's, beside its graph) */
        if (k && m->moe.router_sigmoid)
            ch->buffer_bytes = ml_add(ch, ch->buffer_bytes, ml_mul(ch, m->moe.experts, 4));
        if (m->attn.kv_cache)
            kv_cache(ch, b, m, d);
        b->out_cache_bytes = ml_mul(ch, ml_mul(ch, 2, ml_mul(ch, d->BT, d->Dkv)),
                                    G[k].out_cache_bpe);
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
    /* SDPA and flash get no 4-D causal mask: with no padding, HF's mask
     * builder returns None and the kernel runs is_causal (masking_utils.py,
     * sdpa_mask and _ignore_causal_mask_sdpa), so a checkpoint keeps the
     * position ids alone */
    if (enc && !m->embed.image_size)
        ch->ckpt_side = ml_mul(ch, d->BT, w);
    else if (!enc && (m->norms.kind != ML_NORM_LAYERNORM || m->residual.parallel))
        ch->ckpt_side = ml_add(ch, ch->mask_in_forward ? ml_mul(ch, ml_mul(ch, d->T, d->T), w) : 0,
                               m->embed.position == ML_POS_ROPE ? ml_mul(ch, d->T, 8) : 0);
    /* the position ids and the mask are two tensors (the ids made first:
     * the mask is built from cache_position, LlamaModel.forward) */
    if (!enc && m->embed.position == ML_POS_ROPE && ch->ckpt_side && d->T <= UINT32_MAX / 8)
        ch->side_ids = (uint32_t)(d->T * 8);
    return ML_OK;
}

/* The layout a refusal names: the parts the op graph may decline. */
static const char *layout_name(const ml_model *m)
{
    if (m->attn.kv_lora && m->moe.experts)
        return "multi-head latent attention, mixture of experts";
    if (m->attn.kv_lora)
        return "multi-head latent attention";
    if (m->moe.experts)
        return "mixture of experts";
    if (m->residual.parallel && m->attn.kv_heads && m->attn.kv_heads != m->attn.heads)
        return "parallel residual, grouped key/value heads";
    return m->residual.prenorm ? "pre-norm" : "post-norm";
}

ml_status ml__ck_declined(const ml_model *m, const char *part, ml_error *err)
{
    return ml__errorf(err, ML_RANGE,
                      "model: %s's %s (%s) at this shape, precision and attention kernel is "
                      "not modelled: the op graph declines this combination of the model's "
                      "keys and no other rule plans it (the layouts planned: docs/graph.md, "
                      "\"What the graph expresses today\")",
                      m->name, part, layout_name(m));
}

ml_status ml__ck_layers_declined(const ml_model *m, ml_error *err)
{
    return ml__ck_declined(m, "layers", err);
}

ml_status ml__chain_build_transformer(const ml_model *m, const ml_config *cfg, ml_chain *ch,
                                      ml_error *err)
{
    ml_ck_dims d;
    ml_status st = ml__ck_dims_of(m, &cfg->training, ch, &d, err);
    if (st == ML_OK && (st = ml__ck_embedding_block(ch, m, &d)) == ML_RANGE)
        return ml__ck_declined(m, "embedding", err);
    if (st == ML_OK && (st = ml__ck_layer_blocks(ch, m, &d)) == ML_RANGE)
        return ml__ck_layers_declined(m, err);
    if (st == ML_OK && (st = ml__ck_head_and_loss(ch, m, &d, &cfg->training)) == ML_RANGE)
        return ml__ck_declined(m, "head", err);
    if (st != ML_OK)
        return st;
    /* sequence parallelism: Megatron gathers a column-parallel linear's
     * input into one buffer it keeps and reuses for every gather, forward
     * and backward (get_global_memory_buffer, tensor_parallel/layers.py):
     * the whole B x T x D stream, resident once the first layer has run */
    if (d.sp > 1)
        ch->buffer_bytes = ml_add(ch, ch->buffer_bytes, ml__ck_mul3(ch, d.BT, d.D, ch->prec.w));
    for (size_t i = 0; i < ch->n; i++)
        if (ch->blocks[i].flops_bwd == 0 && !ch->blocks[i].grads_in_fwd)
            ch->blocks[i].flops_bwd = 2.0 * ch->blocks[i].flops_fwd;
    return ML_OK;
}
