/* colocate: jobs sharing one device, each in its own process (its own CUDA
 * context and runtime reserve). The worst case is the sum of the peaks (some
 * phase lines them up); with a time axis, the peak when the jobs start
 * together and the share of time their sum is over the device when their
 * phases are independent (docs/colocate.md). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ledger/levels.h"
#include "ledger/replay.h"
#include "memledger/plan.h"
#include "util/error.h"

/* One job's steady iteration as a periodic curve: event i holds `v[i]`
 * (the allocator's bytes after it, plus the job's reserve and allowance)
 * from t[i] until the next event; the period is T. An inference job is
 * flat: one level, `flat`, at every instant (no period). */
typedef struct {
    const ml_event *ev; /* the events, or */
    const ml_level *lv; /* their levels (ml__ledger_keep_levels) */
    size_t n;
    double T;
    uint64_t offset;
    bool is_flat;
    uint64_t flat; /* the inference job's allocator peak */
} curve;

static uint64_t event_total(const ml_event *e)
{
    uint64_t s = 0;
    for (int k = 0; k < ML_CAT_COUNT; k++)
        s += e->live[k];
    return s;
}

/* Event k's time and the bytes after it. */
static double t_at(const curve *c, size_t k)
{
    return c->is_flat ? 0 : c->lv ? c->lv[k].t_s : c->ev[k].t_s;
}

static uint64_t v_at(const curve *c, size_t k)
{
    return c->is_flat ? c->flat : c->lv ? c->lv[k].total : event_total(&c->ev[k]);
}

static void curve_of(const ml_colocate_job *j, curve *c)
{
    memset(c, 0, sizeof *c);
    if (j->inference) {
        const ml_inference *i = j->inference;
        c->is_flat = true;
        c->flat = i->peak;
        c->n = 1;
        c->offset = i->runtime_reserve + i->fragmentation;
        return;
    }
    const ml_summary *s = ml_ledger_summary(j->ledger);
    c->lv = ml__ledger_levels(j->ledger, &c->n);
    if (!c->lv) {
        c->ev = ml_ledger_events(j->ledger);
        c->n = ml_ledger_event_count(j->ledger);
    }
    /* the iteration's period: a pipeline stage's events span its own work,
     * and it holds its last level through the rest of the pipeline's step */
    c->T = ml_summary_step_time(s);
    c->offset = s->runtime_reserve + s->fragmentation;
}

static size_t events_of(const ml_colocate_job *j)
{
    curve c;
    curve_of(j, &c);
    return c.n;
}

/* The job's period: its step time; 0 for a flat job (no time axis). */
static double period_of(const ml_colocate_job *j)
{
    return j->inference ? 0 : ml_summary_step_time(ml_ledger_summary(j->ledger));
}

/* The job's binding allocator peak and its device total (for a training
 * job, the allocator peak is the device total less the job's reserve and
 * allowance: the binding one of its three peaks, docs/ledger.md). */
static void peaks_of(const ml_colocate_job *j, uint64_t *peak, uint64_t *total)
{
    if (j->inference) {
        *peak = j->inference->peak;
        *total = j->inference->peak_total;
        return;
    }
    const ml_summary *s = ml_ledger_summary(j->ledger);
    *peak = ml_summary_budget_figure(s); /* what plan holds against its budget */
    *total = s->peak_total;
}

/* The last event at or before u (events are in time order; the first is
 * at 0). */
static size_t last_at(const curve *c, double u)
{
    size_t lo = 0, hi = c->n;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (t_at(c, mid) <= u)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

static double phase(const curve *c, double t)
{
    double u = fmod(t, c->T);
    return u < 0 ? u + c->T : u;
}

static uint64_t level(const ml_colocate_job *j, double t_s)
{
    curve c;
    curve_of(j, &c);
    if (c.is_flat)
        return c.flat + c.offset;
    if (!c.n || !(c.T > 0))
        return c.offset;
    return v_at(&c, last_at(&c, phase(&c, t_s))) + c.offset;
}

uint64_t ml_colocate_level(const ml_ledger *l, double t_s)
{
    const ml_colocate_job j = {l, NULL};
    return level(&j, t_s);
}

uint64_t ml_colocate_job_level(const ml_colocate_job *j, double t_s)
{
    return level(j, t_s);
}

/* The most the job holds at the instant t: its level, or higher while the
 * events at exactly that time run (they take no time on this axis; the
 * step's events at T are those of the next iteration's 0 too). */
static uint64_t instant_max(const curve *c, double t)
{
    if (c->is_flat)
        return c->flat + c->offset;
    /* "the same instant" within a billionth of the period: the phase of a
     * sum of periods loses the last bits */
    const double tol = 1e-9 * c->T;
    double u = phase(c, t);
    if (c->T - u <= tol)
        u = 0;
    size_t k = last_at(c, u + tol);
    uint64_t best = v_at(c, k);
    for (size_t i = k + 1; i-- > 0 && t_at(c, i) >= u - tol;)
        best = best > v_at(c, i) ? best : v_at(c, i);
    for (size_t i = c->n; u <= tol && i-- > 0 && t_at(c, i) >= c->T - tol;)
        best = best > v_at(c, i) ? best : v_at(c, i);
    return best + c->offset;
}

/* Started together: the highest sum at any event of any job (the others at
 * their level then), over the longest period. *work bounds the candidate
 * instants (a short period repeats within the long one). */
static void aligned(const ml_colocate_job *ls, size_t n, ml_colocate_result *r)
{
    double H = 0, work = 0;
    for (size_t j = 0; j < n; j++)
        H = fmax(H, period_of(&ls[j]));
    /* counted in doubles: a period ratio past 2^64 must not wrap the count;
     * a flat job is one instant */
    for (size_t j = 0; j < n; j++)
        work += (double)events_of(&ls[j]) *
                (ls[j].inference ? 1 : ceil(H / period_of(&ls[j])));
    if (!(work <= ML_COLOCATE_MAX_INSTANTS))
        return;
    for (size_t j = 0; j < n; j++) {
        curve c;
        curve_of(&ls[j], &c);
        const uint64_t reps = c.is_flat ? 1 : (uint64_t)ceil(H / c.T);
        for (uint64_t b = 0; b < reps; b++)
            for (size_t k = 0; k < c.n; k++) {
                const double at = (double)b * c.T + t_at(&c, k);
                if (at > H * (1 + 1e-12))
                    break;
                uint64_t sum = v_at(&c, k) + c.offset;
                for (size_t i = 0; i < n; i++)
                    if (i != j) {
                        curve o;
                        curve_of(&ls[i], &o);
                        sum += o.is_flat || (o.n && o.T > 0) ? instant_max(&o, at) : o.offset;
                    }
                if (sum > r->aligned_total) {
                    r->aligned_total = sum;
                    r->aligned_at_s = at;
                }
            }
    }
    r->aligned_known = true;
}

typedef struct {
    uint64_t v;
    double w; /* share of the period */
} seg;

static int by_value(const void *a, const void *b)
{
    const seg *x = a, *y = b;
    return x->v < y->v ? -1 : x->v > y->v;
}

/* The job's levels with the share of its period each holds. */
static seg *segments(const ml_colocate_job *l, size_t *out)
{
    curve c;
    curve_of(l, &c);
    seg *s = malloc((c.n ? c.n : 1) * sizeof *s);
    if (!s)
        return NULL;
    size_t m = 0;
    if (c.is_flat) { /* its level all the time */
        s[m++] = (seg){c.flat + c.offset, 1};
        c.n = 0;
    }
    for (size_t k = 0; k < c.n; k++) {
        const double end = k + 1 < c.n ? t_at(&c, k + 1) : c.T;
        const double d = fmin(end, c.T) - t_at(&c, k);
        if (d > 0)
            s[m++] = (seg){v_at(&c, k) + c.offset, d / c.T};
    }
    *out = m;
    return s;
}

/* Two jobs at independent uniform phases: P(a + b > memory). */
static ml_status time_over(const ml_colocate_job *a, const ml_colocate_job *b, uint64_t memory,
                           double *p, ml_error *err)
{
    size_t na = 0, nb = 0;
    seg *sa = segments(a, &na), *sb = segments(b, &nb);
    if (!sa || !sb) {
        free(sa);
        free(sb);
        return ml__errorf(err, ML_NOMEM, "out of memory");
    }
    qsort(sb, nb, sizeof *sb, by_value);
    /* tail[i]: the share of b's period at levels sb[i..] */
    for (size_t i = nb; i-- > 1;)
        sb[i - 1].w += sb[i].w;
    double over = 0;
    for (size_t k = 0; k < na; k++) {
        if (sa[k].v > memory) {
            over += sa[k].w;
            continue;
        }
        const uint64_t room = memory - sa[k].v; /* b over room is over the device */
        size_t lo = 0, hi = nb;                 /* first level above room */
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (sb[mid].v > room)
                hi = mid;
            else
                lo = mid + 1;
        }
        if (lo < nb)
            over += sa[k].w * sb[lo].w;
    }
    *p = fmin(1.0, over);
    free(sa);
    free(sb);
    return ML_OK;
}

/* The verdict over the jobs' sums: plan's (docs/ledger.md, "The verdict")
 * with the allocator peaks summed against the budget and the device totals
 * summed against the device. */
static ml_status verdict(const ml_colocate_job *jobs, size_t n, ml_colocate_result *out,
                         ml_error *err)
{
    size_t simulated = 0;
    for (size_t j = 0; j < n; j++) {
        uint64_t peak = 0, total = 0;
        peaks_of(&jobs[j], &peak, &total);
        simulated += !jobs[j].inference && ml_ledger_summary(jobs[j].ledger)->has_reserved;
        if (__builtin_add_overflow(out->worst_total, total, &out->worst_total) ||
            __builtin_add_overflow(out->peak_sum, peak, &out->peak_sum))
            return ml__errorf(err, ML_OVERFLOW, "the jobs' peaks together exceed 64 bits");
    }
    out->peaks_reserved = !simulated ? 0 : simulated == n ? 1 : 2;
    /* the default line, as plan's memory - runtime_reserve: here the
     * jobs' reserves (and allowances, which only lower it further: the
     * device total's condition then implies the budget's) */
    if (!out->budget_given) {
        uint64_t own = 0; /* below worst_total: no wrap */
        for (size_t j = 0; j < n; j++)
            own += jobs[j].inference ? jobs[j].inference->runtime_reserve
                                     : ml_ledger_summary(jobs[j].ledger)->runtime_reserve;
        out->budget = own < out->memory ? out->memory - own : 0;
    }
    for (size_t j = 0; j < n && !out->oom_job; j++)
        if (jobs[j].ledger && ml_ledger_summary(jobs[j].ledger)->reserved_oom_weighed)
            out->oom_job = j + 1;
    out->fits = !out->oom_job && out->peak_sum <= out->budget && out->worst_total <= out->memory;
    int64_t h1 = 0, h2 = 0;
    if (!ml__headroom(out->budget, out->peak_sum, &h1) ||
        !ml__headroom(out->memory, out->worst_total, &h2))
        return ml__errorf(err, ML_OVERFLOW, "the jobs' peaks are more than 8 EiB (2^63 B) over "
                                           "the device: their headroom does not fit 64 bits");
    out->headroom = h1 < h2 ? h1 : h2;
    if (out->oom_job && out->headroom >= 0)
        out->headroom = -1; /* as plan's for a plan that runs out with room left */
    return ML_OK;
}

ml_status ml_colocate_jobs(const ml_colocate_job *jobs, size_t n, uint64_t memory,
                           uint64_t budget, ml_colocate_result *out, ml_error *err)
{
    ml_error local;
    if (!err)
        err = &local;
    memset(err, 0, sizeof *err);
    memset(out, 0, sizeof *out);
    out->memory = memory;
    out->p_time_over = -1;
    if (n < 2)
        return ml__errorf(err, ML_USAGE, "colocate needs two jobs or more");
    for (size_t j = 0; j < n; j++)
        if (!jobs[j].ledger == !jobs[j].inference)
            return ml__errorf(err, ML_USAGE, "colocate: job %zu must be a training job (a "
                              "ledger) or an inference job, one of the two", j + 1);
    if (budget > memory)
        return ml__errorf(err, ML_RANGE, "budget: the budget is above the device memory");
    out->budget = budget;
    out->budget_given = budget > 0;
    ml_status st = verdict(jobs, n, out, err);
    if (st)
        return st;
    out->timed = true;
    for (size_t j = 0; j < n; j++) /* a flat job is the same at every instant */
        out->timed &= jobs[j].inference || (period_of(&jobs[j]) > 0 && events_of(&jobs[j]) > 0);
    if (!out->timed)
        return ML_OK;
    aligned(jobs, n, out);
    if (n == 2)
        return time_over(&jobs[0], &jobs[1], memory, &out->p_time_over, err);
    return ML_OK;
}

ml_status ml_colocate(const ml_ledger *const *jobs, size_t n, uint64_t memory,
                      ml_colocate_result *out, ml_error *err)
{
    ml_colocate_job *js = calloc(n ? n : 1, sizeof *js);
    if (!js) {
        if (err)
            ml__errorf(err, ML_NOMEM, "out of memory");
        return ML_NOMEM;
    }
    for (size_t j = 0; j < n; j++)
        js[j].ledger = jobs[j];
    ml_status st = ml_colocate_jobs(js, n, memory, 0, out, err);
    free(js);
    return st;
}
