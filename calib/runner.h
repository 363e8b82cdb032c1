/* Private to memledger-calibrate (runner.c, runner_options.c,
 * runner_check.c): its options and the steps the files share. */
#ifndef ML_CALIB_RUNNER_H
#define ML_CALIB_RUNNER_H

#include <stdbool.h>
#include <stddef.h>

#include "layers.h"

#define RUNNER_MAX_POINTS 64

/* The command line, then (runner_resolve_options) the values it implies
 * for the backend: every size set, the points and the kinds to measure. */
typedef struct {
    const char *backend; /* "cpu" or "cuda" */
    const char *dtype;   /* "fp32" or "bf16" */
    const char *layers, *grid, *out, *name; /* NULL when not given */
    size_t D, H, V, KVH, FF;                /* 0 when not given */
    double peak, dropout;
    bool check;
    /* resolved */
    bool gpu, bf16;
    size_t B[RUNNER_MAX_POINTS], T[RUNNER_MAX_POINTS], npoints;
    bool want[LAYER_KIND_COUNT];
} runner_options;

/* Reads argv into *o, checking each value's form and the choices of
 * --backend, --dtype and --dropout. Returns 0, 1 when --help printed the
 * usage (exit 0), or 2 after an error message (bad usage). */
int runner_parse_options(runner_options *o, int argc, char **argv);
/* Sizes the options left out for the backend (o->gpu), checks how they
 * divide, reads --points and --layers. Returns 0, or 2 after an error
 * message. */
int runner_resolve_options(runner_options *o);

/* --check: every layer kind on be and on the CPU backend with the same
 * weights and inputs. Returns the exit status: 0 all agree, 1 a mismatch
 * or out of memory, 2 no CPU backend. */
int runner_check_backends(ml_backend *be, const runner_options *o);

/* Fills t with fixed pseudo-random values: token ids below V (ids), else
 * floats in [-0.5, 0.5). */
void runner_fill_random(ml_backend *be, tensor *t, bool ids, size_t V);

#endif
