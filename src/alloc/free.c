/* Freeing in the caching-allocator simulator (alloc.h): free_block, one
 * allocation at a time or many in one pass (DeviceCachingAllocator::free,
 * PyTorch 2.x, c10/cuda/CUDACachingAllocator.cpp; docs/allocator.md). */
#include "alloc/sim.h"

/* Whether handle names a block in state `state` (a live allocation: ML_AB_ALLOC). */
static bool names(const ml_alloc_sim *s, uint64_t handle, int state)
{
    uint32_t x = (uint32_t)handle;
    return x != 0 && x < s->t.n && s->t.b[x].state == state &&
           s->t.b[x].gen == (uint32_t)(handle >> 32);
}

uint64_t ml__alloc_sim_address(const ml_alloc_sim *s, uint64_t handle)
{
    return names(s, handle, ML_AB_ALLOC) ? s->t.b[(uint32_t)handle].addr : 0;
}

ml_alloc_result ml__alloc_sim_free(ml_alloc_sim *s, uint64_t handle)
{
    if (!handle) {
        s->st.events++;
        return ML_ALLOC_OK;
    }
    uint32_t x = (uint32_t)handle;
    if (!names(s, handle, ML_AB_ALLOC))
        return ML_ALLOC_BAD_HANDLE;
    s->st.events++;
    ml_ab *b = BLK(s, x);
    stat_sub(&s->st.allocated, b->size);
    stat_sub(&s->st.requested, b->requested);
    if (s->cfg.mode == ML_ALLOC_NONE) {
        stat_sub(&s->st.reserved, b->size);
        stat_sub(&s->st.segments, 1);
        s->st.device_frees++;
        ml_ab_release(&s->t, x);
        return ML_ALLOC_OK;
    }
    /* free_block: merge with free neighbours, back into the pool */
    b->state = ML_AB_DETACHED;
    ml__as_try_merge(s, x, b->prev, ML_AB_FREE);
    ml__as_try_merge(s, x, BLK(s, x)->next, ML_AB_FREE);
    ml__as_cache(s, x);
    return ML_ALLOC_OK;
}

/* free_block for n allocations in one pass: each block is marked, then
 * each run of adjacent free blocks merges and enters its pool's set once,
 * where n single frees would insert and erase a block per merge. The state
 * is theirs: every free block joins its free neighbours, so a segment's
 * free blocks end as its maximal free runs whatever the order, and frees
 * move no peak and call no get_free_block (the GC clock). */
ml_alloc_result ml__alloc_sim_free_many(ml_alloc_sim *s, const uint64_t *handles, size_t n)
{
    ml_alloc_result res = ML_ALLOC_OK;
    if (s->cfg.mode == ML_ALLOC_NONE) {
        for (size_t i = 0; i < n; i++)
            if (ml__alloc_sim_free(s, handles[i]) != ML_ALLOC_OK)
                res = ML_ALLOC_BAD_HANDLE;
        return res;
    }
    for (size_t i = 0; i < n; i++) {
        if (handles[i] && !names(s, handles[i], ML_AB_ALLOC)) {
            res = ML_ALLOC_BAD_HANDLE; /* skipped, as ml__alloc_sim_free would */
            continue;
        }
        s->st.events++;
        if (!handles[i])
            continue;
        ml_ab *b = BLK(s, (uint32_t)handles[i]);
        stat_sub(&s->st.allocated, b->size);
        stat_sub(&s->st.requested, b->requested);
        b->state = ML_AB_PENDING;
    }
    for (size_t i = 0; i < n; i++) {
        if (!handles[i] || !names(s, handles[i], ML_AB_PENDING))
            continue; /* a bad handle, or merged into an earlier one's run */
        uint32_t x = (uint32_t)handles[i], y;
        BLK(s, x)->state = ML_AB_DETACHED;
        while ((y = BLK(s, x)->prev) != 0 && (BLK(s, y)->state == ML_AB_PENDING ||
                                              BLK(s, y)->state == ML_AB_FREE)) {
            if (BLK(s, y)->state == ML_AB_FREE)
                ml__as_uncache(s, y);
            ml__as_join(s, x, y);
        }
        while ((y = BLK(s, x)->next) != 0 && (BLK(s, y)->state == ML_AB_PENDING ||
                                              BLK(s, y)->state == ML_AB_FREE)) {
            if (BLK(s, y)->state == ML_AB_FREE)
                ml__as_uncache(s, y);
            ml__as_join(s, x, y);
        }
        ml__as_cache(s, x);
    }
    return res;
}
