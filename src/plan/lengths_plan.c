/* Planning under a length distribution: the ledger evaluated at the batch
 * shapes the distribution produces — padded random batches (the longest of
 * b samples), a token budget, buckets, packing — and the largest token
 * budget whose worst batch fits (docs/lengths.md). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "memledger/lengths.h"
#include "memledger/plan.h"
#include "model/model_internal.h"
#include "util/error.h"

#define MAX_TOKENS (1ull << 34)
/* batch shapes a token budget may ask to evaluate (docs/lengths.md) */
#define MAX_RANGES 4096u

ml_lengths_request ml_lengths_request_defaults(void)
{
    ml_lengths_request r;
    memset(&r, 0, sizeof r);
    r.batching = ML_BATCHING_PADDED;
    r.buckets = 4;
    return r;
}

/* The points a search has planned, by (b, t): open addressing, cap a power
 * of two, an empty slot's b 0 (every batch has a sample). A search asks
 * for many shapes again (a token budget's longest lengths recur from one
 * budget to the next): each is planned once. */
typedef struct {
    struct seen_point {
        uint64_t b, t;
        ml_length_point pt;
    } *e;
    size_t n, cap;
} seen_points;

typedef struct {
    const ml_model *m;
    ml_config cfg;
    unsigned evaluations;
    ml_error *err;
    seen_points *seen; /* NULL: every point planned */
} lengths_ctx;

static size_t seen_slot(const seen_points *s, uint64_t b, uint64_t t)
{
    uint64_t h = (b * 0x9E3779B97F4A7C15ull) ^ (t * 0xC2B2AE3D27D4EB4Full);
    size_t i = (size_t)(h ^ (h >> 29)) & (s->cap - 1);
    while (s->e[i].b && (s->e[i].b != b || s->e[i].t != t))
        i = (i + 1) & (s->cap - 1);
    return i;
}

/* pt as (b, t)'s point; a host out of memory keeps nothing (the memo only
 * spares work). */
static void seen_put(seen_points *s, const ml_length_point *pt)
{
    if (2 * (s->n + 1) > s->cap) {
        seen_points g = {NULL, 0, s->cap ? 2 * s->cap : 256};
        if (!(g.e = calloc(g.cap, sizeof *g.e)))
            return;
        for (size_t i = 0; i < s->cap; i++)
            if (s->e[i].b)
                g.e[seen_slot(&g, s->e[i].b, s->e[i].t)] = s->e[i];
        g.n = s->n;
        free(s->e);
        *s = g;
    }
    size_t i = seen_slot(s, pt->micro_batch, pt->seq_len);
    s->e[i] = (struct seen_point){pt->micro_batch, pt->seq_len, *pt};
    s->n++;
}

/* p without the allocator's simulation (the allocated view), its points
 * planned each time (the memo holds simulated ones). */
static lengths_ctx allocated_view(const lengths_ctx *p)
{
    lengths_ctx q = *p;
    ml__device_allocated_view(&q.cfg.device);
    q.seen = NULL;
    return q;
}

/* The ledger at micro-batch b and sequence length t. */
static ml_status point_at(lengths_ctx *p, uint64_t b, uint64_t t, ml_length_point *out)
{
    if (p->seen && p->seen->cap) {
        size_t i = seen_slot(p->seen, b, t);
        if (p->seen->e[i].b) {
            *out = p->seen->e[i].pt;
            return ML_OK;
        }
    }
    ml_config c = p->cfg;
    c.training.micro_batch = b;
    c.training.seq_len = t;
    ml_ledger *l = NULL;
    p->evaluations++;
    ml_status st = ml_ledger_evaluate(p->m, &c, false, &l, p->err);
    if (st)
        return st;
    const ml_summary *s = ml_ledger_summary(l);
    const uint64_t peaks[] = {s->peak, s->peak_first_iteration, s->peak_eval};
    *out = (ml_length_point){b,           t, peaks[s->binding], s->peak_total,
                             s->has_device && s->fits, s->has_device ? s->headroom : 0};
    ml_ledger_destroy(l);
    if (p->seen)
        seen_put(p->seen, out);
    return ML_OK;
}

/* Whether batch a is worse than batch b: with a device, the tighter (one
 * that does not fit before any that does, then the less headroom, then the
 * higher peak: the verdict's and triage's batch); without one, the higher
 * binding allocator peak. */
static bool worse(const ml_length_point *a, const ml_length_point *b, bool device)
{
    if (device && a->fits != b->fits)
        return !a->fits;
    if (device && a->headroom != b->headroom)
        return a->headroom < b->headroom;
    return a->peak > b->peak;
}

/* out->max the tightest of the rows listed: the median's and P99's batches
 * too (with the caching allocator simulated, one of them can run out of
 * the device where the longest fits). */
static void tightest(ml_lengths_result *out, bool device)
{
    if (worse(&out->p99, &out->max, device))
        out->max = out->p99;
    if (worse(&out->p50, &out->max, device))
        out->max = out->p50;
}

/* Samples of a token budget's batch whose longest sample has t tokens. */
static uint64_t budget_batch(uint64_t tokens, uint64_t t)
{
    return tokens / t ? tokens / t : 1;
}

/* What every plan needs: a model with a sequence, lengths within its
 * positions. */
static ml_status check_model(const ml_model *m, const ml_lengths *d, ml_error *err)
{
    if (m->type == ML_MODEL_SEQUENTIAL || m->embed.image_size)
        return ml__errorf(err, ML_USAGE,
                          "lengths: %s has no token sequence (a sequential or vision model); "
                          "length distributions apply to text decoders and encoders",
                          ml_model_name(m));
    if (ml_model_image_tokens(m))
        return ml__errorf(err, ML_USAGE,
                          "lengths: %s is multimodal: each sample's %llu image tokens are part "
                          "of its sequence, which one text-length distribution does not "
                          "describe; plan the longest batch with --seq-len",
                          ml_model_name(m), (unsigned long long)ml_model_image_tokens(m));
    if (m->type == ML_MODEL_ENCDEC)
        return ml__errorf(err, ML_USAGE,
                          "lengths: %s is an encoder-decoder, whose inputs and targets have "
                          "lengths of their own; one distribution is not planned: plan the "
                          "longest batch with --seq-len and --target-len",
                          ml_model_name(m));
    if (m->embed.position == ML_POS_LEARNED && ml_lengths_max(d) > m->embed.max_positions)
        return ml__errorf(err, ML_RANGE,
                          "lengths: the longest sample has %llu tokens, beyond the model's %llu "
                          "learned positions (model.max_positions): truncate the samples to "
                          "%llu tokens, as the tokenizer's max_length would",
                          (unsigned long long)ml_lengths_max(d),
                          (unsigned long long)m->embed.max_positions,
                          (unsigned long long)m->embed.max_positions);
    return ML_OK;
}

/* The longest length in (lo, hi] whose batch of b samples fits, or lo when
 * none does: bisection, since at a fixed micro-batch the peak rises with the
 * length. */
static ml_status longest_fitting(lengths_ctx *p, uint64_t b, uint64_t lo, uint64_t hi,
                                 uint64_t *out)
{
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo + 1) / 2;
        ml_length_point pt;
        ml_status st = point_at(p, b, mid, &pt);
        if (st)
            return st;
        if (pt.fits)
            lo = mid;
        else
            hi = mid - 1;
    }
    *out = lo;
    return ML_OK;
}

/* Padded random batches of the config's micro-batch: the longest of b
 * samples at the median and P99, the worst batch, the longest that fits
 * and the probability of a batch over the device: 1 - F(T_fit)^b. */
static ml_status padded_fixed(lengths_ctx *p, const ml_lengths *d, ml_lengths_result *out)
{
    const uint64_t b = p->cfg.training.micro_batch;
    ml_status st;
    if ((st = point_at(p, b, ml_lengths_batch_max_quantile(d, b, 0.5), &out->p50)) ||
        (st = point_at(p, b, ml_lengths_batch_max_quantile(d, b, 0.99), &out->p99)) ||
        (st = point_at(p, b, ml_lengths_max(d), &out->max)))
        return st;
    if (!p->cfg.device.present)
        return ML_OK;
    tightest(out, true);
    uint64_t lo = ml_lengths_max(d);
    if (!out->max.fits && (st = longest_fitting(p, b, 0, lo - 1, &lo)))
        return st;
    out->longest_fit = lo;
    out->p_over_budget = 1 - pow(ml_lengths_cdf(d, lo), (double)b);
    return ML_OK;
}

/* The lengths t of d's support range whose batches have the same size
 * budget_batch(tokens, t): [t, last]. */
static uint64_t same_batch_last(uint64_t tokens, uint64_t t, uint64_t tmax)
{
    uint64_t b = budget_batch(tokens, t);
    uint64_t last = b > 1 || tokens / t ? tokens / b : tmax; /* floor(N/b) keeps b */
    return last < tmax ? last : tmax;
}

/* The largest token budget whose batches of the shortest samples stay
 * within the micro-batch limit (2^24). */
static uint64_t budget_limit(const ml_lengths *d)
{
    const uint64_t tmin = ml_lengths_min(d);
    return tmin <= MAX_TOKENS >> 24 ? tmin << 24 : MAX_TOKENS;
}

uint64_t ml_lengths_budget_limit(const ml_lengths *d)
{
    return d ? budget_limit(d) : 0;
}

/* The same-batch ranges of a token budget that hold a sample; ML_RANGE
 * past MAX_RANGES (each costs a ledger evaluation or more). */
static ml_status count_ranges(const ml_lengths *d, uint64_t tokens, ml_error *err)
{
    const uint64_t tmax = ml_lengths_max(d);
    unsigned n = 0;
    for (uint64_t t = ml_lengths_min(d); t <= tmax;) {
        const uint64_t end = same_batch_last(tokens, t, tmax);
        n += ml_lengths_floor(d, end) >= t;
        if (n > MAX_RANGES)
            return ml__errorf(err, ML_RANGE,
                              "lengths: a budget of %llu tokens over lengths %llu to %llu makes "
                              "more than %u batch sizes to plan; use a smaller max_tokens, "
                              "or lengths from a CSV (only the lengths that occur are planned)",
                              (unsigned long long)tokens, (unsigned long long)ml_lengths_min(d),
                              (unsigned long long)tmax, MAX_RANGES);
        t = end + 1;
    }
    return ML_OK;
}

/* A token budget: batches of floor(N / t) samples of length <= t. Within a
 * range of lengths with the same batch size the peak rises with t, so the
 * worst batch is at some range's longest length, and the lengths that fit
 * are a prefix of each range. */
static ml_status token_budget(lengths_ctx *p, const ml_lengths *d, uint64_t tokens,
                              ml_lengths_result *out)
{
    ml_status st = count_ranges(d, tokens, p->err);
    if (st)
        return st;
    const uint64_t q50 = ml_lengths_quantile(d, 0.5), q99 = ml_lengths_quantile(d, 0.99);
    if ((st = point_at(p, budget_batch(tokens, q50), q50, &out->p50)) ||
        (st = point_at(p, budget_batch(tokens, q99), q99, &out->p99)))
        return st;
    const uint64_t tmin = ml_lengths_min(d), tmax = ml_lengths_max(d);
    bool have = false;
    double over = 0;
    for (uint64_t t = tmin; t <= tmax;) {
        const uint64_t end = same_batch_last(tokens, t, tmax), b = budget_batch(tokens, t);
        const uint64_t last = ml_lengths_floor(d, end);
        if (last < t) { /* no sample has a length in [t, end] */
            t = end + 1;
            continue;
        }
        ml_length_point top;
        if ((st = point_at(p, b, last, &top)))
            return st;
        if (!have || worse(&top, &out->max, p->cfg.device.present))
            out->max = top;
        have = true;
        if (p->cfg.device.present && !top.fits) {
            /* the longest of [t, last] that fits: the rest is over */
            uint64_t lo;
            if ((st = longest_fitting(p, b, t - 1, last - 1, &lo)))
                return st;
            over += ml_lengths_cdf(d, last) - ml_lengths_cdf(d, lo);
        }
        t = end + 1;
    }
    tightest(out, p->cfg.device.present);
    out->p_over_budget = p->cfg.device.present ? over : NAN;
    return ML_OK;
}

/* K buckets of equal shares (by the quantiles k/K); each at its longest
 * length with the largest micro-batch that fits (ml_fit), or the config's
 * micro-batch without a device. */
static ml_status bucketed(lengths_ctx *p, const ml_lengths *d, unsigned k, ml_lengths_result *out)
{
    ml_status st;
    uint64_t lo = ml_lengths_min(d);
    for (unsigned i = 1; i <= k && lo <= ml_lengths_max(d); i++) {
        uint64_t hi = i == k ? ml_lengths_max(d) : ml_lengths_quantile(d, (double)i / k);
        if (hi < lo)
            continue;
        ml_length_bucket *bk = &out->buckets[out->nbuckets++];
        bk->lo = lo;
        bk->hi = hi;
        bk->share = ml_lengths_cdf(d, hi) - ml_lengths_cdf(d, lo - 1);
        uint64_t b = p->cfg.training.micro_batch;
        if (p->cfg.device.present) {
            ml_config c = p->cfg;
            c.training.seq_len = hi;
            ml_fit_request req = ml_fit_request_defaults();
            ml_fit_result fr;
            if ((st = ml_fit(p->m, &c, &req, &fr, p->err)))
                return st;
            p->evaluations += fr.evaluations;
            b = fr.fits ? fr.micro_batch : 1;
        }
        if ((st = point_at(p, b, hi, &bk->point)))
            return st;
        lo = hi + 1;
    }
    /* the worst bucket's batch; the median and P99 samples' buckets */
    const uint64_t q50 = ml_lengths_quantile(d, 0.5), q99 = ml_lengths_quantile(d, 0.99);
    double over = 0;
    for (size_t i = 0; i < out->nbuckets; i++) {
        const ml_length_bucket *bk = &out->buckets[i];
        if (!i || worse(&bk->point, &out->max, p->cfg.device.present))
            out->max = bk->point;
        if (q50 >= bk->lo && q50 <= bk->hi)
            out->p50 = bk->point;
        if (q99 >= bk->lo && q99 <= bk->hi)
            out->p99 = bk->point;
        if (!bk->point.fits)
            over += bk->share;
    }
    out->p_over_budget = p->cfg.device.present ? over : NAN;
    return ML_OK;
}

/* Context parallelism needs each batch's length a multiple of 2 cp (ring
 * attention's load balancing): not planned over a distribution. */
static ml_status cp_refused(const ml_config *cfg, ml_error *err)
{
    if (cfg->training.context_parallel <= 1)
        return ML_OK;
    return ml__errorf(err, ML_RANGE,
                      "parallel.cp: %llu with a length distribution (lengths): context "
                      "parallelism splits sequences of a multiple of 2 x cp tokens, which "
                      "batches of these lengths are not; plan lengths without parallel.cp, "
                      "or one seq_len with it",
                      (unsigned long long)cfg->training.context_parallel);
}

ml_status ml_lengths_plan(const ml_model *m, const ml_config *cfg, const ml_lengths *d,
                          const ml_lengths_request *req, ml_lengths_result *out, ml_error *err)
{
    memset(out, 0, sizeof *out);
    out->p_over_budget = NAN;
    ml_status st = cp_refused(cfg, err);
    if (!st)
        st = check_model(m, d, err);
    if (st)
        return st;
    if (req->max_tokens > budget_limit(d))
        return ml__errorf(err, ML_RANGE,
                          "lengths: a budget of %llu tokens makes batches of more than 16777216 "
                          "samples of the shortest length (%llu tokens): at most %llu",
                          (unsigned long long)req->max_tokens,
                          (unsigned long long)ml_lengths_min(d),
                          (unsigned long long)budget_limit(d));
    if (req->batching == ML_BATCHING_BUCKETED &&
        (req->buckets < 1 || req->buckets > ML_LENGTHS_MAX_BUCKETS))
        return ml__errorf(err, ML_RANGE, "buckets: must be between 1 and %d, got %u",
                          ML_LENGTHS_MAX_BUCKETS, req->buckets);
    lengths_ctx p = {m, *cfg, 0, err, NULL};
    switch (req->batching) {
    case ML_BATCHING_PACKED: /* every batch: micro_batch rows of seq_len tokens */
        if ((st = point_at(&p, cfg->training.micro_batch, cfg->training.seq_len, &out->max)))
            break;
        out->p50 = out->p99 = out->max;
        out->longest_fit = out->max.fits ? out->max.seq_len : 0;
        out->p_over_budget = cfg->device.present ? (out->max.fits ? 0 : 1) : NAN;
        break;
    case ML_BATCHING_BUCKETED:
        st = bucketed(&p, d, req->buckets, out);
        break;
    case ML_BATCHING_PADDED:
    default:
        st = req->max_tokens ? token_budget(&p, d, req->max_tokens, out)
                             : padded_fixed(&p, d, out);
        if (!st && !cfg->device.present)
            out->p_over_budget = NAN;
        break;
    }
    out->evaluations = p.evaluations;
    return st;
}

/* A same-batch range's top: its batch, its longest length with a sample,
 * and (planned without the simulation) its headroom. */
typedef struct {
    uint64_t b, t;
    int64_t headroom;
} range_top;

static int tighter_first(const void *x, const void *y)
{
    const range_top *a = x, *b = y;
    return a->headroom != b->headroom ? (a->headroom < b->headroom ? -1 : 1)
                                      : (a->t > b->t) - (a->t < b->t);
}

/* Whether every batch of a token budget fits: each same-batch range at its
 * longest length. Planned without the allocator's simulation first: the
 * allocator peak is at most the reserved one, so a range top over the
 * budget there is over it simulated too (fit's search prunes so:
 * docs/allocator.md); then simulated, the tightest first, to the first
 * that does not fit. */
static ml_status budget_fits(lengths_ctx *p, const ml_lengths *d, uint64_t tokens, bool *fits)
{
    ml_status st = count_ranges(d, tokens, p->err);
    if (st)
        return st;
    const uint64_t tmax = ml_lengths_max(d);
    range_top *tops = malloc(MAX_RANGES * sizeof *tops);
    if (!tops)
        return ml__errorf(p->err, ML_NOMEM, "out of memory");
    size_t n = 0;
    lengths_ctx q = allocated_view(p);
    *fits = true;
    for (uint64_t t = ml_lengths_min(d); t <= tmax && *fits && !st;) {
        const uint64_t end = same_batch_last(tokens, t, tmax);
        const uint64_t last = ml_lengths_floor(d, end);
        const uint64_t b = budget_batch(tokens, t);
        ml_length_point pt;
        if (last >= t && n < MAX_RANGES && !(st = point_at(&q, b, last, &pt))) {
            tops[n++] = (range_top){b, last, pt.headroom};
            *fits = pt.fits;
        }
        t = end + 1;
    }
    p->evaluations = q.evaluations;
    if (!st && *fits && p->cfg.device.allocator != ML_ALLOCATOR_NONE) {
        qsort(tops, n, sizeof *tops, tighter_first);
        for (size_t i = 0; i < n && *fits && !st; i++) {
            ml_length_point pt;
            if (!(st = point_at(p, tops[i].b, tops[i].t, &pt)))
                *fits = pt.fits;
        }
    }
    free(tops);
    return st;
}

/* The largest budget in [lo, hi) that fits, lo fitting and hi not:
 * bisection. */
static ml_status bisect_budget(lengths_ctx *p, const ml_lengths *d, uint64_t lo, uint64_t hi,
                               uint64_t *out)
{
    bool fits;
    while (lo + 1 < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        ml_status st = budget_fits(p, d, mid, &fits);
        if (st)
            return st;
        *(fits ? &lo : &hi) = mid;
    }
    *out = lo;
    return ML_OK;
}

/* The largest budget that fits, from the longest sample up (0: not even
 * that): N >= the longest sample (else it would get a batch of its own);
 * the worst batch grows with N: doubling to a failure, then bisection. */
static ml_status largest_budget(lengths_ctx *p, const ml_lengths *d, uint64_t *out)
{
    uint64_t lo = ml_lengths_max(d), hi = 0;
    const uint64_t limit = budget_limit(d);
    bool fits;
    ml_status st = budget_fits(p, d, lo, &fits);
    *out = 0;
    if (st || !fits)
        return st;
    for (uint64_t n = lo * 2; !hi && lo < limit; n *= 2) {
        if (n > limit)
            n = limit;
        if ((st = budget_fits(p, d, n, &fits)))
            return st;
        *(fits ? &lo : &hi) = n;
    }
    return hi ? bisect_budget(p, d, lo, hi, out) : (*out = lo, ML_OK);
}

/* The same, searching down from top, a budget that fits without the
 * allocator's simulation: top, then steps of 1, 2, 4, ... below it to one
 * that fits, then bisection between that one and the last that did not. A
 * budget that does not fit is cheap to tell (budget_fits stops at its
 * first batch over, the tightest first); one that fits plans every batch. */
static ml_status largest_budget_below(lengths_ctx *p, const ml_lengths *d, uint64_t top,
                                      uint64_t *out)
{
    const uint64_t first = ml_lengths_max(d);
    bool fits;
    ml_status st = budget_fits(p, d, top, &fits);
    *out = 0;
    if (st || fits) {
        *out = st ? 0 : top;
        return st;
    }
    uint64_t hi = top, step = 1;
    for (;;) {
        const uint64_t n = hi - first > step ? hi - step : first;
        if ((st = budget_fits(p, d, n, &fits)))
            return st;
        if (fits)
            return bisect_budget(p, d, n, hi, out);
        if (n == first)
            return ML_OK;
        hi = n;
        step *= 2;
    }
}

/* The largest token budget whose batches all fit. With the allocator
 * simulated, the allocated view first, without the simulation: a budget
 * that fits with the cache fits without it (the simulation only adds to
 * the peak), so the answer is at most the allocated view's, and the
 * simulated search runs down from there (as fit's micro-batch search:
 * docs/lengths.md). With plan, that budget planned too, from the points
 * the search simulated. */
static ml_status search_tokens(const ml_model *m, const ml_config *cfg, const ml_lengths *d,
                               uint64_t *tokens, ml_lengths_result *plan,
                               unsigned *evaluations, ml_error *err)
{
    *tokens = 0;
    ml_status st = cp_refused(cfg, err);
    if (!st)
        st = check_model(m, d, err);
    if (st)
        return st;
    if (!cfg->device.present)
        return ml__errorf(err, ML_USAGE,
                          "max_tokens auto needs a device (device.memory)");
    if (ml_lengths_max(d) > budget_limit(d))
        return ml__errorf(err, ML_RANGE,
                          "lengths: the longest sample (%llu tokens) is more than 16777216 "
                          "times the shortest (%llu): no token budget fits both",
                          (unsigned long long)ml_lengths_max(d),
                          (unsigned long long)ml_lengths_min(d));
    seen_points seen = {NULL, 0, 0};
    lengths_ctx p = {m, *cfg, 0, err, &seen};
    lengths_ctx q = allocated_view(&p);
    uint64_t top = 0;
    st = largest_budget(cfg->device.allocator == ML_ALLOCATOR_NONE ? &p : &q, d, &top);
    if (!st && top && cfg->device.allocator != ML_ALLOCATOR_NONE)
        st = largest_budget_below(&p, d, top, &top);
    if (!st)
        *tokens = top;
    if (!st && plan && top) {
        memset(plan, 0, sizeof *plan);
        plan->p_over_budget = NAN;
        st = token_budget(&p, d, top, plan);
        plan->evaluations = p.evaluations + q.evaluations;
    }
    free(seen.e);
    if (evaluations)
        *evaluations = p.evaluations + q.evaluations;
    return st;
}

ml_status ml_lengths_fit_tokens(const ml_model *m, const ml_config *cfg, const ml_lengths *d,
                                uint64_t *tokens, unsigned *evaluations, ml_error *err)
{
    return search_tokens(m, cfg, d, tokens, NULL, evaluations, err);
}

ml_status ml_lengths_fit_tokens_plan(const ml_model *m, const ml_config *cfg, const ml_lengths *d,
                                     uint64_t *tokens, ml_lengths_result *out, ml_error *err)
{
    return search_tokens(m, cfg, d, tokens, out, NULL, err);
}
