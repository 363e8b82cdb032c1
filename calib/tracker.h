/* The calibration runner's tracking allocator: every tensor the layers use
 * is allocated through it, so the live bytes per category and the peak per
 * phase are exact (docs/calibration.md). */
#ifndef ML_CALIB_TRACKER_H
#define ML_CALIB_TRACKER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"

/* T_CAST: autocast's cached bf16 weight copies, kept for backward */
enum { T_PARAM, T_GRAD, T_STATE, T_SAVED, T_WORK, T_CAST, T_NCAT };
enum { PH_FORWARD, PH_BACKWARD, PH_STEP, PH_N };

typedef struct {
    ml_backend *be;
    uint64_t live[T_NCAT];
    uint64_t total;
    uint64_t peak[PH_N];
    int phase;
    uint64_t dev_base, dev_peak; /* the device's own view (CUDA) */
    bool oom;
} tracker;

/* A block of backend memory and what it counts as. */
typedef struct {
    void *p;
    size_t bytes;
    int cat;
    bool low; /* bf16 values (2 bytes each); otherwise fp32, int64 or bytes */
} tensor;

void tracker_init(tracker *tr, ml_backend *be);
/* bytes in category cat. Once an allocation has failed (tr->oom), and for
 * the one that fails, p is NULL: callers check tr->oom once after a run of
 * allocations. */
tensor tensor_alloc(tracker *tr, size_t bytes, int cat);
/* Frees t (nothing when t->p is NULL) and sets t->p to NULL. */
void tensor_free(tracker *tr, tensor *t);
/* notes the device's used memory (cudaMemGetInfo) as a candidate peak */
void tracker_device_sample(tracker *tr);

#endif
