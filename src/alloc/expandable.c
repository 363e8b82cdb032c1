/* Expandable segments (expandable_segments:True): one segment of address
 * space per pool, mapped in pages on demand (PyTorch's ExpandableSegment and
 * the DeviceCachingAllocator methods named below; docs/allocator.md). */
#include "alloc/sim.h"

/* unmap_block: returns the whole pages inside a free expandable block. */
void ml__as_unmap_block(ml_alloc_sim *s, uint32_t x)
{
    ml_ab *b = BLK(s, x);
    uint64_t pg = page(b->pool);
    uint64_t begin = up(b->addr, pg), end = (b->addr + b->size) / pg * pg;
    if (begin >= end)
        return;
    uint64_t addr = b->addr, stop = b->addr + b->size;
    ml__as_uncache(s, x);
    if (begin > addr)
        ml__as_cache(s, ml_as_piece(s, x, addr, begin - addr, BLK(s, x)->prev, x));
    if (stop > end)
        ml__as_cache(s, ml_as_piece(s, x, end, stop - end, x, BLK(s, x)->next));
    b = BLK(s, x);
    b->addr = begin;
    b->size = end - begin;
    ml__as_try_merge(s, x, b->prev, ML_AB_UNMAPPED);
    ml__as_try_merge(s, x, BLK(s, x)->next, ML_AB_UNMAPPED);
    ml__as_unmapped_add(s, x);
    stat_sub(&s->st.reserved, end - begin);
    s->st.device_frees++;
}

/* What an expandable block could grow to: itself and the unmapped space after it. */
uint64_t ml__as_expandable_size(const ml_alloc_sim *s, uint32_t x)
{
    const ml_ab *b = &s->t.b[x];
    return b->size + (b->next && s->t.b[b->next].state == ML_AB_UNMAPPED ? s->t.b[b->next].size
                                                                           : 0);
}

/* map_block: back the first `size` bytes of an unmapped block with pages. */
static bool map_block(ml_alloc_sim *s, uint32_t x, uint64_t size)
{
    uint64_t mapped = up(size, page(BLK(s, x)->pool));
    if (s->cfg.device_bytes && s->st.reserved.current + mapped > s->cfg.device_bytes)
        return false; /* cuMemCreate fails: the pages of this call are returned */
    ml__as_unmapped_del(s, x);
    if (mapped < BLK(s, x)->size) {
        ml_ab *b = BLK(s, x);
        ml__as_unmapped_add(s, ml_as_piece(s, x, b->addr + mapped, b->size - mapped, x, b->next));
        BLK(s, x)->size = mapped;
    }
    ml__as_try_merge(s, x, BLK(s, x)->prev, ML_AB_FREE);
    ml__as_try_merge(s, x, BLK(s, x)->next, ML_AB_FREE);
    ml__as_cache(s, x);
    stat_add(&s->st.reserved, mapped);
    s->st.device_allocs++;
    return true;
}

/* find_expandable_block: the lowest address where free and unmapped space
 * together hold size, or a new segment's address space. */
static uint32_t find_expandable_block(ml_alloc_sim *s, int pi, uint64_t size)
{
    pool_t *p = &s->pool[pi];
    for (uint32_t c = ml__ab_first(&s->t, p->unmapped); c;
         c = ml__ab_after(&s->t, p->unmapped, c, true)) {
        uint32_t start = c;
        if (BLK(s, c)->prev && BLK(s, BLK(s, c)->prev)->state == ML_AB_FREE)
            start = BLK(s, c)->prev;
        uint64_t bytes = 0;
        for (uint32_t b = start; b && bytes < size && BLK(s, b)->state != ML_AB_ALLOC;
             b = BLK(s, b)->next)
            bytes += BLK(s, b)->size;
        if (bytes >= size)
            return start;
    }
    uint64_t base = up(s->next_addr, ML_ALLOC_LARGE_BUFFER);
    s->next_addr = base + s->va[pi];
    uint32_t x = ml_ab_new(&s->t);
    ml_ab *b = BLK(s, x);
    b->addr = base;
    b->size = s->va[pi];
    b->pool = (uint8_t)pi;
    b->expandable = true;
    ml__as_unmapped_add(s, x);
    stat_add(&s->st.segments, 1);
    return x;
}

/* try_allocate_expandable_block: map pages until a block of size exists. */
uint32_t ml__as_try_allocate_expandable(ml_alloc_sim *s, int pi, uint64_t size)
{
    uint32_t c = find_expandable_block(s, pi, size);
    if (BLK(s, c)->state == ML_AB_UNMAPPED) {
        uint64_t want = BLK(s, c)->size < size ? BLK(s, c)->size : size;
        if (!map_block(s, c, want))
            return 0;
    }
    while (BLK(s, c)->size < size) {
        uint32_t nx = BLK(s, c)->next;
        if (!nx || BLK(s, nx)->state != ML_AB_UNMAPPED)
            return 0; /* cannot happen: find_expandable_block saw the room */
        uint64_t rest = size - BLK(s, c)->size;
        if (!map_block(s, nx, BLK(s, nx)->size < rest ? BLK(s, nx)->size : rest))
            return 0;
        c = nx; /* it absorbed c */
    }
    ml__as_uncache(s, c);
    return c;
}
