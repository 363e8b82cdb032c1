/* memledger — decisions on top of the ledger: the largest micro-batch and
 * the accumulation steps for a target batch (fit), and checkpoint policies
 * side by side (compare). docs/choosing.md walks through both. */
#ifndef MEMLEDGER_PLAN_H
#define MEMLEDGER_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "export.h"
#include "ledger.h"
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ml_fit_request {
    uint64_t global_batch;    /* target effective batch; 0 = none */
    uint64_t max_micro_batch; /* upper end of the search (default 65536) */
    bool auto_checkpoint;     /* pick the policy (docs/choosing.md); else cfg's */
} ml_fit_request;

ML_API ml_fit_request ml_fit_request_defaults(void);

typedef struct ml_fit_result {
    bool fits;                  /* some micro-batch >= 1 fits */
    uint64_t micro_batch;       /* chosen */
    uint64_t grad_accum;
    uint64_t data_parallel;
    uint64_t effective_batch;   /* micro_batch * grad_accum * data_parallel */
    uint64_t max_micro_batch;   /* the largest that fits (before divisibility) */
    bool exact;                 /* effective_batch == global_batch (true without one) */
    ml_checkpoint checkpoint;   /* the policy used */
    char plan[256];             /* the plan as run ("optimal: [0-3]" ...) */
    uint64_t peak_total;        /* at the chosen micro-batch */
    uint64_t budget;
    int64_t headroom;
    double flops_recompute;     /* per iteration at the chosen point */
    uint64_t peak;              /* allocator peak (peak_total less the runtime reserve) */
    double step_time_s;         /* < 0 when unknown */
    unsigned evaluations;       /* ledger evaluations the search made */
    char note[512];             /* why the choice, or why nothing fits */
} ml_fit_result;

/* Finds the largest micro-batch whose peak fits the device (cfg->device must
 * be present) and the accumulation steps reaching req->global_batch. The
 * search is exact on the ledger (bisection; the peak is monotone in the
 * micro-batch for a fixed plan). Returns ML_OK with out->fits false and a
 * note when even micro-batch 1 does not fit; ML_USAGE without a device;
 * ML_RANGE, ML_OVERFLOW, ML_NOMEM as ml_ledger_evaluate. */
ML_API ml_status ml_fit(const ml_model *m, const ml_config *cfg, const ml_fit_request *req,
                        ml_fit_result *out, ml_error *err);

typedef struct ml_compare_row {
    ml_checkpoint checkpoint;
    char plan[256];
    uint64_t peak;
    uint64_t peak_total;
    uint64_t activations_saved;
    double flops_recompute;
    double flops_total;
    double recompute_pct;   /* flops_recompute / flops_total of `none`, in % */
    double step_time_s;     /* < 0 when unknown */
    bool has_device;
    bool fits;
} ml_compare_row;

#define ML_COMPARE_ROWS 7

/* none, full, every-2, every-4, sqrt, selective and (with a device) optimal,
 * at cfg's micro-batch. Writes up to ML_COMPARE_ROWS rows and their count. */
ML_API ml_status ml_compare(const ml_model *m, const ml_config *cfg, ml_compare_row *rows,
                            size_t *nrows, ml_error *err);

#ifdef __cplusplus
}
#endif
#endif
