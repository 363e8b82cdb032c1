/* Private to src/alloc/: the simulator's state and the helpers its files
 * share (ml_as_ prefix). alloc.c keeps the free sets and the caching rules,
 * free.c the frees, expandable.c the expandable segments. */
#ifndef ML_ALLOC_SIM_H
#define ML_ALLOC_SIM_H

#include "alloc/alloc.h"
#include "alloc/blocks.h"

enum { SMALL = 0, LARGE = 1 };

typedef struct {
    /* free mapped blocks by (size, address), BlockPool::blocks: size classes
     * (blocks.h) with the caching allocator, a treap with expandable
     * segments (whose best fit walks the order past the lower bound) */
    ml_ab_classes cls;
    uint32_t blocks;
    uint32_t unmapped; /* expandable address space without pages: BlockPool::unmapped */
    size_t nfree, nunmapped;
    uint64_t calls; /* get_free_blocks_call_count: get_free_block calls while GC is on */
} pool_t;

struct ml_alloc_sim {
    ml_alloc_config cfg;
    uint64_t max_split; /* UINT64_MAX: unlimited */
    uint64_t non_split; /* max_non_split_rounding_size */
    uint64_t va[2];     /* an expandable segment's address space, per pool */
    ml_ab_table t;
    ml_ab_cls_table ct; /* the size classes' slots (blocks.h), with the caching allocator */
    pool_t pool[2];
    uint64_t next_addr; /* where the next segment goes (docs/allocator.md, "Addresses") */
    ml_alloc_stats st;
    uint32_t *scratch;
    size_t scratch_cap;
};

#define BLK(s, i) (&(s)->t.b[(i)])

static inline uint64_t up(uint64_t v, uint64_t m)
{
    return (v + m - 1) / m * m;
}

static inline uint64_t page(int pool)
{
    return pool == SMALL ? ML_ALLOC_SMALL_BUFFER : ML_ALLOC_LARGE_BUFFER;
}

static inline void stat_add(ml_alloc_stat *st, uint64_t n)
{
    st->current += n;
    if (st->current > st->peak)
        st->peak = st->current;
}

static inline void stat_sub(ml_alloc_stat *st, uint64_t n)
{
    st->current -= n;
}

/* Whether the pools' free blocks are in size classes (else in treaps). */
static inline bool classed(const ml_alloc_sim *s)
{
    return s->cfg.mode == ML_ALLOC_CACHING;
}

/* The free sets: a mapped free block into / out of its pool's size-ordered
 * set (BlockPool::insert_into_blocks stamps the GC clock), an unmapped one
 * into / out of the address-ordered set. */
void ml__as_cache(ml_alloc_sim *s, uint32_t x);
void ml__as_uncache(ml_alloc_sim *s, uint32_t x);
void ml__as_unmapped_add(ml_alloc_sim *s, uint32_t x);
void ml__as_unmapped_del(ml_alloc_sim *s, uint32_t x);
/* try_merge_blocks: dst (in no set) absorbs neighbour src when src is in
 * state want (ML_AB_FREE for a mapped dst, ML_AB_UNMAPPED for an unmapped one). */
void ml__as_try_merge(ml_alloc_sim *s, uint32_t dst, uint32_t src, int want);
/* dst absorbs its neighbour src, both in no set; src's slot is released. */
void ml__as_join(ml_alloc_sim *s, uint32_t dst, uint32_t src);
/* A new block [addr, addr + size), of like's pool, spliced between prev and
 * next (inline: every split makes one). */
static inline uint32_t ml_as_piece(ml_alloc_sim *s, uint32_t like, uint64_t addr,
                                   uint64_t size, uint32_t prev, uint32_t next)
{
    uint32_t n = ml_ab_new(&s->t);
    ml_ab *b = BLK(s, n);
    b->addr = addr;
    b->size = size;
    b->pool = BLK(s, like)->pool;
    b->expandable = BLK(s, like)->expandable;
    b->prev = prev;
    b->next = next;
    if (prev)
        BLK(s, prev)->next = n;
    if (next)
        BLK(s, next)->prev = n;
    return n;
}
bool ml__as_is_split(const ml_alloc_sim *s, uint32_t x);

/* release.c: after a failed cudaMalloc, every cached whole segment
 * (release_cached_blocks) or, with max_split_size, oversize ones
 * (release_available_cached_blocks: true when enough were freed); above
 * the GC threshold, the oldest cached segments of the large pool
 * (garbage_collect_cached_blocks). */
void ml__as_release_cached(ml_alloc_sim *s);
bool ml__as_release_available(ml_alloc_sim *s, int pi, uint64_t size);
void ml__as_garbage_collect(ml_alloc_sim *s);

/* expandable.c */
uint64_t ml__as_expandable_size(const ml_alloc_sim *s, uint32_t x);
void ml__as_unmap_block(ml_alloc_sim *s, uint32_t x);
uint32_t ml__as_try_allocate_expandable(ml_alloc_sim *s, int pi, uint64_t size);

#endif
