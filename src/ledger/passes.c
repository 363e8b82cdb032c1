/* The passes beside the steady iteration: the evaluation pass
 * (training.eval_batch) and the caching-allocator simulation of the whole
 * run (device.allocator). docs/ledger.md, "First iteration and evaluation";
 * docs/allocator.md, "On the plan". */
#include <stdlib.h>
#include <string.h>

#include "ledger/replay.h"
#include "util/error.h"

/* Scratch of one evaluation pass: n + 1 entries each. */
typedef struct {
    int *seg;
    ml_boundary *bd;
    uint64_t *held, *recomputed;
    ml_category *held_cat;
} eval_scratch;

static void eval_scratch_free(eval_scratch *e)
{
    free(e->seg);
    free(e->bd);
    free(e->held);
    free(e->recomputed);
    free(e->held_cat);
}

static bool eval_scratch_alloc(eval_scratch *e, size_t n)
{
    e->seg = calloc(n + 1, sizeof *e->seg);
    e->bd = calloc(n + 1, sizeof *e->bd);
    e->held = calloc(n + 1, sizeof *e->held);
    e->recomputed = calloc(n + 1, sizeof *e->recomputed);
    e->held_cat = calloc(n + 1, sizeof *e->held_cat);
    return e->seg && e->bd && e->held && e->recomputed && e->held_cat;
}

/* The batch the training loop holds through the iteration: the input
 * tensor and the targets (docs/ledger.md, "The batch and the buffers"). */
void ml_eval_batch(ml_replay *r, const ml_chain *ch)
{
    ml_replay_alloc(r, ML_CAT_BATCH, ch->batch_input);
    ml_replay_alloc(r, ML_CAT_BATCH, ch->batch_targets);
}

/* model.eval() under torch.no_grad(): every block runs as a checkpointed
 * block's first forward does (nothing saved, its would-be saved tensors
 * transient), each boundary freed once consumed, except the model output,
 * which the evaluation loop keeps (to compute the loss and metrics). The
 * resident states are the training's: parameters, master weights and the
 * optimizer states the steps before created; no gradients (zero_grad
 * set them to None). */
static ml_status eval_forward(const ml_model *m, const ml_evalctx *x, ml_rsim *rsim,
                              uint64_t *peak, ml_phase_peak *phases, ml_error *err)
{
    const ml_training *t = &x->cfg->training;
    ml_config ec = *x->cfg;
    ec.training.micro_batch = t->eval_batch;
    ec.training.seq_len = t->eval_seq_len ? t->eval_seq_len : t->seq_len;
    ec.training.checkpoint.kind = ML_CKPT_NONE;
    ml_chain ch;
    ml_status st = ml_chain_build_eval(m, &ec, &ch, err);
    if (st) {
        /* the evaluation's shape is its own settings': name them */
        if (t->eval_seq_len)
            ml_error_reword(err, "training.seq_len:", "training.eval_seq_len:");
        ml_error_reword(err, "training.micro_batch:", "training.eval_batch:");
        return st;
    }
    const size_t n = ch.n;
    eval_scratch e;
    memset(&e, 0, sizeof e);
    ml_ledger sl;
    memset(&sl, 0, sizeof sl);
    if (!eval_scratch_alloc(&e, n)) {
        eval_scratch_free(&e);
        ml_chain_free(&ch);
        return ml_errorf(err, ML_NOMEM, "out of memory");
    }
    for (size_t k = 0; k < n; k++) {
        e.bd[k].kept = ch.blocks[k].in_held;
        e.bd[k].cat = ML_CAT_WORKSPACE;
        e.bd[k].alias = k > 0 && ch.blocks[k - 1].identity && e.bd[k - 1].kept;
    }
    ml_summary *s = &sl.sum;
    ml_eval_model_states(&ch, &ec.training, &x->ob, s);
    const uint64_t N = t->data_parallel ? t->data_parallel : 1;
    ml_shard sh = {N, t->zero, t->zero >= 2, t->zero >= 3, ch.prec.param, 0, -1, 0, 0, false};
    ml_replay r;
    memset(&r, 0, sizeof r);
    r.l = &sl;
    r.ch = &ch;
    r.sh = &sh;
    r.seg = e.seg;
    r.bd = e.bd;
    r.held = e.held;
    r.held_cat = e.held_cat;
    r.recomputed = e.recomputed;
    r.hold_cache = true;
    r.whole = x->whole;
    r.block = -1;
    r.sub = "";
    r.phase = ML_PHASE_FORWARD;
    ml_replay_alloc(&r, ML_CAT_PARAMS, s->bytes_params);
    ml_replay_alloc(&r, ML_CAT_MASTER, s->bytes_master);
    ml_replay_alloc(&r, ML_CAT_OPTIMIZER, s->bytes_optimizer);
    if (t->zero_grad == ML_ZERO_GRAD_ZERO) /* zeroed, still allocated */
        ml_replay_alloc(&r, ML_CAT_GRADS, s->bytes_grads);
    /* the buffers, and the training batch the loop still holds (a plain
     * loop's names are rebound only by the next batch) */
    ml_replay_alloc(&r, ML_CAT_BUFFERS, x->ch->buffer_bytes);
    ml_eval_batch(&r, x->ch);
    /* a simulation has the resident states already, from training */
    r.rsim = rsim;
    if (rsim)
        ml_rsim_use_chain(rsim, &ch);
    ml_eval_batch(&r, &ch); /* the evaluation's own batch */
    ml_replay_forward(&r);
    if (rsim)
        ml_rsim_use_chain(rsim, x->ch);
    *peak = s->peak;
    if (phases) { /* each phase's peak: forward, and the loss where the head computes it */
        ml_replay_phase_names(&r, s);
        memcpy(phases, s->phase_steady, sizeof s->phase_steady);
    }
    bool overflow = r.overflow || ch.overflow;
    eval_scratch_free(&e);
    ml_chain_free(&ch);
    if (overflow)
        return ml_errorf(err, ML_OVERFLOW,
                         "byte counts exceed 64 bits in the evaluation pass: use a smaller "
                         "eval_batch or eval_seq_len");
    return ML_OK;
}

ml_status ml_eval_pass(const ml_model *m, ml_evalctx *x, ml_error *err)
{
    x->has_eval = x->cfg->training.eval_batch > 0;
    x->eval_peak = 0;
    memset(x->eval_phases, 0, sizeof x->eval_phases);
    return x->has_eval ? eval_forward(m, x, NULL, &x->eval_peak, x->eval_phases, err) : ML_OK;
}

/* zero_grad: zero — the first iteration has no gradients yet: its backward
 * creates them as set_to_none's does. Its peak (and its phases' peaks, into
 * phases) from a replay without them (evaluate.c's steady replay has them). */
uint64_t ml_eval_first_without_grads(ml_evalctx *x, const int *seg,
                                     ml_phase_peak phases[ML_PHASE_COUNT])
{
    ml_ledger sl;
    memset(&sl, 0, sizeof sl);
    ml_eval_model_states((ml_chain *)x->ch, &x->cfg->training, &x->ob, &sl.sum);
    ml_shard sh;
    ml_replay r;
    ml_eval_setup(x, seg, &sl, &sh, &r);
    ml_eval_residents(&r, x, &sl.sum, true);
    ml_eval_iteration(&r, x, &sl.sum, false);
    ml_replay_phase_names(&r, &sl.sum);
    memcpy(phases, sl.sum.phase_first, sizeof sl.sum.phase_first);
    return r.peak_first;
}

/* The plan's events through the caching allocator, as a training run
 * meets them: the parameters (and master weights), a first iteration whose
 * step creates the optimizer states, two steady iterations (the cache
 * warms in the first), and the evaluation pass. */
ml_status ml_eval_reserved(const ml_model *m, ml_evalctx *x, const int *seg, ml_summary *out,
                           ml_error *err)
{
    const ml_device *dv = &x->cfg->device;
    out->has_reserved = dv->allocator != ML_ALLOCATOR_NONE;
    if (!out->has_reserved)
        return ML_OK;
    ml_alloc_config ac = ml_alloc_config_defaults();
    ac.mode = dv->allocator == ML_ALLOCATOR_EXPANDABLE ? ML_ALLOC_EXPANDABLE : ML_ALLOC_CACHING;
    ac.max_split_size = dv->max_split_size;
    ac.device_bytes = dv->present ? dv->memory - dv->runtime_reserve : 0;
    ml_rsim *rs = NULL;
    ml_status st = ml_rsim_create(&ac, x->ch, &rs, err);
    if (st)
        return st;
    ml_ledger sl;
    memset(&sl, 0, sizeof sl);
    ml_eval_model_states((ml_chain *)x->ch, &x->cfg->training, &x->ob, &sl.sum);
    ml_shard sh;
    ml_replay r;
    ml_eval_setup(x, seg, &sl, &sh, &r);
    r.rsim = rs;
    ml_eval_residents(&r, x, &sl.sum, false);
    ml_eval_iteration(&r, x, &sl.sum, true);
    for (int i = 0; i < 2; i++)
        ml_eval_iteration(&r, x, &sl.sum, false);
    uint64_t ignored;
    if (x->has_eval && ml_rsim_ok(rs, NULL))
        st = eval_forward(m, x, rs, &ignored, NULL, err);
    bool nomem = false;
    out->reserved_oom = !ml_rsim_ok(rs, &nomem) && !nomem;
    ml_alloc_stats a;
    ml_rsim_stats(rs, &a);
    out->reserved_peak = a.reserved.peak;
    out->reserved_segments = a.segments.peak;
    ml_rsim_destroy(rs);
    if (!st && (nomem || r.nomem))
        st = ml_errorf(err, ML_NOMEM, "out of memory");
    return st;
}
