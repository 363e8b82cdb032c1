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
    ml_abn *nn = realloc(t->nd, cap * sizeof *nn);
    if (!nn)
        return false; /* the blocks' room grew, the capacity not yet: harmless */
    t->nd = nn;
    t->cap = cap;
    if (t->n == 0) {
        memset(&t->b[0], 0, sizeof t->b[0]); /* index 0: "none" */
        memset(&t->nd[0], 0, sizeof t->nd[0]);
        t->n = 1;
        t->nn = 0;
    }
    return true;
}

void ml_ab_table_free(ml_ab_table *t)
{
    free(t->b);
    free(t->nd);
    memset(t, 0, sizeof *t);
}

/* A node with key (size, addr) for block x (0 for a size class), and a
 * fresh priority. */
uint32_t ml_ab_node_new(ml_ab_table *t, uint64_t size, uint64_t addr, uint32_t x)
{
    uint32_t i = t->node_head;
    if (i)
        t->node_head = t->nd[i].kid[0];
    else
        i = (uint32_t)++t->nn; /* below cap: a node per block in a set */
    /* xorshift64 (Marsaglia 2003) */
    uint64_t r = t->rng;
    r ^= r << 13;
    r ^= r >> 7;
    r ^= r << 17;
    t->rng = r;
    ml_abn *n = &t->nd[i];
    n->size = size;
    n->addr = addr;
    n->kid[0] = n->kid[1] = 0;
    n->prio = (uint32_t)(r >> 32);
    n->blk = x;
    t->b[x].node = i;
    return i;
}

static inline void node_release(ml_ab_table *t, uint32_t i)
{
    t->b[t->nd[i].blk].node = 0;
    t->nd[i].kid[0] = t->node_head;
    t->node_head = i;
}

/* Joins two treaps, every key of a below every key of b. */
static uint32_t merge(ml_abn *nd, uint32_t a, uint32_t b)
{
    uint32_t root = 0, *link = &root;
    while (a && b) {
        /* the higher priority on top: a with its right side to merge on,
         * or b with its left */
        bool take_b = nd[a].prio <= nd[b].prio;
        uint32_t n = take_b ? b : a;
        *link = n;
        link = &nd[n].kid[!take_b];
        a = take_b ? a : *link;
        b = take_b ? *link : b;
    }
    *link = a ? a : b;
    return root;
}

#ifdef __SIZEOF_INT128__
__extension__ typedef unsigned __int128 key128; /* (size, address) as one number */
#endif

/* Key (s1, a1) below key (s2, a2): the order with by_addr a constant once
 * inlined. Without branches, as the walks below: which way a walk turns is
 * a coin toss a branch predictor loses half the time, and a lost guess
 * costs more than the comparisons (cmov instead). */
static inline bool key_less(uint64_t s1, uint64_t a1, uint64_t s2, uint64_t a2, bool by_addr)
{
    if (by_addr)
        return a1 < a2;
#ifdef __SIZEOF_INT128__
    return ((key128)s1 << 64 | a1) < ((key128)s2 << 64 | a2);
#else
    return (s1 < s2) | ((s1 == s2) & (a1 < a2));
#endif
}

/* The key (size, addr) below node n's. */
static inline bool below(const ml_abn *n, uint64_t size, uint64_t addr, bool by_addr)
{
    return key_less(size, addr, n->size, n->addr, by_addr);
}

static inline void insert(ml_abn *nd, uint32_t *root, uint32_t xi, bool by_addr)
{
    /* down to where x's priority belongs, then split what hangs there into
     * the keys below x's (x's left) and above (its right), walking down once */
    const uint64_t size = nd[xi].size, addr = nd[xi].addr;
    const uint32_t prio = nd[xi].prio;
    uint32_t *link = root, n;
    while ((n = *link) != 0 && nd[n].prio >= prio)
        link = &nd[n].kid[!below(&nd[n], size, addr, by_addr)];
    /* open[0]: where the next key below x's hangs, open[1]: above; n goes
     * to its side, and the walk goes on into its subtree toward x's key */
    uint32_t *open[2] = {&nd[xi].kid[0], &nd[xi].kid[1]};
    while (n) {
        int side = below(&nd[n], size, addr, by_addr);
        *open[side] = n;
        open[side] = &nd[n].kid[!side];
        n = *open[side];
    }
    *open[0] = *open[1] = 0;
    *link = xi;
}

void ml_ab_insert_node(ml_ab_table *t, uint32_t *root, uint32_t xi)
{
    insert(t->nd, root, xi, false);
}

void ml_ab_insert(ml_ab_table *t, uint32_t *root, uint32_t x, bool by_addr)
{
    uint32_t xi = ml_ab_node_new(t, t->b[x].size, t->b[x].addr, x);
    if (by_addr)
        insert(t->nd, root, xi, true);
    else
        insert(t->nd, root, xi, false);
}

void ml_ab_erase(ml_ab_table *t, uint32_t *root, uint32_t x, bool by_addr)
{
    ml_abn *nd = t->nd;
    const uint32_t xi = t->b[x].node;
    if (!xi)
        return; /* in no set: a caller's bug, harmless here */
    const uint64_t size = nd[xi].size, addr = nd[xi].addr;
    uint32_t *link = root;
    while (*link && *link != xi)
        link = &nd[*link].kid[!below(&nd[*link], size, addr, by_addr)];
    if (*link) /* else not in this set: a caller's bug, harmless here */
        ml_ab_erase_at(t, link);
}

uint32_t ml_ab_lower_bound(const ml_ab_table *t, uint32_t n, uint64_t size)
{
    uint32_t best = 0;
    while (n) {
        if (t->nd[n].size >= size) {
            best = n; /* keys (size, addr) >= (size, 0) */
            n = t->nd[n].kid[0];
        } else {
            n = t->nd[n].kid[1];
        }
    }
    return t->nd[best].blk;
}

uint32_t ml_ab_lower_bound_at(ml_ab_table *t, uint32_t *root, uint64_t size, uint32_t **link,
                              uint32_t *pred)
{
    /* the last node the walk leaves to the right is the largest below the
     * result: nodes passed later lie in the left subtree of the result */
    const ml_abn *nd = t->nd;
    uint32_t under = 0, *at = root, *best_at = NULL;
    for (uint32_t n; (n = *at) != 0;) {
        bool fits = nd[n].size >= size;
        best_at = fits ? at : best_at; /* it holds n, the best so far */
        under = fits ? under : n;
        at = &t->nd[n].kid[!fits];
    }
    if (!best_at)
        return 0;
    *link = best_at;
    *pred = nd[under].blk;
    return nd[*best_at].blk;
}

void ml_ab_erase_at(ml_ab_table *t, uint32_t *link)
{
    uint32_t xi = *link;
    *link = merge(t->nd, t->nd[xi].kid[0], t->nd[xi].kid[1]);
    node_release(t, xi);
}

/* The node after (dir 1) or before (dir 0) block x's key in the set under
 * n; 0: none. */
static uint32_t next_node(const ml_abn *nd, uint32_t n, const ml_ab *x, bool by_addr, int dir)
{
    uint32_t best = 0;
    while (n) {
        bool beyond = dir ? key_less(x->size, x->addr, nd[n].size, nd[n].addr, by_addr)
                          : key_less(nd[n].size, nd[n].addr, x->size, x->addr, by_addr);
        best = beyond ? n : best;
        n = nd[n].kid[beyond ? !dir : dir]; /* past x's key: back toward it */
    }
    return best;
}

uint32_t ml_ab_after(const ml_ab_table *t, uint32_t n, uint32_t x, bool by_addr)
{
    return t->nd[next_node(t->nd, n, &t->b[x], by_addr, 1)].blk;
}

uint32_t ml_ab_before(const ml_ab_table *t, uint32_t n, uint32_t x, bool by_addr)
{
    return t->nd[next_node(t->nd, n, &t->b[x], by_addr, 0)].blk;
}

uint32_t ml_ab_first(const ml_ab_table *t, uint32_t n)
{
    while (n && t->nd[n].kid[0])
        n = t->nd[n].kid[0];
    return t->nd[n].blk;
}

uint32_t ml_ab_last(const ml_ab_table *t, uint32_t n)
{
    while (n && t->nd[n].kid[1])
        n = t->nd[n].kid[1];
    return t->nd[n].blk;
}

static void collect(const ml_abn *nd, uint32_t n, uint32_t *out, size_t room, size_t *k)
{
    while (n) {
        collect(nd, nd[n].kid[0], out, room, k);
        if (*k < room)
            out[*k] = nd[n].blk;
        (*k)++;
        n = nd[n].kid[1]; /* the right spine iteratively */
    }
}

size_t ml_ab_collect(const ml_ab_table *t, uint32_t root, uint32_t *out, size_t room)
{
    size_t k = 0;
    collect(t->nd, root, out, room, &k);
    return k < room ? k : room;
}
