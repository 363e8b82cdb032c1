/* The caching-allocator simulator (alloc.h). Each function names the
 * DeviceCachingAllocator method it models (PyTorch 2.x,
 * c10/cuda/CUDACachingAllocator.cpp); docs/allocator.md derives the rules
 * and lists what is simplified. Blocks live in one table and are named by
 * index; free blocks sit in size classes (classes.c) or, with expandable
 * segments, in treaps (blocks.c), so a request costs O(log n) in the
 * cached blocks or less. Expandable segments: expandable.c; freeing: free.c. */
#include <stdlib.h>
#include <string.h>

#include "alloc/sim.h"
#include "util/grow.h"

ml_alloc_config ml__alloc_config_defaults(void)
{
    ml_alloc_config c;
    memset(&c, 0, sizeof c);
    c.mode = ML_ALLOC_CACHING;
    return c;
}

static const char *const mode_names[] = {"caching", "expandable", "none"};

const char *ml__alloc_mode_name(ml_alloc_mode m)
{
    return (unsigned)m < 3 ? mode_names[m] : "?";
}

bool ml__alloc_mode_parse(const char *s, ml_alloc_mode *out)
{
    for (unsigned i = 0; i < 3; i++)
        if (!strcmp(s, mode_names[i])) {
            *out = (ml_alloc_mode)i;
            return true;
        }
    return false;
}

/* roundup_power2_next_division: the next of `div` equal steps between the
 * powers of two around size. */
static uint64_t power2_division(uint64_t size, unsigned div)
{
    if ((size & (size - 1)) == 0)
        return size;
    uint64_t floor2 = 1;
    while (floor2 <= size / 2)
        floor2 <<= 1;
    unsigned lg = 0;
    while ((2u << lg) <= div)
        lg++;
    uint64_t step = floor2 >> lg;
    if (!step)
        return floor2 << 1;
    uint64_t r = size & ~(step - 1);
    return r == size ? size : r + step;
}

static inline uint64_t round_size(unsigned divisions, uint64_t bytes)
{
    if (bytes < ML_ALLOC_MIN_BLOCK)
        return ML_ALLOC_MIN_BLOCK;
    if (divisions > 1 && bytes > (uint64_t)ML_ALLOC_MIN_BLOCK * divisions)
        return power2_division(bytes, divisions);
    return (bytes + ML_ALLOC_MIN_BLOCK - 1) & ~(uint64_t)(ML_ALLOC_MIN_BLOCK - 1);
}

uint64_t ml__alloc_round_size(const ml_alloc_config *cfg, uint64_t bytes)
{
    return round_size(cfg ? cfg->roundup_power2_divisions : 0, bytes);
}

uint64_t ml__alloc_segment_size(uint64_t rounded)
{
    if (rounded <= ML_ALLOC_SMALL_SIZE)
        return ML_ALLOC_SMALL_BUFFER;
    if (rounded < ML_ALLOC_MIN_LARGE_ALLOC)
        return ML_ALLOC_LARGE_BUFFER;
    return up(rounded, ML_ALLOC_ROUND_LARGE);
}

/* Room for `need` more blocks, and with size classes a class slot for each
 * block the table can hold (a class per free block at most), so that no
 * call allocates once room() has passed. */
static bool tables_reserve(ml_alloc_sim *s, size_t need)
{
    if (!ml__ab_reserve(&s->t, need))
        return false;
    if (!classed(s))
        return true;
    /* then ct.cap >= t.cap and index room for t.cap classes per pool: a
     * class slot for each block the table can hold, as the live classes
     * never outnumber the free blocks (slot 0 is "none" in both tables) */
    size_t live = s->ct.n ? s->ct.n - 1 - s->ct.free_count : 0;
    return ml__ab_cls_reserve(&s->ct, s->t.cap > live + 1 ? s->t.cap - 1 - live : 0) &&
           ml__ab_classes_reserve(&s->pool[SMALL].cls, s->t.cap) &&
           ml__ab_classes_reserve(&s->pool[LARGE].cls, s->t.cap);
}

/* Whether tables_reserve's class room covers the block table. */
static inline bool classes_room(const ml_alloc_sim *s)
{
    return s->ct.cap >= s->t.cap && ml_ab_classes_room(&s->pool[SMALL].cls, s->t.cap) &&
           ml_ab_classes_room(&s->pool[LARGE].cls, s->t.cap);
}

ml_alloc_result ml__alloc_sim_create(const ml_alloc_config *cfg, ml_alloc_sim **out)
{
    const uint64_t lim = 1ull << 62;
    unsigned d = cfg->roundup_power2_divisions;
    if ((unsigned)cfg->mode > ML_ALLOC_NONE || cfg->device_bytes > lim ||
        (cfg->max_split_size && (cfg->max_split_size < ML_ALLOC_LARGE_BUFFER ||
                                 cfg->max_split_size > lim)) ||
        (cfg->max_non_split_rounding && (cfg->max_non_split_rounding < ML_ALLOC_LARGE_BUFFER ||
                                         cfg->max_non_split_rounding > lim)) ||
        !(cfg->gc_threshold >= 0 && cfg->gc_threshold < 1) || d > 64 || (d & (d - 1)))
        return ML_ALLOC_BAD_CONFIG;
    ml_alloc_sim *s = calloc(1, sizeof *s);
    if (!s)
        return ML_ALLOC_NOMEM;
    s->cfg = *cfg;
    s->max_split = cfg->max_split_size ? cfg->max_split_size : UINT64_MAX;
    s->non_split = cfg->max_non_split_rounding ? cfg->max_non_split_rounding
                                               : ML_ALLOC_LARGE_BUFFER;
    /* ExpandableSegment reserves address space for 1 1/8 of the device */
    uint64_t dev = cfg->device_bytes ? cfg->device_bytes : ML_ALLOC_NO_DEVICE_BYTES;
    for (int p = 0; p < 2; p++)
        s->va[p] = up(dev + dev / 8, page(p));
    s->t.rng = 0x9E3779B97F4A7C15ull;
    s->next_addr = 1ull << 32;
    if (!tables_reserve(s, 16)) {
        ml__alloc_sim_destroy(s);
        return ML_ALLOC_NOMEM;
    }
    *out = s;
    return ML_ALLOC_OK;
}

ml_alloc_result ml__alloc_sim_reserve(ml_alloc_sim *s, size_t blocks)
{
    return tables_reserve(s, blocks) ? ML_ALLOC_OK : ML_ALLOC_NOMEM;
}

void ml__alloc_sim_destroy(ml_alloc_sim *s)
{
    if (!s)
        return;
    ml__ab_table_free(&s->t);
    ml__ab_cls_table_free(&s->ct);
    ml__ab_classes_free(&s->pool[SMALL].cls);
    ml__ab_classes_free(&s->pool[LARGE].cls);
    free(s->scratch);
    free(s);
}

/* ---- the free sets ---- */

void ml__as_cache(ml_alloc_sim *s, uint32_t x) /* BlockPool::insert_into_blocks */
{
    ml_ab *b = BLK(s, x);
    pool_t *p = &s->pool[b->pool];
    b->state = ML_AB_FREE;
    b->gc_base = (int64_t)p->calls;
    if (classed(s))
        ml__ab_class_insert(&s->t, &s->ct, &p->cls, x);
    else
        ml__ab_insert(&s->t, &p->blocks, x, false);
    p->nfree++;
}

void ml__as_uncache(ml_alloc_sim *s, uint32_t x)
{
    pool_t *p = &s->pool[BLK(s, x)->pool];
    if (classed(s))
        ml__ab_class_erase(&s->t, &s->ct, &p->cls, x);
    else
        ml__ab_erase(&s->t, &p->blocks, x, false);
    p->nfree--;
    BLK(s, x)->state = ML_AB_DETACHED;
}

void ml__as_unmapped_add(ml_alloc_sim *s, uint32_t x)
{
    pool_t *p = &s->pool[BLK(s, x)->pool];
    BLK(s, x)->state = ML_AB_UNMAPPED;
    ml__ab_insert(&s->t, &p->unmapped, x, true);
    p->nunmapped++;
}

void ml__as_unmapped_del(ml_alloc_sim *s, uint32_t x)
{
    pool_t *p = &s->pool[BLK(s, x)->pool];
    ml__ab_erase(&s->t, &p->unmapped, x, true);
    p->nunmapped--;
    BLK(s, x)->state = ML_AB_DETACHED;
}

/* dst absorbs its neighbour src, both in no set; src's slot is released. */
void ml__as_join(ml_alloc_sim *s, uint32_t dst, uint32_t src)
{
    ml_ab *d = BLK(s, dst), *c = BLK(s, src);
    if (d->prev == src) {
        d->addr = c->addr;
        d->prev = c->prev;
        if (d->prev)
            BLK(s, d->prev)->next = dst;
    } else {
        d->next = c->next;
        if (d->next)
            BLK(s, d->next)->prev = dst;
    }
    d->size += c->size;
    ml_ab_release(&s->t, src);
}

/* try_merge_blocks: dst (in no set) absorbs its neighbour src when src is
 * in state `want` (free for a mapped dst, unmapped for an unmapped one). */
void ml__as_try_merge(ml_alloc_sim *s, uint32_t dst, uint32_t src, int want)
{
    if (!src || BLK(s, src)->state != want)
        return;
    if (want == ML_AB_FREE)
        ml__as_uncache(s, src);
    else
        ml__as_unmapped_del(s, src);
    ml__as_join(s, dst, src);
}

bool ml__as_is_split(const ml_alloc_sim *s, uint32_t x)
{
    return s->t.b[x].prev || s->t.b[x].next;
}

/* ---- finding and making blocks ---- */

/* get_free_block: the smallest cached block that fits, unless the
 * max_split_size rules refuse it (only that one block is considered). The
 * block stays in its pool's set; *link holds it there and *pred is the
 * block before it (*link NULL: the expandable walk passed the lower bound). */
static uint32_t get_free_block(ml_alloc_sim *s, int pi, uint64_t size, uint32_t **link,
                               uint32_t *pred)
{
    pool_t *p = &s->pool[pi];
    if (s->cfg.gc_threshold > 0 && s->cfg.device_bytes)
        p->calls++;
    uint32_t *lk = NULL, pr = 0;
    uint32_t it = classed(s) ? ml__ab_class_lower_bound(&s->ct, &p->cls, size)
                             : ml__ab_lower_bound_at(&s->t, &p->blocks, size, &lk, &pr);
    if (!it)
        return 0;
    if (BLK(s, it)->expandable) {
        /* best fit counts what a block at the mapped end could grow to */
        uint32_t nx = ml__ab_after(&s->t, p->blocks, it, false);
        while (nx && ml__as_expandable_size(s, nx) < ml__as_expandable_size(s, it)) {
            it = nx;
            lk = NULL;
            nx = ml__ab_after(&s->t, p->blocks, it, false);
        }
    }
    uint64_t bs = BLK(s, it)->size;
    if (size < s->max_split && bs >= s->max_split)
        return 0; /* no oversize block for a smaller request */
    if (size >= s->max_split && bs >= size + s->non_split)
        return 0; /* an oversize block may be only so much larger */
    *link = lk;
    *pred = pr;
    return it;
}

/* alloc_block: a new segment from the device (or pages), or 0 when the
 * device is full. */
static uint32_t alloc_block(ml_alloc_sim *s, int pi, uint64_t size, uint64_t alloc_size,
                            bool retry)
{
    if (retry)
        s->st.num_alloc_retries++;
    if (s->cfg.mode == ML_ALLOC_EXPANDABLE)
        return ml__as_try_allocate_expandable(s, pi, size);
    if (s->cfg.device_bytes && s->st.reserved.current + alloc_size > s->cfg.device_bytes)
        return 0;
    uint32_t x = ml_ab_new(&s->t);
    ml_ab *b = BLK(s, x);
    b->addr = s->next_addr;
    b->size = alloc_size;
    b->pool = (uint8_t)pi;
    s->next_addr += up(alloc_size, ML_ALLOC_ROUND_LARGE);
    stat_add(&s->st.segments, 1);
    stat_add(&s->st.reserved, alloc_size);
    s->st.device_allocs++;
    return x;
}

/* should_split: whether the block's remainder after size becomes a cached block. */
static bool should_split(const ml_alloc_sim *s, uint32_t x, uint64_t size)
{
    uint64_t rest = s->t.b[x].size - size;
    if (s->t.b[x].pool == SMALL || s->cfg.mode == ML_ALLOC_EXPANDABLE)
        return rest >= ML_ALLOC_MIN_BLOCK;
    return size < s->max_split && rest > ML_ALLOC_SMALL_SIZE;
}

/* alloc_found_block, the split: the front of x (in no set) becomes a new
 * block that serves the request, the rest stays x and is cached. */
static uint32_t split_front(ml_alloc_sim *s, uint32_t x, uint64_t size)
{
    ml_ab *r = BLK(s, x);
    uint32_t n = ml_as_piece(s, x, r->addr, size, r->prev, x);
    r = BLK(s, x);
    r->addr += size;
    r->size -= size;
    ml__as_cache(s, x);
    return n;
}

/* alloc_found_block for x, the cached block get_free_block chose (link and
 * pred as it gave them): returns the block that serves the request. When
 * split, the rest is x's key made smaller; if it still sorts after pred,
 * x keeps its place in the set and is re-keyed there, sparing an erase and
 * an insert (the set's order is what BlockPool::blocks holds either way). */
static uint32_t take_cached(ml_alloc_sim *s, uint32_t x, uint64_t size, uint32_t *link,
                            uint32_t pred)
{
    ml_ab *b = BLK(s, x);
    bool split = should_split(s, x, size);
    if (split && classed(s)) {
        uint64_t addr = b->addr;
        if (ml__ab_class_shrink(&s->t, &s->ct, &s->pool[b->pool].cls, x, b->size - size,
                                addr + size)) {
            uint32_t n = ml_as_piece(s, x, addr, size, BLK(s, x)->prev, x);
            BLK(s, x)->gc_base = (int64_t)s->pool[BLK(s, x)->pool].calls;
            return n;
        }
    }
    if (split && link) {
        uint64_t rs = b->size - size, ra = b->addr + size;
        const ml_ab *q = pred ? BLK(s, pred) : NULL;
        if (!q || q->size < rs || (q->size == rs && q->addr < ra)) {
            uint32_t n = ml_as_piece(s, x, b->addr, size, b->prev, x);
            b = BLK(s, x);
            b->addr = ra;
            b->size = rs;
            b->gc_base = (int64_t)s->pool[b->pool].calls; /* as insert_into_blocks stamps it */
            return n;
        }
    }
    if (link) {
        ml__ab_erase_at(&s->t, link);
        s->pool[b->pool].nfree--;
        b->state = ML_AB_DETACHED;
    } else {
        ml__as_uncache(s, x);
    }
    return split ? split_front(s, x, size) : x;
}

/* The allocation of block x (in no set): its handle. */
static uint64_t give_out(ml_alloc_sim *s, uint32_t x, uint64_t bytes)
{
    ml_ab *b = BLK(s, x);
    b->state = ML_AB_ALLOC;
    b->gen++;
    b->requested = bytes;
    stat_add(&s->st.allocated, b->size);
    stat_add(&s->st.requested, bytes);
    return ((uint64_t)b->gen << 32) | x;
}

static ml_alloc_result oom(ml_alloc_sim *s)
{
    s->st.num_ooms++;
    if (!s->st.oom_event)
        s->st.oom_event = s->st.events;
    return ML_ALLOC_OOM;
}

static bool room_grow(ml_alloc_sim *s, size_t n, size_t need)
{
    if (!tables_reserve(s, need))
        return false;
    uint32_t *ns = ml_grow_to(s->scratch, n, &s->scratch_cap, sizeof *ns, 64);
    if (!ns)
        return false;
    s->scratch = ns;
    return true;
}

/* Room for what one call may add: blocks (an unmapping splits each free
 * block in up to three) and the scratch list of a pool's free blocks. */
static inline bool room(ml_alloc_sim *s)
{
    size_t n = s->pool[0].nfree + s->pool[1].nfree + s->pool[0].nunmapped +
               s->pool[1].nunmapped + 16;
    size_t need = s->cfg.mode == ML_ALLOC_EXPANDABLE ? 3 * n : 8;
    if (s->t.free_count + (s->t.cap - s->t.n) >= need && s->scratch_cap >= n &&
        (!classed(s) || classes_room(s)))
        return true; /* the usual case; else also after a failed grow, retried */
    return room_grow(s, n, need);
}

/* After a served request: the figures at the reserved peak, when it raised
 * the peak (it was `peak` before). */
static inline void note_peak(ml_alloc_sim *s, uint64_t peak)
{
    if (s->st.reserved.peak > peak) {
        s->st.at_peak_allocated = s->st.allocated.current;
        s->st.at_peak_segments = s->st.segments.current;
    }
}

/* One allocation: ml__alloc_sim_malloc and ml__alloc_sim_malloc_many. */
static inline ml_alloc_result malloc_one(ml_alloc_sim *s, uint64_t bytes, uint64_t *handle)
{
    if (!room(s))
        return ML_ALLOC_NOMEM;
    s->st.events++;
    if (!bytes) {
        *handle = 0;
        return ML_ALLOC_OK;
    }
    if (bytes >= ML_ALLOC_MAX_REQUEST)
        return oom(s);
    uint64_t size = round_size(s->cfg.roundup_power2_divisions, bytes);
    int pi = size <= ML_ALLOC_SMALL_SIZE ? SMALL : LARGE;
    const uint64_t peak = s->st.reserved.peak;
    if (s->cfg.mode == ML_ALLOC_NONE) {
        uint32_t x = alloc_block(s, pi, size, size, false);
        if (!x)
            return oom(s);
        *handle = give_out(s, x, bytes);
        note_peak(s, peak);
        return ML_ALLOC_OK;
    }
    uint32_t *link = NULL, pred = 0;
    uint32_t x = get_free_block(s, pi, size, &link, &pred);
    if (x) {
        x = take_cached(s, x, size, link, pred);
    } else {
        uint64_t alloc_size = ml__alloc_segment_size(size);
        if (s->cfg.gc_threshold > 0 && s->cfg.device_bytes)
            ml__as_garbage_collect(s);
        x = alloc_block(s, pi, size, alloc_size, false);
        if (!x && ml__as_release_available(s, pi, size))
            x = alloc_block(s, pi, size, alloc_size, false);
        if (!x) {
            ml__as_release_cached(s);
            x = alloc_block(s, pi, size, alloc_size, true);
        }
        if (!x)
            return oom(s);
        if (should_split(s, x, size))
            x = split_front(s, x, size);
    }
    *handle = give_out(s, x, bytes);
    note_peak(s, peak);
    return ML_ALLOC_OK;
}

ml_alloc_result ml__alloc_sim_malloc(ml_alloc_sim *s, uint64_t bytes, uint64_t *handle)
{
    return malloc_one(s, bytes, handle);
}

ml_alloc_result ml__alloc_sim_malloc_many(ml_alloc_sim *s, const uint64_t *bytes, size_t n,
                                          uint64_t *handles, size_t *done)
{
    ml_alloc_result r = ML_ALLOC_OK;
    size_t i = 0;
    while (i < n && (r = malloc_one(s, bytes[i], &handles[i])) == ML_ALLOC_OK)
        i++;
    *done = i;
    return r;
}

ml_alloc_result ml__alloc_sim_empty_cache(ml_alloc_sim *s)
{
    if (!room(s))
        return ML_ALLOC_NOMEM;
    if (s->cfg.mode != ML_ALLOC_NONE)
        ml__as_release_cached(s);
    return ML_ALLOC_OK;
}

void ml__alloc_sim_reset_peaks(ml_alloc_sim *s)
{
    ml_alloc_stat *st[] = {&s->st.allocated, &s->st.requested, &s->st.reserved,
                           &s->st.segments};
    for (size_t i = 0; i < sizeof st / sizeof st[0]; i++)
        st[i]->peak = st[i]->current;
    s->st.at_peak_allocated = s->st.allocated.current;
    s->st.at_peak_segments = s->st.segments.current;
}

void ml__alloc_sim_stats(const ml_alloc_sim *s, ml_alloc_stats *out)
{
    *out = s->st;
}

uint64_t ml__alloc_sim_reserved_peak(const ml_alloc_sim *s)
{
    return s->st.reserved.peak;
}
