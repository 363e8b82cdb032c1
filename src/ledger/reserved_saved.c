/* The saved inventories of the allocator simulation (reserved.h): freed
 * entry by entry as their nodes run, or opened empty and filled by a
 * block's forward steps. */
#include <stdint.h>
#include <string.h>

#include "ledger/reserved_internal.h"

/* The latest live ML_T_SAVED allocation of category c for block (its
 * index in r->live[c]), SIZE_MAX: none. */
static size_t block_saved(const ml_rsim *r, ml_category c, size_t block)
{
    for (size_t k = r->nlive[c]; k-- > 0;) {
        const group *g = &r->g[r->live[c][k]];
        if (g->split == ML_T_SAVED && g->block == block)
            return k;
    }
    return SIZE_MAX;
}

void ml__rsim_free_block_saved(ml_rsim *r, ml_category c, size_t block, uint64_t bytes)
{
    if (r->oom || r->nomem)
        return;
    const size_t k = block_saved(r, c, block);
    if (k != SIZE_MAX && r->g[r->live[c][k]].bytes == bytes)
        ml__rsim_release(r, c, k);
    else
        ml__rsim_free_as(r, c, 0, bytes);
}

bool ml__rsim_free_saved(ml_rsim *r, ml_category c, size_t block, size_t entry)
{
    if (r->oom || r->nomem)
        return true; /* nothing runs after a failure */
    const size_t k = block_saved(r, c, block);
    if (k == SIZE_MAX) {
        r->inexact++; /* a saved tensor with no allocation to free it from */
        return false;
    }
    const group *g = &r->g[r->live[c][k]];
    const size_t nsaved = r->ch->blocks[block].nsaved;
    /* per handles an entry (one made whole: one, a zero-byte entry's 0),
     * unless the entries did not add up and the aggregate is one tensor
     * (then it goes whole with the block's backward) */
    const unsigned per = g->per ? g->per : 1;
    if (g->n != nsaved * per || entry >= nsaved)
        return false;
    uint64_t *h = &r->h[g->first + entry * per];
    for (unsigned i = 0; i < per; i++)
        if (h[i]) {
            ml__alloc_sim_free_many(r->sim, &h[i], 1);
            ml__rsim_note(r, ML_SIM_FREE, h[i], 0);
            h[i] = 0; /* freed: the aggregate's free skips it */
        }
    return true;
}

void ml__rsim_saved_open(ml_rsim *r, ml_category c, uint64_t bytes, size_t block,
                         size_t entries, unsigned per)
{
    if (!bytes || r->oom || r->nomem)
        return;
    per = per ? per : 1;
    const size_t n = entries * (size_t)per;
    if (!ml__rsim_group_room(r, n))
        return;
    memset(&r->h[r->nh], 0, n * sizeof *r->h);
    r->g[r->ng] = (group){c, bytes, r->nh, n, block, ML_T_SAVED, per};
    r->nh += n;
    if (!ml__rsim_add_live(r, c, r->ng++))
        r->nomem = true;
}

void ml__rsim_saved_fill(ml_rsim *r, ml_category c, size_t block, size_t entry, unsigned slot,
                         uint64_t bytes)
{
    if (!bytes || r->oom || r->nomem)
        return;
    const size_t k = block_saved(r, c, block);
    const group *g = k == SIZE_MAX ? NULL : &r->g[r->live[c][k]];
    if (!g || !g->per || slot >= g->per || (entry + 1) * g->per > g->n) {
        r->inexact++; /* no open inventory to fill: a bug, counted */
        return;
    }
    const size_t at = g->first + entry * g->per + slot;
    size_t made = 0;
    uint64_t h = 0;
    ml__rsim_granted(r, ml__alloc_sim_malloc_many(r->sim, &bytes, 1, &h, &made));
    if (!made) {
        ml__rsim_note_refused(r, bytes);
        return;
    }
    r->h[at] = h;
    ml__rsim_note(r, ML_SIM_ALLOC, h, bytes);
}

