/* The passes beside the steady iteration: the evaluation pass
 * (training.eval_batch) and the caching-allocator simulation of the whole
 * run (device.allocator). docs/ledger.md, "First iteration and evaluation";
 * docs/allocator.md, "On the plan". */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ledger/replay.h"
#include "util/error.h"
#include "util/grow.h"

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
void ml__eval_batch(ml_replay *r, const ml_chain *ch)
{
    ml__replay_alloc(r, ML_CAT_BATCH, ch->batch_input);
    ml__replay_alloc(r, ML_CAT_BATCH, ch->batch_targets);
}

/* What an inference job's forward leaves besides its peak (inf != NULL:
 * the inference residents, ml_inference_evaluate). */
typedef struct {
    uint64_t weights, kv_forward;
    unsigned cache_bpe; /* the KV cache's bytes an element (ml__kv_cache_bpe) */
} nograd_figures;

/* What is resident before the no-grad forward: the parameters; for the
 * evaluation pass the training's master weights, optimizer states (and
 * gradients zeroed, not freed), buffers and the training batch the loop
 * still holds (a plain loop's names are rebound only by the next batch);
 * for an inference job the buffers alone besides the parameters. */
static void nograd_residents(ml_replay *r, const ml_evalctx *x, const ml_summary *s,
                             const ml_chain *ch, bool inference)
{
    ml__replay_alloc(r, ML_CAT_PARAMS, s->bytes_params);
    if (inference) {
        ml__replay_alloc(r, ML_CAT_BUFFERS, ch->buffer_bytes);
        return;
    }
    ml__replay_alloc(r, ML_CAT_MASTER, s->bytes_master);
    ml__replay_alloc(r, ML_CAT_OPTIMIZER, s->bytes_optimizer);
    if (x->cfg->training.zero_grad == ML_ZERO_GRAD_ZERO) /* zeroed, still allocated */
        ml__replay_alloc(r, ML_CAT_GRADS, s->bytes_grads);
    ml__replay_alloc(r, ML_CAT_BUFFERS, x->ch->buffer_bytes);
    ml__eval_batch(r, x->ch);
}

/* model.eval() under torch.no_grad(): every block runs as a checkpointed
 * block's first forward does (nothing saved, its would-be saved tensors
 * transient), each boundary freed once consumed, except the model output,
 * which the evaluation loop keeps (to compute the loss and metrics). The
 * resident states are the training's: parameters, master weights and the
 * optimizer states the steps before created; no gradients (zero_grad
 * set them to None). With inf (an inference job, docs/colocate.md) the
 * residents are the parameters and buffers alone: no training before it. */
static ml_status eval_forward(const ml_model *m, const ml_evalctx *x, ml_rsim *rsim,
                              uint64_t *peak, ml_phase_peak *phases, nograd_figures *inf,
                              ml_error *err)
{
    const ml_training *t = &x->cfg->training;
    ml_config ec = *x->cfg;
    ec.training.micro_batch = t->eval_batch;
    ec.training.seq_len = t->eval_seq_len ? t->eval_seq_len : t->seq_len;
    ec.training.checkpoint.kind = ML_CKPT_NONE;
    ml_chain ch;
    ml_status st = ml__chain_build_eval(m, &ec, &ch, err);
    if (st) {
        /* the evaluation's shape is its own settings': name them (an
         * inference job's are its micro_batch and seq_len) */
        if (t->eval_seq_len && !inf)
            ml__error_reword(err, "training.seq_len:", "training.eval_seq_len:");
        if (!inf)
            ml__error_reword(err, "training.micro_batch:", "training.eval_batch:");
        return st;
    }
    const size_t n = ch.n;
    eval_scratch e;
    memset(&e, 0, sizeof e);
    ml_ledger sl;
    memset(&sl, 0, sizeof sl);
    if (!eval_scratch_alloc(&e, n)) {
        eval_scratch_free(&e);
        ml__chain_free(&ch);
        return ml__errorf(err, ML_NOMEM, "out of memory");
    }
    for (size_t k = 0; k < n; k++) {
        e.bd[k].kept = ch.blocks[k].in_held;
        e.bd[k].cat = ML_CAT_WORKSPACE;
        e.bd[k].alias = k > 0 && ch.blocks[k - 1].identity && e.bd[k - 1].kept;
    }
    ml_summary *s = &sl.sum;
    ml__eval_model_states(&ch, &ec.training, &x->ob, s);
    const uint64_t N = ml__shard_group(t);
    ml_shard sh = {N, t->zero, t->zero >= 2, t->zero >= 3, ch.prec.param, 0, -1, 0, 0, false,
                   ml__grad_views(t)};
    ml_replay r = {.l = &sl,           .ch = &ch,         .sh = &sh,
                   .seg = e.seg,       .bd = e.bd,        .held = e.held,
                   .held_cat = e.held_cat, .recomputed = e.recomputed,
                   .hold_cache = true, .whole = x->whole, .block = -1,
                   .sub = "",          .phase = ML_PHASE_FORWARD};
    nograd_residents(&r, x, s, &ch, inf != NULL);
    /* a simulation has the resident states already, from training */
    r.rsim = rsim;
    if (rsim)
        ml__rsim_use_chain(rsim, &ch);
    ml__eval_batch(&r, &ch); /* the evaluation's own batch */
    ml__replay_forward(&r);
    if (rsim)
        ml__rsim_use_chain(rsim, x->ch);
    *peak = s->peak;
    if (phases) { /* each phase's peak: forward, and the loss where the head computes it */
        ml__replay_phase_names(&r, s);
        memcpy(phases, s->phase_steady, sizeof s->phase_steady);
    }
    if (inf) {
        inf->weights = s->bytes_params;
        inf->cache_bpe = ml__kv_cache_bpe(&ch, m); /* the generation's, as the prompt's */
        inf->kv_forward = 0;
        for (size_t k = 0; k < n; k++) /* held to the end: hold_cache */
            inf->kv_forward = ml_add(&ch, inf->kv_forward, ch.blocks[k].cache_bytes);
    }
    bool overflow = r.overflow || ch.overflow;
    eval_scratch_free(&e);
    ml__chain_free(&ch);
    if (overflow)
        return ml__errorf(err, ML_OVERFLOW,
                          "byte counts exceed 64 bits in the evaluation pass: use a smaller "
                          "%s", inf ? "micro_batch or seq_len" : "eval_batch or eval_seq_len");
    return ML_OK;
}

ml_status ml__eval_pass(const ml_model *m, ml_evalctx *x, ml_error *err)
{
    x->has_eval = x->cfg->training.eval_batch > 0;
    x->eval_peak = 0;
    memset(x->eval_phases, 0, sizeof x->eval_phases);
    return x->has_eval ? eval_forward(m, x, NULL, &x->eval_peak, x->eval_phases, NULL, err) : ML_OK;
}

/* zero_grad: zero — the first iteration has no gradients yet: its backward
 * creates them as set_to_none's does. Its peak (and its phases' peaks, into
 * phases) from a replay without them (evaluate.c's steady replay has them). */
uint64_t ml__eval_first_without_grads(ml_evalctx *x, const int *seg,
                                      ml_phase_peak phases[ML_PHASE_COUNT])
{
    ml_ledger sl;
    memset(&sl, 0, sizeof sl);
    ml__eval_model_states((ml_chain *)x->ch, &x->cfg->training, &x->ob, &sl.sum);
    ml_shard sh;
    ml_replay r;
    ml__eval_setup(x, seg, &sl, &sh, &r);
    ml__eval_residents(&r, x, &sl.sum, true);
    ml__eval_iteration(&r, x, &sl.sum, false);
    ml__replay_phase_names(&r, &sl.sum);
    memcpy(phases, sl.sum.phase_first, sizeof sl.sum.phase_first);
    return r.peak_first;
}

/* One simulation a memo keeps: what decides its events (the config with
 * its checkpoint policy as the chain reads it, sim_config; the plan's
 * segments; the chain's length and overflow flag; whether every block is
 * replayed), then what it left: its figures and the chain's overflow flag
 * after it. */
struct ml_reserved_seen {
    ml_config cfg; /* the policy as the chain reads it (ml__chain_policy) */
    int *seg;      /* n entries, the entry's own */
    size_t n;
    bool overflow, whole;
    bool oom, overflow_after;
    ml_reserved_when oom_when;
    uint64_t peak, segments, first, steady, inexact;
    uint64_t start[3]; /* reserved, allocated, segments */
    ml_reserved_at at;
};

void ml__reserved_memo_free(ml_reserved_memo *memo)
{
    for (size_t i = 0; memo && i < memo->n; i++)
        free(memo->e[i].seg);
    if (memo) {
        free(memo->e);
        memset(memo, 0, sizeof *memo);
    }
}

/* x's plan seg[] as a memo entry's key (its seg borrowed): the config
 * byte for byte (two configs a search derived from one by assignment
 * compare equal exactly when their fields do; any other pair at worst
 * differs, a simulation run again), its checkpoint policy as the chain
 * reads it. */
static void seen_key(const ml_evalctx *x, const int *seg, ml_reserved_seen *k)
{
    memset(k, 0, sizeof *k);
    memcpy(&k->cfg, x->cfg, sizeof k->cfg);
    ml__chain_policy(&k->cfg.training.checkpoint);
    memset(k->cfg.training.checkpoint.blocks, 0, sizeof k->cfg.training.checkpoint.blocks);
    k->seg = (int *)seg; /* not written through: a key is only compared */
    k->n = x->ch->n;
    k->overflow = x->ch->overflow;
    k->whole = x->whole;
}

static ml_reserved_seen *seen_find(ml_reserved_memo *memo, const ml_reserved_seen *k)
{
    for (size_t i = 0; memo && i < memo->n; i++) {
        ml_reserved_seen *e = &memo->e[i];
        if (e->n == k->n && e->overflow == k->overflow && e->whole == k->whole &&
            !memcmp(e->seg, k->seg, k->n * sizeof *k->seg) &&
            !memcmp(&e->cfg, &k->cfg, sizeof k->cfg))
            return e;
    }
    return NULL;
}

/* The simulation started from the device's start state (--allocator-start):
 * its figures into out; ML_RANGE where the state alone runs out of the
 * device (of device_bytes), ML_NOMEM out of host memory. */
static ml_status start_from(ml_rsim *rs, const ml_device *dv, uint64_t device_bytes,
                            ml_summary *out, ml_error *err)
{
    if (!ml__rsim_start(rs, dv->start)) {
        bool nomem = false;
        ml__rsim_ok(rs, &nomem);
        if (nomem)
            return ml__errorf(err, ML_NOMEM, "out of memory");
        char cap[32];
        ml_format_bytes(device_bytes, cap, sizeof cap);
        return ml__errorf(err, ML_RANGE,
                          "device.start: the allocator's start state alone runs out of the "
                          "device (%s: its memory less the runtime reserve); plan on a larger "
                          "device, or from a smaller start",
                          cap);
    }
    ml_alloc_stats a0;
    ml__rsim_stats(rs, &a0);
    out->start_reserved = a0.reserved.current;
    out->start_allocated = a0.allocated.current;
    out->start_segments = a0.segments.current;
    return ML_OK;
}

/* k with out's figures into memo; a host out of memory keeps nothing (the
 * memo only spares work). */
static void seen_add(ml_reserved_memo *memo, const ml_reserved_seen *key, const ml_summary *out,
                     bool overflow_after)
{
    ml_reserved_seen *e = ml_grow(memo->e, memo->n, &memo->cap, sizeof *e, 8);
    int *seg = malloc((key->n ? key->n : 1) * sizeof *seg);
    if (!e || !seg) {
        free(seg);
        if (e)
            memo->e = e;
        return;
    }
    memo->e = e;
    ml_reserved_seen k = *key;
    memcpy(seg, k.seg, k.n * sizeof *seg);
    k.seg = seg;
    k.oom = out->reserved_oom;
    k.oom_when = out->reserved_oom_when;
    k.peak = out->reserved_peak;
    k.segments = out->reserved_segments;
    k.first = out->reserved_first;
    k.steady = out->reserved_steady;
    k.start[0] = out->start_reserved;
    k.start[1] = out->start_allocated;
    k.start[2] = out->start_segments;
    k.at = out->reserved_at;
    k.inexact = out->reserved_inexact;
    k.overflow_after = overflow_after;
    memo->e[memo->n++] = k;
}

static ml_status simulate(const ml_model *m, ml_evalctx *x, const int *seg, ml_summary *out,
                          ml_error *err);

ml_status ml__eval_reserved(const ml_model *m, ml_evalctx *x, const int *seg, ml_summary *out,
                            ml_error *err)
{
    out->has_reserved = x->cfg->device.allocator != ML_ALLOCATOR_NONE;
    if (!out->has_reserved)
        return ML_OK;
    ml_reserved_seen k;
    seen_key(x, seg, &k);
    /* (a plan found in the memo records no events: only timeline asks for
     * them, which keeps none) */
    const ml_reserved_seen *e = seen_find(x->memo, &k);
    if (e) {
        out->reserved_oom = e->oom;
        out->reserved_oom_when = e->oom_when;
        out->reserved_peak = e->peak;
        out->reserved_segments = e->segments;
        out->reserved_first = e->first;
        out->reserved_steady = e->steady;
        out->reserved_inexact = e->inexact;
        out->start_reserved = e->start[0];
        out->start_allocated = e->start[1];
        out->start_segments = e->start[2];
        out->reserved_at = e->at;
        ((ml_chain *)x->ch)->overflow |= e->overflow_after; /* as the simulation leaves it */
        return ML_OK;
    }
    ml_status st = simulate(m, x, seg, out, err);
    if (!st && x->memo)
        seen_add(x->memo, &k, out, x->ch->overflow);
    return st;
}

/* Where r's simulation reached its reserved peak (a): the point the
 * replay recorded, or the evaluation pass when the peak is past it. */
static void reserved_at(const ml_replay *r, const ml_alloc_stats *a, ml_reserved_at *o)
{
    memset(o, 0, sizeof *o);
    o->block = -1;
    if (a->reserved.peak > r->rsv.top) { /* (the replay records its own peaks) */
        o->when = ML_RESERVED_EVAL;
        o->phase = ML_PHASE_FORWARD;
        o->allocated = a->at_peak_allocated;
        o->segments = a->at_peak_segments;
        ml__name_join(o->at, sizeof o->at, "evaluation", "");
        return;
    }
    o->when = r->rsv.when;
    o->phase = r->rsv.phase;
    o->block = r->rsv.block;
    o->allocated = r->rsv.allocated;
    o->segments = r->rsv.segments;
    if (o->block >= 0 && (size_t)o->block < r->ch->n)
        ml__name_join(o->at, sizeof o->at, r->ch->blocks[o->block].name,
                      r->rsv.sub ? r->rsv.sub : "");
    else
        ml__name_join(o->at, sizeof o->at,
                      o->phase == ML_PHASE_OPTIMIZER ? "optimizer.step" : "resident", "");
}

/* The plan's events through the caching allocator, as a training run
 * meets them: the parameters (and master weights), a first iteration whose
 * step creates the optimizer states, two steady iterations (the cache
 * warms in the first), and the evaluation pass. */
static ml_status simulate(const ml_model *m, ml_evalctx *x, const int *seg, ml_summary *out,
                          ml_error *err)
{
    const ml_device *dv = &x->cfg->device;
    ml_alloc_config ac = ml__rsim_config(dv);
    ml_rsim *rs = NULL;
    ml_status st = ml__rsim_create(&ac, x->ch, &rs, err);
    if (st)
        return st;
    ml__rsim_set_shards(rs, ml__shard_group(&x->cfg->training), x->cfg->training.virtual_stages);
    if (x->aev_to)
        ml__rsim_record(rs);
    if (dv->start && (st = start_from(rs, dv, ac.device_bytes, out, err))) {
        ml__rsim_destroy(rs);
        return st;
    }
    ml_ledger sl;
    memset(&sl, 0, sizeof sl);
    ml__eval_model_states((ml_chain *)x->ch, &x->cfg->training, &x->ob, &sl.sum);
    ml_shard sh;
    ml_replay r;
    ml__eval_setup(x, seg, &sl, &sh, &r);
    r.rsim = rs;
    r.rsv.now = ML_RESERVED_RESIDENT;
    ml__rsim_mark(rs, ML_RESERVED_RESIDENT, false);
    ml__eval_residents(&r, x, &sl.sum, false);
    /* the pass in which it runs out, if it does: the first that ends with
     * the simulation stopped (nothing runs after) */
    ml_reserved_when oom_when = ML_RESERVED_EVAL;
    if (!ml__rsim_ok(rs, NULL))
        oom_when = ML_RESERVED_RESIDENT;
    r.rsv.now = ML_RESERVED_FIRST;
    ml__rsim_mark(rs, ML_RESERVED_FIRST, false);
    /* a new process's threads make their cuBLAS workspaces in its first
     * iteration; one that ran before (a start state) has them */
    if (!dv->start)
        r.blas_fwd = r.blas_bwd = dv->blas_workspace;
    ml__eval_iteration(&r, x, &sl.sum, true);
    if (oom_when == ML_RESERVED_EVAL && !ml__rsim_ok(rs, NULL))
        oom_when = ML_RESERVED_FIRST;
    ml_alloc_stats a;
    ml__rsim_stats(rs, &a);
    out->reserved_first = a.reserved.peak;
    r.rsv.now = ML_RESERVED_STEADY;
    for (int i = 0; i < 2; i++) {
        ml__rsim_mark(rs, ML_RESERVED_STEADY, i == 1);
        ml__eval_iteration(&r, x, &sl.sum, false);
    }
    ml__rsim_stats(rs, &a);
    out->reserved_steady = a.reserved.peak;
    if (oom_when == ML_RESERVED_EVAL && !ml__rsim_ok(rs, NULL))
        oom_when = ML_RESERVED_STEADY;
    uint64_t ignored;
    if (x->has_eval && ml__rsim_ok(rs, NULL)) {
        ml__rsim_mark(rs, ML_RESERVED_EVAL, false);
        st = eval_forward(m, x, rs, &ignored, NULL, NULL, err);
    }
    bool nomem = false;
    out->reserved_oom = !ml__rsim_ok(rs, &nomem) && !nomem;
    out->reserved_oom_when = out->reserved_oom ? oom_when : ML_RESERVED_RESIDENT;
    ml__rsim_stats(rs, &a);
    out->reserved_peak = a.reserved.peak;
    out->reserved_segments = a.segments.peak;
    out->reserved_inexact = ml__rsim_inexact(rs);
    reserved_at(&r, &a, &out->reserved_at);
    if (x->aev_to) {
        free(x->aev_to->aev);
        x->aev_to->aev = ml__rsim_take_events(rs, &x->aev_to->naev);
    }
    ml__rsim_destroy(rs);
    if (!st && (nomem || r.nomem))
        st = ml__errorf(err, ML_NOMEM, "out of memory");
    return st;
}

/* Why a model cannot generate with the cache planned (NULL: it can): a
 * decoder's stack of self-attention layers, DynamicCache's layout. */
static const char *generate_refused(const ml_model *m)
{
    if (m->type != ML_MODEL_DECODER)
        return "the model is not a decoder (an encoder, an encoder-decoder or a sequential "
               "model): only a decoder's generation and its KV cache are planned";
    if (m->head.classes)
        return "the model has a sequence-classification head: it does not generate";
    if (m->vision.layers)
        return "a multimodal decoder's generation (its image tokens in the cache) is not "
               "planned: drop --generate to plan its forward";
    if (m->attn.kv_lora)
        return "multi-head latent attention's cache (DeepSeek) is not planned for "
               "generation: drop --generate to plan its forward";
    return NULL;
}

/* The keys and values of every layer for t tokens, as transformers'
 * DynamicCache holds them (cache_utils.py, DynamicLayer.update: key_states
 * and value_states of (batch, kv_heads, tokens, head_dim) each, concatenated
 * along the tokens; docs/colocate.md, "Inference jobs"). */
static uint64_t kv_bytes(ml_chain *ch, const ml_model *m, uint64_t batch, uint64_t t,
                         unsigned bytes)
{
    const uint64_t dh = m->attn.head_dim ? m->attn.head_dim : m->hidden / m->attn.heads;
    uint64_t v = ml_mul(ch, 2, m->layers);
    v = ml_mul(ch, v, batch);
    v = ml_mul(ch, v, m->attn.kv_heads);
    v = ml_mul(ch, v, dh);
    v = ml_mul(ch, v, t);
    return ml_mul(ch, v, bytes);
}

/* The splits an inference job's plan does not take. */
static ml_status inference_refused(const ml_training *t, ml_error *err)
{
    if (t->context_parallel > 1)
        return ml__errorf(err, ML_RANGE,
                          "parallel.cp: %llu for an inference job: its context parallelism "
                          "(the KV cache split over ranks) is not planned; plan it without "
                          "parallel.cp",
                          (unsigned long long)t->context_parallel);
    if (ml_training_ep(t) > 1)
        return ml__errorf(err, ML_RANGE,
                          "parallel.ep: %llu for an inference job: its expert parallelism "
                          "(the experts split over ranks at decode) is not planned; plan it "
                          "without parallel.ep",
                          (unsigned long long)ml_training_ep(t));
    return ML_OK;
}

ml_status ml_inference_evaluate(const ml_model *m, const ml_config *cfg, uint64_t generate,
                                ml_inference *out, ml_error *err)
{
    ml_error local;
    if (!err)
        err = &local;
    memset(err, 0, sizeof *err);
    ml_status refused = inference_refused(&cfg->training, err);
    if (refused)
        return refused;
    /* the job's shape is its micro_batch and seq_len; nothing trains */
    ml_config c = *cfg;
    ml_training *t = &c.training;
    t->eval_batch = t->micro_batch;
    t->eval_seq_len = 0;
    t->grad_accum = 1;
    t->data_parallel = 1;
    t->zero = 0;
    t->offload = ML_OFFLOAD_NONE;
    t->checkpoint.kind = ML_CKPT_NONE;
    t->checkpoint.count = 0;
    ml__device_allocated_view(&c.device);
    ml_status st = ml_config_check(&c, err);
    if (st)
        return st;
    const char *no = generate ? generate_refused(m) : NULL;
    if (no)
        return ml__errorf(err, ML_RANGE, "generate: %s", no);
    uint64_t total_t = t->seq_len + generate; /* both below 2^63: no wrap */
    if (generate > ML_MAX_TOKENS || total_t > ML_MAX_TOKENS)
        return ml__errorf(err, ML_RANGE, "generate: seq_len + generate must be at most %llu "
                          "tokens", (unsigned long long)ML_MAX_TOKENS);
    /* learned positions end at their table, as the ledger refuses for a
     * sequence (chain_transformer.c); rotary ones extrapolate */
    if (generate && m->embed.position == ML_POS_LEARNED && m->embed.max_positions &&
        total_t > m->embed.max_positions)
        return ml__errorf(err, ML_RANGE,
                          "generate: seq_len + generate (%llu tokens) exceeds "
                          "the model's max_positions (%llu) of learned positions",
                          (unsigned long long)total_t, (unsigned long long)m->embed.max_positions);
    if (generate && m->attn.sliding_window && total_t > m->attn.sliding_window)
        return ml__errorf(err, ML_RANGE,
                          "generate: seq_len + generate (%llu tokens) exceeds "
                          "the model's sliding_window (%llu), which the cache is not planned "
                          "for",
                          (unsigned long long)total_t, (unsigned long long)m->attn.sliding_window);
    ml_evalctx x;
    memset(&x, 0, sizeof x);
    x.cfg = &c;
    nograd_figures f;
    memset(&f, 0, sizeof f);
    uint64_t fwd = 0;
    if ((st = eval_forward(m, &x, NULL, &fwd, NULL, &f, err)))
        return st;
    ml_inference r;
    memset(&r, 0, sizeof r);
    ml_chain ov; /* the sticky overflow flag of ml_mul and ml_add */
    memset(&ov, 0, sizeof ov);
    r.batch = t->micro_batch;
    r.seq_len = t->seq_len;
    r.generate = generate;
    r.weights = f.weights;
    r.forward_peak = fwd;
    r.kv_forward = f.kv_forward;
    r.peak = fwd;
    if (generate) {
        r.kv_cache = kv_bytes(&ov, m, r.batch, total_t, f.cache_bpe);
        r.peak = ml_add(&ov, fwd - f.kv_forward, r.kv_cache);
    }
    const double frag = (double)r.peak * c.device.fragmentation;
    r.fragmentation = frag < 1.8e19 ? (uint64_t)llround(frag) : UINT64_MAX;
    r.runtime_reserve = c.device.runtime_reserve;
    r.peak_total = ml_add(&ov, ml_add(&ov, r.peak, r.fragmentation), r.runtime_reserve);
    if (ov.overflow)
        return ml__errorf(err, ML_OVERFLOW, "the inference job's bytes exceed 64 bits: use a "
                          "smaller batch, seq_len or generate");
    *out = r;
    return ML_OK;
}
