/* Optimal checkpointing over a heterogeneous chain (docs/optimal.md): the
 * segmentation of the checkpointable blocks with the least recompute FLOPs
 * whose memory high-water marks all stay within a budget. */
#ifndef ML_OPTIMAL_H
#define ML_OPTIMAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memledger/error.h"

/* One block of the chain model. Bytes are above the kept prefix P (the
 * bytes that earlier blocks keep until their backward). */
typedef struct {
    uint64_t keep;    /* a: kept from forward to backward when not checkpointed */
    uint64_t input;   /* x: the block's input, kept by a segment that starts here */
    uint64_t recomp;  /* r: bytes recomputed for it inside a segment (keep less
                         the input when it is part of keep) */
    uint64_t fwd;     /* u: forward high-water when not checkpointed (incl. keep) */
    uint64_t fwd_ng;  /* v: forward high-water under no_grad (incl. its input) */
    uint64_t bwd;     /* w: backward high-water besides its own kept/recomputed bytes */
    uint64_t base_b;  /* b: resident during its backward (states, later grads) */
    double flops;     /* f: forward FLOPs, the cost of recomputing it */
} ml_opt_block;

typedef struct {
    size_t n;
    const ml_opt_block *blk;
    uint64_t base_f;   /* resident during the forward pass */
    uint64_t base_t;   /* tail (head, loss) high-water besides the kept prefix */
    uint64_t budget;
} ml_opt_chain;

/* Checks a plan: seg[i] = -1 (kept) or a segment id (equal ids are one
 * contiguous segment). Returns true when every constraint holds; *cost gets
 * the recompute FLOPs and *peak the model's highest point. */
bool ml_opt_check(const ml_opt_chain *c, const int *seg, double *cost, uint64_t *peak);

/* Solves. On ML_OK, *feasible says whether any plan fits; when it does, seg
 * (n entries) holds the plan and *cost its recompute FLOPs. max_states caps
 * the Pareto set per block boundary (0: 4096 up to 128 blocks, 256 beyond);
 * beyond it the set is thinned, never above the budget. Segments are at most
 * max(16, 2 ceil(sqrt(n))) blocks. ML_NOMEM otherwise. */
ml_status ml_opt_solve(const ml_opt_chain *c, size_t max_states, int *seg, double *cost,
                       bool *feasible);

#endif
