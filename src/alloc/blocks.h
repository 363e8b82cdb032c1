/* Private to src/alloc/: the simulator's block table and the ordered sets
 * of free blocks (PyTorch's std::set<Block*> with BlockComparatorSize or
 * BlockComparatorAddress), as treaps threaded through the table by index,
 * or as size classes (below). */
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
    union {
        /* in a treap: links (0: left, keys below; 1: right) and heap priority */
        struct {
            uint32_t kid[2], prio;
        };
        /* in a class's pairing heap: first child, next sibling, and the
         * previous sibling or (for a first child) the parent */
        struct {
            uint32_t hc, hs, hp;
        };
    };
    uint32_t cls;       /* in a class set: its class (a slot of the class table) */
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
    b->prev = b->next = b->kid[0] = b->kid[1] = b->cls = 0;
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
/* Inserts x into the size-ordered set unless a block of the same key is in
 * it: returns that one (x left out), else x. */
uint32_t ml_ab_insert_unique(ml_ab_table *t, uint32_t *root, uint32_t x);
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

/* ---- Class sets (classes.c): the caching allocator's size-ordered free
 * sets. One class per size with free blocks: a slot of a table of its own
 * (the class table: size = the class's size, addr = 0, next = the class's
 * lowest-addressed block) in a treap of classes by size; the class's blocks
 * form a pairing heap by address (Fredman, Sedgewick, Sleator and Tarjan
 * 1986). The best fit, the first block of the (size, address) order at or
 * above a size, is then the heap top of the first class at or above it:
 * the block BlockPool::blocks.lower_bound gives, with an insert that costs
 * O(1) in the class. The order of a class's blocks is kept only as far as
 * its top. The class table needs a slot per class, at most one per free
 * block: room for as many slots as the block table has keeps every call
 * free of allocations. */
typedef struct {
    uint32_t root; /* the treap of classes; 0: no free block */
    /* the class the last lower bound walked to (0: none, or found by the
     * memo) and the class just below it then (0: none) */
    uint32_t found, under;
    /* a direct-mapped memo of size -> class, checked before use */
    struct {
        uint64_t size;
        uint32_t cls;
    } memo[64];
} ml_ab_classes;

/* Block x (in no set) into the class set c of the blocks t, classes ct. */
void ml_ab_class_insert(ml_ab_table *t, ml_ab_table *ct, ml_ab_classes *c, uint32_t x);
/* Block x out of the class set c. */
void ml_ab_class_erase(ml_ab_table *t, ml_ab_table *ct, ml_ab_classes *c, uint32_t x);
/* The lowest-addressed block of the smallest class whose size is >= size;
 * 0: none. */
uint32_t ml_ab_class_lower_bound(ml_ab_table *ct, ml_ab_classes *c, uint64_t size);
/* Gives block x (in c) the key (size, addr), size below its own, in place
 * when x is alone in its class and no class lies between (as the lower
 * bound just before, which walked to x's class, saw): the class keeps its
 * place in the order and takes the new size. Returns false (nothing
 * changed) otherwise. */
bool ml_ab_class_shrink(ml_ab_table *t, ml_ab_table *ct, ml_ab_classes *c, uint32_t x,
                        uint64_t size, uint64_t addr);
/* Writes the set's blocks, class by class from the smallest (in no order
 * within a class), into out, at most room of them; returns how many. */
size_t ml_ab_class_collect(const ml_ab_table *t, const ml_ab_table *ct, const ml_ab_classes *c,
                           uint32_t *out, size_t room);

#endif
