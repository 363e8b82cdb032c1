/* The timeline's clock (steptime.h): the step-time model's (FLOPs done,
 * time) points, and the time at a FLOP count between them. */
#include "ledger/steptime.h"
#include "util/grow.h"

void ml__time_map_add(ml_time_map *m, double flops, double t)
{
    if (!m || m->nomem)
        return;
    ml_time_point *v = ml_grow(m->p, m->n, &m->cap, sizeof *v, 64);
    if (!v) {
        m->nomem = true;
        return;
    }
    m->p = v;
    m->p[m->n++] = (ml_time_point){flops, t};
}

double ml__time_at(const ml_time_map *map, double f)
{
    if (!map || !map->n || map->nomem)
        return -1;
    const ml_time_point *p = map->p;
    size_t lo = 0, hi = map->n; /* the first point with p.flops >= f */
    while (lo < hi) {
        const size_t mid = lo + (hi - lo) / 2;
        if (p[mid].flops < f)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == map->n)
        return p[map->n - 1].t;
    if (lo == 0 || p[lo].flops == f)
        return p[lo].t;
    const ml_time_point *a = &p[lo - 1], *b = &p[lo];
    return a->t + (b->t - a->t) * (f - a->flops) / (b->flops - a->flops);
}
