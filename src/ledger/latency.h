/* A collective's latency (the alpha of an alpha-beta model), as NCCL's own
 * tuning model has it (latency.c; docs/search.md, "Latency"). Internal. */
#ifndef ML_LATENCY_H
#define ML_LATENCY_H

#include <stdint.h>

typedef enum {
    ML_COLL_ALL_REDUCE,
    ML_COLL_HALF, /* an all-gather or a reduce-scatter: half a ring all-reduce's steps */
    ML_COLL_SEND, /* a point-to-point send */
    ML_COLL_ALL_TO_ALL /* an all-to-all: a send to every peer, in one group */
} ml_coll;

/* Seconds one call of kind takes beyond its bytes over a group of ranks
 * spanning nodes (1: inside one node, over NVLink); 0 for a group of one. */
double ml__coll_latency_s(ml_coll kind, uint64_t ranks, uint64_t nodes);

#endif
