/* The per-op step-time model (steptime.c; docs/time.md). Internal. */
#ifndef ML_STEPTIME_H
#define ML_STEPTIME_H

#include "ledger/chain.h"

/* The clock of the timeline: at each breakpoint, the FLOPs done before it
 * (as the replay counts them, ml_event.flops_before) and the per-op
 * model's time then; for the first and the last micro-batch and the
 * optimizer step (the replay's events are theirs). */
typedef struct {
    double flops, t;
} ml_time_point;
typedef struct ml_time_map {
    ml_time_point *p;
    size_t n, cap;
    bool nomem;
    double step_end; /* when the optimizer step's run ends (< 0: not timed) */
} ml_time_map;
/* s->time for chain ch under cfg, seg the checkpoint segments (seg[k] >= 0:
 * block k recomputed), after the FLOPs' time (s->step_time_s, kept as
 * time.flops_s) and before ml__time_finish: when the step is timed, its
 * compute (step_time_s) becomes the pipeline's. */
void ml__step_time(const ml_chain *ch, const ml_config *cfg, const int *seg, ml_summary *s,
                   ml_time_map *map);
/* Whether ml__step_time times cfg's step op by op (a device with a memory
 * bandwidth, or a profile measured on it): only then does it read the
 * chain's work items. */
bool ml__step_time_per_op(const ml_config *cfg);
/* The time at which f FLOPs were done: the first breakpoint at f, or the
 * line between the two around it; < 0 when the map is empty. */
double ml__time_at(const ml_time_map *map, double f);
/* Adds the point (flops done, time) to m (NULL: none kept; out of memory:
 * m->nomem, later points dropped) (timemap.c). */
void ml__time_map_add(ml_time_map *m, double flops, double t);

#endif
