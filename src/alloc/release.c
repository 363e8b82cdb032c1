/* Releasing cached memory in the caching-allocator simulator (sim.h):
 * release_cached_blocks, release_available_cached_blocks and
 * garbage_collect_cached_blocks of DeviceCachingAllocator (PyTorch 2.x,
 * c10/cuda/CUDACachingAllocator.cpp; docs/allocator.md). */
#include "alloc/sim.h"

/* A pool's free blocks into the scratch list (room() sized it); returns
 * how many. In (size, address) order from a treap; from size classes, by
 * size only: what the callers below do with them does not depend on it. */
static size_t pool_blocks(ml_alloc_sim *s, int pi)
{
    const pool_t *p = &s->pool[pi];
    return classed(s) ? ml__ab_class_collect(&s->t, &s->ct, &p->cls, s->scratch, s->scratch_cap)
                      : ml__ab_collect(&s->t, p->blocks, s->scratch, s->scratch_cap);
}

/* release_block: cudaFree of a whole cached segment. */
static void release_block(ml_alloc_sim *s, uint32_t x)
{
    uint64_t size = BLK(s, x)->size;
    ml__as_uncache(s, x);
    stat_sub(&s->st.reserved, size);
    stat_sub(&s->st.segments, 1);
    s->st.device_frees++;
    ml_ab_release(&s->t, x);
}

/* release_blocks of each pool, large first (release_cached_blocks). */
void ml__as_release_cached(ml_alloc_sim *s)
{
    for (int pi = LARGE; pi >= SMALL; pi--) {
        size_t n = pool_blocks(s, pi);
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            uint32_t x = s->scratch[i];
            if (BLK(s, x)->expandable)
                s->scratch[k++] = x; /* unmapping changes the set: after the walk */
            else if (!ml__as_is_split(s, x))
                release_block(s, x);
        }
        for (size_t i = 0; i < k; i++) {
            uint32_t x = s->scratch[i];
            ml__as_unmap_block(s, x);
            if (BLK(s, x)->state == ML_AB_UNMAPPED && !ml__as_is_split(s, x)) {
                ml__as_unmapped_del(s, x); /* release_expandable_segment */
                ml_ab_release(&s->t, x);
                stat_sub(&s->st.segments, 1);
            }
        }
    }
}

/* release_available_cached_blocks: with max_split_size, cudaFree oversize
 * cached blocks, one large enough or several from the largest down. Only
 * without expandable segments: the pools' free sets are size classes. */
bool ml__as_release_available(ml_alloc_sim *s, int pi, uint64_t size)
{
    if (s->max_split == UINT64_MAX || !classed(s))
        return false;
    uint64_t key = size < s->max_split ? s->max_split : size;
    uint32_t it = ml__ab_class_lower_bound(&s->ct, &s->pool[pi].cls, key);
    if (it) {
        if (ml__as_is_split(s, it))
            return false; /* PyTorch would cudaFree a split block; oversize ones never are */
        release_block(s, it);
        return true;
    }
    /* the oversize blocks, released from the last in (size, address) order
     * down (a rare path: each step looks for the largest left) */
    size_t n = pool_blocks(s, pi), m = 0;
    for (size_t i = 0; i < n; i++)
        if (BLK(s, s->scratch[i])->size >= s->max_split)
            s->scratch[m++] = s->scratch[i];
    uint64_t total = 0;
    while (m && total < key) {
        size_t top = 0;
        for (size_t i = 1; i < m; i++) {
            const ml_ab *a = BLK(s, s->scratch[i]), *b = BLK(s, s->scratch[top]);
            if (a->size > b->size || (a->size == b->size && a->addr > b->addr))
                top = i;
        }
        uint32_t cur = s->scratch[top];
        if (ml__as_is_split(s, cur))
            break;
        s->scratch[top] = s->scratch[--m];
        total += BLK(s, cur)->size;
        release_block(s, cur);
    }
    return total >= key;
}

/* garbage_collect_cached_blocks: above the threshold, cudaFree the cached
 * whole segments of the large pool that have waited longest (in
 * get_free_block calls), older than the average first. */
void ml__as_garbage_collect(ml_alloc_sim *s)
{
    uint64_t thr = (uint64_t)(s->cfg.gc_threshold * (double)s->cfg.device_bytes);
    if (s->st.reserved.current <= thr)
        return;
    uint64_t target = s->st.reserved.current - thr, reclaimed = 0, total_age = 0, count = 0;
    pool_t *p = &s->pool[LARGE];
    size_t n = pool_blocks(s, LARGE);
    for (size_t i = 0; i < n; i++)
        if (!ml__as_is_split(s, s->scratch[i])) {
            total_age += p->calls - (uint64_t)BLK(s, s->scratch[i])->gc_base;
            count++;
        }
    bool freed = true;
    while (reclaimed < target && freed && count > 0) {
        double age_threshold = (double)total_age / (double)count;
        freed = false;
        n = pool_blocks(s, LARGE);
        for (size_t i = 0; i < n; i++) {
            uint32_t x = s->scratch[i];
            uint64_t age = p->calls - (uint64_t)BLK(s, x)->gc_base;
            if (!ml__as_is_split(s, x) && (double)age >= age_threshold) {
                freed = true;
                reclaimed += BLK(s, x)->size;
                total_age -= age;
                count--;
                release_block(s, x);
            }
        }
    }
}
