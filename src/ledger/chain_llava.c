/* Llava's chain (HF LlavaForConditionalGeneration, transformers 4.5x
 * modeling_llava.py, with modeling_clip.py's vision tower): the token
 * embedding, the CLIP vision embedding and layers, the projector with the
 * merge of the image features into the token embeddings, then the decoder's
 * layers, head and loss as a decoder's (chain_transformer.c). The vision
 * embedding, layers and projector come from the op graph alone
 * (graph/kit_clip.c, chain_graph_llava.c): one it declines (a wide
 * tower's full-feature projector in fp32) is not modelled, the chain
 * refused (ML_RANGE). What each op keeps:
 * docs/inventory.md, "Llava". The token embeddings wait beside the
 * vision tower (a side tensor, docs/ledger.md, "Side tensors"); the layers
 * after the one the projector reads run with their output unused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/families.h"
#include "ledger/chain_kit.h"
#include "util/error.h"

/* The vision embedding block (graph/kit_clip.c; ML_RANGE when the graph
 * declines it): its backward is the patch conv weight's gradient only,
 * its input (the pixels, the batch the loop holds) needs none. */
static ml_status vision_embedding(ml_chain *ch, const ml_model *m, const ml_ck_dims *d,
                                  ml_ck_graph *G, const char **why)
{
    ml_cblock *b = ml__ck_begin(ch, "vision.embedding", -1);
    if (!b)
        return ML_NOMEM;
    uint64_t px =
        ml_mul(ch, ml__ck_mul3(ch, d->B, m->vision.channels, m->vision.image), m->vision.image);
    if (!ml__ck_graph_clip_embedding(ch, m, d, G)) {
        *why = "the vision embedding";
        return ML_RANGE;
    }
    ml__ck_graph_emit(ch, b, G, ml_mul(ch, ml_mul(ch, d->BT, d->D), ch->prec.w));
    b->flops_bwd = b->flops_fwd; /* the weight's gradient only */
    b->in_nograd = true;
    /* position_ids, (1, T) int64, registered with persistent=False */
    ch->buffer_bytes = ml_add(ch, ch->buffer_bytes, ml_mul(ch, d->T, 8));
    ch->batch_input = ml_add(ch, ch->batch_input, ml_mul(ch, px, ch->prec.w));
    return ch->nomem ? ML_NOMEM : ML_OK;
}

/* CLIPEncoderLayer i, its block closed; `used`: the projector reads its
 * output or a later one's. An unused layer (after vision_feature_layer's)
 * still runs with grad: its saved tensors and its output live until
 * get_image_features returns (a side tensor to the projector), its
 * parameters (from p0) get no gradient; its norm saves its input, which
 * the projector keeps in fp32 (its linear saves the feature slice, a view
 * of it). The last layer's pooled class token goes through
 * post_layernorm, its output unused too. */
static void layer_roles(ml_chain *ch, ml_cblock *b, const ml_model *m, const ml_ck_dims *d,
                        size_t p0, bool used, bool last)
{
    const unsigned w = ch->prec.w;
    uint64_t BTD = ml_mul(ch, d->BT, d->D);
    /* the output (B, D) of post_layernorm on the class tokens, a view of
     * the layer's output, which the LayerNorm keeps with its statistics */
    uint64_t pooled = last ? ml_mul(ch, ml_mul(ch, d->B, d->D), w) : 0;
    if (used && !last)
        return;
    if (used) { /* post_layernorm's parameters get no gradient */
        for (size_t j = ch->nparams - 2; j < ch->nparams; j++)
            ch->params[j].nograd = true;
        uint64_t g = ml_mul(ch, 2 * d->D, ch->prec.grad);
        b->grad_bytes -= g;
        b->grad_accum_bytes -= g;
        /* its statistics and output live until get_image_features returns;
         * its input is the projector's, kept by the stream */
        ml__ck_side(ch, "post_layernorm statistics and output (unused)",
                    ml_add(ch, ml_mul(ch, d->B, 8), pooled), ch->n - 1, ch->n);
        return;
    }
    b->unused_out = b->fwd_only = true;
    b->identity = true; /* the projector's input is this layer's input */
    /* the projector's linear keeps that input in fp32
     * (ml__ck_llava_keeps_hidden); else, the class token dropped, a
     * contiguous copy of the slice */
    b->in_saved = ml__ck_llava_keeps_hidden(ch, m, d->B);
    for (size_t j = p0; j < ch->nparams; j++)
        ch->params[j].nograd = true;
    b->grad_bytes = b->grad_accum_bytes = 0;
    b->flops_bwd = 0; /* it runs forward only */
    ml__ck_side(ch, "an unused vision layer's saved tensors and output",
                ml_add(ch, b->saved_bytes, last ? pooled : ml_mul(ch, BTD, w)), ch->n - 1, 0);
}

/* The projector block (graph/kit_clip.c; ML_RANGE when the graph declines
 * it: a wide tower's whole hidden state kept in fp32): its input is the
 * feature layer's hidden state, its output the decoder's input. */
static ml_status projector(ml_chain *ch, const ml_model *m, const ml_ck_dims *vd,
                           const ml_ck_dims *d, uint64_t n_img, const char **why)
{
    ml_cblock *b = ml__ck_begin(ch, "projector", -1);
    if (!b)
        return ML_NOMEM;
    b->in_bytes = ml_mul(ch, ml_mul(ch, vd->BT, vd->D), ch->prec.w);
    ml_ck_graph *G = malloc(sizeof *G);
    if (!G)
        return ML_NOMEM;
    const bool taken = ml__ck_graph_llava_projector(ch, m, vd, d, n_img, G);
    if (taken)
        ml__ck_graph_emit(ch, b, G, ml_mul(ch, ml_mul(ch, d->BT, d->D), ch->prec.w));
    free(G);
    if (!taken) {
        *why = "the projector (the vision tower's whole hidden state, wider than six of the "
               "decoder's, kept in fp32)";
        return ML_RANGE;
    }
    return ch->nomem ? ML_NOMEM : ML_OK;
}

/* training.vision_tower: frozen (requires_grad_(False) on the tower): with
 * neither its input nor its parameters needing a gradient the tower builds
 * no graph, so blocks first..end-1 save nothing (what they would save is
 * transient, as under no_grad), have no backward and their parameters
 * (from p0 to p1) no gradient; the projector's input needs none. What the
 * tower returns with output_hidden_states=True still holds every layer's
 * output until get_image_features returns: at the last layer, the Lv - 1
 * before its input (a side tensor to the projector). The evaluation pass
 * (no_grad) runs the tower the same way (p0 = p1: no parameter marked). */
static void freeze(ml_chain *ch, const ml_model *m, const ml_ck_dims *vd, size_t first,
                   size_t end, size_t p0, size_t p1)
{
    for (size_t k = first; k < end; k++) {
        ml_cblock *b = &ch->blocks[k];
        b->saved_bytes = b->core_bytes = b->cast_bytes = 0;
        b->ws_fwd = b->ws_nograd;
        b->ws_fwd_ops = b->ws_nograd_ops;
        b->frozen = b->fwd_only = true;
        b->unused_out = false;
        b->identity = b->in_saved = false;
        b->ckpt_index = -1;
        b->grad_bytes = b->grad_accum_bytes = 0;
        b->flops_bwd = 0;
    }
    for (size_t j = p0; j < p1; j++)
        ch->params[j].nograd = ch->params[j].frozen = true;
    ch->nsides = 0; /* the unused layers' saved tensors: none */
    uint64_t h = ml_mul(ch, ml_mul(ch, vd->BT, vd->D), ch->prec.w);
    ml__ck_side(ch, "the tower's hidden states (output_hidden_states)",
                ml_mul(ch, m->vision.layers - 1, h), end - 1, end);
    /* the projector's input needs no gradient: linear_1's mm keeps no weight
     * (derivatives.yaml: mm keeps mat2 for self's gradient), so no autocast
     * copy of it */
    ml_cblock *p = &ch->blocks[end];
    p->in_nograd = true;
    p->flops_bwd = p->flops_fwd; /* the weights' gradients only */
    if (ch->prec.autocast) {
        uint64_t copy = ml_mul(ch, ml_mul(ch, m->vision.hidden, m->hidden), 2);
        p->saved_bytes -= copy;
        p->cast_bytes -= copy;
        /* nor is its entry a tensor (the allocator simulation makes a
         * block's saved and held tensors from its entries) */
        for (size_t i = p->saved_first; i < p->saved_first + p->nsaved; i++)
            if ((ch->saved[i].flags & ML_SV_WCAST) && ch->saved[i].bytes == copy) {
                ch->saved[i].flags &= ~(unsigned)ML_SV_WCAST;
                ch->saved[i].bytes = 0;
                break;
            }
    }
    ch->mask_ckpt0 = 0;
}

/* The tower's layers from the op graph (graph/kit_clip.c): one graph of
 * the layer (G[0]), emitted once and copied for the others (a copy of a
 * clean block: one whose roles, above, changed nothing), and the last
 * layer's with post_layernorm (G[1]). Their settings are the model's
 * vision stack's, read by the family itself. ML_RANGE when the graph
 * declines them. */
static ml_status layers_graph(ml_chain *ch, const ml_model *m, const ml_ck_dims *d,
                              const char **why)
{
    const unsigned w = ch->prec.w;
    const bool last_used = m->vision.used == m->vision.layers;
    ml_ck_graph *G = malloc(2 * sizeof *G);
    if (!G)
        return ML_NOMEM;
    if (!ml__ck_graph_vision_layer(ch, m, d, MLG_CLIP_LAYER, &G[0]) ||
        !ml__ck_graph_vision_layer(ch, m, d,
                                   last_used ? MLG_CLIP_POOLED : MLG_CLIP_POOLED_KEPT, &G[1])) {
        free(G);
        *why = "the vision layers";
        return ML_RANGE;
    }
    size_t proto = SIZE_MAX, pfirst = 0, pcount = 0;
    for (uint64_t i = 0; i < m->vision.layers && !ch->nomem && !ch->overflow; i++) {
        const bool used = i < m->vision.used, last = i + 1 == m->vision.layers;
        char name[48];
        snprintf(name, sizeof name, "vision.layer.%llu", (unsigned long long)i);
        size_t p0 = ch->nparams;
        ml_cblock *b = ml__ck_begin(ch, name, used ? (int)i : -1);
        if (!b)
            break;
        b->in_bytes = ml_mul(ch, ml_mul(ch, d->BT, d->D), w);
        if (!last && proto != SIZE_MAX) {
            ml__ck_graph_repeat(ch, b, proto, pfirst, pcount);
        } else {
            ml__ck_graph_emit(ch, b, &G[last], b->in_bytes);
            if (!last && used) {
                proto = ch->n - 1;
                pfirst = p0;
                pcount = ch->nparams - p0;
            }
        }
        layer_roles(ch, b, m, d, p0, used, last);
    }
    free(G);
    return ch->nomem ? ML_NOMEM : ML_OK;
}

/* The vision tower's blocks (its embedding and layers) and the projector,
 * from the op graph; ML_RANGE (why set) when it declines one. */
static ml_status vision_blocks(ml_chain *ch, const ml_model *m, const ml_ck_dims *vd,
                               const ml_ck_dims *d, size_t *p1, const char **why)
{
    ml_ck_graph *G = malloc(sizeof *G);
    if (!G)
        return ML_NOMEM;
    ml_status st = vision_embedding(ch, m, vd, G, why);
    free(G);
    if (st || (st = layers_graph(ch, m, vd, why)))
        return st;
    *p1 = ch->nparams;
    return projector(ch, m, vd, d, ml_model_image_tokens(m), why);
}

ml_status ml__chain_build_llava(const ml_model *m, const ml_config *cfg, ml_chain *ch,
                                ml_error *err)
{
    const ml_training *t = &cfg->training;
    uint64_t n_img = ml_model_image_tokens(m);
    if (t->seq_len < n_img)
        return ml__errorf(err, ML_RANGE,
                          "a sequence of %llu tokens holds no image: each sample's image is "
                          "%llu tokens of it (model.stacks.vision); plan training.seq_len (and "
                          "training.eval_seq_len) of at least %llu",
                          (unsigned long long)t->seq_len, (unsigned long long)n_img,
                          (unsigned long long)n_img);
    ml_ck_dims d, vd;
    ml_status st = ml__ck_dims_of(m, t, ch, &d, err);
    if (st)
        return st;
    uint64_t g = m->vision.image / m->vision.patch;
    vd = (ml_ck_dims){.B = d.B,
                      .T = g * g + 1,
                      .D = m->vision.hidden,
                      .F = m->vision.mlp.ffn,
                      .H = m->vision.attn.heads,
                      .Hkv = m->vision.attn.heads,
                      .dh = m->vision.hidden / m->vision.attn.heads,
                      .V = 0,
                      .expert_imbalance = 1};
    vd.BT = ml_mul(ch, vd.B, vd.T);
    vd.sp = 1;
    vd.BTs = vd.BT;
    vd.Dkv = vd.D;
    const unsigned w = ch->prec.w;
    uint64_t BTD = ml_mul(ch, d.BT, d.D);
    /* the token embeddings (the rotary tables with them), beside the tower */
    if ((st = ml__ck_embedding_block(ch, m, &d)) == ML_RANGE)
        return ml__ck_declined(m, "embedding", err);
    if (st)
        return st;
    ml_cblock *e = &ch->blocks[0];
    e->ws_bwd -= e->bwd_in; /* its output's gradient is the side tensor's */
    e->bwd_in = 0;
    ch->record_nodes = false;
    size_t p0 = ch->nparams, p1 = 0;
    const char *why = "";
    if ((st = vision_blocks(ch, m, &vd, &d, &p1, &why)) == ML_RANGE)
        return ml__errorf(err, ML_RANGE,
                          "%s: %s at this shape and precision is not modelled: the op graph "
                          "declines it and no other rule plans it",
                          m->name, why);
    if (st)
        return st;
    size_t proj = ch->n - 1;
    for (size_t i = 0; i < ch->nsides; i++)
        ch->sides[i].to = (uint32_t)proj; /* get_image_features returns */
    ch->blocks[proj].in_nograd = false;
    ch->mask_ckpt0 = m->vision.used;
    ch->vis_mode = t->vision_tower;
    if (t->vision_tower == ML_VT_FROZEN || ch->eval_mode)
        freeze(ch, m, &vd, 1, proj, p0, ch->eval_mode ? p0 : p1);
    ml_side *s = ml__ck_side(ch, "token embeddings (inputs_embeds)", ml_mul(ch, BTD, w), 0, proj);
    if (s && !ch->eval_mode) { /* masked_scatter's gradient for them */
        s->grad = ml_mul(ch, BTD, w);
        s->grad_from = (uint32_t)proj;
        s->grad_to = 0;
    }
    if ((st = ml__ck_layer_blocks(ch, m, &d)) == ML_RANGE)
        return ml__ck_layers_declined(m, err);
    if (st == ML_OK && (st = ml__ck_head_and_loss(ch, m, &d, t)) == ML_RANGE)
        return ml__ck_declined(m, "head", err);
    if (st)
        return st;
    for (size_t i = 0; i < ch->n; i++)
        if (ch->blocks[i].flops_bwd == 0 && !ch->blocks[i].grads_in_fwd &&
            !ch->blocks[i].fwd_only)
            ch->blocks[i].flops_bwd = 2.0 * ch->blocks[i].flops_fwd;
    return ML_OK;
}
