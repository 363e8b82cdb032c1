/* Private to src/alloc/: the simulator's block table and the ordered sets
 * of free blocks (PyTorch's std::set<Block*> with BlockComparatorSize or
 * BlockComparatorAddress), as treaps threaded through the table by index. */
#ifndef ML_ALLOC_BLOCKS_H
#define ML_ALLOC_BLOCKS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum {
    ML_AB_SLOT,     /* unused slot, on the table's free list */
    ML_AB_FREE,     /* mapped and free: in its pool's size-ordered set */
    ML_AB_ALLOC,    /* handed out */
    ML_AB_UNMAPPED, /* expandable address space without pages: in the address-ordered set */
    ML_AB_DETACHED, /* between sets: a block being allocated or released */
    ML_AB_PENDING,  /* freed by ml_alloc_sim_free_many, not merged yet */
};

/* One block: a piece of a segment. Index 0 is "none". */
typedef struct {
    uint64_t addr, size;
    uint64_t requested; /* the request it serves, when allocated */
    int64_t gc_base;    /* the pool's get_free_block count when it was cached */
    uint32_t prev, next; /* neighbours in the segment, by address */
    uint32_t kid[2], prio; /* treap links (0: left, keys below; 1: right) and heap priority */
    uint32_t gen;       /* counts allocations of this slot: stale handles fail */
    uint8_t state, pool;
    bool expandable;
} ml_ab;

typedef struct {
    ml_ab *b;
    size_t n, cap;      /* slots used (index 0 included), allocated */
    uint32_t free_head; /* list of unused slots through .next */
    size_t free_count;
    uint64_t rng;       /* xorshift state for treap priorities: deterministic */
} ml_ab_table;

/* Room for `need` more blocks without allocating: false when the host is
 * out of memory (the table unchanged). */
bool ml_ab_reserve(ml_ab_table *t, size_t need);
/* A zeroed block (state DETACHED) from the reserved room; never fails after
 * a successful ml_ab_reserve covering it. Inline: every split makes one. */
static inline uint32_t ml_ab_new(ml_ab_table *t)
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
    /* xorshift64 (Marsaglia 2003) */
    uint64_t r = t->rng;
    r ^= r << 13;
    r ^= r >> 7;
    r ^= r << 17;
    t->rng = r;
    ml_ab *b = &t->b[i];
    b->addr = b->size = b->requested = 0;
    b->gc_base = 0;
    b->prev = b->next = b->kid[0] = b->kid[1] = 0;
    b->prio = (uint32_t)(r >> 32);
    b->state = ML_AB_DETACHED;
    b->pool = 0;
    b->expandable = false;
    return i;
}

static inline void ml_ab_release(ml_ab_table *t, uint32_t i)
{
    t->b[i].state = ML_AB_SLOT;
    t->b[i].next = t->free_head;
    t->free_head = i;
    t->free_count++;
}

void ml_ab_table_free(ml_ab_table *t);

/* Ordered sets: *root is 0 when empty. by_addr orders by address, else by
 * (size, address). A block's key must not change while it is in a set,
 * unless its place in the order stays (then it may, in place). */
void ml_ab_insert(ml_ab_table *t, uint32_t *root, uint32_t x, bool by_addr);
void ml_ab_erase(ml_ab_table *t, uint32_t *root, uint32_t x, bool by_addr);
/* The smallest block of a size-ordered set whose size is >= size; 0: none. */
uint32_t ml_ab_lower_bound(const ml_ab_table *t, uint32_t root, uint64_t size);
/* The same in the set *root, also giving *link, the link that holds it
 * (for ml_ab_erase_at), and *pred, the block before it in the order (0:
 * none); both are written only when a block is found, and *link is valid
 * until the set or the table changes. */
uint32_t ml_ab_lower_bound_at(ml_ab_table *t, uint32_t *root, uint64_t size, uint32_t **link,
                              uint32_t *pred);
/* Erases the block that *link holds, with no search. */
void ml_ab_erase_at(ml_ab_table *t, uint32_t *link);
/* The next and previous block of a set after / before x (in the set); 0: none. */
uint32_t ml_ab_after(const ml_ab_table *t, uint32_t root, uint32_t x, bool by_addr);
uint32_t ml_ab_before(const ml_ab_table *t, uint32_t root, uint32_t x, bool by_addr);
uint32_t ml_ab_first(const ml_ab_table *t, uint32_t root);
uint32_t ml_ab_last(const ml_ab_table *t, uint32_t root);
/* Writes the set's blocks in order into out (room for count of them). */
size_t ml_ab_collect(const ml_ab_table *t, uint32_t root, uint32_t *out, size_t room);

#endif
