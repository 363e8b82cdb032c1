/* Builds the chain of blocks (chain.h): the family's builder
 * (chain_transformer.c, chain_sequential.c), then a calibration profile's
 * measured inventories, then the overflow and out-of-memory checks. */
#include <math.h>
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "ledger/chain_kit.h"
#include "ledger/dist_optimizer.h"
#include "memledger/calib.h"
#include "util/error.h"

/* A block's inventory from profile kind k at the chain's shape (x = B*T*D
 * times the dtype's bytes): the profile's fit (its B*H*T^2 and T^2 terms
 * included), or, from points measured at this model's T, D and H, the exact
 * per-sample bytes: a straight line in B through them (ch->calib_exact). */
static double profile_inventory(ml_chain *ch, const ml_profile_kind *k, uint64_t heads, double x)
{
    double inv = ml_profile_kind_saved(k, ch->B, ch->T, ch->c_width, heads, ch->prec.a);
    double *qx = malloc((k->npoints ? k->npoints : 1) * sizeof *qx);
    double *qy = malloc((k->npoints ? k->npoints : 1) * sizeof *qy);
    size_t npt = 0;
    for (size_t j = 0; qx && qy && j < k->npoints; j++) {
        const ml_profile_point *q = &k->points[j];
        if (q->T != ch->T || q->D != ch->c_width || (q->H && q->H != heads))
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
    return inv;
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
    bool llama = m->norms.kind == ML_NORM_RMSNORM;
    const ml_profile_kind_id kid = llama ? ML_PK_LLAMA_BLOCK : ML_PK_TRANSFORMER_BLOCK;
    const ml_profile_kind *k = ml_profile_find(p, ml_profile_kind_name(kid));
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
    if (ml__ck_fused_attention(ch->prec.a, m)) {
        ch->calib_note = "the model's attention runs a fused kernel (flash, or sdpa as "
                         "dispatched), the runner's eager";
        return;
    }
    /* the runner's blocks have D/H-wide heads: a model whose head size
     * differs (head_dim) has other projection and attention shapes */
    if (m->attn.head_dim && m->attn.head_dim * m->attn.heads != m->hidden) {
        ch->calib_note = "the model's head size (head_dim) is not hidden/heads, the "
                         "runner's blocks' is";
        return;
    }
    /* c holds the MLP's B*T*F terms at the measured F/D: another ratio
     * (Llama-2's 11008/4096 against the runner's 704/256) would carry them
     * over wrongly */
    for (size_t j = 0; j < k->npoints; j++) {
        const ml_profile_point *q = &k->points[j];
        if (q->F && (double)q->F * (double)ch->c_width != (double)m->mlp.ffn * (double)q->D) {
            ch->calib_note = "the profile's blocks were measured at another ffn/hidden ratio "
                             "(re-measure at the model's ffn width: docs/calibration.md)";
            return;
        }
    }
    /* the profile's fit at this shape (its B*H*T^2 and T^2 terms included),
     * or the exact one through the points measured at this shape */
    double x = (double)ch->c_tokens * (double)ch->c_width * (double)ch->prec.a;
    double inv = profile_inventory(ch, k, m->attn.heads, x);
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
        const uint64_t graph_saved = b->saved_bytes;
        b->saved_bytes = (uint64_t)llround(saved);
        b->core_bytes = (uint64_t)llround(act * share);
        b->measured = true;
        ch->calibrated++;
        /* the blocks' c as the table prints it: the measured bytes (input
         * included) and the ledger's weight copies */
        ch->calib_c = x > 0 ? (inv + (double)b->cast_bytes) / x : 0;
        /* where the profile measured the inventory the graph lists, the
         * graph's tensors stand: its forward's steps, its transients and
         * its backward's nodes (allocator.md, "On the plan") */
        if (b->saved_bytes == graph_saved)
            continue;
        b->gstep_first = b->ngsteps = b->gstep_out = 0;
        b->nnodes = 0; /* (a list another block shares stays in ch->nodes) */
        /* the forward program's ws_fwd is what stays beside the ledger's
         * inventory (docs/ledger.md, "The forward, op by op"): another
         * one gets the block rule */
        b->ws_fwd = ml_mul(ch, 2, b->unit_fwd);
        b->ws_fwd_ops = false;
    }
}

/* Sizes the arrays once: a transformer block lists at most ~24 saved
 * tensors and ~16 parameter tensors, a sequential entry a handful per layer. */
static void reserve(ml_chain *ch, const ml_model *m)
{
    size_t n = m->type == ML_MODEL_SEQUENTIAL
                   ? m->nseq
                   : (size_t)(m->layers + m->t5.dec_layers + m->vision.layers + 2);
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

/* logits: fused is the fused linear cross-entropy of a language model's
 * head, as modelled (docs/ledger.md, "The loop's references"). */
static ml_status fused_refused(const ml_model *m, const ml_training *t, ml_error *err)
{
    const ml_prec prec = ml__prec_of(t->precision), *p = &prec;
    if (t->logits != ML_LOGITS_FUSED)
        return ML_OK;
    if (m->type == ML_MODEL_ENCDEC)
        return ml__errorf(err, ML_RANGE,
                          "training.logits: fused is planned for a decoder's LM head; an "
                          "encoder-decoder's (T5's) is not modelled: use kept or released");
    if (m->type != ML_MODEL_DECODER || m->head.classes)
        return ml__errorf(err, ML_RANGE,
                          "training.logits: fused is a language model's head (a decoder's LM "
                          "head and cross-entropy); this model's loss is another: use kept or "
                          "released");
    if (p->autocast)
        return ml__errorf(err, ML_RANGE,
                          "training.logits: fused is modelled without autocast (fp32, bf16, "
                          "bf16-master, fp16-master); under %s its products' dtypes are not: "
                          "use kept or released, or another precision",
                          ml_precision_name(t->precision));
    if (m->head.final_softcap > 0)
        return ml__errorf(err, ML_RANGE,
                          "training.logits: fused with the model's final_softcap (Gemma 2's "
                          "soft-capped logits) is not modelled: use kept or released");
    if (t->zero >= 2)
        return ml__errorf(err, ML_RANGE,
                          "training.logits: fused with training.zero %u (sharded gradients) is "
                          "not modelled: use zero 0 or 1, or logits kept or released",
                          t->zero);
    return ML_OK;
}

ml_status ml__chain_refused(const ml_model *m, const ml_training *t, ml_error *err)
{
    ml_status st = fused_refused(m, t, err);
    if (!st)
        st = ml__tp_refused(m, t, err);
    if (!st)
        st = ml__cp_refused(m, t, err);
    if (!st)
        st = ml__ep_refused(m, t, err);
    if (!st)
        st = ml__pp_refused(m, t, err);
    if (!st)
        st = ml__engine_refused(m, t, err);
    if (!st)
        st = ml__dp_sharding_refused(t, err);
    if (st)
        return st;
    /* OLMo's norm exists in the op graph only: a model whose layers the
     * chain builders write cannot have it (the model file refuses it at
     * its key; this holds for models made otherwise) */
    if (m->norms.kind == ML_NORM_OLMO_LAYERNORM &&
        (m->type != ML_MODEL_DECODER || m->vision.layers || m->moe.experts || m->attn.kv_lora ||
         m->residual.parallel || m->head.classes || !m->residual.prenorm))
        return ml__errorf(err, ML_RANGE,
                          "model.norm: olmo_layernorm is planned in OLMo's decoder layer only; "
                          "%s's layout is another: use rmsnorm or layernorm",
                          m->name);
    /* the optimal solver's chain is one stream of layers: T5's side
     * tensors (docs/ledger.md) and its non-layer blocks between the
     * stacks are not in it */
    if ((m->type == ML_MODEL_ENCDEC || m->vision.layers) && t->checkpoint.kind == ML_CKPT_OPTIMAL)
        return ml__errorf(err, ML_RANGE,
                          "training.checkpoint: optimal is not planned for %s (%s): use full "
                          "(what Hugging Face's gradient checkpointing runs), every-K, sqrt or "
                          "a list of blocks",
                          m->vision.layers ? "a multimodal model" : "an encoder-decoder", m->name);
    const ml_checkpoint *cp = &t->checkpoint;
    uint32_t low = UINT32_MAX; /* the lowest block a list names */
    for (uint32_t j = 0; (cp->kind == ML_CKPT_LIST || cp->kind == ML_CKPT_SEGMENTS) &&
                         j < cp->count && j < ML_CKPT_LIST_MAX;
         j++)
        low = cp->blocks[j] < low ? cp->blocks[j] : low;
    if (m->vision.layers && (t->vision_tower == ML_VT_NONE || t->vision_tower == ML_VT_FULL) &&
        low < m->vision.used)
        return ml__errorf(err, ML_RANGE,
                          "training.checkpoint: block %u is a vision layer (0 to %llu), whose "
                          "checkpointing training.vision_tower: %s sets; list the decoder's "
                          "layers only (from %llu), or use vision_tower: same",
                          low, (unsigned long long)m->vision.used - 1,
                          ml_vision_tower_name(t->vision_tower),
                          (unsigned long long)m->vision.used);
    if (!m->vision.layers && t->vision_tower != ML_VT_SAME)
        return ml__errorf(err, ML_RANGE,
                          "training.vision_tower: a multimodal model's setting; %s has no "
                          "vision tower: remove it",
                          m->name);
    if (m->type != ML_MODEL_ENCDEC && t->target_len)
        return ml__errorf(err, ML_RANGE,
                          "training.target_len: the decoder's length of an encoder-decoder; %s "
                          "has one sequence (training.seq_len): remove it",
                          m->name);
    return ML_OK;
}

/* The model's rotary tables (its cos and its sin) are saved by every
 * layer's rotary products and released by the last of them to run: the
 * first rotary layer's last product by each in its backward (the engine
 * runs the layers last to first, and within one the nodes as listed).
 * The graph marks every product (mlg_op.table); each list (identical
 * layers share one) keeps the mark at its last node for each table, and
 * the replay acts on the first layer's (tables_at). */
void ml__chain_mark_tables(ml_chain *ch)
{
    ch->tables_at = 0;
    for (size_t k = 0; k < ch->n; k++) {
        if (!ch->blocks[k].nnodes)
            continue; /* (a chain without node lists has no array) */
        ml_bnode *nd = &ch->nodes[ch->blocks[k].node_first];
        unsigned seen = 0;
        for (size_t j = ch->blocks[k].nnodes; j-- > 0;) {
            const unsigned t = nd[j].frees_table;
            nd[j].frees_table = (uint8_t)(t & ~seen);
            seen |= t;
        }
        if (seen && !ch->tables_at && k < UINT32_MAX)
            ch->tables_at = (uint32_t)k + 1;
    }
}

static ml_status build(const ml_model *m, const ml_config *cfg, bool eval, ml_chain *ch,
                       ml_error *err)
{
    memset(ch, 0, sizeof *ch);
    ch->eval_mode = eval;
    ch->selective = cfg->training.checkpoint.kind == ML_CKPT_SELECTIVE;
    ml_status refused = ml__chain_refused(m, &cfg->training, err);
    if (!refused)
        refused = ml__split_calib_refused(cfg, err);
    if (refused)
        return refused;
    ml_model rank;
    m = ml__rank_model(m, cfg, &rank);
    if (cfg->training.expert_imbalance > 1 && !m->moe.experts)
        return ml__errorf(err, ML_RANGE,
                          "training.expert_imbalance: sizes a mixture of experts' busiest "
                          "expert; %s has no experts (model.experts): remove it",
                          m->name);
    /* multi-head latent attention's sdpa, with q/k heads wider than the
     * value heads, dispatches to kernels whose saved tensors are not
     * modelled (docs/inventory.md, "DeepSeek-V3 block") */
    if (m->attn.kv_lora && m->attn.kernel != ML_ATTN_EAGER)
        return ml__errorf(err, ML_RANGE,
                          "attention %s with multi-head latent attention (model.kv_lora_rank) "
                          "is not modelled: its q/k heads are wider than its value heads, "
                          "which sdpa and flash kernels handle in ways not planned; use "
                          "--attention eager",
                          m->attn.kernel == ML_ATTN_SDPA ? "sdpa" : "flash");
    reserve(ch, m);
    ch->prec = ml__prec_of(cfg->training.precision);
    /* Megatron accumulates and all-reduces gradients in fp32 (arguments.py
     * sets accumulate_allreduce_grads_in_fp32 with --bf16): main_grad */
    if (cfg->training.engine == ML_ENGINE_MEGATRON)
        ch->prec.grad = 4;
    ml_status st = m->type == ML_MODEL_SEQUENTIAL ? ml__chain_build_sequential(m, cfg, ch, err)
                   : m->type == ML_MODEL_ENCDEC   ? ml__chain_build_t5(m, cfg, ch, err)
                   : m->vision.layers             ? ml__chain_build_llava(m, cfg, ch, err)
                                                  : ml__chain_build_transformer(m, cfg, ch, err);
    /* the runner's blocks are GPT-2's and Llama's: a Gemma block's norm and
     * MLP keep other tensors (docs/inventory.md), so no profile applies */
    if (st == ML_OK && cfg->calib && m->norms.kind == ML_NORM_GEMMA_RMSNORM)
        ch->calib_note = "the runner measures no Gemma blocks ((1 + weight) RMSNorm, GeGLU)";
    else if (st == ML_OK && cfg->calib && m->type == ML_MODEL_ENCDEC)
        ch->calib_note = "the runner measures no encoder-decoder (T5) blocks";
    else if (st == ML_OK && cfg->calib && m->vision.layers)
        ch->calib_note = "the runner measures no vision-tower (CLIP) blocks";
    else if (st == ML_OK && cfg->calib && m->norms.kind == ML_NORM_OLMO_LAYERNORM)
        ch->calib_note = "the runner measures no OLMo blocks (its LayerNorm without weight)";
    else if (st == ML_OK && cfg->calib && (m->attn.kv_lora || m->moe.experts))
        ch->calib_note = "the runner measures no mixture-of-experts or latent-attention blocks";
    else if (st == ML_OK && cfg->calib && m->type != ML_MODEL_SEQUENTIAL)
        apply_profile(ch, cfg->calib, m, cfg->training.precision);
    if (st == ML_OK && ch->n > 0) {
        /* the model's input is the batch the loop holds all iteration, not
         * a boundary the first block's backward frees */
        ch->batch_input = ml_add(ch, ch->batch_input, ch->blocks[0].in_bytes);
        ch->blocks[0].in_bytes = 0;
        ch->buffer_bytes = ml_add(ch, ch->buffer_bytes, m->buffers); /* declared */
    }
    if (st == ML_OK) {
        ml__chain_mark_tables(ch);
        ml__chain_mark_runs(ch);
        ch->psum = ml__param_sums(ch);
    }
    if (st == ML_OK && ch->nomem)
        st = ML_NOMEM;
    if (st == ML_OK && ch->overflow) {
        st = ml__errorf(err, ML_OVERFLOW,
                        "byte counts exceed 64 bits for training.micro_batch %llu x "
                        "training.seq_len %llu%s%.0llu: use smaller values",
                        (unsigned long long)cfg->training.micro_batch,
                        (unsigned long long)cfg->training.seq_len,
                        ml_model_target_len(m, &cfg->training) ? " x training.target_len " : "",
                        (unsigned long long)ml_model_target_len(m, &cfg->training));
    }
    if (st == ML_NOMEM)
        ml__errorf(err, ML_NOMEM, "out of memory");
    if (st)
        ml__chain_free(ch);
    return st;
}

ml_param_sums ml__param_sums(ml_chain *ch)
{
    ml_param_sums p = ch->psum;
    if (!p.known) {
        ml_chain ov; /* the sums' own overflow flag */
        ov.overflow = false;
        memset(&p, 0, sizeof p);
        for (size_t i = 0; i < ch->nparams; i++) {
            const ml_ptensor *t = &ch->params[i];
            p.all = ml_add(&ov, p.all, t->numel);
            p.trained = t->frozen ? p.trained : ml_add(&ov, p.trained, t->numel);
            p.with_grad = t->frozen || t->nograd ? p.with_grad : ml_add(&ov, p.with_grad, t->numel);
        }
        p.overflow = ov.overflow;
        p.known = true;
    }
    if (p.overflow)
        ch->overflow = true;
    return p;
}

/* A key's bytes: the configuration's but the checkpoint's list and the
 * pipeline's layers (1 KiB each, in no key: their lengths and the policy's
 * kind are), as [from, to) ranges; ml__chain_key writes only these. */
static const size_t key_ranges[3][2] = {
    {0, offsetof(ml_config, training.checkpoint.blocks)},
    {offsetof(ml_config, training.checkpoint.blocks) + sizeof(uint32_t) * ML_CKPT_LIST_MAX,
     offsetof(ml_config, training.pp_layers)},
    {offsetof(ml_config, training.pp_layers) + sizeof(uint32_t) * ML_PP_MAX_STAGES,
     sizeof(ml_config)},
};

_Static_assert(sizeof((ml_config *)0)->training.checkpoint.blocks ==
                   sizeof(uint32_t) * ML_CKPT_LIST_MAX &&
               sizeof((ml_config *)0)->training.pp_layers == sizeof(uint32_t) * ML_PP_MAX_STAGES,
               "key_ranges: the two lists' sizes");

void ml__chain_key(const ml_config *cfg, ml_config *key)
{
    for (size_t i = 0; i < 3; i++)
        memcpy((char *)key + key_ranges[i][0], (const char *)cfg + key_ranges[i][0],
               key_ranges[i][1] - key_ranges[i][0]);
    /* the device, the profile and any padding after the training section */
    memset((char *)key + offsetof(ml_config, device), 0, sizeof *key - offsetof(ml_config, device));
    key->calib = cfg->calib;
    key->training.micro_batch = 0;
    /* what only the evaluation reads (ml__chain_refused has checked them):
     * the accumulation, data parallelism, the pipeline (its stages are
     * sliced from the whole chain, pipeline.c) */
    key->training.grad_accum = 0;
    key->training.data_parallel = 0;
    key->training.pipeline_parallel = 0;
    key->training.virtual_stages = 0;
    key->training.pp_schedule = ML_PP_1F1B;
    key->training.npp_layers = 0;
    ml__chain_policy(&key->training.checkpoint);
}

void ml__chain_policy(ml_checkpoint *c)
{
    c->kind = c->kind == ML_CKPT_SELECTIVE ? ML_CKPT_SELECTIVE : ML_CKPT_NONE;
    c->every = c->count = 0;
}

bool ml__chain_key_equal(const ml_config *a, const ml_config *b)
{
    for (size_t i = 0; i < 3; i++)
        if (memcmp((const char *)a + key_ranges[i][0], (const char *)b + key_ranges[i][0],
                   key_ranges[i][1] - key_ranges[i][0]))
            return false;
    return true;
}

ml_status ml__chain_build(const ml_model *m, const ml_config *cfg, ml_chain *ch, ml_error *err)
{
    return build(m, cfg, false, ch, err);
}

ml_status ml__chain_build_eval(const ml_model *m, const ml_config *cfg, ml_chain *ch,
                               ml_error *err)
{
    return build(m, cfg, true, ch, err);
}

void ml__chain_free(ml_chain *ch)
{
    free(ch->blocks);
    free(ch->saved);
    free(ch->params);
    free(ch->nodes);
    free(ch->sides);
    free(ch->work);
    free(ch->fsteps);
    memset(ch, 0, sizeof *ch);
}
