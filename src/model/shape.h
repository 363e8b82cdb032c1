/* Per-sample shape inference for sequential models, shared by the loader
 * (which reports errors with positions) and the ledger (which sizes tensors). */
#ifndef ML_SHAPE_H
#define ML_SHAPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/model_internal.h"

typedef struct {
    uint64_t d[3];
    unsigned rank;  /* 1: [F] or [T] ids, 2: [T, D], 3: [C, H, W] */
    bool ids;       /* integer token ids (before an embedding) */
} ml_shape;

/* Per-sample element count (saturates at UINT64_MAX). */
uint64_t ml__shape_elems(const ml_shape *s);

/* Output shape of one layer (residuals: of the whole group). Returns false and
 * writes a message (and the failing layer) when the layer does not apply. */
bool ml__shape_step(const ml_layer *l, const ml_shape *in, ml_shape *out, char *msg, size_t size,
                    const ml_layer **where);

#endif
