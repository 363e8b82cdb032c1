/* The block table and its treaps (blocks.h). A treap keeps the expected
 * depth logarithmic whatever the order of sizes, with random priorities
 * drawn from a per-table generator, so a replay is deterministic. */
#include <stdlib.h>
#include <string.h>

#include "alloc/blocks.h"

void *ml__ab_grow(void *arr, size_t elem, size_t *n, size_t *cap, size_t free_count, size_t need)
{
    if (arr && free_count + (*cap - *n) >= need)
        return arr;
    size_t want = *n + need;
    if (want > UINT32_MAX - 1)
        return NULL; /* indices are 32-bit */
    size_t c = *cap ? *cap : 64;
    while (c < want)
        c *= 2;
    void *na = realloc(arr, c * elem);
    if (!na)
        return NULL;
    *cap = c;
    if (*n == 0) {
        memset(na, 0, elem); /* index 0: "none" */
        *n = 1;
    }
    return na;
}

bool ml__ab_reserve(ml_ab_table *t, size_t need)
{
    ml_ab *b = ml__ab_grow(t->b, sizeof *t->b, &t->n, &t->cap, t->free_count, need);
    if (b)
        t->b = b;
    return b != NULL;
}

void ml__ab_table_free(ml_ab_table *t)
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

/* Joins two treaps, every key of a below every key of b. */
static uint32_t merge(ml_ab_table *t, uint32_t a, uint32_t b)
{
    uint32_t root = 0, *link = &root;
    while (a && b) {
        /* the higher priority on top: a with its right side to merge on,
         * or b with its left */
        bool take_b = t->b[a].prio <= t->b[b].prio;
        uint32_t n = take_b ? b : a;
        *link = n;
        link = &t->b[n].kid[!take_b];
        a = take_b ? a : *link;
        b = take_b ? *link : b;
    }
    *link = a ? a : b;
    return root;
}

#ifdef __SIZEOF_INT128__
__extension__ typedef unsigned __int128 key128; /* (size, address) as one number */
#endif

/* x's key below n's: the order with by_addr a constant once inlined.
 * Without branches, as the walks below: which way a walk turns is a coin
 * toss a branch predictor loses half the time, and a lost guess costs
 * more than the comparisons (cmov instead). */
static inline bool below(const ml_ab *n, uint64_t size, uint64_t addr, bool by_addr)
{
    if (by_addr)
        return addr < n->addr;
#ifdef __SIZEOF_INT128__
    return ((key128)size << 64 | addr) < ((key128)n->size << 64 | n->addr);
#else
    return (size < n->size) | ((size == n->size) & (addr < n->addr));
#endif
}

/* x in place of the subtree at *link, which holds no key equal to x's:
 * what hangs there splits into the keys below x's (x's left) and above
 * (its right), walking down once. */
static inline void split_under(ml_ab *b, uint32_t *link, uint32_t x, bool by_addr)
{
    const uint64_t size = b[x].size, addr = b[x].addr;
    /* open[0]: where the next key below x's hangs, open[1]: above; n goes
     * to its side, and the walk goes on into its subtree toward x's key */
    uint32_t *open[2] = {&b[x].kid[0], &b[x].kid[1]};
    for (uint32_t n = *link; n;) {
        int side = below(&b[n], size, addr, by_addr);
        *open[side] = n;
        open[side] = &b[n].kid[!side];
        n = *open[side];
    }
    *open[0] = *open[1] = 0;
    *link = x;
}

static inline void insert(ml_ab_table *t, uint32_t *root, uint32_t x, bool by_addr)
{
    /* down to where x's priority belongs, then the split */
    ml_ab *b = t->b;
    const uint64_t size = b[x].size, addr = b[x].addr;
    const uint32_t prio = b[x].prio;
    uint32_t *link = root, n;
    while ((n = *link) != 0 && b[n].prio >= prio)
        link = &b[n].kid[!below(&b[n], size, addr, by_addr)];
    split_under(b, link, x, by_addr);
}

void ml__ab_insert(ml_ab_table *t, uint32_t *root, uint32_t x, bool by_addr)
{
    if (by_addr)
        insert(t, root, x, true);
    else
        insert(t, root, x, false);
}

void ml__ab_erase(ml_ab_table *t, uint32_t *root, uint32_t x, bool by_addr)
{
    uint32_t *link = root;
    const uint64_t size = t->b[x].size, addr = t->b[x].addr;
    while (*link && *link != x)
        link = &t->b[*link].kid[!below(&t->b[*link], size, addr, by_addr)];
    if (*link) /* else not in the set: a caller's bug, harmless here */
        *link = merge(t, t->b[x].kid[0], t->b[x].kid[1]);
    t->b[x].kid[0] = t->b[x].kid[1] = 0;
}

uint32_t ml__ab_lower_bound(const ml_ab_table *t, uint32_t n, uint64_t size)
{
    uint32_t best = 0;
    while (n) {
        if (t->b[n].size >= size) {
            best = n; /* keys (size, addr) >= (size, 0) */
            n = t->b[n].kid[0];
        } else {
            n = t->b[n].kid[1];
        }
    }
    return best;
}

uint32_t ml__ab_lower_bound_at(ml_ab_table *t, uint32_t *root, uint64_t size, uint32_t **link,
                               uint32_t *pred)
{
    /* the last node the walk leaves to the right is the largest below the
     * result: nodes passed later lie in the left subtree of the result */
    uint32_t under = 0, *at = root, *best_at = NULL;
    for (uint32_t n; (n = *at) != 0;) {
        bool fits = t->b[n].size >= size;
        best_at = fits ? at : best_at; /* it holds n, the best so far */
        under = fits ? under : n;
        at = &t->b[n].kid[!fits];
    }
    if (!best_at)
        return 0;
    *link = best_at;
    *pred = under;
    return *best_at;
}

void ml__ab_erase_at(ml_ab_table *t, uint32_t *link)
{
    uint32_t x = *link;
    *link = merge(t, t->b[x].kid[0], t->b[x].kid[1]);
    t->b[x].kid[0] = t->b[x].kid[1] = 0;
}

uint32_t ml__ab_after(const ml_ab_table *t, uint32_t n, uint32_t x, bool by_addr)
{
    uint32_t best = 0;
    while (n) {
        if (less(&t->b[x], &t->b[n], by_addr)) {
            best = n;
            n = t->b[n].kid[0];
        } else {
            n = t->b[n].kid[1];
        }
    }
    return best;
}

uint32_t ml__ab_before(const ml_ab_table *t, uint32_t n, uint32_t x, bool by_addr)
{
    uint32_t best = 0;
    while (n) {
        if (less(&t->b[n], &t->b[x], by_addr)) {
            best = n;
            n = t->b[n].kid[1];
        } else {
            n = t->b[n].kid[0];
        }
    }
    return best;
}

uint32_t ml__ab_first(const ml_ab_table *t, uint32_t n)
{
    while (n && t->b[n].kid[0])
        n = t->b[n].kid[0];
    return n;
}

uint32_t ml__ab_last(const ml_ab_table *t, uint32_t n)
{
    while (n && t->b[n].kid[1])
        n = t->b[n].kid[1];
    return n;
}

static void collect(const ml_ab_table *t, uint32_t n, uint32_t *out, size_t room, size_t *k)
{
    while (n) {
        collect(t, t->b[n].kid[0], out, room, k);
        if (*k < room)
            out[*k] = n;
        (*k)++;
        n = t->b[n].kid[1]; /* the right spine iteratively */
    }
}

size_t ml__ab_collect(const ml_ab_table *t, uint32_t root, uint32_t *out, size_t room)
{
    size_t k = 0;
    collect(t, root, out, room, &k);
    return k < room ? k : room;
}
