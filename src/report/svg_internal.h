/* Shared by the SVG and HTML writers. */
#ifndef ML_SVG_INTERNAL_H
#define ML_SVG_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "memledger/ledger.h"

#define ML_SVG_POINTS 1500
/* The timeline chart's plot area in SVG units (viewBox 1040 x 580). */
#define ML_SVG_X0 90.0
#define ML_SVG_W 720.0

/* A chart's plot area in SVG units and the top of its byte axis. */
typedef struct ml_svg_chart {
    double x0, y0, w, h;
    double ymax;
} ml_svg_chart;

/* The SVG element with a white background, w x h units. */
void ml_svg_header(FILE *f, int w, int h);
/* y of a byte count on c. */
double ml_svg_py(const ml_svg_chart *c, double bytes);
/* The byte axis (a binary unit, 4 to 10 ticks) and the x axis line. */
void ml_svg_y_axis(FILE *f, const ml_svg_chart *c);
/* A horizontal line at `bytes`, labelled at its right end (or left). */
void ml_svg_hline(FILE *f, const ml_svg_chart *c, uint64_t bytes, const char *color,
                  const char *dash, const char *label, bool left);

/* The latest event time when every event has one, else 0: the chart's x
 * axis is then seconds (0..T), else the event index. */
double ml_svg_time_end(const ml_ledger *l);

/* Up to cap event indices, each the highest event of its bucket. */
size_t ml_svg_sample(const ml_ledger *l, size_t *idx, size_t cap);

#endif
