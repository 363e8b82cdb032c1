/* Megatron-LM's distributed optimizer (docs/parallel.md, "The distributed
 * optimizer"): the parameter and gradient buffers its DDP lays out, padded,
 * and the shard of them whose fp32 master weights and optimizer states one
 * data-parallel rank keeps. Internal to src/ledger/. */
#ifndef ML_DIST_OPTIMIZER_H
#define ML_DIST_OPTIMIZER_H

#include "ledger/chain.h"

typedef struct {
    uint64_t padded;  /* elements of the buffers, padding included */
    uint64_t shard;   /* parameter elements in the fullest rank's shards */
    uint64_t rank;    /* that rank (the lowest of the fullest) */
    uint64_t buckets; /* buckets over the buffers */
    size_t fragments; /* the shard's pieces: one tensor each (master copy, state) */
} ml_dopt;

/* The layout of ch's trained parameters over dp ranks with v model chunks
 * (a stage's interleaved chunks each get their buffers), as
 * megatron/core/optimizer/distrib_optimizer.py
 * (_compute_per_buffer_param_layout) makes it; frag, when not NULL, gets the
 * fullest rank's pieces (elements) in order, `cap` at most. ML_NOMEM or
 * ML_OK. */
ml_status ml__dopt_layout(const ml_chain *ch, uint64_t dp, uint64_t v, ml_dopt *out,
                          uint64_t *frag, size_t cap);

/* The data-parallel sharding's conditions: parallel.dp_shard dividing the
 * ranks, with a sharding on; parallel.dist_optimizer with Megatron's
 * engine, its optimizers (Adam, AdamW, SGD), no ZeRO stage or offload
 * beside it. ML_RANGE with the fix, else ML_OK. */
ml_status ml__dp_sharding_refused(const ml_training *t, ml_error *err);

#endif
