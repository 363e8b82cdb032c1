/* The simulation's names of the tensors the replay frees by name beside
 * its aggregates: the chain's side tensors and the output's key/value
 * cache (reserved.h, ml__rsim_side_note and ml__rsim_cache_note). */
#include <stdlib.h>
#include <string.h>

#include "ledger/reserved_internal.h"

/* names[at] = name, the array grown (zeroed) to cover at + slack; nothing
 * when the host is out of memory (the free is then by size). */
static void name_put(size_t **names, size_t *cap, size_t at, size_t slack, size_t name)
{
    if (at >= *cap) {
        const size_t grow = at + slack;
        size_t *grown = realloc(*names, grow * sizeof *grown);
        if (!grown)
            return;
        memset(grown + *cap, 0, (grow - *cap) * sizeof *grown);
        *names = grown;
        *cap = grow;
    }
    (*names)[at] = name;
}

static size_t name_take(size_t *names, size_t cap, size_t at)
{
    if (at >= cap)
        return 0;
    const size_t name = names[at];
    names[at] = 0;
    return name;
}

void ml__rsim_side_note(ml_rsim *r, size_t side, unsigned slot, ml_category c)
{
    name_put(&r->side_names, &r->side_cap, side * ML_SIDE_SLOTS + slot, 8 * ML_SIDE_SLOTS,
             ml__rsim_latest(r, c));
}

size_t ml__rsim_side_take(ml_rsim *r, size_t side, unsigned slot)
{
    return name_take(r->side_names, r->side_cap, side * ML_SIDE_SLOTS + slot);
}

void ml__rsim_cache_note(ml_rsim *r, size_t block)
{
    name_put(&r->cache_names, &r->cache_cap, 2 * block, 2 * r->nblocks + 2,
             ml__rsim_latest(r, ML_CAT_WORKSPACE));
}

void ml__rsim_cache_age(ml_rsim *r)
{
    for (size_t k = 0; k + 1 < r->cache_cap; k += 2) {
        r->cache_names[k + 1] = r->cache_names[k];
        r->cache_names[k] = 0;
    }
}

size_t ml__rsim_cache_take(ml_rsim *r, size_t block, bool prev)
{
    return name_take(r->cache_names, r->cache_cap, 2 * block + prev);
}
