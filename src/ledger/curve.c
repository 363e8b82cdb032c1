/* The memory curve as (t, bytes) points (docs/ledger.md, "Time"). */
#include <stdlib.h>

#include "ledger/levels.h"
#include "ledger/replay.h"

static uint64_t total_of(const ml_event *e)
{
    uint64_t t = 0;
    for (int k = 0; k < ML_CAT_COUNT; k++)
        t += e->live[k];
    return t;
}

static void put(ml_curve_point *points, size_t cap, size_t *m, double t, uint64_t bytes)
{
    if (*m < cap)
        points[*m] = (ml_curve_point){t, bytes};
    (*m)++;
}

size_t ml_ledger_curve(const ml_ledger *l, ml_curve_point *points, size_t cap)
{
    const size_t n = l->nevents;
    const ml_event *ev = l->events;
    /* a curve in time needs every event's time: all known or none is */
    for (size_t i = 0; i < n; i++)
        if (!(ev[i].t_s >= 0))
            return 0;
    size_t m = 0;
    for (size_t a = 0; a < n;) {
        /* the run of events at the instant ev[a].t_s */
        size_t b = a;
        uint64_t hi = total_of(&ev[a]);
        while (b + 1 < n && ev[b + 1].t_s == ev[a].t_s) {
            b++;
            uint64_t v = total_of(&ev[b]);
            if (v > hi)
                hi = v;
        }
        put(points, cap, &m, ev[a].t_s, hi);
        uint64_t last = total_of(&ev[b]);
        if (last < hi)
            put(points, cap, &m, ev[a].t_s, last);
        a = b + 1;
    }
    return m;
}

bool ml__ledger_keep_levels(ml_ledger *l)
{
    if (!l->nevents)
        return true;
    ml_level *lv = malloc(l->nevents * sizeof *lv);
    if (!lv)
        return false;
    for (size_t i = 0; i < l->nevents; i++)
        lv[i] = (ml_level){l->events[i].t_s, total_of(&l->events[i])};
    free(l->events);
    l->events = NULL;
    free(l->aev); /* the simulation's events: not kept either */
    l->aev = NULL;
    l->naev = 0;
    l->levels = lv;
    l->nlevels = l->nevents;
    l->nevents = l->cap = 0;
    return true;
}

const ml_level *ml__ledger_levels(const ml_ledger *l, size_t *n)
{
    *n = l->nlevels;
    return l->levels;
}
