/* What the tests and the searches ask a prepared planner (planner.c). */
#ifndef ML_PLANNER_H
#define ML_PLANNER_H

#include "ledger/reserved_memo.h"
#include "memledger/ledger.h"

/* Evaluations whose chain was derived, not built (chain_affine.c). */
unsigned long ml__planner_derived(const ml_planner *p);

/* ml_planner_evaluate whose allocator simulation is looked up in, and
 * added to, *memo (NULL: none kept; reserved_memo.h). */
ml_status ml__planner_evaluate_with(ml_planner *p, const ml_config *cfg, bool keep_events,
                                    ml_reserved_memo *memo, ml_ledger **out, ml_error *err);

#endif
