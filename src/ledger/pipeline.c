/* Pipeline parallelism (docs/parallel.md): each stage's plan.
 *
 * A stage runs a slice of the model's chain: the embedding on the first,
 * its layers, the head and the loss on the last. Between stages a
 * micro-batch's activation goes forward and its gradient back: a stage
 * holds the input it received until that micro-batch's backward (its
 * gradient is sent then), and frees its own output once sent, keeping only
 * its autograd graph (Megatron-LM's deallocate_pipeline_outputs, which
 * megatron/training/arguments.py turns on; schedules.py
 * deallocate_output_tensor). One micro-batch's replay of the slice is the
 * stage's forward and backward; the schedule decides how many other
 * micro-batches' activations the stage holds meanwhile (ml__pp_in_flight),
 * resident beside it while the micro-batches run. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ledger/chain.h"
#include "ledger/chain_kit.h" /* ml__ck_inv_freq_bytes */
#include "util/error.h"

static uint64_t pp_of(const ml_training *t)
{
    return t->pipeline_parallel > 1 ? t->pipeline_parallel : 1;
}

static uint64_t vpp_of(const ml_training *t)
{
    return t->virtual_stages > 1 ? t->virtual_stages : 1;
}

/* What a pipeline of m's layers under t cannot plan: NULL, or why. */
static const char *unstaged(const ml_model *m, const ml_training *t)
{
    if (m->type != ML_MODEL_DECODER || m->vision.layers || m->embed.image_size)
        return "it is planned for decoder language models (type: decoder)";
    if (t->eval_batch)
        return "an evaluation pass (training.eval_batch) is not staged yet: remove it";
    if (t->checkpoint.kind == ML_CKPT_LIST || t->checkpoint.kind == ML_CKPT_SEGMENTS ||
        t->checkpoint.kind == ML_CKPT_OPTIMAL)
        return "a checkpoint list, segments or optimal are not staged yet: use none, full, "
               "every-K, sqrt or selective (each stage's own layers)";
    return NULL;
}

static ml_status stage_split(const ml_model *m, const ml_training *t, ml_error *err)
{
    const uint64_t p = pp_of(t), v = vpp_of(t), L = m->layers;
    if (t->npp_layers) {
        if (v > 1)
            return ml__errorf(err, ML_RANGE, "parallel.pp_layers: an uneven split is not "
                                             "planned with virtual stages (parallel.vpp %llu)",
                              (unsigned long long)v);
        if (t->npp_layers != p)
            return ml__errorf(err, ML_RANGE,
                              "parallel.pp_layers: %u stages listed for parallel.pp %llu: list "
                              "each stage's layers",
                              t->npp_layers, (unsigned long long)p);
        uint64_t sum = 0;
        for (uint32_t i = 0; i < t->npp_layers; i++)
            sum += t->pp_layers[i];
        if (sum != L)
            return ml__errorf(err, ML_RANGE,
                              "parallel.pp_layers: the stages hold %llu layers, %s has %llu: "
                              "list each stage's so that they add up",
                              (unsigned long long)sum, m->name, (unsigned long long)L);
        return ML_OK;
    }
    if (L % (p * v) && v > 1)
        return ml__errorf(err, ML_RANGE,
                          "parallel.vpp: %llu stages of %llu virtual stages each do not split "
                          "%s's %llu layers evenly: use a pp x vpp that divides %llu",
                          (unsigned long long)p, (unsigned long long)v, m->name,
                          (unsigned long long)L, (unsigned long long)L);
    if (L % p)
        return ml__errorf(err, ML_RANGE,
                          "parallel.pp: %llu stages do not split %s's %llu layers evenly: "
                          "give each stage's layers (parallel.pp_layers, %llu counts adding "
                          "up to %llu)",
                          (unsigned long long)p, m->name, (unsigned long long)L,
                          (unsigned long long)p, (unsigned long long)L);
    return ML_OK;
}

ml_status ml__pp_refused(const ml_model *m, const ml_training *t, ml_error *err)
{
    const uint64_t p = pp_of(t), v = vpp_of(t);
    if ((unsigned)t->pp_schedule >= ML_PP_COUNT)
        return ml__errorf(err, ML_RANGE, "parallel.pp_schedule: unknown; use 1f1b, gpipe or "
                                         "interleaved");
    if (p == 1) {
        if (v > 1 || t->npp_layers || t->pp_schedule != ML_PP_1F1B)
            return ml__errorf(err, ML_RANGE,
                              "parallel.%s: a pipeline's setting; it needs parallel.pp above 1",
                              v > 1 ? "vpp" : t->npp_layers ? "pp_layers" : "pp_schedule");
        return ML_OK;
    }
    if ((t->pp_schedule == ML_PP_INTERLEAVED) != (v > 1))
        return ml__errorf(err, ML_RANGE,
                          v > 1 ? "parallel.pp_schedule: %s with %llu virtual stages "
                                  "(parallel.vpp): virtual stages run the interleaved schedule"
                                : "parallel.pp_schedule: %s needs virtual stages: give "
                                  "parallel.vpp above 1 (it was %llu)",
                          ml_pp_schedule_name(t->pp_schedule), (unsigned long long)v);
    /* Megatron asserts it (schedules.py, forward_backward_pipelining_with_interleaving) */
    if (v > 1 && t->grad_accum % p)
        return ml__errorf(err, ML_RANGE,
                          "training.grad_accum: %llu micro-batches do not divide over "
                          "parallel.pp %llu stages, which the interleaved schedule needs",
                          (unsigned long long)t->grad_accum, (unsigned long long)p);
    const char *why = unstaged(m, t);
    if (why)
        return ml__errorf(err, ML_RANGE, "parallel.pp: %llu with %s: %s", (unsigned long long)p,
                          m->name, why);
    if (p > m->layers)
        return ml__errorf(err, ML_RANGE,
                          "parallel.pp: %llu stages for %s's %llu layers: each stage needs one",
                          (unsigned long long)p, m->name, (unsigned long long)m->layers);
    return stage_split(m, t, err);
}

double ml__pp_in_flight(const ml_training *t, uint64_t r)
{
    const uint64_t p = pp_of(t), v = vpp_of(t), m = t->grad_accum ? t->grad_accum : 1;
    if (p == 1)
        return 1;
    if (t->pp_schedule == ML_PP_GPIPE)
        return (double)m;
    if (v == 1) /* 1F1B: p - r - 1 warmup forwards, then one more before a backward */
        return (double)(p - r < m ? p - r : m);
    /* interleaved (schedules.py, get_pp_rank_microbatches): (p - r - 1) x 2
     * + (v - 1) x p warmup chunk forwards, capped at m v, then one more
     * before a backward; a micro-batch is v chunks */
    uint64_t warm = (p - r - 1) * 2 + (v - 1) * p;
    if (warm > m * v)
        warm = m * v;
    uint64_t units = warm + 1 < m * v ? warm + 1 : m * v;
    return (double)units / (double)v;
}

double ml__pp_in_flight_later(const ml_training *t, uint64_t r)
{
    const uint64_t p = pp_of(t), v = vpp_of(t), m = t->grad_accum ? t->grad_accum : 1;
    const double first = ml__pp_in_flight(t, r);
    if (p == 1 || m == 1)
        return first;
    if (t->pp_schedule == ML_PP_GPIPE) /* the first micro-batch's backward is done */
        return first - 1;
    /* 1F1B's steady state keeps the count (a forward before each backward);
     * a pipeline that never reaches it (all warmup) holds one fewer */
    const bool steady = v == 1 ? m > p - r : (double)(m * v) > first * (double)v;
    return steady ? first : first - 1.0 / (double)v;
}

void ml__pp_stage_layers(const ml_model *m, const ml_training *t, uint64_t r, uint64_t *first,
                         uint64_t *count)
{
    const uint64_t p = pp_of(t);
    if (t->npp_layers) {
        uint64_t a = 0;
        for (uint64_t i = 0; i < r; i++)
            a += t->pp_layers[i];
        *first = a;
        *count = t->pp_layers[r];
        return;
    }
    *count = m->layers / p;
    *first = r * *count;
}

/* A block of the stage that is no layer's (the rotary tables, the send):
 * no parameters, nodes or work, not checkpointable, its transients none
 * (nothing of it is a forward's op). */
static ml_cblock *pseudo_block(ml_cblock *b, const ml_chain *full, const char *name)
{
    memset(b, 0, sizeof *b);
    snprintf(b->name, sizeof b->name, "%s", name);
    b->ckpt_index = -1;
    b->fwd_phase = ML_PHASE_FORWARD;
    b->saved_first = full->nsaved;
    b->node_first = full->nnodes;
    b->work_first = (uint32_t)full->nwork;
    b->work_known = true;
    b->ws_fwd_ops = b->ws_nograd_ops = true;
    return b;
}

/* Tied embeddings over stages, as Megatron keeps them
 * (LanguageModule.setup_embeddings_and_output_layer,
 * megatron/core/models/common/language_module/language_module.py): the
 * last stage holds its own copy of the word embeddings for the output
 * layer, a parameter with its gradient and optimizer states, the two
 * copies' gradients all-reduced before the step. So the first stage's
 * embedding makes the table's gradient itself (the head no longer does
 * before it: the first micro-batch's becomes .grad, later ones' are added
 * into it), and the last stage registers the copy. */
static void tie_across(ml_chain *st, const ml_model *m, const ml_training *t, uint64_t r,
                       bool last)
{
    const uint64_t tp = t->tensor_parallel > 1 ? t->tensor_parallel : 1;
    const uint64_t rows = (m->embed.vocab + tp - 1) / tp, numel = rows * m->hidden;
    const uint64_t g = numel * st->prec.grad;
    size_t j = 0; /* block k's first parameter tensor */
    for (size_t k = 0; k < st->n; k++) {
        ml_cblock *b = &st->blocks[k];
        if (r == 0 && !strcmp(b->name, "embedding")) {
            b->grad_bytes += g;
            b->grad_accum_bytes += g;
            b->ws_bwd = b->ws_bwd > g ? b->ws_bwd - g : 0;
            /* its table (the first tensor) is the shared embedding */
            if (j < st->nparams && st->params[j].numel == numel)
                st->params[j].shared = true;
        }
        if (last && !strcmp(b->name, "head") && st->nparams < st->paramcap) {
            b->params += numel;
            st->params[st->nparams++] = (ml_ptensor){numel, rows, m->hidden, false, false, true};
        }
        for (uint64_t got = 0; got < b->params && j < st->nparams;)
            got += st->params[j++].numel;
    }
}

/* The first saved entry of the rotary tables (its cos, then its sin)
 * among the blocks before the first layer (the embedding's); SIZE_MAX:
 * none. */
static size_t rotary_entry(const ml_chain *ch)
{
    for (size_t k = 0; k < ch->n && ch->blocks[k].ckpt_index < 0; k++) {
        const ml_cblock *b = &ch->blocks[k];
        for (size_t j = 0; j < b->nsaved; j++) {
            const ml_saved *s = &ch->saved[b->saved_first + j];
            if (s->flags & ML_SV_TABLES)
                return b->saved_first + j;
        }
    }
    return SIZE_MAX;
}

/* A chunk's own rotary tables: a pseudo-block holding the embedding's
 * entry of them (rot, its cos then its sin), its input no gradient's. */
static void rotary_block(ml_cblock *b, const ml_chain *full, size_t rot)
{
    pseudo_block(b, full, "rotary");
    b->saved_first = rot;
    b->in_nograd = true;
    for (size_t j = rot;
         j < full->nsaved && (full->saved[j].flags & ML_SV_TABLES) && b->nsaved < 2; j++) {
        b->nsaved++;
        b->saved_bytes += full->saved[j].bytes;
    }
}

/* The parameter tensors' range of each block: blocks register theirs in
 * order (ml__ck_param), so a block's are the next ones whose elements add
 * up to its count. false: they do not (not a chain this file slices). */
static bool param_ranges(const ml_chain *ch, size_t *first)
{
    size_t j = 0;
    for (size_t k = 0; k < ch->n; k++) {
        first[k] = j;
        uint64_t sum = 0;
        while (sum < ch->blocks[k].params && j < ch->nparams)
            sum += ch->params[j++].numel;
        if (sum != ch->blocks[k].params)
            return false;
    }
    first[ch->n] = j;
    return j == ch->nparams;
}

/* The blocks of stage r: its layers (interleaved: its v chunks), after
 * the blocks before the first layer on the first stage, and the blocks
 * after the last layer on the last; idx gets them in order. */
static size_t stage_blocks(const ml_chain *ch, const ml_model *m, const ml_training *t,
                           uint64_t r, size_t *idx)
{
    const uint64_t p = pp_of(t), v = vpp_of(t), L = m->layers;
    size_t l0 = 0; /* the first layer block */
    while (l0 < ch->n && ch->blocks[l0].ckpt_index < 0)
        l0++;
    size_t n = 0;
    for (size_t k = 0; r == 0 && k < l0; k++)
        idx[n++] = k;
    if (v > 1) {
        const uint64_t chunk = L / (p * v);
        for (uint64_t c = 0; c < v; c++)
            for (uint64_t i = 0; i < chunk; i++)
                idx[n++] = l0 + (size_t)((c * p + r) * chunk + i);
    } else {
        uint64_t first, count;
        ml__pp_stage_layers(m, t, r, &first, &count);
        for (uint64_t i = 0; i < count; i++)
            idx[n++] = l0 + (size_t)(first + i);
    }
    for (size_t k = l0 + (size_t)L; r + 1 == p && k < ch->n; k++)
        idx[n++] = k;
    return n;
}

/* out: full's scalars, its saved, node and work lists whole (the blocks
 * index them), room for `blocks` blocks and for its parameters; false out
 * of memory (out freed). */
static bool copy_arrays(const ml_chain *full, size_t blocks, ml_chain *out)
{
    *out = *full;
    out->blocks = malloc(blocks * sizeof *out->blocks);
    out->saved = malloc((full->nsaved ? full->nsaved : 1) * sizeof *out->saved);
    out->nodes = malloc((full->nnodes ? full->nnodes : 1) * sizeof *out->nodes);
    out->work = malloc((full->nwork ? full->nwork : 1) * sizeof *out->work);
    out->fsteps = malloc((full->nfsteps ? full->nfsteps : 1) * sizeof *out->fsteps);
    /* one more: the last stage's copy of tied embeddings */
    out->params = malloc((full->nparams + 1) * sizeof *out->params);
    out->sides = NULL;
    out->cap = blocks;
    out->savedcap = out->nsaved;
    out->nodecap = out->nnodes;
    out->workcap = out->nwork;
    out->fstepcap = out->nfsteps;
    out->paramcap = full->nparams + 1;
    out->nparams = 0;
    if (!out->blocks || !out->saved || !out->nodes || !out->work || !out->fsteps ||
        !out->params) {
        ml__chain_free(out);
        return false;
    }
    /* (an empty array may be NULL: memcpy takes none) */
    if (full->nsaved)
        memcpy(out->saved, full->saved, full->nsaved * sizeof *out->saved);
    if (full->nnodes)
        memcpy(out->nodes, full->nodes, full->nnodes * sizeof *out->nodes);
    if (full->nwork)
        memcpy(out->work, full->work, full->nwork * sizeof *out->work);
    if (full->nfsteps)
        memcpy(out->fsteps, full->fsteps, full->nfsteps * sizeof *out->fsteps);
    return true;
}

ml_status ml__pp_stage_chain(const ml_chain *full, const ml_model *m, const ml_training *t,
                             uint64_t r, ml_chain *out)
{
    const uint64_t p = pp_of(t);
    const bool last = r + 1 == p;
    memset(out, 0, sizeof *out);
    size_t *pfirst = malloc((full->n + 1) * sizeof *pfirst);
    size_t *idx = malloc((full->n + 1) * sizeof *idx);
    ml_status st = ML_NOMEM;
    if (!pfirst || !idx)
        goto done;
    st = ML_RANGE;
    if (full->nsides || !param_ranges(full, pfirst))
        goto done; /* not a chain of one stream of blocks */
    const size_t n = stage_blocks(full, m, t, r, idx);
    const uint64_t v = vpp_of(t);
    st = ML_NOMEM;
    if (!copy_arrays(full, n + 1 + (size_t)v, out))
        goto done;
    int layer = 0;
    /* a model chunk that is not the model's first makes the rotary tables
     * itself, as the embedding does on the first (each chunk is a model of
     * its own that runs its rotary_pos_emb, Megatron's GPTModel.forward,
     * with its own inv_freq buffer): the embedding block's entry of them,
     * held like the chunk's saved tensors. One chunk a stage without
     * virtual stages, v with them, the first stage's first having the
     * embedding's. The stage's tables lead its chain (before the embedding
     * on the first stage: no gradient flows through them), so each
     * micro-batch holds every chunk's from its forward to its backward */
    const size_t rot = rotary_entry(full);
    const size_t tables = rot == SIZE_MAX ? 0 : (size_t)(v - (r == 0 ? 1 : 0));
    for (size_t c = 0; c < tables; c++)
        rotary_block(&out->blocks[c], full, rot);
    if (v > 1)
        out->buffer_bytes +=
            (v - 1) * ml__ck_inv_freq_bytes(m, m->attn.head_dim ? m->attn.head_dim
                                                                : m->hidden / m->attn.heads);
    const size_t at = tables; /* the stage's first block after its tables */
    for (size_t i = 0; i < n; i++) {
        const size_t k = idx[i];
        ml_cblock *b = &out->blocks[at + i];
        *b = full->blocks[k];
        if (b->ckpt_index >= 0)
            b->ckpt_index = layer++; /* the stage's own layers, from 0 */
        const size_t np = pfirst[k + 1] - pfirst[k];
        if (np)
            memcpy(&out->params[out->nparams], &full->params[pfirst[k]],
                   np * sizeof *out->params);
        out->nparams += np;
    }
    out->n = at + n;
    /* a stage before the last sends its output, then frees it (a block
     * that runs forward only: its input is that output) */
    if (!last) {
        ml_cblock *b = pseudo_block(&out->blocks[out->n++], full, "send");
        b->fwd_only = true;
        b->in_bytes = idx[n - 1] + 1 < full->n ? full->blocks[idx[n - 1] + 1].in_bytes : 0;
    }
    /* the first stage reads the batch's inputs, the last its targets;
     * another stage's first block receives its input (held until its
     * backward, which sends the input's gradient) */
    out->batch_input = r == 0 ? full->batch_input : 0;
    out->batch_targets = last ? full->batch_targets : 0;
    if (r > 0) /* the schedule keeps the received input until its backward */
        out->blocks[at].in_saved = true;
    out->grad_held = !last; /* and the gradient it receives (replay.c, held_grad) */
    if (m->embed.tied && !m->head.classes)
        tie_across(out, m, t, r, last);
    out->n_ckpt = (size_t)layer;
    out->mask_ckpt0 = 0;
    out->psum.known = false;
    ml__chain_mark_tables(out);
    ml__chain_mark_runs(out);
    out->psum = ml__param_sums(out);
    st = ML_OK;
done:
    free(pfirst);
    free(idx);
    return st;
}
