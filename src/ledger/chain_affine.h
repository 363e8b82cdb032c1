/* A chain at any micro-batch from its builds at powers of two
 * (chain_affine.c; docs/ledger.md, "A prepared planner"). */
#ifndef ML_CHAIN_AFFINE_H
#define ML_CHAIN_AFFINE_H

#include "ledger/chain.h"

/* True when a, b and c, built at micro-batches x/2, x and 2x (x >= 2),
 * have the same structure and every figure on one line with a whole
 * slope: then the chain at any micro-batch in [x/2, 2x] is on it. */
bool ml__chain_line(const ml_chain *a, const ml_chain *b, const ml_chain *c, uint64_t x);
/* The chain at micro-batch B on the line through one (built at x = 2^k)
 * and two (at 2x, the pair ml__chain_line passed) into *o (its arrays reused,
 * grown as needed; o owns them, ml__chain_free, but for its parameters:
 * one's, borrowed, as no figure of theirs depends on B — clear o->params
 * before freeing o, and derive o again after one is freed): ML_OK, ML_NOMEM, or
 * ML_OVERFLOW where a figure would pass 2^56 bytes or 2^50 FLOPs (the
 * caller then builds the chain itself). Without work (an evaluation whose
 * step time is not per op: ml__step_time_per_op), the ops' work items are
 * left out: o lists none, and its blocks are FLOP counts only. */
ml_status ml__chain_at(const ml_chain *one, const ml_chain *two, unsigned k, uint64_t B,
                       bool work, ml_chain *o);

#endif
