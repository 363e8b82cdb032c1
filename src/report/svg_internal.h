/* Shared by the SVG and HTML writers. */
#ifndef ML_SVG_INTERNAL_H
#define ML_SVG_INTERNAL_H

#include <stddef.h>

#include "memledger/ledger.h"

#define ML_SVG_POINTS 1500
/* The timeline chart's plot area in SVG units (viewBox 1040 x 580). */
#define ML_SVG_X0 90.0
#define ML_SVG_W 720.0

/* Up to cap event indices, each the highest event of its bucket. */
size_t ml_svg_sample(const ml_ledger *l, size_t *idx, size_t cap);

#endif
