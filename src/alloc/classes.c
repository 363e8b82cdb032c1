/* Class sets (blocks.h): size classes in a two-level index of sizes, each
 * class's free blocks in a pairing heap by address. Deterministic: a
 * heap's shape comes from the order of calls. */
#include <stdlib.h>
#include <string.h>

#include "alloc/blocks.h"

/* Two heap tops into one; x and y are roots (no parent, no sibling). */
static inline uint32_t meld(ml_ab *b, uint32_t x, uint32_t y)
{
    if (!x)
        return y;
    if (!y)
        return x;
    if (b[y].addr < b[x].addr) {
        uint32_t t = x;
        x = y;
        y = t;
    }
    /* y becomes x's first child */
    b[y].hs = b[x].hc;
    if (b[x].hc)
        b[b[x].hc].hp = y;
    b[y].hp = x;
    b[x].hc = y;
    return x;
}

/* A list of siblings into one heap: the two passes (pairs from the left,
 * then the pairs melded from the right). */
static uint32_t combine(ml_ab *b, uint32_t c)
{
    uint32_t pairs = 0; /* melded pairs, the latest first, linked through hp */
    while (c) {
        uint32_t a = c, d = b[a].hs;
        c = d ? b[d].hs : 0;
        b[a].hs = b[a].hp = 0;
        if (d)
            b[d].hs = b[d].hp = 0;
        uint32_t m = meld(b, a, d);
        b[m].hp = pairs;
        pairs = m;
    }
    uint32_t r = 0;
    while (pairs) {
        uint32_t m = pairs;
        pairs = b[m].hp;
        b[m].hp = 0;
        r = meld(b, r, m);
    }
    return r;
}

/* The heap under root without x (in it): its new root. */
static uint32_t heap_erase(ml_ab *b, uint32_t root, uint32_t x)
{
    uint32_t sub = combine(b, b[x].hc);
    b[x].hc = 0;
    if (x == root)
        return sub;
    uint32_t p = b[x].hp, s = b[x].hs;
    if (b[p].hc == x)
        b[p].hc = s;
    else
        b[p].hs = s;
    if (s)
        b[s].hp = p;
    b[x].hp = b[x].hs = 0;
    return meld(b, root, sub);
}

static inline unsigned memo_slot(uint64_t size)
{
    return (unsigned)(((size >> 9) * 0x9E3779B97F4A7C15ull) >> 58); /* 64 slots */
}

/* ---- the class table ---- */

bool ml__ab_cls_reserve(ml_ab_cls_table *t, size_t need)
{
    ml_ab_cls *k = ml__ab_grow(t->k, sizeof *t->k, &t->n, &t->cap, t->free_count, need);
    if (k)
        t->k = k;
    return k != NULL;
}

void ml__ab_cls_table_free(ml_ab_cls_table *t)
{
    free(t->k);
    memset(t, 0, sizeof *t);
}

/* ---- the index of sizes ---- */

enum { CHUNK = ML_AB_CHUNK, HALF = ML_AB_CHUNK / 2 };

bool ml__ab_classes_reserve(ml_ab_classes *c, size_t classes)
{
    if (ml_ab_classes_room(c, classes))
        return true;
    size_t cap = 4 * classes / CHUNK + 2;
    if (cap > UINT32_MAX / 2)
        return false;
    /* each array grown in turn: one that fails leaves c as it was, with
     * more room in some arrays than cap says */
#define GROW(f)                                                                             \
    do {                                                                                    \
        void *g = realloc(c->f, cap * sizeof *c->f);                                        \
        if (!g)                                                                             \
            return false;                                                                   \
        c->f = g;                                                                           \
    } while (0)
    GROW(ch);
    GROW(order);
    GROW(hi);
    GROW(count);
    GROW(spare);
#undef GROW
    for (size_t id = cap; id > c->cap; id--)
        c->spare[c->nspare++] = (uint32_t)id - 1; /* the lowest id on top */
    c->cap = (uint32_t)cap;
    return true;
}

void ml__ab_classes_free(ml_ab_classes *c)
{
    free(c->ch);
    free(c->order);
    free(c->hi);
    free(c->count);
    free(c->spare);
    memset(c, 0, sizeof *c);
}

/* The index of the first of a[0 .. n) (ascending) that is >= v; n: none.
 * Without branches on the comparisons, which a predictor would lose half
 * the time. */
static inline uint32_t first_at_least(const uint64_t *a, uint32_t n, uint64_t v)
{
    if (!n)
        return 0;
    const uint64_t *base = a;
    while (n > 1) {
        uint32_t half = n / 2;
        base = base[half - 1] < v ? base + half : base;
        n -= half;
    }
    return (uint32_t)(base - a) + (*base < v);
}

/* The first entry whose size is >= size: its chunk position *p and index
 * *i; false (nothing written) when there is none. */
static inline bool locate(const ml_ab_classes *c, uint64_t size, uint32_t *p, uint32_t *i)
{
    uint32_t q = first_at_least(c->hi, c->nch, size);
    if (q == c->nch)
        return false;
    *p = q;
    *i = first_at_least(c->ch[c->order[q]].size, c->count[q], size);
    return true;
}

/* Room for one chunk after position p: the positions above move up. */
static uint32_t open_after(ml_ab_classes *c, uint32_t p)
{
    uint32_t id = c->spare[--c->nspare], n = c->nch - p - 1;
    memmove(&c->order[p + 2], &c->order[p + 1], n * sizeof *c->order);
    memmove(&c->hi[p + 2], &c->hi[p + 1], n * sizeof *c->hi);
    memmove(&c->count[p + 2], &c->count[p + 1], n * sizeof *c->count);
    c->order[p + 1] = id;
    c->count[p + 1] = 0;
    c->nch++;
    return id;
}

/* The chunk at position p out of the list (its entries moved away). */
static void close_at(ml_ab_classes *c, uint32_t p)
{
    uint32_t n = c->nch - p - 1;
    c->spare[c->nspare++] = c->order[p];
    memmove(&c->order[p], &c->order[p + 1], n * sizeof *c->order);
    memmove(&c->hi[p], &c->hi[p + 1], n * sizeof *c->hi);
    memmove(&c->count[p], &c->count[p + 1], n * sizeof *c->count);
    c->nch--;
}

/* Entries [from, count) of chunk position p appended to chunk id dst. */
static void move_tail(ml_ab_classes *c, uint32_t p, uint32_t from, uint32_t dst, uint32_t at)
{
    const ml_ab_chunk *h = &c->ch[c->order[p]];
    uint32_t n = c->count[p] - from;
    memcpy(&c->ch[dst].size[at], &h->size[from], n * sizeof h->size[0]);
    memcpy(&c->ch[dst].cls[at], &h->cls[from], n * sizeof h->cls[0]);
}

/* (size, k) in at position p, index i: where locate() put the first
 * larger size (p == nch: past the end). A full chunk splits in two. */
static void index_insert(ml_ab_classes *c, uint32_t p, uint32_t i, uint64_t size, uint32_t k)
{
    if (c->nch == 0) {
        c->order[0] = c->spare[--c->nspare];
        c->count[0] = 0;
        c->nch = 1;
        p = i = 0;
    } else if (p == c->nch) {
        p = c->nch - 1;
        i = c->count[p];
    }
    if (c->count[p] == CHUNK) {
        uint32_t id = open_after(c, p);
        move_tail(c, p, HALF, id, 0);
        c->count[p + 1] = HALF;
        c->hi[p + 1] = c->hi[p];
        c->count[p] = HALF;
        c->hi[p] = c->ch[c->order[p]].size[HALF - 1];
        if (i > HALF) {
            p++;
            i -= HALF;
        }
    }
    ml_ab_chunk *h = &c->ch[c->order[p]];
    uint32_t n = c->count[p] - i;
    memmove(&h->size[i + 1], &h->size[i], n * sizeof h->size[0]);
    memmove(&h->cls[i + 1], &h->cls[i], n * sizeof h->cls[0]);
    h->size[i] = size;
    h->cls[i] = k;
    if (i == c->count[p]++)
        c->hi[p] = size;
    c->n++;
}

/* The entry at position p, index i out. A chunk left empty goes; one left
 * with fewer than HALF entries together with a neighbour joins it, which
 * keeps every two neighbours at HALF or more (blocks.h): only p's pairs
 * changed, and one join mends both. */
static void index_erase(ml_ab_classes *c, uint32_t p, uint32_t i)
{
    ml_ab_chunk *h = &c->ch[c->order[p]];
    uint32_t n = --c->count[p] - i;
    memmove(&h->size[i], &h->size[i + 1], n * sizeof h->size[0]);
    memmove(&h->cls[i], &h->cls[i + 1], n * sizeof h->cls[0]);
    c->n--;
    if (!c->count[p]) {
        close_at(c, p);
        return;
    }
    if (!n)
        c->hi[p] = h->size[i - 1];
    if (p > 0 && c->count[p - 1] + c->count[p] < HALF)
        p--; /* p joins the chunk before it */
    else if (!(p + 1 < c->nch && c->count[p] + c->count[p + 1] < HALF))
        return;
    move_tail(c, p + 1, 0, c->order[p], c->count[p]);
    c->count[p] += c->count[p + 1];
    c->hi[p] = c->hi[p + 1];
    close_at(c, p + 1);
}

/* ---- the class sets ---- */

void ml__ab_class_insert(ml_ab_table *t, ml_ab_cls_table *ct, ml_ab_classes *c, uint32_t x)
{
    ml_ab *b = t->b;
    const uint64_t size = b[x].size;
    unsigned m = memo_slot(size);
    uint32_t k = c->memo[m].cls;
    if (!k || c->memo[m].size != size) {
        uint32_t p = c->nch, i = 0;
        if (locate(c, size, &p, &i) && c->ch[c->order[p]].size[i] == size) {
            k = c->ch[c->order[p]].cls[i];
        } else {
            k = ml_ab_cls_new(ct, size); /* a slot per free block at most: reserved */
            index_insert(c, p, i, size, k); /* and room in the index: reserved */
            c->fpos = 0;                    /* the positions changed */
        }
        c->memo[m].size = size;
        c->memo[m].cls = k;
    }
    b[x].hc = b[x].hs = b[x].hp = 0;
    ct->k[k].top = meld(b, ct->k[k].top, x);
    b[x].cls = k;
}

void ml__ab_class_erase(ml_ab_table *t, ml_ab_cls_table *ct, ml_ab_classes *c, uint32_t x)
{
    uint32_t k = t->b[x].cls;
    if (!k)
        return; /* in no set: a caller's bug, harmless here */
    t->b[x].cls = 0;
    uint32_t top = heap_erase(t->b, ct->k[k].top, x);
    ct->k[k].top = top;
    if (top)
        return;
    /* the class is empty: out of the memo and the index */
    const uint64_t size = ct->k[k].size;
    unsigned m = memo_slot(size);
    if (c->memo[m].cls == k)
        c->memo[m].cls = 0;
    uint32_t p = 0, i = 0;
    locate(c, size, &p, &i); /* the sizes are distinct: k's own entry */
    index_erase(c, p, i);
    ml_ab_cls_release(ct, k);
    c->fpos = 0;
}

uint32_t ml__ab_class_lower_bound(ml_ab_cls_table *ct, ml_ab_classes *c, uint64_t size)
{
    unsigned m = memo_slot(size);
    c->fpos = 0;
    if (c->memo[m].cls && c->memo[m].size == size)
        return ct->k[c->memo[m].cls].top; /* a class of exactly that size */
    uint32_t p, i;
    if (!locate(c, size, &p, &i))
        return 0;
    c->fpos = p + 1;
    c->fidx = i;
    return ct->k[c->ch[c->order[p]].cls[i]].top;
}

bool ml__ab_class_shrink(ml_ab_table *t, ml_ab_cls_table *ct, ml_ab_classes *c, uint32_t x,
                         uint64_t size, uint64_t addr)
{
    ml_ab *b = t->b;
    uint32_t k = b[x].cls;
    if (!k || ct->k[k].top != x || b[x].hc || !c->fpos)
        return false; /* not alone in its class, or its place unknown */
    /* the class below x's must stay below size; the search that found x
     * knows where it is (a class the memo gave is of the request's size
     * exactly, whose blocks are taken whole) */
    uint32_t p = c->fpos - 1, i = c->fidx;
    if (p >= c->nch || i >= c->count[p])
        return false; /* a place from before the index changed (the resets forbid it) */
    ml_ab_chunk *h = &c->ch[c->order[p]];
    uint64_t under = i ? h->size[i - 1] : p ? c->hi[p - 1] : 0;
    if (h->cls[i] != k || under >= size)
        return false;
    unsigned m = memo_slot(ct->k[k].size);
    if (c->memo[m].cls == k)
        c->memo[m].cls = 0;
    h->size[i] = ct->k[k].size = b[x].size = size;
    if (i + 1 == c->count[p])
        c->hi[p] = size;
    b[x].addr = addr;
    c->fpos = 0;
    return true;
}

const char *ml__ab_classes_check(const ml_ab_classes *c, const ml_ab_cls_table *ct, size_t blocks)
{
    if (!ml_ab_classes_room(c, blocks) || c->nch + c->nspare != c->cap)
        return "an index without room for a class per block, or a chunk lost";
    if (c->fpos && (c->fpos > c->nch || c->fidx >= c->count[c->fpos - 1]))
        return "a lower bound's place outside the index";
    if ((uint64_t)c->nch * ML_AB_CHUNK > 4ull * c->n + ML_AB_CHUNK)
        return "more chunks than the bound allows";
    uint32_t total = 0;
    uint64_t last = 0;
    for (uint32_t p = 0; p < c->nch; p++) {
        const ml_ab_chunk *h = &c->ch[c->order[p]];
        if (!c->count[p] || c->count[p] > ML_AB_CHUNK)
            return "an empty or overfull chunk";
        if (p && c->count[p - 1] + c->count[p] < ML_AB_CHUNK / 2)
            return "two neighbouring chunks under half a chunk";
        for (uint32_t i = 0; i < c->count[p]; i++) {
            if (h->size[i] <= last)
                return "classes out of order or repeated";
            last = h->size[i];
            uint32_t k = h->cls[i];
            if (!k || k >= ct->n || !ct->k[k].size || ct->k[k].size != last)
                return "an index entry naming no class of its size";
        }
        if (c->hi[p] != last)
            return "a chunk's largest size out of date";
        total += c->count[p];
    }
    if (total != c->n)
        return "an index's count of classes differs from its chunks";
    char *seen = calloc(c->cap, 1);
    if (!seen)
        return "out of memory";
    const char *why = NULL;
    for (uint32_t j = 0; j < c->nch + c->nspare && !why; j++) {
        uint32_t id = j < c->nch ? c->order[j] : c->spare[j - c->nch];
        if (id >= c->cap || seen[id]++)
            why = "a chunk id used twice";
    }
    free(seen);
    return why;
}

/* The blocks of the heap under top, appended to out[*n ..] (breadth
 * first, out the queue: a heap may be as deep as it is large). */
static void heap_collect(const ml_ab *b, uint32_t top, uint32_t *out, size_t room, size_t *n)
{
    if (!top || *n >= room)
        return;
    size_t i = *n;
    out[(*n)++] = top;
    for (; i < *n; i++)
        for (uint32_t y = b[out[i]].hc; y && *n < room; y = b[y].hs)
            out[(*n)++] = y;
}

size_t ml__ab_class_collect(const ml_ab_table *t, const ml_ab_cls_table *ct, const ml_ab_classes *c,
                            uint32_t *out, size_t room)
{
    size_t n = 0;
    for (uint32_t p = 0; p < c->nch; p++)
        for (uint32_t i = 0; i < c->count[p]; i++)
            heap_collect(t->b, ct->k[c->ch[c->order[p]].cls[i]].top, out, room, &n);
    return n;
}
