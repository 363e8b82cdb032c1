/* The per-op step-time model (steptime.c; docs/time.md). Internal. */
#ifndef ML_STEPTIME_H
#define ML_STEPTIME_H

#include "ledger/chain.h"
#include "ledger/work.h"

/* The constants of a datasheet estimate, each with its source in
 * docs/time.md ("The GPU's time per item", "The host"). The host's costs are those fitted on the
 * H200 campaign's 60 runs (calib/h200_time.py --fit), a profile's host
 * section replaces them. */
#define ML_TIME_GEMM_SHARE 0.80        /* large GEMMs: their share of the dense peak */
#define ML_TIME_GEMM_LATENCY_S 3e-6    /* a GEMM's time beyond its FLOPs */
#define ML_TIME_ATTN_FWD_SHARE 0.50    /* fused attention, of the GEMM rate: forward */
#define ML_TIME_ATTN_BWD_SHARE 0.40    /* and backward */
#define ML_TIME_KERNEL_FLOOR_S 2.5e-6  /* the least time any kernel takes */
#define ML_TIME_HOST_FORWARD_S 33.05e-6   /* host: per kernel launched in forward */
#define ML_TIME_HOST_BACKWARD_S 0.01e-6   /* per kernel of a backward node */
#define ML_TIME_HOST_FWD_BLOCK_S 1100e-6       /* per block's forward, besides its kernels */
#define ML_TIME_HOST_BWD_BLOCK_S 250e-6       /* per block's backward */
#define ML_TIME_HOST_RECOMPUTE_S 479.16e-6 /* per recomputed (checkpointed) block */
#define ML_TIME_HOST_STEP_CALL_S 72.73e-6 /* optimizer: per foreach call */
#define ML_TIME_HOST_STEP_TENSOR_S 2e-6 /* per tensor in a call */

typedef struct {
    double gemm_flops;      /* FLOP/s of a large product at the compute dtype */
    double gemm_latency_s;  /* added to every product */
    double peak_flops;      /* the datasheet's dense peak (for MFU) */
    double sms;             /* streaming multiprocessors: a product's waves */
    double bw[MLG_OP_KINDS]; /* bytes/s each kernel class achieves */
    double attn_fwd_flops, attn_bwd_flops;
    double kernel_floor_s;
    double host_fwd_s, host_bwd_s, host_fwd_block_s, host_bwd_block_s, host_layer_s;
    double host_step_call_s, host_step_tensor_s;
    ml_time_source source;
    bool host_profiled; /* the host's costs from a profile */
    bool serial;        /* a CPU's: host and compute one after the other */
} ml_time_rates;

/* The rates of cfg's device; false when it has no memory bandwidth or no
 * peak at the plan's compute dtype (the step is then not timed). */
bool ml__time_rates(const ml_config *cfg, ml_time_rates *tr);
/* One item's GPU time; *compute: a product or fused attention. */
double ml__time_item(const ml_time_rates *tr, const ml_work_item *it, bool *compute);
/* s->time for chain ch under cfg, seg the checkpoint segments (seg[k] >= 0:
 * block k recomputed), after the FLOPs' time (s->step_time_s, kept as
 * time.flops_s) and before ml__time_finish: when the step is timed, its
 * compute (step_time_s) becomes the pipeline's. */
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
} ml_time_map;
void ml__step_time(const ml_chain *ch, const ml_config *cfg, const int *seg, ml_summary *s,
                   ml_time_map *map);
/* The time at which f FLOPs were done: the first breakpoint at f, or the
 * line between the two around it; < 0 when the map is empty. */
double ml__time_at(const ml_time_map *map, double f);

#endif
