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
    ML_AB_PENDING,  /* freed by ml__alloc_sim_free_many, not merged yet */
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

/* A table's array arr of elem-byte slots (*n used, index 0 "none"
 * included; *cap allocated; free_count of them on the free list) with
 * room for `need` more: arr itself when it has it, else arr grown by
 * doubling from 64 slots (slot 0 zeroed on first use), *n and *cap
 * updated. NULL (arr and the counts as they were) when the host is out of
 * memory or an index would pass 32 bits. */
void *ml__ab_grow(void *arr, size_t elem, size_t *n, size_t *cap, size_t free_count, size_t need);
/* Room for `need` more blocks without allocating: false when the host is
 * out of memory (the table unchanged). */
bool ml__ab_reserve(ml_ab_table *t, size_t need);
/* A zeroed block (state DETACHED) from the reserved room; never fails after
 * a successful ml__ab_reserve covering it. Inline: every split makes one. */
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

void ml__ab_table_free(ml_ab_table *t);

/* Ordered sets: *root is 0 when empty. by_addr orders by address, else by
 * (size, address). A block's key must not change while it is in a set,
 * unless its place in the order stays (then it may, in place). */
void ml__ab_insert(ml_ab_table *t, uint32_t *root, uint32_t x, bool by_addr);
void ml__ab_erase(ml_ab_table *t, uint32_t *root, uint32_t x, bool by_addr);
/* The smallest block of a size-ordered set whose size is >= size; 0: none. */
uint32_t ml__ab_lower_bound(const ml_ab_table *t, uint32_t root, uint64_t size);
/* The same in the set *root, also giving *link, the link that holds it
 * (for ml__ab_erase_at), and *pred, the block before it in the order (0:
 * none); both are written only when a block is found, and *link is valid
 * until the set or the table changes. */
uint32_t ml__ab_lower_bound_at(ml_ab_table *t, uint32_t *root, uint64_t size, uint32_t **link,
                               uint32_t *pred);
/* Erases the block that *link holds, with no search. */
void ml__ab_erase_at(ml_ab_table *t, uint32_t *link);
/* The next and previous block of a set after / before x (in the set); 0: none. */
uint32_t ml__ab_after(const ml_ab_table *t, uint32_t root, uint32_t x, bool by_addr);
uint32_t ml__ab_before(const ml_ab_table *t, uint32_t root, uint32_t x, bool by_addr);
uint32_t ml__ab_first(const ml_ab_table *t, uint32_t root);
uint32_t ml__ab_last(const ml_ab_table *t, uint32_t root);
/* Writes the set's blocks in order into out (room for count of them). */
size_t ml__ab_collect(const ml_ab_table *t, uint32_t root, uint32_t *out, size_t room);

/* ---- The class table: a slot per size class (classes.c), 16 bytes where
 * a block takes 64, so that the few classes in use share cache lines. */
typedef struct {
    uint64_t size; /* the class's size; 0: an unused slot */
    uint32_t top;  /* its lowest-addressed block; an unused slot: the next unused one */
} ml_ab_cls;

typedef struct {
    ml_ab_cls *k;
    size_t n, cap;      /* slots used (index 0, "none", included), allocated */
    uint32_t free_head; /* the unused slots, through .top */
    size_t free_count;
} ml_ab_cls_table;

/* Room for `need` more classes without allocating: false when the host is
 * out of memory (the table unchanged). */
bool ml__ab_cls_reserve(ml_ab_cls_table *t, size_t need);
void ml__ab_cls_table_free(ml_ab_cls_table *t);
/* A slot of the given size from the reserved room (never fails after a
 * ml__ab_cls_reserve covering it), with no block yet. */
static inline uint32_t ml_ab_cls_new(ml_ab_cls_table *t, uint64_t size)
{
    uint32_t i;
    if (t->free_head) {
        i = t->free_head;
        t->free_head = t->k[i].top;
        t->free_count--;
    } else {
        i = (uint32_t)t->n++;
    }
    t->k[i].size = size;
    t->k[i].top = 0;
    return i;
}

static inline void ml_ab_cls_release(ml_ab_cls_table *t, uint32_t i)
{
    t->k[i].size = 0;
    t->k[i].top = t->free_head;
    t->free_head = i;
    t->free_count++;
}

/* ---- Class sets (classes.c): the caching allocator's size-ordered free
 * sets. One class per size with free blocks: a slot of the class table
 * (above), found through an index of the sizes in order;
 * the class's blocks form a pairing heap by address (Fredman, Sedgewick,
 * Sleator and Tarjan 1986). The best fit, the first block of the (size,
 * address) order at or above a size, is then the heap top of the first
 * class at or above it: the block BlockPool::blocks.lower_bound gives,
 * with an insert that costs O(1) in the class. The order of a class's
 * blocks is kept only as far as its top.
 *
 * The index: the sizes in ascending order, cut into chunks of at most
 * ML_AB_CHUNK entries, with the chunks' largest sizes in an array of
 * their own (a B+ tree of two levels). The classes are few in practice
 * (at most 39 at once in a 96-block plan, 35 in the H200 traces:
 * docs/allocator.md, "Speed"): one chunk, found by a binary search of a
 * contiguous array, faster than a walk of linked nodes. The chunks keep
 * a new or erased size to a move of at most a chunk's entries (plus a
 * move of the chunk list when one splits or merges), however many classes
 * there are. Any two neighbouring chunks hold at least ML_AB_CHUNK / 2
 * entries together, so n classes take at most 4n / ML_AB_CHUNK + 1
 * chunks. The class table needs a slot per class and the index room for
 * as many classes, at most one per free block: room for as many as the
 * block table has blocks keeps every call free of allocations. */
#define ML_AB_CHUNK 32

typedef struct {
    uint64_t size[ML_AB_CHUNK]; /* ascending */
    uint32_t cls[ML_AB_CHUNK];  /* the class slot of each size */
} ml_ab_chunk;

typedef struct {
    ml_ab_chunk *ch; /* chunk storage, cap chunks, by id */
    /* by position, in ascending order of sizes: the chunk's id, its
     * largest size and its count of entries */
    uint32_t *order;
    uint64_t *hi;
    uint32_t *count;
    uint32_t *spare;                /* ids of unused chunks (a stack) */
    uint32_t nch, nspare, cap;      /* chunks in use, unused ids, ids in all */
    uint32_t n;                     /* classes */
    /* where the last lower bound landed: 1 + the chunk's position, and the
     * entry's index in it (fpos 0: unknown, or found by the memo) */
    uint32_t fpos, fidx;
    /* a direct-mapped memo of size -> class, checked before use */
    struct {
        uint64_t size;
        uint32_t cls;
    } memo[64];
} ml_ab_classes;

/* Room in c's index for `classes` classes; false when the host is out of
 * memory (c unchanged but for spare capacity). */
bool ml__ab_classes_reserve(ml_ab_classes *c, size_t classes);
/* Whether c has room for `classes` classes (ml__ab_classes_reserve passed). */
static inline bool ml_ab_classes_room(const ml_ab_classes *c, size_t classes)
{
    return c->cap >= 4 * classes / ML_AB_CHUNK + 2;
}
void ml__ab_classes_free(ml_ab_classes *c);
/* NULL when c's index is consistent with itself and with the class table
 * ct, with room for a class per block of a table of `blocks` blocks:
 * chunks in order, each largest size and count right, every two
 * neighbours at half a chunk or more, every chunk id once; else what is
 * not (ml__alloc_sim_check, and the tests). */
const char *ml__ab_classes_check(const ml_ab_classes *c, const ml_ab_cls_table *ct, size_t blocks);
/* Block x (in no set) into the class set c of the blocks t, classes ct. */
void ml__ab_class_insert(ml_ab_table *t, ml_ab_cls_table *ct, ml_ab_classes *c, uint32_t x);
/* Block x out of the class set c. */
void ml__ab_class_erase(ml_ab_table *t, ml_ab_cls_table *ct, ml_ab_classes *c, uint32_t x);
/* The lowest-addressed block of the smallest class whose size is >= size;
 * 0: none. */
uint32_t ml__ab_class_lower_bound(ml_ab_cls_table *ct, ml_ab_classes *c, uint64_t size);
/* Gives block x (in c) the key (size, addr), size below its own, in place
 * when x is alone in its class and no class lies between (as the lower
 * bound just before, which found x's class, saw): the class keeps its
 * place in the order and takes the new size. Returns false (nothing
 * changed) otherwise. */
bool ml__ab_class_shrink(ml_ab_table *t, ml_ab_cls_table *ct, ml_ab_classes *c, uint32_t x,
                         uint64_t size, uint64_t addr);
/* Writes the set's blocks, class by class from the smallest (in no order
 * within a class), into out, at most room of them; returns how many. */
size_t ml__ab_class_collect(const ml_ab_table *t, const ml_ab_cls_table *ct, const ml_ab_classes *c,
                            uint32_t *out, size_t room);

#endif
