/* Megatron-LM's distributed optimizer: its buffer layout and one rank's
 * shard (docs/parallel.md, "The distributed optimizer"). The rules, from
 * megatron/core/optimizer/distrib_optimizer.py
 * (DistributedOptimizer._compute_per_buffer_param_layout) and
 * megatron/core/optimizer/param_layout.py (pad_param_start,
 * pad_bucket_end):
 * - each model chunk has its own buffers; parameters enter in reverse
 *   order (the backward's), each starting on a 64-element boundary;
 * - one bucket per buffer (overlap_grad_reduce off, the default: bucket_size
 *   None), except that a pipeline's shared embedding (tied embeddings split
 *   over stages: the first stage's table and the last stage's copy, as
 *   language_module.py marks them) gets a bucket of its own;
 * - a bucket's end is padded to a multiple of lcm(dp, 128), and each rank
 *   owns the dp-th part of every bucket;
 * - a rank keeps master weights and states for the parameters' elements in
 *   its parts only, one tensor per piece (padding gets none). */
#include <stdlib.h>

#include "ledger/dist_optimizer.h"
#include "util/error.h"
#include "util/grow.h"

typedef struct {
    uint64_t start, end; /* elements in the chunk's buffer */
    size_t bucket;
} placed;

typedef struct {
    uint64_t start, end, base; /* base: the buffer's offset over all chunks */
} bucket;

/* A change of the padding ranks hold, from rank `rank` on: a gap's
 * share added where its ranks begin and taken off after them. */
typedef struct {
    uint64_t rank;
    int64_t delta;
} loss;

static uint64_t round_up(uint64_t x, uint64_t d)
{
    return (x + d - 1) / d * d;
}

/* lcm(dp, 128): 128 is 2^7, so dp doubled until 128 divides it */
static uint64_t bucket_divisor(uint64_t dp)
{
    uint64_t d = dp;
    while (d % 128)
        d *= 2;
    return d;
}

/* The model chunk of each parameter (interleaved stages: the layers of
 * chunk c are the stage's c-th share; blocks before them are the first
 * chunk's, after them the last's). */
static void chunk_of_params(const ml_chain *ch, uint64_t v, unsigned *chunk)
{
    const uint64_t per = v > 1 && ch->n_ckpt >= v ? ch->n_ckpt / v : 0;
    bool seen_layer = false;
    size_t j = 0;
    for (size_t k = 0; k < ch->n; k++) {
        const ml_cblock *b = &ch->blocks[k];
        uint64_t c = 0;
        if (per && b->ckpt_index >= 0) {
            c = (uint64_t)b->ckpt_index / per;
            seen_layer = true;
        } else if (per && seen_layer) {
            c = v - 1;
        }
        if (c >= v)
            c = v - 1;
        uint64_t got = 0;
        while (got < b->params && j < ch->nparams) {
            got += ch->params[j].numel;
            chunk[j++] = (unsigned)c;
        }
    }
    while (j < ch->nparams)
        chunk[j++] = v > 1 ? (unsigned)(v - 1) : 0;
}

typedef struct {
    placed *at;      /* per parameter */
    bucket *bk;
    size_t nb;
    uint64_t divisor;
} layout;

static void close_bucket(layout *L, uint64_t *bstart, uint64_t end, uint64_t base)
{
    const uint64_t stop = round_up(end, L->divisor);
    L->bk[L->nb++] = (bucket){*bstart, stop, base};
    *bstart = stop;
}

/* One chunk's buffer: its parameters in reverse order; returns its
 * padded size. */
static uint64_t lay_chunk(const ml_chain *ch, const unsigned *chunk, unsigned c, uint64_t base,
                          layout *L)
{
    uint64_t start = 0, bstart = 0, end = 0;
    size_t in_bucket = 0;
    for (size_t i = ch->nparams; i-- > 0;) {
        const ml_ptensor *p = &ch->params[i];
        if (chunk[i] != c || p->frozen)
            continue;
        start = round_up(start, 64);
        if (p->shared && in_bucket) {
            close_bucket(L, &bstart, start, base);
            start = bstart;
            in_bucket = 0;
        }
        end = start + p->numel;
        L->at[i] = (placed){start, end, L->nb};
        in_bucket++;
        if (p->shared) {
            close_bucket(L, &bstart, end, base);
            start = bstart;
            in_bucket = 0;
        } else {
            start = end;
        }
    }
    if (in_bucket)
        close_bucket(L, &bstart, end, base);
    return bstart;
}

static int by_rank(const void *a, const void *b)
{
    const loss *x = a, *y = b;
    return x->rank < y->rank ? -1 : x->rank > y->rank;
}

static bool push(loss **ls, size_t *n, size_t *cap, uint64_t rank, int64_t delta)
{
    loss *grown = ml_grow(*ls, *n, cap, sizeof **ls, 64);
    if (!grown)
        return false;
    *ls = grown;
    (*ls)[(*n)++] = (loss){rank, delta};
    return true;
}

/* The padding [a, b) of bucket bk as changes over the ranks: each rank
 * [lo, hi] it covers loses v elements (its first and last rank their
 * parts of it, those between their whole part, all at once: a bucket's
 * end padding may span a million ranks). */
static bool add_range(loss **ls, size_t *n, size_t *cap, uint64_t dp, uint64_t lo, uint64_t hi,
                      uint64_t v)
{
    if (lo > hi || !v)
        return true;
    return push(ls, n, cap, lo, (int64_t)v) &&
           (hi + 1 >= dp || push(ls, n, cap, hi + 1, -(int64_t)v));
}

static bool add_gap(loss **ls, size_t *n, size_t *cap, const bucket *bk, uint64_t dp, uint64_t a,
                    uint64_t b)
{
    const uint64_t part = (bk->end - bk->start) / dp;
    const uint64_t r0 = (a - bk->start) / part, r1 = (b - 1 - bk->start) / part;
    if (r0 == r1)
        return add_range(ls, n, cap, dp, r0, r0, b - a);
    const uint64_t end0 = bk->start + (r0 + 1) * part, start1 = bk->start + r1 * part;
    return add_range(ls, n, cap, dp, r0, r0, end0 - a) &&
           add_range(ls, n, cap, dp, r0 + 1, r1 - 1, part) &&
           add_range(ls, n, cap, dp, r1, r1, b - start1);
}

/* The fullest rank: the parameter elements of each rank's parts, less the
 * padding in them. */
static bool fullest(const ml_chain *ch, const layout *L, uint64_t dp, ml_dopt *out)
{
    loss *ls = NULL;
    size_t n = 0, cap = 0;
    uint64_t whole = 0;
    bool ok = true;
    for (size_t k = 0; k < L->nb && ok; k++) {
        const bucket *bk = &L->bk[k];
        whole += (bk->end - bk->start) / dp;
        /* the bucket's parameters in buffer order: placed in reverse */
        uint64_t at = bk->start;
        for (size_t i = ch->nparams; i-- > 0 && ok;) {
            if (ch->params[i].frozen || L->at[i].bucket != k || L->at[i].end == 0)
                continue;
            if (L->at[i].start > at)
                ok = add_gap(&ls, &n, &cap, bk, dp, at, L->at[i].start);
            at = L->at[i].end;
        }
        if (ok && bk->end > at)
            ok = add_gap(&ls, &n, &cap, bk, dp, at, bk->end);
    }
    if (!ok) {
        free(ls);
        return false;
    }
    if (n) /* (an empty list may be NULL) */
        qsort(ls, n, sizeof *ls, by_rank);
    /* a sweep over the ranks: the padding is constant between two changes;
     * the lowest rank of the least padded stretch is the fullest */
    uint64_t best_rank = 0, best_lost = UINT64_MAX, from = 0;
    int64_t cur = 0;
    for (size_t i = 0; i <= n; i++) {
        const uint64_t r = i < n ? ls[i].rank : dp;
        if (r > from && (uint64_t)cur < best_lost) {
            best_rank = from;
            best_lost = (uint64_t)cur;
        }
        if (i < n) {
            cur += ls[i].delta;
            from = r;
        }
    }
    if (best_lost == UINT64_MAX)
        best_lost = 0;
    free(ls);
    out->rank = best_rank;
    out->shard = whole - best_lost;
    return true;
}

/* The fullest rank's pieces: each parameter's overlap with its parts. */
static size_t pieces(const ml_chain *ch, const layout *L, uint64_t dp, uint64_t r, uint64_t *frag,
                     size_t cap)
{
    size_t n = 0;
    for (size_t k = 0; k < L->nb; k++) {
        const bucket *bk = &L->bk[k];
        const uint64_t part = (bk->end - bk->start) / dp;
        const uint64_t lo = bk->start + r * part, hi = lo + part;
        for (size_t i = ch->nparams; i-- > 0;) {
            const placed *p = &L->at[i];
            if (ch->params[i].frozen || p->bucket != k || p->end == 0)
                continue;
            const uint64_t a = p->start > lo ? p->start : lo, b = p->end < hi ? p->end : hi;
            if (a < b) {
                if (frag && n < cap)
                    frag[n] = b - a;
                n++;
            }
        }
    }
    return n;
}

ml_status ml__dopt_layout(const ml_chain *ch, uint64_t dp, uint64_t v, ml_dopt *out,
                          uint64_t *frag, size_t cap)
{
    *out = (ml_dopt){0, 0, 0, 0, 0};
    if (dp < 1)
        dp = 1;
    if (v < 1)
        v = 1;
    layout L = {calloc(ch->nparams + 1, sizeof *L.at), NULL, 0, bucket_divisor(dp)};
    unsigned *chunk = calloc(ch->nparams + 1, sizeof *chunk);
    /* each parameter may close a bucket before and after itself */
    L.bk = calloc(2 * ch->nparams + v + 1, sizeof *L.bk);
    ml_status st = ML_NOMEM;
    if (!L.at || !chunk || !L.bk)
        goto done;
    chunk_of_params(ch, v, chunk);
    uint64_t base = 0;
    for (unsigned c = 0; c < v; c++)
        base += lay_chunk(ch, chunk, c, base, &L);
    out->padded = base;
    out->buckets = L.nb;
    if (!fullest(ch, &L, dp, out))
        goto done;
    out->fragments = pieces(ch, &L, dp, out->rank, frag, cap);
    st = ML_OK;
done:
    free(L.at);
    free(L.bk);
    free(chunk);
    return st;
}

ml_status ml__dp_sharding_refused(const ml_training *t, ml_error *err)
{
    const uint64_t dp = t->data_parallel ? t->data_parallel : 1;
    if (t->dp_shard && t->dp_shard != dp) {
        if (dp % t->dp_shard || t->dp_shard > dp)
            return ml__errorf(err, ML_RANGE,
                              "parallel.dp_shard: %llu does not divide the %llu data-parallel "
                              "ranks: a shard group is an equal share of them",
                              (unsigned long long)t->dp_shard, (unsigned long long)dp);
        if (!t->zero && !t->dist_optimizer)
            return ml__errorf(err, ML_RANGE,
                              "parallel.dp_shard: shard groups need a sharding: give "
                              "training.zero 1 to 3 (HSDP: 3) or parallel.dist_optimizer");
    }
    if (!t->dist_optimizer)
        return ML_OK;
    if (t->engine != ML_ENGINE_MEGATRON)
        return ml__errorf(err, ML_RANGE,
                          "parallel.dist_optimizer: Megatron's distributed optimizer shards "
                          "Megatron's buffers: plan with engine megatron (--engine megatron), "
                          "or shard eager PyTorch's optimizer with training.zero 1");
    if (t->zero || t->offload != ML_OFFLOAD_NONE)
        return ml__errorf(err, ML_RANGE,
                          "parallel.dist_optimizer: it is Megatron's own sharding of the "
                          "optimizer; give it without training.zero and training.offload");
    if (t->optimizer != ML_OPT_ADAM && t->optimizer != ML_OPT_ADAMW &&
        t->optimizer != ML_OPT_SGD && t->optimizer != ML_OPT_SGD_MOMENTUM)
        return ml__errorf(err, ML_RANGE,
                          "parallel.dist_optimizer: Megatron's optimizers are Adam (adam, "
                          "adamw) and SGD (sgd, sgd-momentum); %s is not one",
                          ml_optimizer_name(t->optimizer));
    return ML_OK;
}
