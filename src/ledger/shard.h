/* Per-device sharding as the replay applies it (docs/sharding.md): what a
 * rank keeps of the model states and which collectives its blocks run. */
#ifndef ML_LEDGER_SHARD_H
#define ML_LEDGER_SHARD_H

#include <stdbool.h>
#include <stdint.h>

#include "memledger/model.h"

/* A rank's sharding, set once a plan (evaluate.c, passes.c). */
typedef struct {
    uint64_t N;            /* data-parallel degree */
    unsigned zero;
    bool grads_sharded;    /* zero >= 2 */
    bool gather_params;    /* zero == 3: all-gather each block's params */
    unsigned pbytes;       /* param dtype bytes */
    uint64_t reduce_ws;    /* reduce-scatter bucket during backward */
    int side_block;        /* first checkpointed block: keeps the side inputs */
    uint64_t side_bytes;   /* tensors every checkpoint keeps once (masks) */
    double ring;           /* (N-1)/N: what a ring collective sends per byte */
    bool host_params;      /* offload: params: partitions come from the host */
    bool grad_views;       /* ml__grad_views */
} ml_shard;

/* The ZeRO stage the replay shards by: the distributed optimizer's
 * collectives are ZeRO-1's (the gradients reduce-scattered, the parameters
 * all-gathered into its buffer). */
static inline unsigned ml__zero_stage(const ml_training *t)
{
    return t->dist_optimizer ? 1u : t->zero;
}
/* Whether each .grad is a tensor of its own, which may keep a view's
 * storage (ml_cblock.grad_view): not under ZeRO-2/3 nor the distributed
 * optimizer (partitions, buffers). */
static inline bool ml__grad_views(const ml_training *t)
{
    return !t->dist_optimizer && t->zero < 2;
}

#endif
