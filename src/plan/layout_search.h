/* What the layout search (layouts.c) and its table (layout_table.c)
 * share. Internal to the library. */
#ifndef ML_PLAN_LAYOUT_SEARCH_H
#define ML_PLAN_LAYOUT_SEARCH_H

#include "memledger/plan.h"

/* The points that wait to be planned as configured at a time. */
#define LAYOUT_POOL 128

typedef struct ml_layout_search {
    const ml_model *m;
    const ml_config *cfg;
    const ml_layout_request *req;
    ml_layout_result *out;
    ml_planner *planner; /* chains kept between points (docs/search.md) */
    bool planned;      /* some point was planned (it fit or not) */
    ml_error refusal;  /* the first refusal of a point (a layout or a setting
                          the model does not take), said when nothing was
                          planned at all */
    bool refused;
    /* the divisors of a share of the global batch, ascending (divisors_of),
     * and for each the step time of the split's point without
     * recomputation there (-1: not planned), a bound for the others */
    struct layout_divisor {
        uint64_t d;
        double bound;
    } *div;
    size_t ndiv, divcap;
    uint64_t div_of;
    /* points that fit in the allocated view and would enter the table,
     * waiting to be planned as configured (flush) */
    ml_layout_row *pool; /* LAYOUT_POOL rows */
    size_t npool;
} layout_search;

/* The settings of a row of the search. */
ml_config ml__layout_config_of(const layout_search *x, const ml_layout_row *w);

/* The step time a point must beat to enter the table, once it is full
 * and timed (-1: none yet). */
double ml__layout_table_bound(const ml_layout_result *out);

/* One point (split's layout, micro-batch b, mb micro-batches a step,
 * policy) planned in the allocated view; ML_RANGE: the layout is not one
 * the model splits into (not an error of the search); *fits whether it
 * fits every rank so, and then it is a candidate for the table; *bound_s
 * its step time, fitting or not (-1: none), the bound of the same point
 * with recomputation. */
ml_status ml__layout_point(layout_search *x, const ml_layout_row *split, uint64_t b, uint64_t mb,
                           const ml_checkpoint *policy, bool *fits, double *bound_s,
                           ml_error *err);

/* The points waiting for the table planned again as configured, from the
 * fastest, until the rest would not enter it. */
ml_status ml__layout_flush(layout_search *x, ml_error *err);

#endif
