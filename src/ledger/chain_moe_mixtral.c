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

/* Megatron's expert capacity of a rank's N pairs over E experts
 * (moe_utils.py get_capacity: ceil(N / E x factor)); 0: none. */
static uint64_t capacity_of(const ml_ck_dims *d, uint64_t N, uint64_t E)
{
    if (!(d->capacity > 0) || !E)
        return 0;
    const double c = ceil((double)N / (double)E * d->capacity);
    return c < 1 ? 1 : c >= 1e18 ? UINT64_MAX : (uint64_t)c;
}

uint64_t ml__ck_ep_sent(const ml_ck_dims *d, uint64_t N, uint64_t E)
{
    const uint64_t C = capacity_of(d, N, E);
    if (!C)
        return N;
    if (d->pad)
        return times(C, E);
    /* the rank's own pairs over the experts, as its router routes them */
    ml_ck_dims own = *d;
    own.BT = d->dispatch ? d->BTs : d->BT;
    uint64_t c[3], r[3], sent = 0;
    const unsigned n = ml__ck_expert_runs(&own, N, E, c, r);
    for (unsigned i = 0; i < n; i++)
        sent += c[i] * (r[i] < C ? r[i] : C);
    return sent;
}

uint64_t ml__ck_ep_self(const ml_ck_dims *d, uint64_t N, uint64_t E)
{
    const uint64_t C = capacity_of(d, N, E), local = d->ep > 1 ? E / d->ep : E;
    if (C && d->pad)
        return times(C, local);
    ml_ck_dims own = *d;
    own.BT = d->dispatch ? d->BTs : d->BT;
    uint64_t c[3], r[3], self = 0, left = local;
    const unsigned n = ml__ck_expert_runs(&own, N, E, c, r);
    for (unsigned i = 0; i < n && left; i++) {
        const uint64_t take = c[i] < left ? c[i] : left;
        self += take * (C && r[i] > C ? C : r[i]);
        left -= take;
    }
    return self;
}

uint64_t ml__ck_ep_busiest_rows(const ml_ck_dims *d, uint64_t N, uint64_t E)
{
    if (!d->dispatch)
        return ml__ck_busiest_rows(d, N, E);
    const ml_ck_dims g = group_dims(d);
    const uint64_t G = d->ep * d->etp, C = times(capacity_of(d, N, E), G);
    const uint64_t busy = ml__ck_busiest_rows(&g, times(N, G), E);
    return C && (d->pad || busy > C) ? C : busy;
}

unsigned ml__ck_ep_runs(const ml_ck_dims *d, uint64_t N, uint64_t E, uint64_t count[3],
                        uint64_t rows[3])
{
    if (!d->dispatch)
        return ml__ck_expert_runs(d, N, E, count, rows);
    const ml_ck_dims g = group_dims(d);
    const uint64_t G = d->ep * d->etp, C = times(capacity_of(d, N, E), G);
    uint64_t left = d->ep > 1 ? E / d->ep : E;
    if (C && d->pad) { /* every expert the group's capacity */
        count[0] = left;
        rows[0] = C;
        return 1;
    }
    uint64_t c[3], r[3];
    const unsigned n = ml__ck_expert_runs(&g, times(N, G), E, c, r);
    for (unsigned i = 0; C && i < n; i++) /* the rest dropped */
        r[i] = r[i] < C ? r[i] : C;
    unsigned k = 0;
    for (unsigned i = 0; i < n && left; i++) {
        const uint64_t take = c[i] < left ? c[i] : left;
        count[k] = take;
        rows[k++] = r[i];
        left -= take;
    }
    return k;
}
