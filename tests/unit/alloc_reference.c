/* The simple reference allocator (alloc_reference.h). Every rule is a
 * linear scan over plain arrays; the order PyTorch keeps its free blocks in
 * (size, then address) is obtained by sorting a fresh list each time. */
#include <stdlib.h>
#include <string.h>

#include "alloc_reference.h"

#define MIB (1ull << 20)

enum { ST_ALLOC = 'A', ST_FREE = 'F', ST_UNMAPPED = 'U', ST_TAKEN = 'T' };

typedef struct {
    uint64_t addr, size, req, base; /* base: the pool's GC clock when it was cached */
    int st;
} rblock;

typedef struct {
    rblock *b;
    size_t n, cap;
    int pool;
    bool exp, live;
} rseg;

typedef struct {
    size_t seg;
    uint64_t addr;
    bool live;
} rhandle;

struct ref_sim {
    ml_alloc_config c;
    uint64_t msplit, nsplit, va[2], next, calls[2];
    rseg *s;
    size_t ns, caps;
    rhandle *h;
    size_t nh, caph;
    ml_alloc_stats st;
};

typedef struct {
    uint64_t size, addr;
    size_t seg;
} cand;

static void *grow(void *p, size_t *cap, size_t n, size_t elem)
{
    if (n < *cap)
        return p;
    *cap = *cap ? *cap * 2 : 8;
    void *q = realloc(p, *cap * elem);
    if (!q)
        abort();
    return q;
}

static uint64_t ceil_to(uint64_t v, uint64_t m)
{
    return (v + m - 1) / m * m;
}

static void add(ml_alloc_stat *s, uint64_t v)
{
    s->current += v;
    if (s->current > s->peak)
        s->peak = s->current;
}

static uint64_t page_of(int pool)
{
    return pool ? 20 * MIB : 2 * MIB;
}

ref_sim *ref_create(const ml_alloc_config *cfg)
{
    ref_sim *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->c = *cfg;
    r->msplit = cfg->max_split_size ? cfg->max_split_size : UINT64_MAX;
    r->nsplit = cfg->max_non_split_rounding ? cfg->max_non_split_rounding : 20 * MIB;
    uint64_t dev = cfg->device_bytes ? cfg->device_bytes : 1ull << 46;
    r->va[0] = ceil_to(dev + dev / 8, 2 * MIB);
    r->va[1] = ceil_to(dev + dev / 8, 20 * MIB);
    r->next = 1ull << 32;
    return r;
}

void ref_destroy(ref_sim *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->ns; i++)
        free(r->s[i].b);
    free(r->s);
    free(r->h);
    free(r);
}

void ref_stats(const ref_sim *r, ml_alloc_stats *out)
{
    *out = r->st;
}

static uint64_t round_request(const ref_sim *r, uint64_t bytes)
{
    if (bytes < 512)
        return 512;
    uint64_t d = r->c.roundup_power2_divisions;
    if (d > 1 && bytes > 512 * d) {
        uint64_t f = 1;
        while (f * 2 <= bytes)
            f *= 2;
        if (f == bytes)
            return bytes;
        return ceil_to(bytes, f / d);
    }
    return ceil_to(bytes, 512);
}

static uint64_t new_segment_size(uint64_t size)
{
    if (size <= MIB)
        return 2 * MIB;
    if (size < 10 * MIB)
        return 20 * MIB;
    return ceil_to(size, 2 * MIB);
}

static void insert_block(rseg *g, size_t at, rblock b)
{
    g->b = grow(g->b, &g->cap, g->n, sizeof *g->b);
    memmove(&g->b[at + 1], &g->b[at], (g->n - at) * sizeof *g->b);
    g->b[at] = b;
    g->n++;
}

static void remove_block(rseg *g, size_t at)
{
    memmove(&g->b[at], &g->b[at + 1], (g->n - at - 1) * sizeof *g->b);
    g->n--;
}

static size_t index_at(const rseg *g, uint64_t addr) /* the block holding addr */
{
    for (size_t i = 0; i < g->n; i++)
        if (addr >= g->b[i].addr && addr < g->b[i].addr + g->b[i].size)
            return i;
    abort();
}

static size_t new_seg(ref_sim *r, int pool, bool exp, uint64_t addr, uint64_t size, int st)
{
    r->s = grow(r->s, &r->caps, r->ns, sizeof *r->s);
    rseg *g = &r->s[r->ns];
    memset(g, 0, sizeof *g);
    g->pool = pool;
    g->exp = exp;
    g->live = true;
    rblock b = {addr, size, 0, 0, st};
    insert_block(g, 0, b);
    add(&r->st.segments, 1);
    return r->ns++;
}

/* Joins block i with its neighbours in the same state; returns its index. */
static size_t coalesce(rseg *g, size_t i)
{
    if (i + 1 < g->n && g->b[i + 1].st == g->b[i].st) {
        g->b[i].size += g->b[i + 1].size;
        remove_block(g, i + 1);
    }
    if (i > 0 && g->b[i - 1].st == g->b[i].st) {
        g->b[i - 1].size += g->b[i].size;
        remove_block(g, i);
        i--;
    }
    return i;
}

static void make_free(ref_sim *r, rseg *g, size_t i)
{
    g->b[i].st = ST_FREE;
    i = coalesce(g, i);
    g->b[i].base = r->calls[g->pool];
}

static int by_size(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->size != y->size)
        return x->size < y->size ? -1 : 1;
    return x->addr < y->addr ? -1 : x->addr > y->addr;
}

/* The free blocks of a pool of at least `min` bytes, by (size, address). */
static cand *free_list(const ref_sim *r, int pool, uint64_t min, size_t *n)
{
    cand *c = NULL;
    size_t cap = 0;
    *n = 0;
    for (size_t s = 0; s < r->ns; s++) {
        const rseg *g = &r->s[s];
        if (!g->live || g->pool != pool)
            continue;
        for (size_t i = 0; i < g->n; i++)
            if (g->b[i].st == ST_FREE && g->b[i].size >= min) {
                c = grow(c, &cap, *n, sizeof *c);
                c[(*n)++] = (cand){g->b[i].size, g->b[i].addr, s};
            }
    }
    if (*n)
        qsort(c, *n, sizeof *c, by_size);
    return c;
}

static uint64_t grow_room(const ref_sim *r, const cand *c)
{
    const rseg *g = &r->s[c->seg];
    size_t i = index_at(g, c->addr);
    uint64_t extra = i + 1 < g->n && g->b[i + 1].st == ST_UNMAPPED ? g->b[i + 1].size : 0;
    return c->size + extra;
}

static bool take_cached(ref_sim *r, int pool, uint64_t size, size_t *seg, uint64_t *addr)
{
    if (r->c.gc_threshold > 0 && r->c.device_bytes)
        r->calls[pool]++;
    size_t n;
    cand *c = free_list(r, pool, size, &n);
    size_t k = 0;
    if (r->c.mode == ML_ALLOC_EXPANDABLE)
        while (k + 1 < n && grow_room(r, &c[k + 1]) < grow_room(r, &c[k]))
            k++;
    bool ok = n > 0 && !(size < r->msplit && c[k].size >= r->msplit) &&
              !(size >= r->msplit && c[k].size >= size + r->nsplit);
    if (ok) {
        *seg = c[k].seg;
        *addr = c[k].addr;
        rseg *g = &r->s[*seg];
        g->b[index_at(g, *addr)].st = ST_TAKEN;
    }
    free(c);
    return ok;
}

static void drop_segment(ref_sim *r, size_t s)
{
    rseg *g = &r->s[s];
    r->st.reserved.current -= g->b[0].size;
    r->st.segments.current--;
    r->st.device_frees++;
    g->live = false;
}

static bool whole_free(const rseg *g)
{
    return g->live && g->n == 1 && g->b[0].st == ST_FREE;
}

static bool release_oversize(ref_sim *r, int pool, uint64_t size)
{
    if (r->msplit == UINT64_MAX || r->c.mode == ML_ALLOC_EXPANDABLE)
        return false;
    uint64_t key = size > r->msplit ? size : r->msplit;
    size_t n;
    cand *c = free_list(r, pool, 0, &n);
    size_t k = 0;
    while (k < n && c[k].size < key)
        k++;
    bool ok = false;
    if (k < n) {
        ok = whole_free(&r->s[c[k].seg]);
        if (ok)
            drop_segment(r, c[k].seg);
    } else {
        uint64_t total = 0;
        for (size_t j = n; j-- > 0 && total < key;) {
            if (c[j].size < r->msplit || !whole_free(&r->s[c[j].seg]))
                break;
            total += c[j].size;
            drop_segment(r, c[j].seg);
        }
        ok = total >= key;
    }
    free(c);
    return ok;
}

static void unmap(ref_sim *r, rseg *g, size_t i)
{
    uint64_t pg = page_of(g->pool);
    rblock b = g->b[i];
    uint64_t lo = ceil_to(b.addr, pg), hi = (b.addr + b.size) / pg * pg;
    if (lo >= hi)
        return;
    remove_block(g, i);
    size_t at = i;
    if (lo > b.addr)
        insert_block(g, at++, (rblock){b.addr, lo - b.addr, 0, r->calls[g->pool], ST_FREE});
    insert_block(g, at, (rblock){lo, hi - lo, 0, 0, ST_UNMAPPED});
    if (b.addr + b.size > hi)
        insert_block(g, at + 1,
                     (rblock){hi, b.addr + b.size - hi, 0, r->calls[g->pool], ST_FREE});
    coalesce(g, at);
    r->st.reserved.current -= hi - lo;
    r->st.device_frees++;
}

static void release_all(ref_sim *r)
{
    for (int pool = 1; pool >= 0; pool--) {
        for (size_t s = 0; s < r->ns; s++)
            if (!r->s[s].exp && r->s[s].pool == pool && whole_free(&r->s[s]))
                drop_segment(r, s);
        size_t n;
        cand *c = free_list(r, pool, 0, &n);
        for (size_t k = 0; k < n; k++) {
            rseg *g = &r->s[c[k].seg];
            if (!g->exp)
                continue;
            unmap(r, g, index_at(g, c[k].addr));
            if (g->n == 1 && g->b[0].st == ST_UNMAPPED) {
                g->live = false;
                r->st.segments.current--;
            }
        }
        free(c);
    }
}

static void collect_garbage(ref_sim *r)
{
    uint64_t thr = (uint64_t)(r->c.gc_threshold * (double)r->c.device_bytes);
    if (r->st.reserved.current <= thr)
        return;
    uint64_t target = r->st.reserved.current - thr, got = 0, ages = 0, count = 0;
    for (size_t s = 0; s < r->ns; s++)
        if (r->s[s].pool == 1 && whole_free(&r->s[s])) {
            ages += r->calls[1] - r->s[s].b[0].base;
            count++;
        }
    bool any = true;
    while (got < target && any && count > 0) {
        double avg = (double)ages / (double)count;
        any = false;
        for (size_t s = 0; s < r->ns; s++) {
            if (r->s[s].pool != 1 || !whole_free(&r->s[s]))
                continue;
            uint64_t age = r->calls[1] - r->s[s].b[0].base;
            if ((double)age >= avg) {
                any = true;
                got += r->s[s].b[0].size;
                ages -= age;
                count--;
                drop_segment(r, s);
            }
        }
    }
}

static bool map_pages(ref_sim *r, rseg *g, size_t i, uint64_t size)
{
    uint64_t len = ceil_to(size, page_of(g->pool));
    if (r->c.device_bytes && r->st.reserved.current + len > r->c.device_bytes)
        return false;
    if (len < g->b[i].size) {
        rblock rest = {g->b[i].addr + len, g->b[i].size - len, 0, 0, ST_UNMAPPED};
        g->b[i].size = len;
        insert_block(g, i + 1, rest);
    }
    make_free(r, g, i);
    add(&r->st.reserved, len);
    r->st.device_allocs++;
    return true;
}

static bool expand(ref_sim *r, int pool, uint64_t size, size_t *seg, uint64_t *addr)
{
    size_t s = SIZE_MAX;
    uint64_t a = 0, best = UINT64_MAX;
    for (size_t t = 0; t < r->ns; t++) { /* unmapped blocks from the lowest address */
        const rseg *g = &r->s[t];
        if (!g->live || !g->exp || g->pool != pool)
            continue;
        for (size_t i = 0; i < g->n; i++) {
            if (g->b[i].st != ST_UNMAPPED || g->b[i].addr >= best)
                continue;
            size_t j = i > 0 && g->b[i - 1].st == ST_FREE ? i - 1 : i;
            uint64_t room = 0;
            for (size_t k = j; k < g->n && room < size && g->b[k].st != ST_ALLOC; k++)
                room += g->b[k].size;
            if (room >= size) {
                best = g->b[i].addr;
                s = t;
                a = g->b[j].addr;
            }
        }
    }
    if (s == SIZE_MAX) {
        a = ceil_to(r->next, 20 * MIB);
        r->next = a + r->va[pool];
        s = new_seg(r, pool, true, a, r->va[pool], ST_UNMAPPED);
    }
    rseg *g = &r->s[s];
    size_t i = index_at(g, a);
    if (g->b[i].st == ST_UNMAPPED &&
        !map_pages(r, g, i, g->b[i].size < size ? g->b[i].size : size))
        return false;
    i = index_at(g, a);
    while (g->b[i].size < size) {
        if (i + 1 >= g->n || g->b[i + 1].st != ST_UNMAPPED)
            return false;
        uint64_t want = size - g->b[i].size;
        if (!map_pages(r, g, i + 1, g->b[i + 1].size < want ? g->b[i + 1].size : want))
            return false;
        i = index_at(g, a);
    }
    g->b[i].st = ST_TAKEN;
    *seg = s;
    *addr = g->b[i].addr;
    return true;
}

static bool new_block(ref_sim *r, int pool, uint64_t size, uint64_t seg_size, bool retry,
                      size_t *seg, uint64_t *addr)
{
    if (retry)
        r->st.num_alloc_retries++;
    if (r->c.mode == ML_ALLOC_EXPANDABLE)
        return expand(r, pool, size, seg, addr);
    if (r->c.device_bytes && r->st.reserved.current + seg_size > r->c.device_bytes)
        return false;
    *addr = r->next;
    r->next += ceil_to(seg_size, 2 * MIB);
    *seg = new_seg(r, pool, false, *addr, seg_size, ST_TAKEN);
    add(&r->st.reserved, seg_size);
    r->st.device_allocs++;
    return true;
}

static ml_alloc_result out_of_memory(ref_sim *r)
{
    r->st.num_ooms++;
    if (!r->st.oom_event)
        r->st.oom_event = r->st.events;
    return ML_ALLOC_OOM;
}

ml_alloc_result ref_malloc(ref_sim *r, uint64_t bytes, uint64_t *handle)
{
    r->st.events++;
    if (!bytes) {
        *handle = 0;
        return ML_ALLOC_OK;
    }
    if (bytes >= 1ull << 60)
        return out_of_memory(r);
    uint64_t size = round_request(r, bytes);
    int pool = size > MIB;
    size_t s = 0;
    uint64_t a = 0;
    bool ok;
    if (r->c.mode == ML_ALLOC_NONE) {
        ok = new_block(r, pool, size, size, false, &s, &a);
    } else {
        uint64_t seg_size = new_segment_size(size);
        ok = take_cached(r, pool, size, &s, &a);
        if (!ok) {
            if (r->c.gc_threshold > 0 && r->c.device_bytes)
                collect_garbage(r);
            ok = new_block(r, pool, size, seg_size, false, &s, &a);
            if (!ok && release_oversize(r, pool, size))
                ok = new_block(r, pool, size, seg_size, false, &s, &a);
            if (!ok) {
                release_all(r);
                ok = new_block(r, pool, size, seg_size, true, &s, &a);
            }
        }
    }
    if (!ok)
        return out_of_memory(r);
    rseg *g = &r->s[s];
    size_t i = index_at(g, a);
    uint64_t rest = g->b[i].size - size;
    bool split = r->c.mode != ML_ALLOC_NONE &&
                 (pool == 0 || r->c.mode == ML_ALLOC_EXPANDABLE
                      ? rest >= 512
                      : size < r->msplit && rest > MIB);
    if (split) {
        insert_block(g, i + 1,
                     (rblock){g->b[i].addr + size, rest, 0, r->calls[pool], ST_FREE});
        g->b[i].size = size;
    }
    g->b[i].st = ST_ALLOC;
    g->b[i].req = bytes;
    add(&r->st.allocated, g->b[i].size);
    add(&r->st.requested, bytes);
    r->h = grow(r->h, &r->caph, r->nh, sizeof *r->h);
    r->h[r->nh++] = (rhandle){s, a, true};
    *handle = r->nh;
    return ML_ALLOC_OK;
}

ml_alloc_result ref_free(ref_sim *r, uint64_t handle)
{
    if (!handle) {
        r->st.events++;
        return ML_ALLOC_OK;
    }
    if (handle > r->nh || !r->h[handle - 1].live)
        return ML_ALLOC_BAD_HANDLE;
    r->st.events++;
    rhandle *h = &r->h[handle - 1];
    h->live = false;
    rseg *g = &r->s[h->seg];
    size_t i = index_at(g, h->addr);
    r->st.allocated.current -= g->b[i].size;
    r->st.requested.current -= g->b[i].req;
    if (r->c.mode == ML_ALLOC_NONE)
        drop_segment(r, h->seg);
    else
        make_free(r, g, i);
    return ML_ALLOC_OK;
}

void ref_empty_cache(ref_sim *r)
{
    if (r->c.mode != ML_ALLOC_NONE)
        release_all(r);
}

uint64_t ref_address(const ref_sim *r, uint64_t handle)
{
    return handle && handle <= r->nh && r->h[handle - 1].live ? r->h[handle - 1].addr : 0;
}
