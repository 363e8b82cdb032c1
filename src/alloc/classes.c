/* Class sets (blocks.h): size classes in a treap of the class table, each
 * class's free blocks in a pairing heap by address. Deterministic: the
 * treap's priorities come from the class table's generator and a heap's
 * shape from the order of calls. */
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

void ml_ab_class_insert(ml_ab_table *t, ml_ab_table *ct, ml_ab_classes *c, uint32_t x)
{
    ml_ab *b = t->b;
    const uint64_t size = b[x].size;
    unsigned m = memo_slot(size);
    uint32_t k = c->memo[m].cls;
    if (!k || c->memo[m].size != size) {
        k = ml_ab_new(ct); /* a slot per free block at most: reserved */
        ct->b[k].size = size;
        uint32_t in = ml_ab_insert_unique(ct, &c->root, k);
        if (in != k)
            ml_ab_release(ct, k); /* the class was there */
        else
            c->found = 0; /* the classes changed */
        k = in;
        c->memo[m].size = size;
        c->memo[m].cls = k;
    }
    b[x].hc = b[x].hs = b[x].hp = 0;
    ct->b[k].next = meld(b, ct->b[k].next, x);
    b[x].cls = k;
}

void ml_ab_class_erase(ml_ab_table *t, ml_ab_table *ct, ml_ab_classes *c, uint32_t x)
{
    uint32_t k = t->b[x].cls;
    if (!k)
        return; /* in no set: a caller's bug, harmless here */
    t->b[x].cls = 0;
    uint32_t top = heap_erase(t->b, ct->b[k].next, x);
    ct->b[k].next = top;
    if (top)
        return;
    /* the class is empty: out of the memo and the treap */
    unsigned m = memo_slot(ct->b[k].size);
    if (c->memo[m].cls == k)
        c->memo[m].cls = 0;
    ml_ab_erase(ct, &c->root, k, false);
    ml_ab_release(ct, k);
    c->found = 0;
}

uint32_t ml_ab_class_lower_bound(ml_ab_table *ct, ml_ab_classes *c, uint64_t size)
{
    unsigned m = memo_slot(size);
    if (c->memo[m].cls && c->memo[m].size == size) {
        c->found = 0; /* the class below it unknown */
        return ct->b[c->memo[m].cls].next; /* a class of exactly that size */
    }
    uint32_t *link;
    c->found = ml_ab_lower_bound_at(ct, &c->root, size, &link, &c->under);
    return ct->b[c->found].next;
}

bool ml_ab_class_shrink(ml_ab_table *t, ml_ab_table *ct, ml_ab_classes *c, uint32_t x,
                        uint64_t size, uint64_t addr)
{
    ml_ab *b = t->b;
    uint32_t k = b[x].cls;
    if (!k || ct->b[k].next != x || b[x].hc)
        return false; /* not alone in its class */
    /* the class below x's must stay below size; the walk that found x
     * knows it (a class the memo gave is of the request's size exactly,
     * whose blocks are taken whole) */
    if (c->found != k || (c->under && ct->b[c->under].size >= size))
        return false;
    unsigned m = memo_slot(ct->b[k].size);
    if (c->memo[m].cls == k)
        c->memo[m].cls = 0;
    ct->b[k].size = b[x].size = size;
    b[x].addr = addr;
    c->found = 0;
    return true;
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

size_t ml_ab_class_collect(const ml_ab_table *t, const ml_ab_table *ct, const ml_ab_classes *c,
                           uint32_t *out, size_t room)
{
    size_t n = 0;
    for (uint32_t k = ml_ab_first(ct, c->root); k; k = ml_ab_after(ct, c->root, k, false))
        heap_collect(t->b, ct->b[k].next, out, room, &n);
    return n;
}
