/* Class sets (blocks.h): size classes in a treap, each class's free blocks
 * in a pairing heap by address. Deterministic: the treap's priorities come
 * from the table's generator and a heap's shape from the order of calls. */
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

/* The link holding the class node of exactly `size`; *link 0: none. */
static uint32_t *class_link(ml_abn *nd, uint32_t *root, uint64_t size)
{
    uint32_t *link = root;
    while (*link && nd[*link].size != size)
        link = &nd[*link].kid[nd[*link].size < size];
    return link;
}

/* Drops the spare class (an empty one kept in the treap), if any. */
static void flush(ml_ab_table *t, ml_ab_classes *c)
{
    if (!c->spare)
        return;
    uint32_t *link = class_link(t->nd, &c->root, t->nd[c->spare].size);
    if (*link == c->spare)
        ml_ab_erase_at(t, link);
    c->spare = 0;
    c->found = 0; /* the classes changed */
}

/* The spare class re-keyed to size when it keeps its place in the order
 * (the classes around it are below and above size): the class for size
 * without a treap insert and erase. Else the spare is dropped; 0. */
static uint32_t reuse_spare(ml_ab_table *t, ml_ab_classes *c, uint64_t size)
{
    ml_abn *nd = t->nd;
    const uint32_t k = c->spare;
    const uint64_t old = nd[k].size;
    uint64_t lo = 0, hi = UINT64_MAX; /* the nearest classes' sizes around k */
    uint32_t *link = &c->root;
    while (*link && *link != k) {
        uint32_t n = *link;
        bool right = nd[n].size < old;
        lo = right ? nd[n].size : lo;
        hi = right ? hi : nd[n].size;
        link = &nd[n].kid[right];
    }
    for (uint32_t n = nd[k].kid[0]; n; n = nd[n].kid[1])
        lo = nd[n].size;
    for (uint32_t n = nd[k].kid[1]; n; n = nd[n].kid[0])
        hi = nd[n].size;
    c->spare = 0;
    c->found = 0;
    if (lo < size && size < hi) {
        nd[k].size = size;
        return k;
    }
    if (*link == k)
        ml_ab_erase_at(t, link);
    return 0;
}

void ml_ab_class_insert(ml_ab_table *t, ml_ab_classes *c, uint32_t x)
{
    ml_ab *b = t->b;
    const uint64_t size = b[x].size;
    unsigned m = memo_slot(size);
    uint32_t k = c->memo[m].node;
    if (!k || c->memo[m].size != size) {
        k = *class_link(t->nd, &c->root, size);
        if (!k && c->spare)
            k = reuse_spare(t, c, size);
        if (!k) {
            k = ml_ab_node_new(t, size, 0, 0);
            ml_ab_insert_node(t, &c->root, k);
            c->found = 0;
        }
        c->memo[m].size = size;
        c->memo[m].node = k;
    }
    if (k == c->spare)
        c->spare = 0; /* found by its size: in use again */
    b[x].hc = b[x].hs = b[x].hp = 0;
    t->nd[k].blk = meld(b, t->nd[k].blk, x);
    b[x].node = k;
}

void ml_ab_class_erase(ml_ab_table *t, ml_ab_classes *c, uint32_t x)
{
    ml_ab *b = t->b;
    uint32_t k = b[x].node;
    if (!k)
        return; /* in no set: a caller's bug, harmless here */
    b[x].node = 0;
    uint32_t top = heap_erase(b, t->nd[k].blk, x);
    t->nd[k].blk = top;
    if (top)
        return;
    /* the class is empty: out of the memo, and kept as the spare (a free
     * often empties a class and fills a new one at once) */
    unsigned m = memo_slot(t->nd[k].size);
    if (c->memo[m].node == k)
        c->memo[m].node = 0;
    flush(t, c);
    c->spare = k;
}

bool ml_ab_class_shrink(ml_ab_table *t, ml_ab_classes *c, uint32_t x, uint64_t size,
                        uint64_t addr)
{
    ml_ab *b = t->b;
    uint32_t k = b[x].node;
    if (!k || t->nd[k].blk != x || b[x].hc)
        return false; /* not alone in its class */
    /* the largest class below x's must stay below size */
    const uint64_t old = b[x].size;
    uint64_t under = c->under;
    if (c->found != k) {
        under = 0;
        for (uint32_t n = c->root; n;) {
            bool lower = t->nd[n].size < old;
            under = lower ? t->nd[n].size : under;
            n = t->nd[n].kid[lower];
        }
    }
    if (under >= size)
        return false;
    unsigned m = memo_slot(old);
    if (c->memo[m].node == k)
        c->memo[m].node = 0;
    t->nd[k].size = b[x].size = size;
    b[x].addr = addr;
    c->found = 0;
    return true;
}

uint32_t ml_ab_class_lower_bound(ml_ab_table *t, ml_ab_classes *c, uint64_t size)
{
    flush(t, c);
    unsigned m = memo_slot(size);
    if (c->memo[m].node && c->memo[m].size == size) {
        c->found = 0; /* the class below it unknown */
        return t->nd[c->memo[m].node].blk; /* a class of exactly that size */
    }
    /* the walk also finds the largest class below, for ml_ab_class_shrink */
    const ml_abn *nd = t->nd;
    uint32_t best = 0;
    uint64_t under = 0;
    for (uint32_t n = c->root; n;) {
        bool fits = nd[n].size >= size;
        best = fits ? n : best;
        under = fits ? under : nd[n].size;
        n = nd[n].kid[!fits];
    }
    c->found = best;
    c->under = under;
    return nd[best].blk;
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

static void classes_collect(const ml_ab_table *t, uint32_t k, uint32_t *out, size_t room,
                            size_t *n)
{
    while (k) {
        classes_collect(t, t->nd[k].kid[0], out, room, n);
        heap_collect(t->b, t->nd[k].blk, out, room, n);
        k = t->nd[k].kid[1];
    }
}

size_t ml_ab_class_collect(const ml_ab_table *t, const ml_ab_classes *c, uint32_t *out,
                           size_t room)
{
    size_t n = 0;
    classes_collect(t, c->root, out, room, &n);
    return n;
}
