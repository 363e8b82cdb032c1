/* The allocator simulation's aggregates (reserved.c) as the files that
 * make them share them: reserved.c, and reserved_saved.c for the saved
 * inventories. Internal to src/ledger/. */
#ifndef ML_RESERVED_INTERNAL_H
#define ML_RESERVED_INTERNAL_H

#include "ledger/reserved.h"

/* One aggregate the replay allocated: its tensors' handles are
 * h[first .. first + n). */
typedef struct {
    ml_category cat;
    uint64_t bytes;
    size_t first, n;
    size_t block;         /* the block of a block's split (ML_T_SAVED*) */
    ml_tensor_split split;
    unsigned per;         /* an inventory opened empty (ml__rsim_saved_open):
                             handles per saved entry, 0 unfilled; 0: made
                             whole (ml__rsim_alloc) */
} group;

struct ml_rsim {
    ml_alloc_sim *sim;
    const ml_chain *ch;
    size_t nblocks;
    size_t *pfirst, *pcount; /* per block: its parameter tensors in ch->params */
    uint64_t P;              /* parameter elements */
    uint64_t Pt, Pg;         /* those that train (not frozen), and that also get a
                                gradient (an unused layer's do not) */
    group *g;
    size_t ng, gcap;
    uint64_t *h;
    size_t nh, hcap;
    /* per category, the live groups in allocation order */
    size_t *live[ML_CAT_COUNT];
    size_t nlive[ML_CAT_COUNT], livecap[ML_CAT_COUNT];
    uint64_t live_bytes[ML_CAT_COUNT];
    uint64_t dp, chunks; /* ML_T_SHARD's layout */
    uint64_t *sizes; /* scratch: one aggregate's tensor sizes */
    size_t sizecap;
    bool oom, nomem;
    uint64_t inexact;      /* frees released by size, not by the tensor named */
    size_t *side_names;    /* ML_SIDE_SLOTS per side tensor (ml__rsim_side_note) */
    size_t side_cap;
    size_t *cache_names;   /* two per block, this micro-batch's and the previous
                              one's (ml__rsim_cache_note) */
    size_t cache_cap;
    bool recording;        /* ml__rsim_record */
    ml_sim_event *ev;
    size_t nev, evcap;
};

/* One event into the record (when recording; a handle 0 is nothing). */
void ml__rsim_note(ml_rsim *r, ml_sim_action a, uint64_t id, uint64_t bytes);
/* After a request the simulator refused: when it ran out of the device,
 * the request into the record, so that a trace of the plan runs out where
 * the plan does (id 1, which no handle has: a handle's upper half is its
 * slot's generation, at least 1). */
void ml__rsim_note_refused(ml_rsim *r, uint64_t bytes);
/* Whether the simulator's answer ar let the request through; else r
 * records the failure: the device ran out (oom) or the host (nomem). */
bool ml__rsim_granted(ml_rsim *r, ml_alloc_result ar);
/* Group gi live in category c; false when the host is out of memory. */
bool ml__rsim_add_live(ml_rsim *r, ml_category c, size_t gi);
/* Room for one more group and n more handles; false (r->nomem) when the
 * host is out of memory. */
bool ml__rsim_group_room(ml_rsim *r, size_t n);
/* Frees the live group at index `at` of category c's live list. */
void ml__rsim_release(ml_rsim *r, ml_category c, size_t at);

#endif
