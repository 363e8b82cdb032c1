/* A block's chain entries from its op graph (graph/graph.h; docs/graph.md,
 * "Passes"): the saved inventory, the backward node list, the parameters,
 * the FLOPs and the transients, then the forward's live bytes with and
 * without grad. Nothing here knows a family: every figure is read off the
 * graph. */
#include <stdlib.h>
#include <string.h>

#include "graph/families.h"
#include "graph/kit_embed.h"
#include "graph/kit_head.h"
#include "ledger/chain_kit.h"
#include "ledger/replay.h" /* ml__ceil_div */
#include "ledger/work.h"
#include "util/grow.h"

/* What of the configuration changes the ops. */
mlg_config ml__ck_graph_config(const ml_chain *ch, const ml_model *m)
{
    return (mlg_config){ch->prec.a,        ch->prec.w,   ch->prec.fp16,
                        ch->prec.autocast, ml__ck_fused_attention(ch->prec.a, m), ch->eval_mode,
                        ch->cp > 1,        ch->ep_dispatch, ch->ep == 1, ch->etp > 1,
                        ch->ep > 1 && ch->moe_experts == ch->ep, ch->B == 1};
}

/* Each dtype class's bytes under the chain's precision, then each
 * tensor's bytes at G's sizes. */
void ml__ck_graph_dtype_bytes(ml_chain *ch, ml_ck_graph *G)
{
    ml_graph_sizes *z = &G->z;
    const unsigned bytes[MLG_NDTYPES] = {
        [MLG_COMPUTE] = ch->prec.a, [MLG_STREAM] = ch->prec.w, [MLG_FP32] = 4, [MLG_HALF] = 2,
        [MLG_INT64] = 8,            [MLG_BOOL] = 1,            [MLG_PARAM] = ch->prec.param};
    memcpy(z->bytes, bytes, sizeof bytes);
    z->grad_bytes = ch->prec.grad;
    ml__graph_bytes(&G->g, z, G->tb);
    if (z->overflow)
        ch->overflow = true;
}

/* Whether m's layer forward is written out op by op (forward programs):
 * eager attention, or sdpa's math kernel (graph/kit_math.c, not under
 * Falcon's one shared norm); none with experts or latent attention (the
 * block rule, said in the output); the parallel layers and a LayerNorm
 * layout with rotary positions only as the live-bytes oracle holds them (a
 * decoder; without dropout; GPT-NeoX's with as many key/value heads as
 * query heads, Falcon's with one or as many). */
static bool programs_held(const ml_chain *ch, const ml_model *m)
{
    const bool math = m->attn.kernel == ML_ATTN_SDPA && !ml__ck_fused_attention(ch->prec.a, m) &&
                      !m->residual.shared_norm;
    const bool rope_ln = m->norms.kind == ML_NORM_LAYERNORM && m->embed.position == ML_POS_ROPE;
    const bool held = (!rope_ln || m->type == ML_MODEL_DECODER) &&
                      (!m->residual.parallel ||
                       (m->dropout == 0 &&
                        (m->residual.shared_norm || m->attn.kv_heads == m->attn.heads)));
    return (!ch->prec.autocast || ml__ck_autocast_ops(m)) &&
           (m->attn.kernel == ML_ATTN_EAGER || math) &&
           !m->attn.kv_lora && !m->moe.experts && held;
}

/* G's sizes at the chain's shape, each tensor's bytes, and whether the
 * forward's live bytes come from the graph (programs_held; docs/graph.md,
 * "What the passes do not derive yet"). False when G is not whole. */
bool ml__ck_graph_sized(ml_chain *ch, const ml_model *m, const ml_ck_dims *d, ml_ck_graph *G)
{
    if (!ml__graph_valid(&G->g))
        return false;
    ml_graph_sizes *z = &G->z;
    memset(z, 0, sizeof *z);
    z->dim[MLG_B] = d->B;
    z->dim[MLG_T] = d->T;
    z->dim[MLG_TKV] = d->cp > 1 ? ml_mul(ch, d->T, d->cp) : d->T;
    z->dim[MLG_D] = d->D;
    z->dim[MLG_H] = d->H;
    z->dim[MLG_HKV] = d->Hkv;
    z->dim[MLG_DH] = d->dh;
    z->dim[MLG_F] = d->F;
    z->dim[MLG_V] = d->V;
    z->dim[MLG_DQ] = ml_mul(ch, d->H, d->dh);
    z->dim[MLG_DKV] = d->Dkv;
    z->dim[MLG_QKV] = ml_add(ch, z->dim[MLG_DQ], ml_mul(ch, 2, d->Dkv));
    z->dim[MLG_F2] = ml_mul(ch, 2, d->F);
    /* latent attention's (zero elsewhere); the model file keeps the
     * rotated part below the head size */
    z->dim[MLG_RQ] = m->attn.q_lora;
    z->dim[MLG_RKV] = m->attn.kv_lora;
    z->dim[MLG_KVA] = ml_add(ch, m->attn.kv_lora, m->attn.rope_dim);
    z->dim[MLG_DV] = m->attn.v_dim;
    z->dim[MLG_VO] = ml_mul(ch, d->H, m->attn.v_dim);
    z->dim[MLG_KVB] = m->attn.kv_lora
                          ? ml_mul(ch, d->H, ml_add(ch, d->dh - m->attn.rope_dim, m->attn.v_dim))
                          : 0;
    /* the experts' (zero elsewhere): the busiest expert's rows as the
     * builders' routing model gives them */
    z->dim[MLG_E] = m->moe.experts;
    z->dim[MLG_K] = m->moe.per_token;
    z->dim[MLG_FE] = m->moe.expert_ffn ? m->moe.expert_ffn : d->F;
    z->dim[MLG_FS] = m->moe.shared_ffn;
    /* the rank's (token, expert) pairs: of its sequence shard under the
     * dispatch with sequence parallelism */
    const uint64_t pairs = ml_mul(ch, m->moe.per_token, d->dispatch ? d->BTs : d->BT);
    z->dim[MLG_ROWS] = m->moe.experts ? ml__ck_ep_busiest_rows(d, pairs, m->moe.experts) : 0;
    z->dim[MLG_EL] = d->ep > 1 ? m->moe.experts / d->ep : m->moe.experts;
    /* a repeated group's instances: the experts with rows (Mixtral's,
     * Qwen2-MoE's), MLG_NE the first's; the graph's literal sizes */
    if (G->g.rep.t1 != G->g.rep.t0 || G->g.rep.o1 != G->g.rep.o0) {
        uint64_t count[3], rows[3];
        z->nruns = ml__ck_ep_runs(d, pairs, m->moe.experts, count, rows);
        for (unsigned i = 0; i < z->nruns; i++) {
            z->runs[i].count = count[i];
            z->runs[i].size = rows[i];
            z->dim[MLG_R] = ml_add(ch, z->dim[MLG_R], ml_mul(ch, count[i], rows[i]));
        }
        /* the all-to-all's share: an even part of the expert-tensor
         * ranks' (the fullest rank's, rounded up) */
        z->dim[MLG_RA] = d->etp > 1 ? ml__ceil_div(z->dim[MLG_R], d->etp) : z->dim[MLG_R];
        ch->ep_rows = d->dispatch ? z->dim[MLG_R] : 0;
        /* the pairs the rank sends (an expert capacity drops or pads) */
        z->dim[MLG_PS] = pairs;
        ch->ep_pairs = ch->ep_self = 0;
        if (d->dispatch) {
            ml__ck_ep_own(d, pairs, m->moe.experts, &ch->ep_pairs, &ch->ep_self);
            z->dim[MLG_PS] = ch->ep_pairs;
        }
        z->dim[MLG_NE] = rows[0];
    }
    memcpy(&z->dim[MLG_L0], G->g.lit, G->g.nlit * sizeof G->g.lit[0]);
    if (d->sp > 1) {
        z->seq_div = d->sp;
        ml__graph_shard_sequence(&G->g, d->sp);
    }
    ml__ck_graph_dtype_bytes(ch, G);
    G->programs = programs_held(ch, m);
    return true;
}

bool ml__ck_graph_layer(ml_chain *ch, const ml_model *m, const ml_ck_dims *d, ml_ck_graph *G)
{
    return ml__ck_graph_layer_at(ch, m, d, 0, G);
}

bool ml__ck_graph_layer_at(ml_chain *ch, const ml_model *m, const ml_ck_dims *d, uint64_t layer,
                           ml_ck_graph *G)
{
    mlg_layer L;
    const mlg_config c = ml__ck_graph_config(ch, m);
    if (!ml__family_layer(m, &c, &L))
        return false;
    /* DeepSeek's first dense_layers layers: one dense MLP */
    if (layer < m->moe.dense_layers)
        L.moe = (mlg_moe){0};
    ml__family_layer_graph(&G->g, &L);
    G->out_cache_bpe = ml__family_out_cache_bpe(m, &c, &L);
    return ml__ck_graph_sized(ch, m, d, G);
}

bool ml__ck_graph_head(ml_chain *ch, const ml_model *m, const ml_ck_dims *d, bool fused,
                       ml_ck_graph *G)
{
    mlg_layer L;
    const mlg_config c = ml__ck_graph_config(ch, m);
    if (!ml__family_head(m, &c, &L))
        return false;
    ml__family_head_graph(&G->g, &L, m->embed.tied, fused, m->head.final_softcap > 0);
    return ml__ck_graph_sized(ch, m, d, G);
}

bool ml__ck_graph_embedding(ml_chain *ch, const ml_model *m, const ml_ck_dims *d,
                            ml_ck_graph *G)
{
    mlg_embed E;
    const mlg_config c = ml__ck_graph_config(ch, m);
    if (!ml__family_embedding(m, &c, d->drop, &E))
        return false;
    /* the literal sizes, as the builders multiplied them */
    E.positions = m->embed.max_positions;
    E.ntypes = m->embed.token_types;
    E.rot = m->attn.kv_lora ? m->attn.rope_dim : d->dh;
    E.image = ml__ck_mul3(ch, m->embed.channels, m->embed.image_size, m->embed.image_size);
    E.kin = ml__ck_mul3(ch, m->embed.channels, m->embed.patch_size, m->embed.patch_size);
    E.npatches = d->T ? d->T - 1 : 0;
    E.td = ml_mul(ch, d->T, d->D);
    ml__kit_embedding(&G->g, &E);
    if (!ml__ck_graph_sized(ch, m, d, G))
        return false;
    G->programs = false; /* the builders had none: the block rule */
    return true;
}

bool ml__ck_graph_cls_head(ml_chain *ch, const ml_model *m, const ml_ck_dims *d, ml_ck_graph *G)
{
    mlg_layer L;
    const mlg_config c = ml__ck_graph_config(ch, m);
    if (!ml__family_seq_cls_head(m, &c, &L))
        return false;
    ml__kit_seq_cls_head(&G->g, &L, m->head.classes, !m->head.cls_no_pad);
    if (!ml__ck_graph_sized(ch, m, d, G))
        return false;
    return true;
}

bool ml__ck_graph_encoder_head(ml_chain *ch, const ml_model *m, const ml_ck_dims *d,
                               ml_ck_graph *G)
{
    mlg_layer L;
    const mlg_config c = ml__ck_graph_config(ch, m);
    if (!ml__family_encoder_classifier(m, &c, &L))
        return false;
    /* ViT's classifier reads the first token, no dropout between
     * (BERT's has one; in evaluation the identity: none, as T5's) */
    ml__kit_encoder_classifier(&G->g, &L, m->head.classes, m->residual.prenorm, m->head.pooler,
                               d->drop && !m->embed.image_size && !ch->eval_mode);
    if (!ml__ck_graph_sized(ch, m, d, G))
        return false;
    return true;
}

bool ml__ck_graph_mlm_head(ml_chain *ch, const ml_model *m, const ml_ck_dims *d, ml_ck_graph *G)
{
    mlg_layer L;
    const mlg_config c = ml__ck_graph_config(ch, m);
    if (!ml__family_mlm_head(m, &c, &L))
        return false;
    ml__kit_mlm_head(&G->g, &L, m->embed.tied);
    if (!ml__ck_graph_sized(ch, m, d, G))
        return false;
    G->z.dim[MLG_L0] = ml_add(ch, d->D, d->V);
    ml__ck_graph_dtype_bytes(ch, G);
    /* a text encoder with rotary positions: the block rule (its forward is
     * not walked op by op, as the LayerNorm rotary layers' are not) */
    if (m->embed.position == ML_POS_ROPE)
        G->programs = false;
    return true;
}

bool ml__ck_graph_vision_layer(ml_chain *ch, const ml_model *m, const ml_ck_dims *vd,
                               unsigned pool, ml_ck_graph *G)
{
    mlg_layer L;
    /* the tower's attention is eager whatever the decoder's kernel */
    const mlg_config c = {ch->prec.a,        ch->prec.w, ch->prec.fp16, ch->prec.autocast,
                          false,             ch->eval_mode, false,      false,
                          false,             false,      false,         ch->B == 1};
    if (!ml__family_clip_layer(m, &c, &L))
        return false;
    ml__family_clip_graph(&G->g, &L, (mlg_clip_pool)pool);
    if (!ml__ck_graph_sized(ch, m, vd, G))
        return false;
    G->programs = false; /* a vision encoder's: the block rule */
    return true;
}

bool ml__ck_graph_seq(ml_chain *ch, const ml_layer *l, const ml_shape *in, unsigned in_bytes,
                      bool in_nograd, ml_ck_graph *G, mlg_seq_block *info)
{
    const mlg_seq_config c = {ch->B,        ch->prec.w, ch->prec.autocast,
                              ch->eval_mode, in_bytes,   in_nograd};
    if (!ml__seq_block_graph(&G->g, l, in, &c, info))
        return false;
    ml_graph_sizes *z = &G->z;
    memset(z, 0, sizeof *z);
    z->dim[MLG_B] = ch->B;
    memcpy(&z->dim[MLG_L0], G->g.lit, G->g.nlit * sizeof G->g.lit[0]);
    if (info->attention) {
        /* one head count, k and v D wide as q is (the builders' Dkv) */
        z->dim[MLG_T] = z->dim[MLG_TKV] = info->T;
        z->dim[MLG_D] = z->dim[MLG_DKV] = info->D;
        z->dim[MLG_H] = z->dim[MLG_HKV] = info->H;
        z->dim[MLG_DH] = info->D / info->H;
        z->dim[MLG_DQ] = ml_mul(ch, info->H, z->dim[MLG_DH]);
        z->dim[MLG_QKV] = ml_add(ch, z->dim[MLG_DQ], ml_mul(ch, 2, info->D));
    }
    ml__ck_graph_dtype_bytes(ch, G);
    /* autocast's cast copies are not in the programs (the block rule), nor
     * an attention layer's forward (the builders flagged both bad) */
    G->programs = !ch->prec.autocast && !info->attention;
    return true;
}

/* The block's output, when the graph names it: saved, it is a boundary
 * tensor the replay releases, not a node (chain.h, ML_SV_OUTPUT); the
 * block's input itself (an identity block), the forward programs end
 * holding nothing new. Returns the bytes the programs end holding. */
static uint64_t output(ml_chain *ch, ml_cblock *b, const ml_ck_graph *G, const size_t *idx,
                       uint64_t out)
{
    const ml_graph *g = &G->g;
    if (g->out == MLG_NONE)
        return out;
    if (g->t[ml__graph_storage(g, g->out)].role == MLG_INPUT)
        return 0;
    const size_t k = idx[ml__graph_entry(g, g->out)];
    if (k != SIZE_MAX) {
        ch->saved[k].flags |= ML_SV_OUTPUT;
        ch->saved[k].node = ML_NODE_NONE;
        b->out_saved = true;
        b->saved_bytes -= ch->saved[k].bytes;
    }
    return out;
}

/* Where the inventory put each saved tensor: idx[e] its entry in
 * ch->saved (SIZE_MAX: the block's input, or none; a repeated tensor's:
 * the first instance's, instance i's `per` entries later), first[e] the op
 * that first saves it, whose node releases it. */
typedef struct {
    size_t idx[MLG_MAX_TENSORS];
    uint16_t first[MLG_MAX_TENSORS];
    size_t per;
    /* per op: its accumulation adds out of place (ml__ck_accum_shared), and
     * the bytes of the old sum its node frees, the last to hold it */
    bool oop[MLG_MAX_OPS];
    uint64_t carry[MLG_MAX_OPS];
    uint16_t incoming; /* ml__ck_accum_plan's answer */
} ml_entries;

/* The entries of the tensors [from, to) at bytes tb (saved[s]: storage s
 * is saved), in declaration order; each entry's index into x->idx when
 * keep. Returns the entries listed. */
static size_t list(ml_chain *ch, ml_cblock *b, const ml_graph *g, const uint64_t *tb,
                   const bool *saved, uint16_t from, uint16_t to, ml_entries *x, bool keep)
{
    uint64_t bytes[MLG_MAX_TENSORS] = {0};
    size_t n = 0;
    for (uint16_t s = 0; s < g->nt; s++) {
        const uint16_t e = ml__graph_entry(g, s);
        if (saved[s] && e >= from && e < to)
            bytes[e] = ml_add(ch, bytes[e], tb[s]);
    }
    for (uint16_t e = from; e < to; e++) {
        const mlg_tensor *t = &g->t[e];
        if (x->first[e] == MLG_NONE || (t->flags & MLG_T_SIDE))
            continue;
        if (t->role == MLG_INPUT) {
            ml__ck_save(ch, b, t->name, bytes[e], 1, ML_SV_INPUT);
            continue;
        }
        if (t->role == MLG_BATCH) {
            ml__ck_save(ch, b, t->name, bytes[e], 1, ML_SV_BATCH);
            continue;
        }
        const unsigned table = (t->table & MLG_TABLE_COS ? ML_SV_TABLE_COS : 0) |
                               (t->table & MLG_TABLE_SIN ? ML_SV_TABLE_SIN : 0) |
                               (t->table & MLG_TABLE_CIS ? ML_SV_TABLE_CIS : 0);
        const size_t k = ml__ck_save(ch, b, t->name, bytes[e], 1,
                                     (t->flags & MLG_T_CORE ? ML_SV_CORE : 0) |
                                         (t->flags & MLG_T_WCAST ? ML_SV_WCAST : 0) | table);
        n++;
        if (keep)
            x->idx[e] = k;
    }
    return n;
}

/* The saved inventory: one entry per saved storage, in the order the
 * graph declares them (a storage counted in another's entry adds its
 * bytes there); the repeated group's once per instance, at its sizes, where
 * the group is declared. Then the transients. */
static void inventory(ml_chain *ch, ml_cblock *b, const ml_ck_graph *G, ml_entries *x)
{
    const ml_graph *g = &G->g;
    const mlg_repeat *r = &g->rep;
    bool saved[MLG_MAX_TENSORS] = {false};
    for (uint16_t t = 0; t < g->nt; t++) {
        x->idx[t] = SIZE_MAX;
        x->first[t] = MLG_NONE;
    }
    for (uint16_t k = 0; k < g->nop; k++) {
        const mlg_op *o = &g->op[k];
        for (unsigned j = 0; j < o->nsave; j++) {
            uint16_t s = ml__graph_storage(g, o->save[j]), e = ml__graph_entry(g, s);
            if (x->first[e] == MLG_NONE)
                x->first[e] = k;
            saved[s] = true;
        }
    }
    list(ch, b, g, G->tb, saved, 0, r->t0, x, true);
    x->per = 0;
    if (r->t1 != r->t0) {
        uint64_t tb[MLG_MAX_TENSORS];
        ml_graph_sizes z = G->z;
        memcpy(tb, G->tb, g->nt * sizeof tb[0]);
        for (unsigned i = 0; i < z.nruns; i++)
            for (uint64_t c = 0; c < z.runs[i].count && !ch->overflow && !ch->nomem; c++) {
                ml__graph_instance_bytes(g, &z, z.runs[i].size, tb);
                const bool first = i == 0 && c == 0;
                const size_t n = list(ch, b, g, tb, saved, r->t0, r->t1, x, first);
                if (first)
                    x->per = n;
            }
        if (z.overflow)
            ch->overflow = true;
    }
    list(ch, b, g, G->tb, saved, r->t1, g->nt, x, true);
    for (uint16_t t = 0; t < g->nt; t++)
        if (g->t[t].flags & MLG_T_TMP)
            ml__ck_tmp(ch, G->tb[t], 1);
}

/* One op's backward node at bytes tb, after the accumulation its input
 * gradient goes into (forward order: ml__ck_end reverses the list); in the
 * repeated group, instance i's (off: i times its entries; last: the last
 * instance). */
typedef struct {
    const uint64_t *tb;
    size_t off;
    bool last;
} ml_instance;

static void node(ml_chain *ch, ml_cblock *b, const ml_ck_graph *G, uint16_t k, const ml_entries *x,
                 const ml_instance *in)
{
    const ml_graph *g = &G->g;
    const mlg_op *o = &g->op[k];
    const uint64_t *tb = in->tb;
    uint64_t gin = 0, gout = 0, pg = 0, pg_bias = 0;
    size_t rel[6] = {SIZE_MAX, SIZE_MAX, SIZE_MAX, SIZE_MAX, SIZE_MAX, SIZE_MAX};
    unsigned nrel = 0;
    for (unsigned j = 0; j < o->ngin; j++)
        gin = ml_add(ch, gin, tb[o->gin[j]]);
    for (unsigned j = 0; j < o->ngout; j++)
        gout = ml_add(ch, gout, tb[o->gout[j]]);
    for (unsigned j = 0; j < o->nparam; j++) {
        uint64_t n = ml__graph_numel(g, &G->z, o->param[j], &ch->overflow);
        pg_bias = ml_mul(ch, n, ch->prec.grad);
        pg = ml_add(ch, pg, pg_bias);
    }
    for (unsigned j = 0; j < o->nsave; j++) {
        uint16_t e = ml__graph_entry(g, o->save[j]);
        if (x->first[e] == k && x->idx[e] != SIZE_MAX && !(g->t[e].flags & MLG_T_KEPT))
            /* an op saves six at most */
            rel[nrel++] = x->idx[e] + (ml__graph_repeated_tensor(g, e) ? in->off : 0);
    }
    /* the input's gradient goes into its InputBuffer once the node that
     * makes it has run: the product's, or its input copy's */
    bool acc = o->accum != MLG_NONE && !(o->accum_but_last && in->last);
    const bool accum = acc;
    const uint16_t w = ch->prec.autocast ? ml__ck_autocast_weight(g, o) : MLG_NONE;
    const uint16_t c = w != MLG_NONE ? ml__ck_autocast_input(g, o) : MLG_NONE;
    if (acc && w == MLG_NONE) {
        ml__ck_accum_node(ch, b, g, o, tb, x->oop[k], k == x->incoming);
        acc = false;
    }
    if (w != MLG_NONE) {
        ml__ck_autocast_param_copies(ch, b, G, o, w, tb, &gin, &pg);
        if (acc && c != MLG_NONE) { /* (runs right after the input copy's node) */
            ml__ck_accum_node(ch, b, g, o, tb, x->oop[k], k == x->incoming);
            acc = false;
        }
        ml__ck_autocast_input_copy(ch, b, G, o, c, tb, &gin, accum);
    }
    if (acc)
        ml__ck_accum_node(ch, b, g, o, tb, x->oop[k], k == x->incoming);
    const bool frees_carry = x->carry[k] && !gout;
    ml__ck_node(ch, b, o->node, gin, pg, frees_carry ? x->carry[k] : gout, rel[0], rel[1]);
    ml_bnode *made = ml__ck_last_node(ch, b);
    if (made) {
        made->unpacks = o->nsave > 0;
        made->frees_carry = frees_carry;
        made->frees_table = o->table; /* (kept at one node: ml__chain_mark_tables) */
    }
    if (w != MLG_NONE)
        ml__ck_autocast_parts(ch, b, G, o, w, c, tb, acc);
    else
        ml__ck_node_parts(ml__ck_last_node(ch, b), g, o, tb, accum);
    /* MmBackward0 (a product without bias) makes its weight's gradient
     * first (its inputs in sorted order, mat2 before self), AddmmBackward0
     * its input's (mat1, mat2, then self: the bias) */
    ml_bnode *nn = ml__ck_last_node(ch, b);
    if (nn && w == MLG_NONE && ml__ck_mm_node(o))
        nn->pg_first = true;
    /* a weight's and its bias's gradients are two tensors (under autocast
     * each copy's ToCopyBackward0 makes its own) */
    if (nn && w == MLG_NONE && o->nparam == 2 && pg_bias < pg)
        nn->pg_bias = pg_bias;
    for (unsigned j = 2; j < nrel; j++)
        ml__ck_node_claim(ch, b, rel[j]);
    ml__ck_op_scratch(ch, b, G, o, tb, nn);
}

/* The repeated group's nodes, once per instance at its sizes. */
static void repeated_nodes(ml_chain *ch, ml_cblock *b, const ml_ck_graph *G, const ml_entries *x)
{
    const ml_graph *g = &G->g;
    uint64_t tb[MLG_MAX_TENSORS];
    ml_graph_sizes z = G->z;
    memcpy(tb, G->tb, g->nt * sizeof tb[0]);
    uint64_t left = 0;
    for (unsigned i = 0; i < z.nruns; i++)
        left += z.runs[i].count;
    ml_instance in = {tb, 0, false};
    for (unsigned i = 0; i < z.nruns; i++) {
        ml__graph_instance_bytes(g, &z, z.runs[i].size, tb);
        for (uint64_t c = 0; c < z.runs[i].count && !ch->overflow && !ch->nomem; c++) {
            in.last = --left == 0;
            for (uint16_t k = g->rep.o0; k < g->rep.o1; k++)
                if (g->op[k].node)
                    node(ch, b, G, k, x, &in);
            in.off += x->per;
        }
    }
}

/* One parameter tensor, rows (x cols); the graph's grad_view names it. */
static void param(ml_chain *ch, ml_cblock *b, const ml_ck_graph *G, const mlg_tensor *p)
{
    if (G->g.grad_view != MLG_NONE && p == &G->g.t[G->g.grad_view])
        b->grad_view_param = (uint32_t)ch->nparams + 1;
    ml__ck_param(ch, b, G->z.dim[p->dim[0]], p->ndim > 1 ? G->z.dim[p->dim[1]] : 0);
}

/* The parameters in the order their modules register them: by group, then as the ops
 * use them; a group of routed experts' parameters (MLG_T_EXPERT, nothing else in it)
 * once per expert, each expert's in turn (nn.ModuleList of the experts), in the order
 * they are declared (an expert module's registration order, which its forward need not
 * follow: Mixtral's w1, w2, w3). */
static void parameters(ml_chain *ch, ml_cblock *b, const ml_ck_graph *G)
{
    const ml_graph *g = &G->g;
    for (uint8_t grp = 0; grp < MLG_GROUPS; grp++) {
        bool experts = false;
        for (uint16_t t = 0; t < g->nt; t++)
            experts |= g->t[t].role == MLG_PARAMETER && g->t[t].group == grp &&
                       (g->t[t].flags & MLG_T_EXPERT);
        const uint64_t rounds = experts ? G->z.dim[MLG_EL] : 1;
        for (uint64_t r = 0; r < rounds && !ch->overflow && !ch->nomem; r++) {
            for (uint16_t t = 0; experts && t < g->nt; t++)
                if (g->t[t].role == MLG_PARAMETER && g->t[t].group == grp)
                    param(ch, b, G, &g->t[t]);
            for (uint16_t k = 0; !experts && k < g->nop; k++)
                for (unsigned j = 0; j < g->op[k].nparam; j++) {
                    const mlg_tensor *p = &g->t[g->op[k].param[j]];
                    if (p->group == grp && !(p->flags & MLG_T_SHARED))
                        param(ch, b, G, p);
                }
        }
    }
}

void ml__ck_graph_emit(ml_chain *ch, ml_cblock *b, const ml_ck_graph *G, uint64_t out)
{
    const ml_graph *g = &G->g;
    ml_entries x;
    inventory(ch, b, G, &x);
    x.incoming = ml__ck_accum_plan(g, G->tb, x.oop, x.carry);
    parameters(ch, b, G);
    const ml_instance whole = {G->tb, 0, false};
    for (uint16_t k = 0; k < g->nop; k++) {
        const mlg_op *o = &g->op[k];
        double f = ml__graph_op_flops(o, &G->z);
        b->flops_fwd += f;
        if (o->core)
            b->flops_core += f;
        /* the repeated group's FLOPs are its instances' together (graph.h) */
        if (k + 1 == g->rep.o1 && g->rep.o1 != g->rep.o0)
            repeated_nodes(ch, b, G, &x);
        else if (o->node && !ml__graph_repeated_op(g, k))
            node(ch, b, G, k, &x, &whole);
    }
    const uint64_t held = output(ch, b, G, x.idx, out);
    if (b->nnodes)
        b->hand_gid = ml__ck_hand_gid(g);
    ml__work_graph(ch, b, g, &G->z, G->tb);
    ml__ck_end(ch, b, out);
    ml__ep_dispatch(ch, b, G);
    /* a block-level backward (no node list): ring attention's buffers
     * beside the block rule's transient, once per fused attention */
    for (uint16_t k = 0; k < g->nop && !b->nnodes; k++)
        if (g->op[k].kind == MLG_OP_ATTENTION)
            b->ws_bwd = ml_add(ch, b->ws_bwd, ml__cp_ring_backward(ch, &G->z));
    if (!G->programs || ch->overflow)
        return;
    ml__ck_nograd(ch, b, g, G->tb, held);
    if (ch->selective)
        return;
    ml__ck_grad(ch, b, g, G->tb, held, x.idx);
}

void ml__ck_graph_repeat(ml_chain *ch, ml_cblock *b, size_t proto, size_t pfirst, size_t pcount)
{
    const ml_cblock *p = &ch->blocks[proto];
    ml_ptensor *pv = ml_grow_to(ch->params, ch->nparams + pcount, &ch->paramcap, sizeof *pv, 16);
    if (!pv) {
        ch->nomem = true;
        return;
    }
    ch->params = pv;
    char name[sizeof b->name];
    memcpy(name, b->name, sizeof name);
    const int ckpt = b->ckpt_index;
    *b = *p;
    memcpy(b->name, name, sizeof name);
    b->ckpt_index = ckpt;
    memcpy(&ch->params[ch->nparams], &ch->params[pfirst], pcount * sizeof *ch->params);
    ch->nparams += pcount;
    /* saved_first and node_first: the prototype's lists, shared (nothing
     * changes a block's lists once it is closed), as ml__ck_end shares equal
     * node lists of successive blocks */
}
