/* What the tests ask a prepared planner (planner.c). */
#ifndef ML_PLANNER_H
#define ML_PLANNER_H

#include "memledger/ledger.h"

/* Evaluations whose chain was derived, not built (chain_affine.c). */
unsigned long ml__planner_derived(const ml_planner *p);

#endif
