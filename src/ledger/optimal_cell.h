/* The open segments of the optimal solver, kept per memory cell: a cell's
 * groups of equally good open segments form a staircase (until ascending,
 * each strictly better than the next), so the best open segment of a cell is
 * always the oldest open member of its first group (docs/optimal.md). Used
 * by src/ledger/optimal.c only. */
#ifndef ML_LEDGER_OPTIMAL_CELL_H
#define ML_LEDGER_OPTIMAL_CELL_H

#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>

#include "ledger/optimal.h"

/* An open segment: it starts from state id (at some level s) and can end
 * at levels s+1..until. Its cost at level i is key + F(i) and its
 * nrec nkey + i, with F the prefix sums of the FLOPs, so open segments from
 * different starts compare the same at every level. */
typedef struct {
    uint64_t P; /* prefix after the segment: the state's P plus the input x */
    double key;
    int32_t nkey;
    uint32_t until, id;
} entry;

/* Open segments of one cell with equal (P, key, nkey) form a group: they
 * differ only in where they start, which decides ties (the earliest start
 * that is still open wins, see ml_oc_better()). Its members, in a pool, are
 * linked oldest first; a member that closes no later than a younger one
 * is useless and never kept, so their until rises along the list. */
typedef struct {
    uint32_t id, until, next;
} member;
#define NIL UINT32_MAX

typedef struct {
    member *v;
    size_t n, cap;
    uint32_t free; /* a list through next */
} pool;

typedef struct {
    uint64_t P;
    double key;
    int32_t nkey;
    uint32_t until;       /* its last (longest-open) member's */
    uint32_t first, last; /* members */
    member oldest;        /* a copy of the first: read at every visit */
} group;

/* The groups of one memory cell, v[head..n): until ascending, each strictly
 * better than the next. A group that closes no earlier and is no worse
 * than another makes that one useless, so the cell's best open segment is
 * always the oldest open member of v[head] (a staircase; docs/optimal.md). */
typedef struct {
    group *v;
    uint32_t head, n;
    size_t cap;
} cell;

/* a strictly better than b: cheaper, then fewer recomputed blocks, then the
 * smaller prefix, then the lower rank: the earlier predecessor (by id), and
 * from the same one keeping before a segment (the order in which the search
 * meets them, so equal plans resolve the same way every time) */
static inline bool ml_oc_better(double ca, int64_t ra, uint64_t pa, uint64_t ka, double cb, int64_t rb,
                   uint64_t pb, uint64_t kb)
{
    if (ca != cb)
        return ca < cb;
    if (ra != rb)
        return ra < rb;
    if (pa != pb)
        return pa < pb;
    return ka < kb;
}

static inline uint64_t ml_oc_rank(uint32_t id, bool segment)
{
    return (uint64_t)id << 1 | segment;
}

/* Enters e into its cell: as a new member of its group, as a new group
 * (dropping the groups it makes useless), or not at all; false when out of
 * memory (the cell is then unchanged). */
bool ml__oc_put(cell *c, pool *pl, const entry *e, ml_opt_stats *sx);

/* The cell's best open segment at level L: closed groups and members
 * released; false when none is left. */
bool ml__oc_best(cell *c, pool *pl, uint32_t L, const group **g, const member **mb);

/* Returns the members first..last (linked) to the pool. */
void ml__oc_free(pool *pl, uint32_t first, uint32_t last);

#endif
