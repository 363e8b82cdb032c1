/* Tensor parallelism (docs/parallel.md): one rank's share of a decoder.
 *
 * Megatron-LM's column-parallel linears (q, k, v, the MLP's gate and up,
 * the LM head) split their output features over the tp ranks, its
 * row-parallel ones (the attention's output, the MLP's down) their input
 * features, and its vocab-parallel embedding the vocabulary
 * (megatron/core/tensor_parallel/layers.py). A rank therefore runs the
 * same layer with heads / tp query heads, kv_heads / tp key/value heads,
 * ffn / tp MLP features and a vocab / tp slice of the vocabulary: the
 * chain of one rank is the chain of that narrower model, with the hidden
 * size and the head size unchanged. Sequence parallelism then shards
 * what runs outside the split region (norms, dropouts, residual adds)
 * over the tokens (ml__graph_shard_sequence). */
#include <string.h>

#include "ledger/chain.h"
#include "util/error.h"

static uint64_t tp_of(const ml_training *t)
{
    return t->tensor_parallel > 1 ? t->tensor_parallel : 1;
}

static ml_status indivisible(const ml_model *m, const char *what, const char *key, uint64_t n,
                             uint64_t tp, ml_error *err)
{
    return ml__errorf(err, ML_RANGE,
                      "parallel.tp: %llu does not divide %s's %s (%s %llu): each rank holds an "
                      "equal share; use a tp that divides %llu",
                      (unsigned long long)tp, m->name, what, key, (unsigned long long)n,
                      (unsigned long long)n);
}

/* What of the model and the settings one rank's plan cannot express. */
static const char *unsplit_layout(const ml_model *m, const ml_training *t)
{
    if (m->type != ML_MODEL_DECODER || m->vision.layers || m->embed.image_size)
        return "it is planned for decoder language models (type: decoder)";
    if (m->moe.experts && !ml_training_sp(t))
        return "Megatron-core's MoE layer refuses tensor parallelism without sequence "
               "parallelism in training (megatron/core/transformer/moe/moe_layer.py); keep "
               "sequence parallelism on, the default with tensor parallelism";
    if (m->attn.kv_lora)
        return "multi-head latent attention's compressed projections are not split yet "
               "(DeepSeek's experts split over ranks with parallel.ep instead)";
    if (m->head.classes)
        return "a sequence-classification head is not split yet";
    if (t->logits == ML_LOGITS_FUSED)
        return "the fused linear-cross-entropy (logits: fused) has no vocab-parallel form "
               "planned; use logits kept or released";
    return NULL;
}

ml_status ml__tp_refused(const ml_model *m, const ml_training *t, ml_error *err)
{
    const uint64_t tp = tp_of(t);
    if (tp == 1) {
        if (t->sequence_parallel == ML_SP_ON)
            return ml__errorf(err, ML_RANGE,
                              "parallel.sp: sequence parallelism shards what tensor "
                              "parallelism replicates; it needs parallel.tp above 1");
        return ML_OK;
    }
    const char *why = unsplit_layout(m, t);
    if (why)
        return ml__errorf(err, ML_RANGE, "parallel.tp: %llu with %s: %s",
                          (unsigned long long)tp, m->name, why);
    if (m->attn.heads % tp)
        return indivisible(m, "query heads", "model.heads", m->attn.heads, tp, err);
    if (m->attn.kv_heads % tp)
        return indivisible(m, "key/value heads", "model.kv_heads", m->attn.kv_heads, tp, err);
    /* a mixture of experts' routed experts are split by etp
     * (expert_parallel.c), its shared experts by tp */
    if (!m->moe.experts && m->mlp.ffn % tp)
        return indivisible(m, "MLP width", "model.ffn", m->mlp.ffn, tp, err);
    if (m->moe.shared_ffn % tp)
        return indivisible(m, "shared experts' width", "model.shared_expert_ffn",
                           m->moe.shared_ffn, tp, err);
    /* a sequence that tp does not divide: Megatron asks the data for
     * lengths it divides (padding); the plan is the fullest rank's,
     * ceil(T / tp) tokens (ml__graph_numel) */
    return ML_OK;
}

const ml_model *ml__rank_model(const ml_model *m, const ml_config *cfg, ml_model *rank)
{
    const ml_training *t = &cfg->training;
    const uint64_t tp = tp_of(t);
    const uint64_t etp = m->moe.experts ? ml_training_etp(t) : 1;
    if (tp == 1 && etp == 1 && t->engine != ML_ENGINE_MEGATRON)
        return m;
    *rank = *m;
    rank->attn.fused_softmax = t->engine == ML_ENGINE_MEGATRON;
    /* Megatron's cross-entropy: its engine's loss, and the only loss of
     * logits split over the vocabulary (F.cross_entropy would take a
     * rank's slice for the whole vocabulary); eager PyTorch's loop holds
     * the targets in its batch, which that loss does not save */
    rank->head.vocab_parallel_ce = t->engine == ML_ENGINE_MEGATRON || tp > 1;
    rank->head.targets_held = tp > 1 && t->engine != ML_ENGINE_MEGATRON;
    /* a routed expert's width over the expert-tensor ranks (Megatron's
     * experts.py: fc1 column-, fc2 row-parallel over expt_tp) */
    if (etp > 1)
        rank->moe.expert_ffn = (m->moe.expert_ffn ? m->moe.expert_ffn : m->mlp.ffn) / etp;
    if (tp == 1)
        return rank;
    /* the head size stays the full model's */
    rank->attn.head_dim = m->attn.head_dim ? m->attn.head_dim : m->hidden / m->attn.heads;
    rank->attn.heads = m->attn.heads / tp;
    rank->attn.kv_heads = m->attn.kv_heads / tp;
    rank->mlp.ffn = m->mlp.ffn / tp;
    if (m->moe.experts && !m->moe.expert_ffn && etp == 1) /* the experts keep their width */
        rank->moe.expert_ffn = m->mlp.ffn;
    rank->moe.shared_ffn = m->moe.shared_ffn / tp;
    /* an uneven vocabulary: the first ranks hold one row more (the plan is
     * the fullest rank's) */
    rank->embed.vocab = (m->embed.vocab + tp - 1) / tp;
    rank->embed.vocab_parallel = true;
    return rank;
}

void ml__chain_layers(const ml_chain *ch, const int *seg, bool moe, double *layers,
                      double *recomputed)
{
    *layers = *recomputed = 0;
    for (size_t k = 0; k < ch->n; k++)
        if (ch->blocks[k].ckpt_index >= 0 && (!moe || ch->blocks[k].moe)) {
            *layers += 1;
            *recomputed += seg && seg[k] >= 0 ? 1 : 0;
        }
}

/* Whether the chain has the embedding and the head (a pipeline stage may
 * have neither). */
static void ends(const ml_chain *ch, bool *embedding, bool *head)
{
    *embedding = *head = false;
    for (size_t k = 0; k < ch->n; k++) {
        *embedding |= !strcmp(ch->blocks[k].name, "embedding");
        *head |= !strcmp(ch->blocks[k].name, "head");
    }
}

double ml__tp_communication(const ml_chain *ch, const ml_training *t, const int *seg,
                            double *allreduces, double *halves)
{
    const uint64_t tp = tp_of(t);
    *allreduces = *halves = 0;
    if (tp == 1)
        return 0;
    /* S: one all-reduce's, all-gather's or reduce-scatter's whole buffer
     * (B x T x D in the compute dtype); a ring sends (tp - 1) / tp of it,
     * all-reduce twice that */
    const double f = (double)(tp - 1) / (double)tp;
    const double S = (double)ch->B * (double)ch->T * (double)ch->c_width * ch->prec.a;
    double L, R;
    bool has_embedding, has_head;
    ml__chain_layers(ch, seg, false, &L, &R);
    ends(ch, &has_embedding, &has_head);
    /* per layer: two column-parallel sites (the attention's input, the
     * MLP's) and two row-parallel ones (their outputs). Without sequence
     * parallelism an all-reduce at each row site in forward and at each
     * column site in backward: 4 x 2S. With it: forward all-gathers at the
     * column sites and reduce-scatters at the row sites; backward the
     * column sites gather their saved shard again and reduce-scatter the
     * input's gradient, the row sites gather the output's gradient:
     * 6 all-gathers and 4 reduce-scatters, 10S. A recomputed layer runs
     * its forward's again (2 x 2S, or 2 + 2). Half of each per part: a
     * mixture of experts' layer has the attention's, and a shared
     * expert's (ch->tp_parts). The embedding: an all-reduce
     * of its output (sp: a reduce-scatter, and an all-gather of the
     * gradient); the head: an all-reduce of its input's gradient (sp: its
     * input gathered, then gathered again and the gradient
     * reduce-scattered); the vocab-parallel cross-entropy: three
     * all-reduces of B x T fp32 figures (the rows' maxima, the target
     * logits, the sums of exponentials). */
    const bool sp = ml_training_sp(t);
    const double parts = (double)(ch->tp_parts ? ch->tp_parts : 2) / 2;
    const double layer = (sp ? 10 : 8) * parts, recompute = 4 * parts;
    const double embed = has_embedding ? 2 : 0, head = has_head ? (sp ? 3 : 2) : 0;
    const double loss = has_head ? 3.0 * 2.0 * (double)ch->B * (double)ch->T * 4.0 : 0;
    const double per_micro = f * (S * (layer * L + recompute * R + embed + head) + loss);
    const double A = (double)(t->grad_accum ? t->grad_accum : 1);
    /* the calls: with SP 6 + 4 a layer, 2 + 2 recomputed, the embedding's 2,
     * the head's 3, gathers and reduce-scatters; without, 4 all-reduces a
     * layer, 2 recomputed, 1 each for the embedding and the head; the
     * loss's 3 all-reduces either way */
    const double sites = sp ? parts * (10 * L + 4 * R) + embed + head
                            : parts * (4 * L + 2 * R) + (has_embedding ? 1 : 0) +
                                  (has_head ? 1 : 0);
    *(sp ? halves : allreduces) = A * sites;
    *allreduces += A * (has_head ? 3 : 0);
    return per_micro * A;
}

ml_status ml__split_calib_refused(const ml_config *cfg, ml_error *err)
{
    const ml_training *t = &cfg->training;
    if (!cfg->calib || (t->tensor_parallel <= 1 && t->pipeline_parallel <= 1))
        return ML_OK;
    return ml__errorf(err, ML_RANGE,
                      "parallel.%s: a calibration profile (--calib) measured whole layers on "
                      "one device; plan a split model without it",
                      t->tensor_parallel > 1 ? "tp" : "pp");
}

ml_status ml__engine_refused(const ml_model *m, const ml_training *t, ml_error *err)
{
    if (t->engine != ML_ENGINE_MEGATRON)
        return ML_OK;
    if (m->attn.kernel != ML_ATTN_EAGER)
        return ml__errorf(err, ML_RANGE,
                          "training.engine: megatron plans its unfused attention with the fused "
                          "masked softmax; %s's attention is %s (its flash path is not modelled): "
                          "use --attention eager",
                          m->name, m->attn.kernel == ML_ATTN_SDPA ? "sdpa" : "flash");
    if (m->type != ML_MODEL_DECODER || m->vision.layers || m->norms.kind != ML_NORM_LAYERNORM ||
        !m->residual.prenorm || m->residual.parallel || m->moe.experts || m->attn.kv_lora ||
        m->embed.image_size)
        return ml__errorf(err, ML_RANGE,
                          "training.engine: megatron plans Megatron-core's GPT layer (pre-norm "
                          "LayerNorm, unfused attention with its fused masked softmax); %s's "
                          "layout is another: use engine eager",
                          m->name);
    if (t->precision != ML_PREC_BF16_MASTER && t->precision != ML_PREC_FP16_MASTER)
        return ml__errorf(err, ML_RANGE,
                          "training.engine: megatron trains a bf16 or fp16 model with fp32 "
                          "master weights (--bf16, --fp16): use precision bf16-master or "
                          "fp16-master");
    if (t->zero_grad != ML_ZERO_GRAD_ZERO)
        return ml__errorf(err, ML_RANGE,
                          "training.zero_grad: set_to_none with engine megatron, whose fp32 "
                          "gradient buffer lives all iteration (zeroed, never freed): use "
                          "zero_grad zero");
    return ML_OK;
}
