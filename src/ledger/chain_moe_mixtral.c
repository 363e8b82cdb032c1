/* A mixture of experts' routed rows (chain_kit.h), which the op graph's
 * expert ops are sized by (chain_graph.c): the busiest expert's rows and
 * the runs of experts with equal rows. The experts themselves are the op
 * graph's (src/graph/kit_moe.c). */
#include <math.h>
#include <stdint.h>

#include "ledger/chain_kit.h"

uint64_t ml__ck_busiest_rows(const ml_ck_dims *d, uint64_t N, uint64_t E)
{
    double busy = (double)N / (double)E * d->expert_imbalance;
    return busy >= (double)d->BT ? d->BT : (uint64_t)ceil(busy);
}

/* The experts with rows, hit = min(N, E) (HF's expert_hitted; every other
 * expert keeps a row, HF skips the experts without any). Each takes N / E
 * rows, one more for the first N mod E experts (balanced; the twins' fixed
 * routing sends pair p to expert p mod E); with an imbalance the first
 * takes the busiest rows (at most all but a row for each other expert)
 * and the others share the rest the same way. */
unsigned ml__ck_expert_runs(const ml_ck_dims *d, uint64_t N, uint64_t E, uint64_t count[3],
                            uint64_t rows[3])
{
    const uint64_t busiest = ml__ck_busiest_rows(d, N, E), hit = N < E ? N : E;
    const uint64_t most = N - (hit - 1);
    const uint64_t busy = d->expert_imbalance > 1 ? (busiest < most ? busiest : most) : 0;
    uint64_t c[3] = {N % E, hit - N % E, 0}, r[3] = {N / E + 1, N / E, 0};
    if (busy && hit >= 2) {
        const uint64_t rest = N - busy, n = hit - 1;
        c[0] = 1;
        r[0] = busy;
        c[1] = rest % n;
        r[1] = rest / n + 1;
        c[2] = n - rest % n;
        r[2] = rest / n;
    }
    unsigned k = 0;
    for (unsigned i = 0; i < 3; i++)
        if (c[i]) {
            count[k] = c[i];
            rows[k++] = r[i];
        }
    return k;
}

/* The group whose pairs reach the rank's experts: its ep x etp ranks'
 * tokens (the all-to-all over ep, the all-gather over etp; the busiest
 * expert takes at most one row of each). */
static uint64_t times(uint64_t a, uint64_t b)
{
    uint64_t r;
    return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r; /* saturated: the sizes
                                                                 overflow downstream */
}

static ml_ck_dims group_dims(const ml_ck_dims *d)
{
    ml_ck_dims g = *d;
    g.BT = times(d->dispatch ? d->BTs : d->BT, d->ep * d->etp);
    return g;
}

uint64_t ml__ck_ep_capacity(const ml_ck_dims *d, uint64_t N, uint64_t E)
{
    if (!(d->capacity > 0) || !E)
        return 0;
    const double c = ceil((double)N / (double)E * d->capacity);
    return c < 1 ? 1 : c >= 1e18 ? UINT64_MAX : (uint64_t)c;
}

/* The runs of N pairs over E experts as d routes them
 * (ml__ck_expert_runs), each expert's rows at most cap (0: none; the rest
 * dropped); padded, every expert exactly cap. */
static unsigned capped_runs(const ml_ck_dims *d, uint64_t N, uint64_t E, uint64_t cap,
                            uint64_t c[3], uint64_t r[3])
{
    if (cap && d->pad) {
        c[0] = E;
        r[0] = cap;
        return 1;
    }
    const unsigned n = ml__ck_expert_runs(d, N, E, c, r);
    for (unsigned i = 0; cap && i < n; i++)
        r[i] = r[i] < cap ? r[i] : cap;
    return n;
}

/* The first `left` experts of the n runs c, r (those the fullest rank
 * holds) into count, rows; returns their runs. */
static unsigned first_experts(const uint64_t c[3], const uint64_t r[3], unsigned n,
                              uint64_t left, uint64_t count[3], uint64_t rows[3])
{
    unsigned k = 0;
    for (unsigned i = 0; i < n && left; i++) {
        const uint64_t take = c[i] < left ? c[i] : left;
        count[k] = take;
        rows[k++] = r[i];
        left -= take;
    }
    return k;
}

static uint64_t rows_of(const uint64_t c[3], const uint64_t r[3], unsigned n)
{
    uint64_t sum = 0;
    for (unsigned i = 0; i < n; i++)
        sum += c[i] * r[i];
    return sum;
}

void ml__ck_ep_own(const ml_ck_dims *d, uint64_t N, uint64_t E, uint64_t *sent,
                   uint64_t *self)
{
    /* the rank's own pairs over the experts, as its router routes them */
    ml_ck_dims own = *d;
    own.BT = d->dispatch ? d->BTs : d->BT;
    uint64_t c[3], r[3], fc[3], fr[3];
    const unsigned n = capped_runs(&own, N, E, ml__ck_ep_capacity(d, N, E), c, r);
    *sent = rows_of(c, r, n);
    *self = rows_of(fc, fr, first_experts(c, r, n, d->ep > 1 ? E / d->ep : E, fc, fr));
}

uint64_t ml__ck_ep_busiest_rows(const ml_ck_dims *d, uint64_t N, uint64_t E)
{
    if (!d->dispatch)
        return ml__ck_busiest_rows(d, N, E);
    const ml_ck_dims g = group_dims(d);
    const uint64_t G = d->ep * d->etp, C = times(ml__ck_ep_capacity(d, N, E), G);
    const uint64_t busy = ml__ck_busiest_rows(&g, times(N, G), E);
    return C && (d->pad || busy > C) ? C : busy;
}

unsigned ml__ck_ep_runs(const ml_ck_dims *d, uint64_t N, uint64_t E, uint64_t count[3],
                        uint64_t rows[3])
{
    if (!d->dispatch)
        return ml__ck_expert_runs(d, N, E, count, rows);
    const ml_ck_dims g = group_dims(d);
    const uint64_t G = d->ep * d->etp;
    uint64_t c[3], r[3];
    const unsigned n = capped_runs(&g, times(N, G), E, times(ml__ck_ep_capacity(d, N, E), G), c, r);
    return first_experts(c, r, n, d->ep > 1 ? E / d->ep : E, count, rows);
}
