/* The block table and its treaps (blocks.h). A treap keeps the expected
 * depth logarithmic whatever the order of sizes, with random priorities
 * drawn from a per-table generator, so a replay is deterministic. */
#include <stdlib.h>
#include <string.h>

#include "alloc/blocks.h"

bool ml_ab_reserve(ml_ab_table *t, size_t need)
{
    if (t->free_count + (t->cap - t->n) >= need)
        return true;
    size_t want = t->n + need;
    if (want > UINT32_MAX - 1)
        return false; /* indices are 32-bit */
    size_t cap = t->cap ? t->cap : 64;
    while (cap < want)
        cap *= 2;
    ml_ab *nb = realloc(t->b, cap * sizeof *nb);
    if (!nb)
        return false;
    t->b = nb;
    t->cap = cap;
    if (t->n == 0) {
        memset(&t->b[0], 0, sizeof t->b[0]); /* index 0: "none" */
        t->n = 1;
    }
    return true;
}

uint32_t ml_ab_new(ml_ab_table *t)
{
    uint32_t i;
    if (t->free_head) {
        i = t->free_head;
        t->free_head = t->b[i].next;
        t->free_count--;
    } else {
        i = (uint32_t)t->n++;
        t->b[i].gen = 0;
    }
    uint32_t gen = t->b[i].gen;
    memset(&t->b[i], 0, sizeof t->b[i]);
    t->b[i].gen = gen;
    t->b[i].state = ML_AB_DETACHED;
    /* xorshift64 (Marsaglia 2003) */
    uint64_t r = t->rng;
    r ^= r << 13;
    r ^= r >> 7;
    r ^= r << 17;
    t->rng = r;
    t->b[i].prio = (uint32_t)(r >> 32);
    return i;
}

void ml_ab_release(ml_ab_table *t, uint32_t i)
{
    t->b[i].state = ML_AB_SLOT;
    t->b[i].next = t->free_head;
    t->free_head = i;
    t->free_count++;
}

void ml_ab_table_free(ml_ab_table *t)
{
    free(t->b);
    memset(t, 0, sizeof *t);
}

static bool less(const ml_ab *a, const ml_ab *b, bool by_addr)
{
    if (!by_addr && a->size != b->size)
        return a->size < b->size;
    return a->addr < b->addr;
}

/* Splits the treap n into the keys below key's (*l) and the rest (*r),
 * walking down once: each step hangs a node on the left or right result. */
static void split(ml_ab_table *t, uint32_t n, const ml_ab *key, bool by_addr, uint32_t *l,
                  uint32_t *r)
{
    while (n) {
        if (less(&t->b[n], key, by_addr)) {
            *l = n;
            l = &t->b[n].right;
            n = t->b[n].right;
        } else {
            *r = n;
            r = &t->b[n].left;
            n = t->b[n].left;
        }
    }
    *l = *r = 0;
}

/* Joins two treaps, every key of a below every key of b. */
static uint32_t merge(ml_ab_table *t, uint32_t a, uint32_t b)
{
    uint32_t root = 0, *link = &root;
    while (a && b) {
        if (t->b[a].prio > t->b[b].prio) {
            *link = a;
            link = &t->b[a].right;
            a = t->b[a].right;
        } else {
            *link = b;
            link = &t->b[b].left;
            b = t->b[b].left;
        }
    }
    *link = a ? a : b;
    return root;
}

void ml_ab_insert(ml_ab_table *t, uint32_t *root, uint32_t x, bool by_addr)
{
    /* down to where x's priority belongs, then split what hangs there */
    uint32_t *link = root;
    while (*link && t->b[*link].prio >= t->b[x].prio)
        link = less(&t->b[x], &t->b[*link], by_addr) ? &t->b[*link].left : &t->b[*link].right;
    split(t, *link, &t->b[x], by_addr, &t->b[x].left, &t->b[x].right);
    *link = x;
}

void ml_ab_erase(ml_ab_table *t, uint32_t *root, uint32_t x, bool by_addr)
{
    uint32_t *link = root;
    while (*link && *link != x)
        link = less(&t->b[x], &t->b[*link], by_addr) ? &t->b[*link].left : &t->b[*link].right;
    if (*link) /* else not in the set: a caller's bug, harmless here */
        *link = merge(t, t->b[x].left, t->b[x].right);
    t->b[x].left = t->b[x].right = 0;
}

uint32_t ml_ab_lower_bound(const ml_ab_table *t, uint32_t n, uint64_t size)
{
    uint32_t best = 0;
    while (n) {
        if (t->b[n].size >= size) {
            best = n; /* keys (size, addr) >= (size, 0) */
            n = t->b[n].left;
        } else {
            n = t->b[n].right;
        }
    }
    return best;
}

uint32_t ml_ab_after(const ml_ab_table *t, uint32_t n, uint32_t x, bool by_addr)
{
    uint32_t best = 0;
    while (n) {
        if (less(&t->b[x], &t->b[n], by_addr)) {
            best = n;
            n = t->b[n].left;
        } else {
            n = t->b[n].right;
        }
    }
    return best;
}

uint32_t ml_ab_before(const ml_ab_table *t, uint32_t n, uint32_t x, bool by_addr)
{
    uint32_t best = 0;
    while (n) {
        if (less(&t->b[n], &t->b[x], by_addr)) {
            best = n;
            n = t->b[n].right;
        } else {
            n = t->b[n].left;
        }
    }
    return best;
}

uint32_t ml_ab_first(const ml_ab_table *t, uint32_t n)
{
    while (n && t->b[n].left)
        n = t->b[n].left;
    return n;
}

uint32_t ml_ab_last(const ml_ab_table *t, uint32_t n)
{
    while (n && t->b[n].right)
        n = t->b[n].right;
    return n;
}

static void collect(const ml_ab_table *t, uint32_t n, uint32_t *out, size_t room, size_t *k)
{
    while (n) {
        collect(t, t->b[n].left, out, room, k);
        if (*k < room)
            out[*k] = n;
        (*k)++;
        n = t->b[n].right; /* the right spine iteratively */
    }
}

size_t ml_ab_collect(const ml_ab_table *t, uint32_t root, uint32_t *out, size_t room)
{
    size_t k = 0;
    collect(t, root, out, room, &k);
    return k < room ? k : room;
}
