/* The per-cell staircase of open segments (optimal_cell.h): entering a
 * segment, reading a cell's best, releasing members. */
#include <string.h>

#include "ledger/optimal_cell.h"
#include "util/grow.h"

/* group g against the open segment e, by value only */
static bool group_better(const group *g, const entry *e)
{
    return ml_oc_better(g->key, g->nkey, g->P, 0, e->key, e->nkey, e->P, 0);
}

static bool entry_better(const entry *e, const group *g)
{
    return ml_oc_better(e->key, e->nkey, e->P, 0, g->key, g->nkey, g->P, 0);
}

static uint32_t member_new(pool *pl, const entry *e)
{
    uint32_t i = pl->free;
    if (i != NIL) {
        pl->free = pl->v[i].next;
    } else {
        member *v = pl->n < NIL ? ml_grow(pl->v, pl->n, &pl->cap, sizeof *v, 1024) : NULL;
        if (!v)
            return NIL;
        pl->v = v;
        i = (uint32_t)pl->n++;
    }
    pl->v[i] = (member){e->id, e->until, NIL};
    return i;
}

void ml__oc_free(pool *pl, uint32_t first, uint32_t last)
{
    if (first == NIL)
        return;
    pl->v[last].next = pl->free;
    pl->free = first;
}

/* e joins the group v[lo] of its value (as its youngest member, when it
 * stays open longer than every member), dropping the worse groups that now
 * close no later. */
static bool join_group(cell *c, pool *pl, uint32_t lo, const entry *e, ml_opt_stats *sx)
{
    group *g = &c->v[lo];
    if (e->until <= g->until)
        return true;
    uint32_t m = member_new(pl, e);
    if (m == NIL)
        return false;
    pl->v[g->last].next = m;
    if (g->first == g->last)
        g->oldest.next = m;
    g->last = m;
    g->until = e->until;
    uint32_t j = lo + 1; /* worse and now closing no later */
    while (j < c->n && c->v[j].until <= e->until) {
        sx->merges += c->v[j].P < e->P;
        ml__oc_free(pl, c->v[j].first, c->v[j].last);
        j++;
    }
    memmove(c->v + lo + 1, c->v + j, (c->n - j) * sizeof *c->v);
    sx->moves += (j - lo - 1) + (c->n - j);
    c->n -= j - lo - 1;
    return true;
}

bool ml__oc_put(cell *c, pool *pl, const entry *e, ml_opt_stats *sx)
{
    /* the first group no better than e (values worsen along v) */
    uint32_t lo = c->head, hi = c->n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (group_better(&c->v[mid], e))
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < c->n && !entry_better(e, &c->v[lo])) /* equal value: a member */
        return join_group(c, pl, lo, e, sx);
    /* a new value: its place by until (usually after every group) */
    lo = c->head;
    hi = c->n;
    if (hi > lo && c->v[hi - 1].until < e->until)
        lo = hi;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (c->v[mid].until < e->until)
            lo = mid + 1;
        else
            hi = mid;
    }
    uint32_t p = lo;
    if (p < c->n && group_better(&c->v[p], e)) { /* better and open as long */
        sx->merges += e->P < c->v[p].P;
        return true;
    }
    uint32_t end = p < c->n && c->v[p].until == e->until ? p + 1 : p;
    uint32_t k = p;
    while (k > c->head && !group_better(&c->v[k - 1], e))
        k--;
    uint32_t m = member_new(pl, e);
    if (m == NIL)
        return false;
    const group ng = {e->P, e->key, e->nkey, e->until, m, m, pl->v[m]};
    for (uint32_t j = k; j < end; j++) {
        sx->merges += c->v[j].P < e->P;
        ml__oc_free(pl, c->v[j].first, c->v[j].last);
    }
    sx->moves += end - k;
    if (k < end) { /* ng replaces v[k..end) */
        c->v[k] = ng;
        memmove(c->v + k + 1, c->v + end, (c->n - end) * sizeof *c->v);
        c->n -= end - k - 1;
        sx->moves += c->n - k - 1;
        return true;
    }
    if (c->head && c->n == c->cap) { /* reuse the closed groups' room */
        memmove(c->v, c->v + c->head, (c->n - c->head) * sizeof *c->v);
        p -= c->head;
        c->n -= c->head;
        sx->moves += c->n;
        c->head = 0;
    }
    group *v = ml_grow(c->v, c->n, &c->cap, sizeof *v, 4);
    if (!v) {
        ml__oc_free(pl, m, m);
        return false;
    }
    c->v = v;
    memmove(v + p + 1, v + p, (c->n - p) * sizeof *v);
    sx->moves += c->n - p;
    v[p] = ng;
    c->n++;
    return true;
}

bool ml__oc_best(cell *c, pool *pl, uint32_t L, const group **g, const member **mb)
{
    while (c->head < c->n && c->v[c->head].until < L) {
        ml__oc_free(pl, c->v[c->head].first, c->v[c->head].last);
        c->head++;
    }
    if (c->head == c->n) {
        c->head = c->n = 0;
        return false;
    }
    group *h = &c->v[c->head];
    while (h->oldest.until < L) { /* the last member is open */
        uint32_t nx = h->oldest.next;
        ml__oc_free(pl, h->first, h->first);
        h->first = nx;
        h->oldest = pl->v[nx];
        /* the next to close, usually at the next boundary */
        if (h->oldest.next != NIL)
            __builtin_prefetch(&pl->v[h->oldest.next]);
    }
    *g = h;
    *mb = &h->oldest;
    return true;
}

