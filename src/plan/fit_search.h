/* What fit's search (fit.c) and its explanation of a miss (fit_explain.c)
 * share. */
#ifndef ML_FIT_SEARCH_H
#define ML_FIT_SEARCH_H

#include "ledger/planner.h"
#include "memledger/ledger.h"
#include "memledger/plan.h"

typedef struct {
    const ml_model *m;
    ml_config cfg;
    ml_planner *planner; /* every plan of the search (docs/ledger.md, "A prepared
                            planner") */
    ml_reserved_memo *memo; /* its simulations, which ml_fit owns (copies of
                               the search share them): a plan two policies
                               or two looks share is simulated once
                               (docs/allocator.md, "Speed") */
    unsigned evals;
    ml_error *err;
    bool accum_over; /* the global batch needs more steps than FIT_MAX_ACCUM */
    /* the latest plan that fit, and its config byte for byte: the
     * search's largest micro-batch, which the result plans again */
    bool has_fit;
    ml_config fit_cfg;
    ml_summary fit_sum;
    /* the latest doubling search's answer, its config (micro-batch 0) and
     * cap: auto's look without the simulation (fit.c, could_beat) is the
     * first half of the same policy's search with it */
    bool has_top;
    ml_config top_cfg;
    uint64_t top_cap, top;
} search;

/* Why micro-batch 1 does not fit, and what would help (docs/choosing.md),
 * into r's note. ML_NOMEM passes up; other failures of an evaluation
 * become the note. */
ml_status ml__fit_explain(search *s, ml_fit_result *r);

#endif
