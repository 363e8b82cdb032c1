/* Dynamic program over the chain model of optimal.h. Recurrence and
 * complexity: docs/optimal.md. */
#include <stdlib.h>
#include <string.h>

#include "ledger/optimal.h"
#include "util/grow.h"

static bool add_ok(uint64_t a, uint64_t b, uint64_t *r)
{
    return !__builtin_add_overflow(a, b, r);
}

/* Live bytes stay within the budget: a + b + c <= budget. */
static bool fits3(uint64_t a, uint64_t b, uint64_t c, uint64_t budget, uint64_t *peak)
{
    uint64_t s;
    if (!add_ok(a, b, &s) || !add_ok(s, c, &s))
        return false;
    if (peak && s > *peak)
        *peak = s;
    return s <= budget;
}

/* Constraints of one kept (not checkpointed) block i at prefix P. */
static bool kept_ok(const ml_opt_chain *c, size_t i, uint64_t P, uint64_t *peak)
{
    const ml_opt_block *b = &c->blk[i];
    bool ok = fits3(c->base_f, P, b->fwd, c->budget, peak);
    uint64_t kb;
    ok = add_ok(b->keep, b->bwd, &kb) && fits3(b->base_b, P, kb, c->budget, peak) && ok;
    return ok;
}

/* Segment [s..e] at prefix P: extends a running check block by block. */
typedef struct {
    uint64_t recomputed; /* sum of recomp over s..j */
    bool ok;
} segstate;

static void seg_step(const ml_opt_chain *c, size_t s, size_t j, uint64_t P, segstate *st,
                     uint64_t *peak)
{
    const ml_opt_block *b = &c->blk[j];
    uint64_t x = c->blk[s].input;
    /* forward under no_grad: the segment input plus this block's high-water */
    uint64_t px;
    if (!add_ok(P, j == s ? 0 : x, &px)) {
        st->ok = false;
        return;
    }
    if (!fits3(c->base_f, px, b->fwd_ng, c->budget, peak))
        st->ok = false;
    /* backward of j after the recompute: blocks s..j recomputed */
    uint64_t r;
    if (!add_ok(st->recomputed, b->recomp, &r)) {
        st->ok = false;
        return;
    }
    st->recomputed = r;
    uint64_t live;
    if (!add_ok(P, x, &live) || !add_ok(live, r, &live) ||
        !fits3(b->base_b, live, b->bwd, c->budget, peak))
        st->ok = false;
}

bool ml_opt_check(const ml_opt_chain *c, const int *seg, double *cost, uint64_t *peak)
{
    uint64_t P = 0, pk = 0;
    double f = 0;
    bool ok = true;
    for (size_t i = 0; i < c->n;) {
        if (seg[i] < 0) {
            ok = kept_ok(c, i, P, &pk) && ok;
            if (!add_ok(P, c->blk[i].keep, &P))
                return false;
            i++;
            continue;
        }
        size_t e = i;
        while (e + 1 < c->n && seg[e + 1] == seg[i])
            e++;
        segstate st = {0, true};
        for (size_t j = i; j <= e; j++) {
            seg_step(c, i, j, P, &st, &pk);
            f += c->blk[j].flops;
        }
        ok = st.ok && ok;
        if (!add_ok(P, c->blk[i].input, &P))
            return false;
        i = e + 1;
    }
    uint64_t t;
    if (!add_ok(c->base_t, P, &t))
        return false;
    if (t > pk)
        pk = t;
    ok = ok && t <= c->budget;
    if (cost)
        *cost = f;
    if (peak)
        *peak = pk;
    return ok;
}

/* A DP state at a block boundary: kept prefix P, cost, and how we got here. */
typedef struct {
    uint64_t P;
    double cost;
    uint32_t nrec;  /* blocks recomputed: breaks ties between equal FLOPs (a
                       zero-FLOP ReLU is not worth checkpointing) */
    uint32_t from;  /* index of the predecessor state at level `lvl` */
    uint32_t lvl;   /* predecessor's level (block boundary) */
    int32_t seg_end; /* -1: block lvl kept; else the segment lvl..seg_end */
} state;

typedef struct {
    state *v;
    size_t n, cap;
} level;

static bool push(level *L, state s)
{
    state *v = ml_grow(L->v, L->n, &L->cap, sizeof *v, 16);
    if (!v)
        return false;
    L->v = v;
    L->v[L->n++] = s;
    return true;
}

static bool cheaper(const state *x, const state *y)
{
    return x->cost < y->cost || (x->cost == y->cost && x->nrec < y->nrec);
}

static int by_p_then_cost(const void *a, const void *b)
{
    const state *x = a, *y = b;
    if (x->P != y->P)
        return x->P < y->P ? -1 : 1;
    return cheaper(x, y) ? -1 : cheaper(y, x);
}

/* Keeps the Pareto front (P up, cost strictly down). Past max_states the
 * front is thinned per bucket of budget / max_states bytes to its first
 * (smallest prefix: keeps feasibility) and last (cheapest) point. Every kept
 * point is a real plan, so a thinned search may miss the optimum but never
 * returns a plan above the budget. */
static void prune(level *L, size_t max_states, uint64_t budget)
{
    if (L->n == 0)
        return;
    qsort(L->v, L->n, sizeof *L->v, by_p_then_cost);
    size_t k = 0;
    for (size_t i = 0; i < L->n; i++)
        if (k == 0 || cheaper(&L->v[i], &L->v[k - 1]))
            L->v[k++] = L->v[i];
    L->n = k;
    if (L->n <= max_states)
        return;
    uint64_t q = budget / (max_states / 2) + 1;
    k = 0;
    for (size_t i = 0; i < L->n; i++) {
        bool first = i == 0 || L->v[i - 1].P / q != L->v[i].P / q;
        bool last = i + 1 == L->n || L->v[i + 1].P / q != L->v[i].P / q;
        if (first || last)
            L->v[k++] = L->v[i];
    }
    L->n = k;
}

ml_status ml_opt_solve(const ml_opt_chain *c, size_t max_states, int *seg, double *cost,
                       bool *feasible)
{
    size_t n = c->n;
    if (!max_states)
        max_states = n <= 128 ? 4096 : 256;
    /* segments longer than max(16, 2 ceil(sqrt(n))) blocks are not tried:
     * they recompute more at once than the sqrt(n) schedule (docs/optimal.md) */
    size_t maxseg = 16;
    while ((maxseg / 2) * (maxseg / 2) < n)
        maxseg += 2;
    level *lv = calloc(n + 1, sizeof *lv);
    if (!lv)
        return ML_NOMEM;
    ml_status st = ML_OK;
    if (!push(&lv[0], (state){0, 0, 0, 0, 0, -1})) {
        st = ML_NOMEM;
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        prune(&lv[i], max_states, c->budget);
        for (size_t k = 0; k < lv[i].n; k++) {
            const state s = lv[i].v[k];
            /* keep block i */
            uint64_t P2;
            if (kept_ok(c, i, s.P, NULL) && add_ok(s.P, c->blk[i].keep, &P2) &&
                P2 <= c->budget &&
                !push(&lv[i + 1], (state){P2, s.cost, s.nrec, (uint32_t)k, (uint32_t)i, -1})) {
                st = ML_NOMEM;
                goto out;
            }
            /* a segment i..e; a longer one contains every failing step of a
             * shorter one, so the first failure ends the extension */
            uint64_t Pseg;
            if (!add_ok(s.P, c->blk[i].input, &Pseg) || Pseg > c->budget)
                continue;
            segstate ss = {0, true};
            double f = s.cost;
            size_t emax = maxseg ? i + maxseg : n;
            for (size_t e = i; e < n && e < emax; e++) {
                seg_step(c, i, e, s.P, &ss, NULL);
                if (!ss.ok)
                    break;
                f += c->blk[e].flops;
                state ns = {Pseg, f, s.nrec + (uint32_t)(e - i + 1), (uint32_t)k, (uint32_t)i,
                            (int32_t)e};
                if (!push(&lv[e + 1], ns)) {
                    st = ML_NOMEM;
                    goto out;
                }
            }
        }
    }
    prune(&lv[n], max_states, c->budget);
    /* the tail: head and loss above everything kept */
    size_t best = SIZE_MAX;
    for (size_t k = 0; k < lv[n].n; k++) {
        uint64_t t;
        if (!add_ok(c->base_t, lv[n].v[k].P, &t) || t > c->budget)
            continue;
        if (best == SIZE_MAX || cheaper(&lv[n].v[k], &lv[n].v[best]))
            best = k;
    }
    *feasible = best != SIZE_MAX;
    if (!*feasible)
        goto out;
    *cost = lv[n].v[best].cost;
    /* walk back */
    size_t lvl = n, k = best;
    int id = 0;
    while (lvl > 0) {
        const state *s = &lv[lvl].v[k];
        if (s->seg_end < 0) {
            seg[s->lvl] = -1;
        } else {
            for (size_t j = s->lvl; j <= (size_t)s->seg_end; j++)
                seg[j] = id;
            id++;
        }
        k = s->from;
        lvl = s->lvl;
    }
out:
    for (size_t i = 0; i <= n; i++)
        free(lv[i].v);
    free(lv);
    return st;
}
