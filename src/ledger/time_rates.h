/* The rates the per-op step time prices work at (time_rates.c;
 * docs/time.md). Internal. */
#ifndef ML_TIME_RATES_H
#define ML_TIME_RATES_H

#include "graph/graph.h"
#include "ledger/chain.h"
#include "memledger/calib.h"

typedef struct {
    double gemm_flops;       /* FLOP/s of a large product at the compute dtype */
    double gemm_latency_s;   /* added to every product */
    double peak_flops;       /* the datasheet's dense peak (for MFU) */
    double sms;              /* streaming multiprocessors: a product's waves */
    double bw[MLG_OP_KINDS]; /* bytes/s each kernel class achieves */
    double attn_fwd_flops, attn_bwd_flops;
    double kernel_floor_s;
    ml_profile_host host;    /* the host's costs: the defaults or a profile's */
    ml_time_source source;
    bool serial;             /* a CPU's: host and compute one after the other */
} ml_time_rates;

/* The rates of cfg's device; false when it has no memory bandwidth or no
 * peak at the plan's compute dtype (the step is then not timed). */
bool ml__time_rates(const ml_config *cfg, ml_time_rates *tr);
/* One item's GPU time, and whether it is a product (or fused attention). */
double ml__time_item(const ml_time_rates *tr, const ml_work_item *it, bool *compute);

#endif
