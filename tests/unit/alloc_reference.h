/* A deliberately simple second implementation of the allocator rules
 * (docs/allocator.md), for the differential test in test_alloc.c: segments
 * as address-sorted arrays of blocks, every search a linear scan and a sort.
 * Slow (quadratic) and obviously shaped like the rules, so a disagreement
 * with src/alloc/ points at a bug in the fast one's data structures. */
#ifndef ML_ALLOC_REFERENCE_H
#define ML_ALLOC_REFERENCE_H

#include "alloc/alloc.h"

typedef struct ref_sim ref_sim;

/* NULL when out of memory; the config is assumed valid (the fast
 * simulator's create checks it). */
ref_sim *ref_create(const ml_alloc_config *cfg);
void ref_destroy(ref_sim *r);
/* As ml__alloc_sim_malloc / _free (handles are the reference's own);
 * returns ML_ALLOC_OK, ML_ALLOC_OOM or ML_ALLOC_BAD_HANDLE, and aborts the
 * test when the host is out of memory. */
ml_alloc_result ref_malloc(ref_sim *r, uint64_t bytes, uint64_t *handle);
ml_alloc_result ref_free(ref_sim *r, uint64_t handle);
void ref_empty_cache(ref_sim *r);
void ref_stats(const ref_sim *r, ml_alloc_stats *out);
/* The address of a live allocation; 0: not live. */
uint64_t ref_address(const ref_sim *r, uint64_t handle);

#endif
