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
    uint64_t recomp;  /* r: bytes recreated for it when it starts a segment (keep
                         less the input when it is part of keep: the segment
                         keeps that as x); a later block of a segment
                         recreates all of keep, its input included */
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
bool ml__opt_check(const ml_opt_chain *c, const int *seg, double *cost, uint64_t *peak);

/* Solves. On ML_OK, *feasible says whether any plan fits; when it does, seg
 * (n entries) holds the plan and *cost its recompute FLOPs (summed as
 * ml__opt_check does). cells is S, the most cells of the memory grid, each
 * q bytes wide, q the least power of two above budget / S: at most one
 * state per cell and block boundary (0: 2^22 / (n + 1), between 256 and
 * 65536). Segments of up to ml__opt_max_segment(n) blocks are searched:
 * any length up to 8,192 blocks. Every returned plan meets
 * every constraint (the prefixes are exact); its cost is at most that of
 * any plan with t kept blocks and segments that meets the constraints with
 * the budget lowered by t q, and it is the optimum when q = 1 or when no
 * cell merged states (ml_opt_stats.merges; docs/optimal.md, "Guarantee").
 * ML_NOMEM when out of memory, ML_RANGE for 2^31 blocks or states or more. */
ml_status ml__opt_solve(const ml_opt_chain *c, size_t cells, int *seg, double *cost,
                        bool *feasible);

/* The work of one solve, for tests and benchmarks. The bounds, with n
 * blocks, S cells and rho the longest segment whose recomputed bytes fit
 * the budget, are derived in docs/optimal.md, "Complexity". */
typedef struct {
    size_t cells;       /* S as used (at most the cells asked for) */
    uint64_t cell_bytes; /* q: 1 means the search is exact */
    size_t states;      /* front states over all boundaries: <= n S */
    size_t segments;    /* open segments entered into cells: <= states + 1 */
    size_t visits;      /* cells visited building the fronts: <= n S */
    size_t steps;       /* segment extensions tried: <= n (rho + 1) */
    size_t moves;       /* groups moved or dropped within cells:
                           <= 2 segments (rho + 1) */
    size_t merges;      /* times a cell kept a state over one with a smaller
                           prefix: 0 means the plan is optimal */
    size_t max_segment; /* the longest segment searched: ml__opt_max_segment */
} ml_opt_stats;

/* The longest segment a solve of n blocks searches: n (every length) up to
 * n^2 = ML_OPT_SEGMENT_WORK extensions, else that work over n blocks but
 * at least ML_OPT_SEGMENT_MIN. A segment's reach is walked once per block,
 * so a long chain whose segments all fit the budget (tiny layers) cost n^2
 * extensions per solve (100,000 layers); past 8,192 blocks the
 * guarantee holds against plans with segments of at most this many blocks
 * (docs/optimal.md, "Complexity"). */
#define ML_OPT_SEGMENT_WORK ((size_t)1 << 26)
#define ML_OPT_SEGMENT_MIN ((size_t)256)
size_t ml__opt_max_segment(size_t n);

/* ml__opt_solve, and on ML_OK (feasible or not) *stats, when not NULL. */
ml_status ml__opt_solve_stats(const ml_opt_chain *c, size_t cells, int *seg, double *cost,
                              bool *feasible, ml_opt_stats *stats);

/* Memory that successive solves share (the planner's rounds), so that a
 * solve after the first touches no fresh pages. Create returns NULL when
 * out of memory; destroy accepts NULL. */
typedef struct ml_opt_work ml_opt_work;
ml_opt_work *ml__opt_work_create(void);
void ml__opt_work_destroy(ml_opt_work *w);

/* ml__opt_solve_stats in w's memory; w stays usable after any status. */
ml_status ml__opt_solve_in(ml_opt_work *w, const ml_opt_chain *c, size_t cells, int *seg,
                           double *cost, bool *feasible, ml_opt_stats *stats);

#endif
